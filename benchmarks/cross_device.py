"""Cross-device scale: round time and peak memory against the population, at a fixed number of
clients sampled per round (issue #29 item 3).

Claim measured: with m clients sampled a round, the engine's round time and memory grow with m,
not with the population N = ``clients.num_clients``. For each workload and each N in
{m (the baseline: everyone could take part), 10^3, 10^4, 10^5}, a fresh subprocess builds a
synthetic population (N clients of ``--per-client`` samples with ``--features`` features, 10
classes: a Gaussian mixture, drawn vectorised), sets up the federation, runs one warm-up round
and ``--rounds`` timed rounds, and reports:

* ``round_s``: the median timed round (sampling, local work, attack, DP, aggregation, step);
* ``setup_s``: building the federation from the data (partition check, client work, plugins);
* ``peak_rss_mb``: the process's peak resident memory (``ru_maxrss``), and ``data_mb`` (the
  dataset's tensors and index arrays, which grow with N by nature: in a deployment they live on
  the devices), ``rounds_mb``: how far the peak of the timed rounds rose above the memory after
  the warm-up round (the kernel's peak mark, VmHWM, is reset after the warm-up), and
  ``state_kb``: the engine's state across rounds (model, server buffer, client momentum rows,
  plugin and attack state, client histories), counted structurally;
* ``x_round`` / ``x_rounds_mb``: those over the baseline's (population = m).

Workloads (``--workloads``): ``dp_fedavg`` — FedAvg, Poisson sampling q = m/N, central
client-level DP (z = 1, C = 1), ALIE from 1% Byzantine clients, the mean (plain protocol);
``dsgd_momentum`` — Robust-DSGD clients with momentum β = 0.9 (rows kept for the clients seen),
fixed-size samples of m, trimmed mean; ``secagg`` — FedAvg, Poisson q = m/N, distributed DP
(z = 1) under SecAgg+ (``protocol = "secagg"``, k-regular graph), ALIE, the mean. The baseline
N = m samples everyone every round (``clients.sampling = "all"``).

    OMP_NUM_THREADS=1 python benchmarks/cross_device.py [--sampled 100 --rounds 3]
        [--populations 1000 10000 100000] [--workloads dp_fedavg dsgd_momentum secagg]
        [--out benchmarks/results/cross_device.json] [--quick]

``--quick`` (m = 20, populations 20 and 2,000, one timed round, ``dp_fedavg`` only) checks that
the script runs; its numbers mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CLASSES = 10


def _rss_mb() -> float:
    """The current resident memory, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process, so that the timed rounds' own
    peak can be read; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status")


