"""The TEE offload's cost: Multi-Krum distances inside the enclave on one thread (baseline) vs
encoded offload to two accelerators (Hashemi et al., Fig. 2b and Fig. 3).

Claim measured: offloading the O(N² d) pairwise distances to accelerators on encoded updates
makes the enclave's robust aggregation faster than computing them inside it, and the remaining
enclave work (decrypt, encode, encrypt: O(N d)) dominates. For every (N, d) of the grid it runs
real protocol rounds (clients verify the quote and encrypt; enclave and accelerators in their
own processes, pipes carrying ciphertexts) and times each phase, then the baseline's
distance/selection/aggregation on one thread in float64 (``pairwise_sq_distances``, the
library's Gram-based kernel: a strong baseline).

    python benchmarks/tee_offload.py [--quick] [--n 8 16 32 64] [--d 100000 1000000]
        [--arithmetic exact float64] [--repeats 2] [--in-process] [--out-dir benchmarks/results]

Outputs ``tee_offload.json`` (every phase of every round, medians, speedups) and two figures
(Matplotlib Figure API): ``tee_offload_breakdown.png`` (stacked per-phase time per round,
baseline vs offload: the paper's Fig. 3) and ``tee_offload_speedup.png`` (speedup vs N: Fig.
2b; distances alone, and the enclave's whole robust aggregation).

Notes on what is measured. *Client work* is a stand-in (10 SGD steps, batch 32, of an MLP with
≈ d parameters) timed once per d; clients run in parallel, so client work and encryption are
per client (encryption: the round's total / N). Noise generation is the offline phase (blocks
drawn one round ahead, sealed on disk) and reported apart. Accelerators run on CUDA when
present, else on one CPU thread each: on a CPU-only machine the "accelerators" are just
other cores, so the speedup shows the protocol's overheads rather than the paper's GPU gains.
The test suite runs ``--quick`` (a smoke run: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import os


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=None, help="clients per round (default 8 16 32 64; --quick 8 12)")
    p.add_argument("--d", type=int, nargs="+", default=None, help="dimensions (default 1e5 1e6; --quick 1e4)")
    p.add_argument("--arithmetic", nargs="+", default=None, choices=["exact", "float64"],
                   help="offload variants (default exact float64; --quick exact)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per entry (default 2; --quick 1)")
    p.add_argument("--noise-ratio", type=float, default=1e6, help="σ²/Var")
    p.add_argument("--local-steps", type=int, default=10, help="SGD steps of the client-work stand-in")
    p.add_argument("--in-process", action="store_true", help="parties in-process instead of separate processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="benchmarks/results")
    p.add_argument("--quick", action="store_true", help="smoke run: N 8 12, d 1e4, exact only, 1 repeat")
    a = p.parse_args()
    a.n = a.n or ([8, 12] if a.quick else [8, 16, 32, 64])
    a.d = a.d or ([10_000] if a.quick else [100_000, 1_000_000])
    a.arithmetic = a.arithmetic or (["exact"] if a.quick else ["exact", "float64"])
    a.repeats = a.repeats or (1 if a.quick else 2)
    return a


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    # the host (clients) and the baseline enclave computation run on one thread
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"

import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from fedsafe.core.types import Message, RoundContext  # noqa: E402
from fedsafe.protocols.tee import TEEConfig, TEEProtocol  # noqa: E402
from fedsafe.robust.distances import pairwise_sq_distances  # noqa: E402
from fedsafe.robust.krum import multi_krum_select  # noqa: E402
from fedsafe.robust.pipeline import RobustPipeline  # noqa: E402
from fedsafe.robust.rows import average_rows  # noqa: E402

OFFLOAD_PHASES = [  # (label, cost key); client work is measured apart, encryption is per client
    ("client work", None), ("client encrypt", "client_encrypt_seconds"), ("enclave decrypt", "enclave_decrypt_seconds"),
    ("noise (online)", "noise_seconds"), ("enclave encode + encrypt", "enclave_encode_seconds"),
    ("transfer", "transfer_seconds"), ("accelerator crypto", "accelerator_crypto_seconds"),
    ("accelerator distances", "accelerator_seconds"), ("decode + select", "decode_select_seconds"),
    ("aggregate", "enclave_aggregate_seconds"),
]
BASELINE_PHASES = ["client work", "client encrypt", "enclave decrypt", "enclave distances", "enclave select", "aggregate"]
COLORS = {
    "client work": "#bbbbbb", "client encrypt": "#8c564b", "enclave decrypt": "#e377c2", "noise (online)": "#17becf",
    "enclave encode + encrypt": "#ff7f0e", "transfer": "#7f7f7f", "accelerator crypto": "#bcbd22",
    "accelerator distances": "#2ca02c", "decode + select": "#9467bd", "aggregate": "#1f77b4",
    "enclave distances": "#d62728", "enclave select": "#9467bd",
}


def updates(n: int, d: int, seed: int) -> torch.Tensor:
    """Honest updates of norm ≈ 1 around a shared direction, and n // 4 outliers."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=gen) / d**0.5
    g = base + 0.3 * torch.randn(n, d, generator=gen) / d**0.5
    g[n - n // 4 :] *= 3.0
    return g


def client_work_seconds(d: int, steps: int) -> float:
    """Stand-in for a client's local work: ``steps`` SGD steps (batch 32) of a 64-h-10 MLP
    with ≈ d parameters."""
    h = max(1, round((d - 10) / 75))
    model = torch.nn.Sequential(torch.nn.Linear(64, h), torch.nn.ReLU(), torch.nn.Linear(h, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    best = float("inf")
    for _ in range(2):
        t = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        best = min(best, time.perf_counter() - t)
    return best


def baseline(g: torch.Tensor, f: int, repeats: int) -> dict[str, float]:
    """The enclave alone, one thread: float64 distances, Multi-Krum selection, mean (median
    of ``repeats`` after a warm-up)."""
    torch.set_num_threads(1)
    out: dict[str, list[float]] = {"enclave distances": [], "enclave select": [], "aggregate": []}
    pairwise_sq_distances(g, dtype=torch.float64)
    for _ in range(repeats):
        t0 = time.perf_counter()
        dist = pairwise_sq_distances(g, dtype=torch.float64)
        t1 = time.perf_counter()
        idx = multi_krum_select(dist, f)
        t2 = time.perf_counter()
        average_rows(g, idx)
        t3 = time.perf_counter()
        for k, v in zip(out, (t1 - t0, t2 - t1, t3 - t2)):
            out[k].append(v)
    return {k: statistics.median(v) for k, v in out.items()}


def median_cost(aggs: list, key: str) -> float:
    return statistics.median(float(a.cost[key]) for a in aggs)


def run(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="tee_bench_")
    protos = {
        a: TEEProtocol(TEEConfig(clip=10.0, noise_ratio=args.noise_ratio, arithmetic=a, processes=not args.in_process,
                                 precompute_rounds=1, sealed_dir=os.path.join(tmp, a), timeout_s=1800), audit=False)
        for a in args.arithmetic
    }
    rounds = {a: 0 for a in args.arithmetic}
    entries = []
    work = {d: client_work_seconds(d, args.local_steps) for d in args.d}
    try:
        for d in args.d:
            for n in args.n:
                f = n // 4
                g = updates(n, d, args.seed + n)
                msgs = [Message(i, g[i]) for i in range(n)]
                pipe = RobustPipeline("multi_krum", {}, [], f, 0)
                base = baseline(g, f, max(5, args.repeats))  # cheap: more repeats
                entry = {"n": n, "d": d, "f": f, "client_work_seconds": work[d], "baseline": base, "offload": {}}
                for a, proto in protos.items():
                    aggs = []
                    for rep in range(args.repeats + 1):  # first round: warm-up (not recorded)
                        rounds[a] += 1
                        agg = proto.aggregate(msgs, pipe, RoundContext(rounds[a], 0, tuple(range(n)), f))
                        if rep:
                            aggs.append(agg)
                        del agg
                    assert torch.equal(aggs[-1].vector, average_rows(g, multi_krum_select(
                        pairwise_sq_distances(g, dtype=torch.float64), f))), "offload differs from plaintext"
                    phases = {label: (work[d] if key is None else median_cost(aggs, key) / (n if key == "client_encrypt_seconds" else 1))
                              for label, key in OFFLOAD_PHASES}
                    entry["offload"][a] = {
                        "phases": phases,
                        "cost": {k: median_cost(aggs, k) for k in aggs[-1].cost},
                        "metrics": dict(aggs[-1].metrics),
                        "devices": aggs[-1].seen["accelerator_1"]["device"],
                    }
                    # the baseline shares the clients' and the decryption's work with the offload
                    if a == args.arithmetic[0]:
                        base["client work"] = work[d]
                        base["client encrypt"] = phases["client encrypt"]
                        base["enclave decrypt"] = phases["enclave decrypt"]
                    server_off = median_cost(aggs, "aggregate_seconds") - median_cost(aggs, "client_encrypt_seconds")
                    server_base = base["enclave decrypt"] + base["enclave distances"] + base["enclave select"] + base["aggregate"]
                    entry["offload"][a]["speedup_distances"] = base["enclave distances"] / phases["accelerator distances"]
                    entry["offload"][a]["speedup_robust_aggregation"] = server_base / server_off
                    entry["offload"][a]["server_seconds"] = server_off
                entry["baseline_server_seconds"] = (base["enclave decrypt"] + base["enclave distances"]
                                                    + base["enclave select"] + base["aggregate"])
                entries.append(entry)
                print(summary_line(entry), flush=True)
    finally:
        for proto in protos.values():
            proto.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "benchmark": "tee_offload",
        "grid": {"n": args.n, "d": args.d, "arithmetic": args.arithmetic, "repeats": args.repeats},
        "noise_ratio": args.noise_ratio,
        "processes": not args.in_process,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "cuda": torch.cuda.is_available()},
        "entries": entries,
    }


def summary_line(e: dict) -> str:
    parts = [f"N={e['n']:>3} d={e['d']:>8}  baseline distances {e['baseline']['enclave distances']:.3f}s"
             f" server {e['baseline_server_seconds']:.3f}s"]
    for a, o in e["offload"].items():
        parts.append(f"{a}: accel {o['phases']['accelerator distances']:.3f}s server {o['server_seconds']:.3f}s "
                     f"(x{o['speedup_distances']:.2f} / x{o['speedup_robust_aggregation']:.2f})")
    return " | ".join(parts)


def figures(result: dict, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    entries, ds = result["entries"], result["grid"]["d"]
    arith = result["grid"]["arithmetic"]
    paths = []

    fig = Figure(figsize=(5.5 * len(ds), 4.8), layout="constrained")
    axes = fig.subplots(1, len(ds), squeeze=False)[0]
    for ax, d in zip(axes, ds):
        rows = [e for e in entries if e["d"] == d]
        labels, x, width = [], 0.0, 0.8
        seen_labels = set()
        for e in rows:
            bars = [("baseline", [(p, e["baseline"][p]) for p in BASELINE_PHASES])]
            bars += [(a, list(e["offload"][a]["phases"].items())) for a in arith]
            for name, phases in bars:
                bottom = 0.0
                for p, v in phases:
                    ax.bar(x, v, width, bottom=bottom, color=COLORS[p], label=None if p in seen_labels else p)
                    seen_labels.add(p)
                    bottom += v
                labels.append((x, f"{name}\nN={e['n']}"))
                x += 1.0
            x += 0.6
        ax.set_xticks([p for p, _ in labels], [t for _, t in labels], fontsize=6, rotation=90)
        ax.set_ylabel("seconds per round")
        ax.set_title(f"d = {d:.0e}: time per phase (Fig. 3)")
    axes[-1].legend(fontsize=7, loc="upper left")
    path = out_dir / "tee_offload_breakdown.png"
    fig.savefig(path, dpi=130)
    paths.append(path)

    fig = Figure(figsize=(10, 4), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    for d in ds:
        rows = [e for e in entries if e["d"] == d]
        ns = [e["n"] for e in rows]
        for a in arith:
            a1.plot(ns, [e["offload"][a]["speedup_distances"] for e in rows], marker="o", label=f"d={d:.0e} {a}")
            a2.plot(ns, [e["offload"][a]["speedup_robust_aggregation"] for e in rows], marker="o", label=f"d={d:.0e} {a}")
    for ax, title in ((a1, "pairwise distances: enclave / accelerator (Fig. 2b)"),
                      (a2, "enclave robust aggregation: baseline / offload")):
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("clients per round N")
        ax.set_ylabel("speedup")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    path = out_dir / "tee_offload_speedup.png"
    fig.savefig(path, dpi=130)
    paths.append(path)
    return paths


def main(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    result = run(args)
    result["wall_seconds"] = time.perf_counter() - t
    result["figures"] = [str(p) for p in figures(result, out_dir)]
    path = out_dir / "tee_offload.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path} and {', '.join(result['figures'])} in {result['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(ARGS))
