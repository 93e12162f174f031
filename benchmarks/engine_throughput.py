"""Rounds per second of the federation loop: serial vs vectorized backend, same process.

100 clients of the `mlp` model (MNIST-sized hidden layer) on digits, `dsgd` (one minibatch
gradient per client per round, momentum sent), plain mean. The first rounds are warm-up
(vmap tracing, allocator) and are not timed.

    python benchmarks/engine_throughput.py [--clients 100 --rounds 30 --threads 2] [--quick]
        [--out benchmarks/results/engine_throughput.json]

``--quick`` (10 clients, 3 timed rounds after 1 warm-up, 1 thread) checks that the script runs;
its ratio means nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=None, help="clients (default 100; --quick 10)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds timed + 1 (default 30; --quick 4)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first rounds (default 3; --quick 1)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads (default 2; --quick 1)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_throughput.json"))
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 clients, 3 timed rounds, 1 thread")
    args = ap.parse_args()
    for name, full, quick in (("clients", 100, 10), ("rounds", 30, 4), ("warmup", 3, 1), ("threads", 2, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch

    torch.set_num_threads(args.threads)
    from fedsafe.config import validate
    from fedsafe.engine.federation import Federation

    results = {}
    for backend in ("serial", "vectorized"):
        cfg = validate(
            {
                "rounds": args.warmup + args.rounds,
                "eval_every": 10**6,
                "execution": backend,
                "data": {"name": "digits"},
                "model": {"name": "mlp", "hidden": args.hidden},
                "clients": {"num_clients": args.clients, "algorithm": "dsgd", "batch_size": args.batch},
            }
        )
        fed = Federation(cfg)
        for _ in range(args.warmup):
            fed.run_round()
        times = []
        for _ in range(args.rounds - 1):  # the last round also evaluates: not timed
            t0 = time.perf_counter()
            fed.run_round()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        results[backend] = {"median_round_seconds": med, "rounds_per_second": 1 / med}

    ratio = results["serial"]["median_round_seconds"] / results["vectorized"]["median_round_seconds"]
    report = {
        "benchmark": "engine_throughput",
        "clients": args.clients,
        "model": f"mlp(64-{args.hidden}-10)",
        "batch_size": args.batch,
        "threads": args.threads,
        "quick": args.quick,
        "timed_rounds": args.rounds - 1,
        "backends": results,
        "vectorized_speedup": ratio,
        "target_speedup": 5.0,
        "pass": ratio >= 5.0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'backend':<12}{'ms/round':>12}{'rounds/s':>12}")
    for name, r in results.items():
        print(f"{name:<12}{1000 * r['median_round_seconds']:>12.2f}{r['rounds_per_second']:>12.1f}")
    print(f"vectorized speedup: {ratio:.1f}x (target >= 5x)  -> {args.out}")


if __name__ == "__main__":
    main()