def _population(n_clients: int, per_client: int, features: int, seed: int):
    import numpy as np
    import torch

    from fedsafe.data import FederatedDataset

    g = torch.Generator().manual_seed(seed)
    n = n_clients * per_client
    centers = torch.randn(CLASSES, features, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = centers[y] + torch.randn(n, features, generator=g)
    yt = torch.randint(0, CLASSES, (2000,), generator=g)
    xt = centers[yt] + torch.randn(2000, features, generator=g)
    idx = np.arange(n, dtype=np.int64).reshape(n_clients, per_client)
    return FederatedDataset(name="population", x_train=x, y_train=y, x_test=xt, y_test=yt,
                            client_indices=list(idx), num_classes=CLASSES, input_shape=(features,))


def _config(workload: str, n_clients: int, sampled: int, rounds: int, hidden: int):
    from fedsafe.config import validate

    q = min(1.0, sampled / n_clients)
    f = max(1, n_clients // 100)
    raw: dict = {
        "name": f"{workload}-{n_clients}", "seed": 0, "rounds": rounds, "eval_every": 10**6,
        "execution": "vectorized",
        "model": {"name": "mlp", "hidden": hidden},
        "clients": {"num_clients": n_clients, "algorithm": "fedavg", "local_steps": 1, "batch_size": 10,
                    "lr": 0.1, "sampling": "poisson", "sample_rate": q},
        "server": {"lr": 1.0},
        "attack": {"name": "alie", "f": f},
        "robust": {"rule": "mean", "f": 0},
    }
    if workload == "dp_fedavg":
        raw["dp"] = {"enabled": True, "clip": 1.0, "noise_multiplier": 1.0, "placement": "central", "delta": 1e-5}
    elif workload == "secagg":
        raw["protocol"] = "secagg"
        raw["secagg"] = {"graph": "k_regular"}
        raw["dp"] = {"enabled": True, "clip": 1.0, "noise_multiplier": 1.0, "placement": "distributed", "delta": 1e-5}
    elif workload == "dsgd_momentum":
        raw["clients"].update(algorithm="dsgd", momentum=0.9, sampling="fixed", sample_size=min(sampled, n_clients))
        del raw["clients"]["sample_rate"], raw["clients"]["local_steps"]
        raw["robust"] = {"rule": "trimmed_mean", "f": max(1, sampled // 100)}
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    if q == 1.0 and raw["clients"]["sampling"] == "poisson":
        # the baseline, N = m: everyone every round (Poisson with q = 1 is the same sample, but
        # distributed DP's released-model accountant cannot compose it: dp-accounting's PLD
        # self-composition takes log1p(-1) of its all-infinite mass)
        raw["clients"]["sampling"] = "all"
        del raw["clients"]["sample_rate"]
    return validate(raw)


def _state_bytes(fed) -> int:
    """The engine's state across rounds, counted structurally (what grows round after round)."""
    from fedsafe.engine.state import state_nbytes

    st = fed.state
    roots = (st.params, st.server_buf, st.momentum, st.previous, st.attack_state, fed.pipeline.history)
    return state_nbytes(roots) + sum(state_nbytes(p.state_dict()) for p in fed.plugins)


def child(args: argparse.Namespace) -> None:
    """One measurement, in this (fresh) process; prints one JSON line."""
    import resource
    import statistics

    import torch

    torch.set_num_threads(1)
    from fedsafe.engine.federation import Federation

    rss_start = _rss_mb()
    data = _population(args.population, args.per_client, args.features, seed=1)
    data_mb = (sum(t.element_size() * t.numel() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
               + sum(ix.nbytes for ix in data.client_indices)) / 2**20
    # more rounds than run: the last round's evaluation and ε are not part of a timed round
    cfg = _config(args.workload, args.population, args.sampled, args.rounds + 10, args.hidden)
    t0 = time.perf_counter()
    fed = Federation(cfg, data=data)
    setup_s = time.perf_counter() - t0
    rss_setup = _rss_mb()
    fed.run_round()  # warm-up: first-call costs (lazy imports, the accountant's set-up)
    rss_warm = _rss_mb()
    reset = _reset_peak()
    times, sampled = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        row = fed.run_round()
        times.append(time.perf_counter() - t0)
        sampled.append(row["participants"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    rounds_peak = _hwm_mb() if reset else peak  # the peak of the timed rounds alone
    fed.close()
    print(json.dumps({
        "workload": args.workload, "population": args.population, "sampled_mean": statistics.mean(sampled),
        "round_s": statistics.median(times), "setup_s": setup_s, "peak_rss_mb": peak,
        "start_rss_mb": rss_start, "setup_rss_mb": rss_setup, "warm_rss_mb": rss_warm,
        "rounds_mb": max(0.0, rounds_peak - rss_warm), "rounds_peak_exact": reset,
        "data_mb": data_mb, "state_kb": _state_bytes(fed) / 1024, "params": fed.state.params.numel(),
    }))


def measure(script: Path, workload: str, population: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(script), "--child", "--workload", workload, "--population", str(population),
           "--sampled", str(args.sampled), "--rounds", str(args.rounds), "--per-client", str(args.per_client),
           "--features", str(args.features), "--hidden", str(args.hidden)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{workload} at N={population} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sampled", type=int, default=None, help="clients sampled a round, m (default 100; --quick 20)")
    ap.add_argument("--populations", type=int, nargs="+", default=None,
                    help="populations N besides the baseline N = m (default 1e3 1e4 1e5; --quick 2000)")
    ap.add_argument("--workloads", nargs="+", default=None, help="default dp_fedavg dsgd_momentum secagg; --quick dp_fedavg")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds after one warm-up (default 3; --quick 1)")
    ap.add_argument("--per-client", type=int, default=10, help="samples per client")
    ap.add_argument("--features", type=int, default=60)
    ap.add_argument("--hidden", type=int, default=100, help="mlp width")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cross_device.json"))
    ap.add_argument("--quick", action="store_true", help="smoke run: m = 20, N in {20, 2000}, dp_fedavg, one round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--population", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.sampled is None:
        args.sampled = 20 if args.quick else 100
    if args.populations is None:
        args.populations = [2000] if args.quick else [1_000, 10_000, 100_000]
    if args.workloads is None:
        args.workloads = ["dp_fedavg"] if args.quick else ["dp_fedavg", "dsgd_momentum", "secagg"]
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    os.environ["OMP_NUM_THREADS"] = "1"
    script = Path(__file__).resolve()
    results = []
    header = (f"{'workload':>14} {'N':>7} {'m':>6} {'round_s':>8} {'x_round':>7} {'setup_s':>7} {'peak_MB':>8} "
              f"{'data_MB':>8} {'rounds_MB':>9} {'x_rounds_MB':>11} {'state_kB':>8}")
    print(f"m = {args.sampled} sampled a round (Poisson: expected), {args.per_client} samples of {args.features} "
          f"features per client, mlp({args.hidden}); median of {args.rounds} rounds after a warm-up")
    print(header)
    for workload in args.workloads:
        base = None
        for population in [args.sampled, *sorted(set(args.populations) - {args.sampled})]:
            r = measure(script, workload, population, args)
            if base is None:
                base = r
            r["x_round"] = r["round_s"] / base["round_s"]
            r["x_rounds_mb"] = r["rounds_mb"] / base["rounds_mb"] if base["rounds_mb"] > 0 else None
            results.append(r)
            xr = "-" if r["x_rounds_mb"] is None else f"{r['x_rounds_mb']:.2f}"
            print(f"{workload:>14} {population:>7} {r['sampled_mean']:>6.0f} {r['round_s']:>8.3f} {r['x_round']:>7.2f} "
                  f"{r['setup_s']:>7.2f} {r['peak_rss_mb']:>8.0f} {r['data_mb']:>8.1f} {r['rounds_mb']:>9.1f} "
                  f"{xr:>11} {r['state_kb']:>8.0f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("sampled", "populations", "workloads", "rounds", "per_client", "features", "hidden")}
    args.out.write_text(json.dumps({"settings": meta, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
