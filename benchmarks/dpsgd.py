"""One client's DP-SGD step (``dp.unit = "example"``) against a non-private step and Opacus's.

A client's local step on a batch of B = 25 MNIST-shaped records (1x28x28), on the models of the
papers' MNIST experiments (``fedsafe.models``: SABLE's MLP 784-100-10, d = 79,510; SABLE's
Fashion-MNIST CNN, d = 431,080). The methods run interleaved call for call in one process, so
that load from other processes hits them alike (one thread):

- ``plain``: fedsafe's non-private client gradient (``VectorizedBackend.gradients`` on the
  client's minibatch, what a ``dsgd`` / ``fedavg`` step computes);
- ``dpsgd``: fedsafe's DP-SGD gradient (``fedsafe.privacy.dp.dpsgd.DPSGDClients``: record sample,
  per-example clipped sums — the hook path, ``method = "auto"`` — noise, ÷B) with seeded noise
  (``torch.randn``, as Opacus's default), and ``dpsgd_secure`` with the secret ChaCha20 noise a
  run uses by default (four float64 Box–Muller draws per normal);
- ``dpsgd_vmap``: the same step, seeded noise, with the per-example ``vmap(grad)`` path
  (``method = "vmap"``: what every model got before the hook path; the reference the hook path
  is tested against);
- ``opacus``: Opacus 1.6's ``GradSampleModule`` + ``DPOptimizer.pre_step`` (per-sample
  gradients by hooks, clip, ``torch.normal`` noise, ÷B) on the same model and batch, noise not
  in ``secure_mode`` (skipped when opacus is not installed).

Two more timings, interleaved with the steps, break the secret noise down (``noise_ms``, not
steps): ``secure_noise`` is ``SecretStream.normal(d)`` alone (one client's N(0, I_d) of a
step), ``float64_ops`` the four torch operations it cannot avoid — float64 ``log``, ``sqrt``,
``cos``, ``sin`` — on arrays of 2·d elements each, as the four Box–Muller draws per normal need.

Each repeat times ``inner`` steps of every method in turn; a ratio (``X_over_plain``,
``X_over_opacus``) is the median over repeats of the ratio within the repeat (paired, so a
load change between repeats cancels); ``ms`` are the medians of the per-step times. The
targets (issue #29): ``dpsgd`` and ``dpsgd_secure`` ≤ 2× ``plain`` and ≤ ``opacus``.

    OMP_NUM_THREADS=1 python benchmarks/dpsgd.py [--repeats 15] [--models mlp cnn_fmnist] [--quick]
        [--out benchmarks/results/dpsgd.json]

``--quick`` (the MLP at hidden 16 on 8x8 inputs, 3 repeats) checks that the script runs; its
ratios mean nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fedsafe.core.randomness import RandomSource, SecretStream  # noqa: E402
from fedsafe.engine.backends import VectorizedBackend  # noqa: E402
from fedsafe.models import ParamLayout, build_model, flatten_params  # noqa: E402
from fedsafe.models.config import ModelConfig  # noqa: E402
from fedsafe.privacy.dp import dpsgd  # noqa: E402

# Opacus's hooks warn that the inputs need no gradient (they do not): not this benchmark's concern
warnings.filterwarnings("ignore", message="Full backward hook is firing")

try:
    from opacus.grad_sample import GradSampleModule
    from opacus.optimizers import DPOptimizer
except ImportError:  # the dpsgd extra is optional
    GradSampleModule = DPOptimizer = None


class _Work:
    """What the DP-SGD oracle reads of the client work: the data and the loss."""

    def __init__(self, model, layout, x, y):
        self.data = type("Data", (), {"x_train": x, "y_train": y, "client_indices": [np.arange(len(y))]})()
        self.backend = type("Backend", (), {"model": model, "layout": layout, "loss_fn": None})()


def _median_ms(fn, repeats: int, inner: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t) / inner * 1e3)
    return statistics.median(out)


def bench_model(name: str, hidden: int, shape: tuple[int, ...], batch: int, records: int, repeats: int,
                inner: int) -> dict:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, hidden=hidden), shape, 10, generator=torch.Generator().manual_seed(0))
    layout = ParamLayout.from_model(model)
    params = flatten_params(model)
    g = torch.Generator().manual_seed(1)
    x_all, y_all = torch.randn(records, *shape, generator=g), torch.randint(0, 10, (records,), generator=g)
    backend = VectorizedBackend(model, layout)
    work = _Work(model, layout, x_all, y_all)
    settings = dpsgd.DPSGDSettings(clip=1.0, z=1.0, batch_size=batch, sampling="fixed")
    seeded = dpsgd.DPSGDClients(settings, RandomSource.seeded(0), [records])
    secure = dpsgd.DPSGDClients(settings, RandomSource.secure(0), [records])
    ids = np.array([0])
    state = {"step": 0}

    def batch_idx():
        state["step"] += 1
        return torch.from_numpy(seeded.sample(1, state["step"], 0))

    def plain():
        idx = batch_idx()
        backend.gradients(params, x_all.index_select(0, idx).unsqueeze(0), y_all.index_select(0, idx).unsqueeze(0))

    def private(oracle):
        def run():
            state["step"] += 1
            oracle(work, 1, state["step"], params, ids)
        return run

    vmap = dpsgd.DPSGDClients(settings, RandomSource.seeded(0), [records], method="vmap")
    methods = {"plain": plain, "dpsgd": private(seeded), "dpsgd_secure": private(secure), "dpsgd_vmap": private(vmap)}
    if GradSampleModule is not None:
        gsm = GradSampleModule(copy.deepcopy(model))
        opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.0), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=batch)

        def opacus():
            idx = batch_idx()
            F.cross_entropy(gsm(x_all.index_select(0, idx)), y_all.index_select(0, idx)).backward()
            opt.pre_step()
            opt.zero_grad(set_to_none=True)

        methods["opacus"] = opacus
    key = bytes(range(32))
    u = torch.rand(2 * layout.dim, dtype=torch.float64, generator=g) * 0.999 + 5e-4

    def float64_ops():
        u.log().sqrt_(), u.cos(), u.sin()

    noise = {"secure_noise": lambda: SecretStream(key).normal(layout.dim), "float64_ops": float64_ops}
    steps = list(methods)
    methods.update(noise)
    for fn in methods.values():  # warm up (vmap tracing, the hook path's one-time check, allocator)
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(repeats):  # interleaved
        for k, fn in methods.items():
            times[k].append(_median_ms(fn, 1, inner))
    ms = {k: statistics.median(v) for k, v in times.items() if k in steps}
    noise_ms = {k: statistics.median(times[k]) for k in noise}

    def ratio(a: str, b: str) -> float:  # median of the per-repeat ratios
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    res = {"model": name, "hidden": hidden, "input": list(shape), "dim": layout.dim, "batch": batch, "ms": ms,
           "noise_ms": noise_ms, "method": "hooks" if dpsgd.hook_layers(model, layout) is not None else "vmap"}
    for k in ("dpsgd", "dpsgd_secure", "dpsgd_vmap"):
        res[f"{k}_over_plain"] = ratio(k, "plain")
    if "opacus" in ms:
        for k in ("dpsgd", "dpsgd_secure", "dpsgd_vmap"):
            res[f"{k}_over_opacus"] = ratio(k, "opacus")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn_fmnist"], help="fedsafe model names")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 15; --quick 3)")
    ap.add_argument("--inner", type=int, default=None, help="steps per timing (default 5; --quick 1)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/dpsgd.json"))
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny MLP on 8x8 inputs, 3 repeats")
    args = ap.parse_args()
    torch.set_num_threads(1)
    repeats = args.repeats or (3 if args.quick else 15)
    inner = args.inner or (1 if args.quick else 5)
    load_before = os.getloadavg()
    rows = []
    if args.quick:
        rows.append(bench_model("mlp", 16, (1, 8, 8), 25, 200, repeats, inner))
    else:
        for name in args.models:
            rows.append(bench_model(name, 100, (1, 28, 28), 25, 1200, repeats, inner))
            print(f"  {name}: done", flush=True)
    report = {
        "benchmark": "dpsgd",
        "quick": args.quick,
        "rows": rows,
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
                        "opacus": None if GradSampleModule is None else __import__("opacus").__version__,
                        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "repeats": repeats,
                        "inner": inner},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    head = (f"\n{'model':<12}{'d':>9}{'B':>4}{'plain ms':>10}{'dpsgd ms':>10}{'secure ms':>11}{'vmap ms':>9}"
            f"{'opacus ms':>11}{'dp/plain':>10}{'sec/plain':>11}{'dp/opacus':>11}{'sec/opacus':>12}{'vmap/plain':>12}")
    print(head)
    for r in rows:
        ms = r["ms"]
        op = ms.get("opacus")

        def f(key: str, width: int) -> str:
            return f"{r[key]:>{width}.2f}" if key in r else f"{'-':>{width}}"

        print(f"{r['model']:<12}{r['dim']:>9}{r['batch']:>4}{ms['plain']:>10.2f}{ms['dpsgd']:>10.2f}"
              f"{ms['dpsgd_secure']:>11.2f}{ms['dpsgd_vmap']:>9.2f}{(f'{op:.2f}' if op else '-'):>11}"
              f"{f('dpsgd_over_plain', 10)}{f('dpsgd_secure_over_plain', 11)}{f('dpsgd_over_opacus', 11)}"
              f"{f('dpsgd_secure_over_opacus', 12)}{f('dpsgd_vmap_over_plain', 12)}")
    for r in rows:
        nm = r["noise_ms"]
        print(f"{r['model']}: secret noise alone {nm['secure_noise']:.2f} ms; the float64 log/sqrt/cos/sin it "
              f"needs, timed alone, {nm['float64_ops']:.2f} ms (plain step {r['ms']['plain']:.2f} ms)")
    print(f"load average before/after: {load_before} / {report['environment']['loadavg_after']} -> {args.out}")


if __name__ == "__main__":
    main()
