"""What DP accounting costs inside a run, and against dp-accounting used the way a user would.

Claim measured: with evaluation (and so an ε) every round, accounting is a small share of a
long run. The run: digits, the default model, 100 clients, Poisson sampling q = 0.1,
``dp.noise_multiplier = 1``, ``eval_every = 1``, ``--rounds`` rounds (default 1,000), one torch
thread; ``central`` placement, and ``distributed`` (secure aggregation, the two observers'
figures). Accounting time is the CPU time spent in the round plugin's accounting calls
(``DPPlan.compose_round`` and the accountant's ``epsilons``/``epsilon``), measured by wrapping
them; the run's CPU time is the whole ``Federation.run``.

Baseline, in the same process: dp-accounting's own ``PLDAccountant`` at the interval the run
used, composing the same round event and asked ``get_epsilon`` after every round (what a user
of dp-accounting writes); its ε must equal the run's to 1e-9 relative (central).

    python benchmarks/accounting.py [--rounds 1000] [--placements central distributed]
        [--out benchmarks/results/accounting.json] [--quick]

``--quick`` (30 rounds) checks that the script runs; its shares mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds of each run (default 1000; --quick 30)")
    p.add_argument("--placements", nargs="+", default=["central", "distributed"], choices=["central", "distributed"])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/accounting.json"))
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.rounds is None:
        a.rounds = 30 if a.quick else 1000
    return a


class _Clock:
    """CPU seconds spent inside the wrapped methods (not nested twice)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0

    def wrap(self, owner: type, name: str) -> None:
        inner = getattr(owner, name)
        clock = self

        def timed(*args, **kwargs):
            if clock.depth:
                return inner(*args, **kwargs)
            clock.depth += 1
            t = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                clock.seconds += time.process_time() - t
                clock.depth -= 1

        setattr(owner, name, timed)


def _config(placement: str, rounds: int):
    from fedsafe.config import apply_overrides, validate

    raw = {
        "name": f"dp_{placement}", "seed": 0, "rounds": rounds, "eval_every": 1,
        "clients": {"num_clients": 100, "sampling": "poisson", "sample_rate": 0.1, "algorithm": "fedavg"},
        "dp": {"enabled": True, "clip": 1.0, "noise_multiplier": 1.0, "placement": placement},
    }
    if placement == "distributed":
        raw["protocol"] = "secagg"
    return validate(apply_overrides(raw, {}))


def _baseline(cfg, interval: float) -> tuple[float, float]:
    """dp-accounting's PLDAccountant on the run's round event, ε after every round: (CPU
    seconds, final ε)."""
    import dp_accounting as dpa
    from dp_accounting import pld

    rounds, delta = cfg.rounds, cfg.dp.delta
    acc = pld.PLDAccountant(value_discretization_interval=interval)
    event = dpa.PoissonSampledDpEvent(cfg.clients.sample_rate, dpa.GaussianDpEvent(cfg.dp.noise_multiplier))
    t = time.process_time()
    eps = 0.0
    for _ in range(rounds):
        acc.compose(event)
        eps = acc.get_epsilon(delta)
    return time.process_time() - t, float(eps)


def main() -> None:
    a = _parse()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from fedsafe.engine.federation import Federation
    from fedsafe.privacy.dp import accounting
    from fedsafe.privacy.dp.config import DPPlan

    clock = _Clock()
    clock.wrap(DPPlan, "compose_round")
    for cls in (accounting.Accountant, accounting.DistributedAccountant):
        for name in ("epsilon", "epsilons"):
            if hasattr(cls, name):
                clock.wrap(cls, name)

    results = []
    for placement in a.placements:
        fed = Federation(_config(placement, a.rounds))
        clock.seconds = 0.0
        t, w = time.process_time(), time.perf_counter()
        fed.run()
        cpu, wall = time.process_time() - t, time.perf_counter() - w
        last = fed.rows[-1]
        row = {
            "placement": placement, "rounds": a.rounds, "run_cpu_seconds": cpu, "run_wall_seconds": wall,
            "accounting_cpu_seconds": clock.seconds, "accounting_share": clock.seconds / cpu,
            "epsilon": last["epsilon"], "epsilon_released": last.get("epsilon_released"),
        }
        acc = next(p.accountant for p in fed.plugins if hasattr(p, "accountant"))
        interval = getattr(acc, "value_discretization_interval", None) if placement == "central" else None
        if interval:
            base_cpu, base_eps = _baseline(fed.cfg, interval)
            row.update(baseline_cpu_seconds=base_cpu, baseline_epsilon=base_eps,
                       x_baseline=base_cpu / max(clock.seconds, 1e-9), interval=interval)
            if abs(base_eps - row["epsilon"]) > 1e-9 * max(1.0, base_eps):
                raise SystemExit(f"central ε {row['epsilon']} differs from dp-accounting's {base_eps}")
        fed.close()
        results.append(row)

    print(f"{'placement':<12} {'rounds':>6} {'run CPU s':>10} {'accounting s':>13} {'share':>7} {'ε':>9} "
          f"{'dp-accounting s':>16} {'speed-up':>9}")
    for r in results:
        base = r.get("baseline_cpu_seconds")
        base_s = "" if base is None else f"{base:.2f}"
        speed = "" if base is None else f"{r['x_baseline']:.1f}x"
        print(f"{r['placement']:<12} {r['rounds']:>6} {r['run_cpu_seconds']:>10.2f} {r['accounting_cpu_seconds']:>13.2f} "
              f"{100 * r['accounting_share']:>6.1f}% {r['epsilon']:>9.4g} {base_s:>16} {speed:>9}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load": os.getloadavg()[0]},
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
