"""Serial vs Ray execution on one machine: speed-up on a heavy client workload, and Ray's
fixed overhead per round on a trivial one. Same process, same seed, same metrics.

Heavy: 8 clients of SABLE's Fashion-MNIST CNN (431,080 parameters) on digits resized to 28×28,
FedAvg with 5 local steps of batch 32. Light: 8 logistic-regression clients, one step each.

    python benchmarks/ray_scaling.py [--rounds 4 --cpus 2] [--quick] [--out benchmarks/results/ray_scaling.json]

``--quick`` (a one-CPU local Ray instance, 2 clients, 1 local step, 1 timed round, the heavy
workload's CNN replaced by the MLP on 8×8 digits) checks that the script runs; its ratios mean
nothing. Needs ``ray`` (``pip install 'fedsafe[ray]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def time_rounds(cfg, rounds: int) -> float:
    from fedsafe.engine.federation import Federation

    fed = Federation(cfg)
    fed.run_round()  # warm-up: worker start, data load, first-call costs
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fed.run_round()
        times.append(time.perf_counter() - t0)
    fed.close()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 4; --quick 1)")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs of the local Ray instance (default 2; --quick 1)")
    ap.add_argument("--clients", type=int, default=None, help="clients (default 8; --quick 2)")
    ap.add_argument("--local-steps", type=int, default=None, help="heavy workload's local steps (default 5; --quick 1)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/ray_scaling.json"))
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 CPU, 2 clients, 1 local step, 1 timed round")
    args = ap.parse_args()
    for name, full, quick in (("rounds", 4, 1), ("cpus", 2, 1), ("clients", 8, 2), ("local_steps", 5, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import ray
    except ImportError:
        raise SystemExit("ray_scaling.py needs ray, which is not installed: pip install 'fedsafe[ray]'") from None
    import torch

    from fedsafe.config import validate

    torch.set_num_threads(1)  # one thread per client computation, in the driver and in workers
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)

    heavy_model = "mlp" if args.quick else "cnn_fmnist"

    def cfg(execution: str, heavy: bool):
        raw = {
            "rounds": args.rounds + 2, "eval_every": 10**6, "execution": execution,
            "data": {"name": "digits", "resize": 28 if heavy and not args.quick else None},
            "model": {"name": heavy_model if heavy else "logreg"},
            "clients": {"num_clients": args.clients, "algorithm": "fedavg", "local_steps": args.local_steps if heavy else 1,
                        "batch_size": 32, "lr": 0.05},
            "ray": {"num_cpus": 1, "clients_per_task": 1},
        }
        if raw["data"]["resize"] is None:
            raw["data"].pop("resize")
        return validate(raw)

    out = {}
    for name, heavy in (("heavy", True), ("light", False)):
        serial = time_rounds(cfg("serial", heavy), args.rounds)
        on_ray = time_rounds(cfg("ray", heavy), args.rounds)
        out[name] = {"serial_s": serial, "ray_s": on_ray, "speedup": serial / on_ray}
    ray.shutdown()
    out["overhead_per_round_s"] = out["light"]["ray_s"] - out["light"]["serial_s"]
    out.update(benchmark="ray_scaling", heavy_model=heavy_model, cpus=args.cpus, clients=args.clients, local_steps=args.local_steps,
               timed_rounds=args.rounds, quick=args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{'workload':<10}{'serial s/round':>16}{'ray s/round':>14}{'speed-up':>10}")
    for name in ("heavy", "light"):
        r = out[name]
        print(f"{name:<10}{r['serial_s']:>16.3f}{r['ray_s']:>14.3f}{r['speedup']:>10.2f}")
    print(f"Ray overhead per round (light workload): {out['overhead_per_round_s'] * 1000:.0f} ms  -> {args.out}")


if __name__ == "__main__":
    main()
