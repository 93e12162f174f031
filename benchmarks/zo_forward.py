"""Perturbed forward passes per second: batched (vmap over perturbations) vs a Python loop.

A BAFFLE client evaluates its batch under K perturbed models. The reference implementation
does it one perturbation at a time (perturb, forward, loss); ``fedsafe.zo.loss_differences``
evaluates ``chunk`` perturbed models per ``torch.func.vmap`` call. Both include what a client
really does per perturbation: regenerate δ_k from the shared seed and run the forward.

Main case (the issue's): BAFFLE's LeNet (Hardswish, GroupNorm) on MNIST-shaped inputs
(1x28x28), batch 32, K = 100 and 500, forward (twice-FD) scheme. Extra rows show the
overhead-bound regime (the same LeNet on 8x8 digits, the MLP) and n clients at once
(``loss_differences_many``). Also records bytes up per client per round: 4K for ZO FedSGD vs
4d for backprop FedSGD.

Methods run interleaved within each repeat so that load from other processes hits them
alike; the median over repeats is reported, with the machine's load average, because this
is a shared 2-core box. CPU seconds (process time) are recorded next to wall seconds.

    python benchmarks/zo_forward.py [--k 100 500] [--threads 1 2] [--chunks 2 4 8 16 32] [--quick]
        [--out benchmarks/results/zo_forward.json]

``--quick`` (K = 8, one thread, chunks 2 and 4, one repeat, 2 clients) checks that the script
runs; its speed-ups mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path


def _time(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _race(methods: dict, repeats: int, forwards: int) -> dict[str, dict[str, float]]:
    """Median wall/CPU seconds of each method (interleaved), as forwards per second."""
    for fn in methods.values():  # warm-up: vmap tracing, oneDNN primitive caches
        fn()
    walls: dict[str, list[float]] = {n: [] for n in methods}
    cpus: dict[str, list[float]] = {n: [] for n in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            w, c = _time(fn)
            walls[name].append(w)
            cpus[name].append(c)
    out = {}
    for name in methods:
        w, c = statistics.median(walls[name]), statistics.median(cpus[name])
        out[name] = {
            "median_wall_seconds": w,
            "median_cpu_seconds": c,
            "forwards_per_second": forwards / w,
            "forwards_per_cpu_second": forwards / c,
        }
    return out


def _summarise(res: dict[str, dict[str, float]]) -> dict[str, object]:
    loop = res["loop"]["forwards_per_second"]
    batched = {n: r for n, r in res.items() if n.startswith("batched")}
    best = max(batched, key=lambda n: batched[n]["forwards_per_second"])
    loop_cpu = res["loop"]["forwards_per_cpu_second"]
    return {
        "loop_forwards_per_second": loop,
        "best_batched": best,
        "best_batched_forwards_per_second": batched[best]["forwards_per_second"],
        "speedup": batched[best]["forwards_per_second"] / loop,
        "speedup_cpu_time": batched[best]["forwards_per_cpu_second"] / loop_cpu,
        "methods": res,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=None, help="perturbations (default 100 500; --quick 8)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="(default 1 2; --quick 1)")
    ap.add_argument("--chunks", type=int, nargs="+", default=None, help="(default 2 4 8 16 32; --quick 2 4)")
    ap.add_argument("--repeats", type=int, default=None, help="(default 3; --quick 1)")
    ap.add_argument("--clients", type=int, default=None, help="n for the many-clients row (0: skip; default 10, --quick 2)")
    ap.add_argument("--no-extra", action="store_true", help="skip the small-model rows")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/zo_forward.json"))
    ap.add_argument("--quick", action="store_true", help="smoke run: K 8, 1 thread, chunks 2 4, 1 repeat, 2 clients")
    args = ap.parse_args()
    for name, full, quick in (("k", [100, 500], [8]), ("threads", [1, 2], [1]), ("chunks", [2, 4, 8, 16, 32], [2, 4]),
                              ("repeats", 3, 1), ("clients", 10, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(args.threads)))

    import torch

    from fedsafe.engine.backends import make_loss
    from fedsafe.models import ModelConfig, ParamLayout, build_model, flatten_params
    from fedsafe.zo import (
        PerturbationSource,
        loss_differences,
        loss_differences_many,
        loss_differences_reference,
        upload_bytes,
    )

    def setup(cfg: ModelConfig, shape: tuple[int, ...], n: int | None = None):
        model = build_model(cfg, shape, 10)
        layout = ParamLayout.from_model(model)
        p = flatten_params(model)
        g = torch.Generator().manual_seed(0)
        lead = (args.batch,) if n is None else (n, args.batch)
        x = torch.randn(*lead, *shape, generator=g)
        y = torch.randint(0, 10, lead, generator=g)
        return make_loss(model, layout), p, x, y, PerturbationSource(0, p.numel(), 1e-4)

    lenet = ModelConfig(name="lenet", activation="hardswish", norm="group")
    mnist = (1, 28, 28)
    cases = []
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    for threads in args.threads:
        torch.set_num_threads(threads)
        loss, p, x, y, src = setup(lenet, mnist)
        for k in args.k:
            methods = {"loop": lambda k=k: loss_differences_reference(loss, p, x, y, src, 0, k)}
            for c in args.chunks:
                methods[f"batched_chunk{c}"] = lambda k=k, c=c: loss_differences(loss, p, x, y, src, 0, k, chunk=c)
            res = _summarise(_race(methods, args.repeats, k))
            cases.append({"model": "lenet-hardswish-group", "input": list(mnist), "k": k, "threads": threads,
                          "clients": 1, "headline": True, **res})
            print(f"  lenet 28x28 K={k} threads={threads}: {res['speedup']:.2f}x ({res['best_batched']})", flush=True)
        if args.clients:
            n, k = args.clients, min(args.k)
            loss_n, p_n, xs, ys, src_n = setup(lenet, mnist, n)

            def loop_many(k=k):
                for i in range(n):
                    loss_differences_reference(loss_n, p_n, xs[i], ys[i], src_n, 0, k)

            methods = {"loop": loop_many}
            for c in (1, 2, 4):
                methods[f"batched_chunk{c}"] = lambda c=c, k=k: loss_differences_many(
                    loss_n, p_n, xs, ys, src_n, 0, k, chunk=c
                )
            res = _summarise(_race(methods, max(1, args.repeats - 1), n * k))
            cases.append({"model": "lenet-hardswish-group", "input": list(mnist), "k": k, "threads": threads,
                          "clients": n, "headline": False, **res})
            print(f"  lenet 28x28 {n} clients K={k} threads={threads}: {res['speedup']:.2f}x", flush=True)
        if not args.no_extra:
            for name, cfg, shape in [("lenet-hardswish-group", lenet, (1, 8, 8)), ("mlp", ModelConfig(name="mlp"), (1, 8, 8))]:
                loss_s, p_s, x_s, y_s, src_s = setup(cfg, shape)
                k = min(args.k)
                methods = {"loop": lambda: loss_differences_reference(loss_s, p_s, x_s, y_s, src_s, 0, k)}
                for c in [c for c in (4, 16, 64) if c <= k] or [k]:
                    methods[f"batched_chunk{c}"] = lambda c=c: loss_differences(loss_s, p_s, x_s, y_s, src_s, 0, k, chunk=c)
                res = _summarise(_race(methods, args.repeats, k))
                cases.append({"model": name, "input": list(shape), "k": k, "threads": threads, "clients": 1,
                              "headline": False, **res})
                print(f"  {name} {shape} K={k} threads={threads}: {res['speedup']:.2f}x", flush=True)

    d_lenet = flatten_params(build_model(lenet, mnist, 10)).numel()
    comm = {
        "d": d_lenet,
        "backprop_fedsgd_bytes_up": 4 * d_lenet,
        "zo": [
            {"k": k, "scheme": s, "bytes_up": upload_bytes(k, s), "vs_backprop": upload_bytes(k, s) / (4 * d_lenet)}
            for k in args.k for s in ("forward", "central")
        ],
        "fedavg_bytes_up": 4 * d_lenet,
    }
    headline = [c for c in cases if c["headline"]]
    report = {
        "benchmark": "zo_forward",
        "model": "lenet(hardswish, groupnorm) on 1x28x28, 10 classes",
        "batch_size": args.batch,
        "scheme": "forward (twice-FD)",
        "sigma": 1e-4,
        "repeats": args.repeats,
        "quick": args.quick,
        "target_speedup": 3.0,
        "pass": all(c["speedup"] >= 3.0 for c in headline),
        "cases": cases,
        "upload": comm,
        "environment": {
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "seconds": time.perf_counter() - t_start,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"\n{'model':<24}{'input':<10}{'K':>5}{'n':>4}{'thr':>4}{'loop fwd/s':>12}{'batched fwd/s':>15}"
          f"{'best':>18}{'speedup':>9}{'(cpu)':>7}")
    for c in cases:
        shape = "x".join(map(str, c["input"][1:]))
        print(f"{c['model']:<24}{shape:<10}{c['k']:>5}{c['clients']:>4}{c['threads']:>4}"
              f"{c['loop_forwards_per_second']:>12.1f}{c['best_batched_forwards_per_second']:>15.1f}"
              f"{c['best_batched']:>18}{c['speedup']:>8.2f}x{c['speedup_cpu_time']:>6.2f}x")
    print(f"\nupload per client per round (d = {d_lenet}): backprop FedSGD {4 * d_lenet} B")
    for z in comm["zo"]:
        print(f"  ZO K={z['k']:<4} {z['scheme']:<8} {z['bytes_up']:>6} B  ({z['vs_backprop']:.2%} of backprop)")
    print(f"load average before/after: {load_before} / {report['environment']['loadavg_after']}")
    print(f"target >= 3x on the headline rows: {'met' if report['pass'] else 'NOT met'} -> {args.out}")


if __name__ == "__main__":
    main()
