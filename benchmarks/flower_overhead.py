"""What running a fedsafe experiment over Flower costs, against fedsafe's own engine in process.

Claim measured: over Flower, a round of the same experiment costs a bounded multiple of the
engine's round, and the cost splits into fedsafe's own Flower-side work (message building,
record conversion, the node-side client code, the secure-aggregation party rebuilt at every
stage) and Flower's runtime (Ray actors as SuperNodes, messages relayed through its LinkState
as in a deployment). For each n (``clients.num_clients``) and protocol (``plain``; ``secagg``
with default settings), one validated ``ExperimentConfig`` (digits, the default model and
client algorithm, ``execution = "serial"``, evaluation every round) runs three ways in this
process:

* ``engine``: fedsafe's engine, ``run_experiment`` into a temporary directory (``quiet=True``);
* ``flower_inprocess``: ``run_over_flower`` with a Grid defined here that calls fedsafe's
  ``ClientApp`` directly for every message (no processes, no polling): the ServerApp's own
  work plus the ClientApp's, without Flower's runtime;
* ``flower_simulation``: ``flwr.simulation.run_simulation(server_app(...), client_app(...))``
  with ``num_supernodes = n`` and Ray as the backend (2 CPUs, 1 per ClientApp actor), as
  ``tests/flower/test_simulation.py`` runs it.

Every variant writes the engine's run directory; seconds per round are the metrics rows'
``seconds`` (the server's wall time for the round, evaluation included), median over the rounds
after the first (the first loads the data on the nodes and warms up). The two in-process
variants run ``--repeats`` times each, alternating, their timed rounds pooled (a round here
takes milliseconds); each simulation runs once, after all the in-process runs, so that no Ray
process winding down slows those. Also reported: the median ``client_work_seconds`` (the
round's local work as the server sees it; over Flower, the train messages' round trip), and
for the in-process grid the seconds spent inside the ClientApp and the exchanges
(``send_and_receive`` calls) and messages per round; for the simulation, the wall time of
``run_simulation`` (Ray start-up and shutdown and node discovery included) and that less the
rounds (``setup_s``). Ratios (``x_engine``) are against ``engine`` for the same n and protocol.

    python benchmarks/flower_overhead.py [--n 4 8] [--rounds 4] [--repeats 3] [--protocols plain secagg]
        [--threads 1] [--out benchmarks/results/flower_overhead.json] [--quick] [--simulation]
        [--no-simulation]

``--threads`` defaults to 1: Flower's simulation runs each ClientApp in a Ray actor with one
torch thread, and on a shared 2-core machine two OpenMP threads per op stall for tens of
milliseconds whenever the other core is busy, which swamps millisecond rounds. ``--quick``
(n = 4, 2 rounds, one run, no simulation unless ``--simulation``: Ray's start-up alone takes
several seconds) checks that the script runs; its ratios mean little.
"""

from __future__ import annotations

import argparse
import os


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=None, help="clients = SuperNodes (default 4 8; --quick 4)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per run (default 4; --quick 2)")
    p.add_argument("--protocols", nargs="+", default=["plain", "secagg"], choices=["plain", "secagg"])
    p.add_argument("--repeats", type=int, default=None,
                   help="runs of engine and flower_inprocess, alternating, rounds pooled (default 3; --quick 1); "
                        "flower_simulation runs once")
    p.add_argument("--threads", type=int, default=1,
                   help="torch / OpenMP threads (default 1, as Ray gives each ClientApp actor)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/flower_overhead.json")
    p.add_argument("--quick", action="store_true", help="smoke run: n = 4, 2 rounds, no Ray simulation")
    sim = p.add_mutually_exclusive_group()
    sim.add_argument("--simulation", dest="simulation", action="store_true", default=None,
                     help="run flower_simulation (Ray) even with --quick")
    sim.add_argument("--no-simulation", dest="simulation", action="store_false",
                     help="skip flower_simulation (Ray)")
    a = p.parse_args()
    a.n = a.n or ([4] if a.quick else [4, 8])
    a.rounds = a.rounds or (2 if a.quick else 4)
    a.repeats = a.repeats or (1 if a.quick else 3)
    if a.simulation is None:
        a.simulation = not a.quick
    if a.rounds < 1 or min(a.n) < 1 or a.threads < 1 or a.repeats < 1:
        p.error("--n, --rounds, --repeats and --threads must be >= 1")
    return a


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from uuid import uuid4  # noqa: E402

import torch  # noqa: E402

from fedsafe import __version__ as fedsafe_version  # noqa: E402
from fedsafe.config import ExperimentConfig, validate  # noqa: E402
from fedsafe.engine.run import run_experiment  # noqa: E402

VARIANTS = ("engine", "flower_inprocess", "flower_simulation")


class InProcessGrid:
    """A Flower ``Grid`` in this process: each node is a ``Context`` (its node config with the
    ``partition-id`` of the client it holds, and its persistent ``state``) and the ClientApp is
    called directly, as a SuperNode would call it; a ClientApp that raises answers with an error
    message, as a SuperNode does. Counts the exchanges (``send_and_receive`` calls) and messages
    of the rounds (the start-up hellos left out) and the seconds spent in the ClientApp."""

    def __init__(self, client_app: Any, num_nodes: int) -> None:
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        # Messages built outside a Flower runtime need a task identity (the ServerApp's).
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.app = client_app
        self.nodes = {
            1000 + i: Context(run_id=1, node_id=1000 + i, node_config={"partition-id": i, "num-partitions": num_nodes},
                              state=RecordDict(), run_config={})
            for i in range(num_nodes)
        }
        self.exchanges = 0
        self.messages = 0
        self.app_seconds = 0.0

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
        from flwr.app import Error, Message

        from fedsafe.flower.records import HELLO

        out = []
        exchange = False
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())  # as a grid does on push
            node = msg.metadata.dst_node_id
            if node not in self.nodes:
                continue  # no reply: the timeout passes
            if msg.metadata.message_type != HELLO:  # not a node's start-up "which client do you hold"
                self.messages += 1
                exchange = True
            t0 = time.perf_counter()
            try:
                reply = self.app(msg, self.nodes[node])
            except Exception as e:  # noqa: BLE001 -- what a SuperNode sends back for a ClientApp that raised
                reply = Message(Error(code=1, reason=f"{type(e).__name__}: {e}"), reply_to=msg)
            self.app_seconds += time.perf_counter() - t0
            out.append(reply)
        self.exchanges += exchange
        return out


def _reset_task_identity() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def config(n: int, protocol: str, rounds: int) -> ExperimentConfig:
    return validate({
        "name": f"flower_overhead_{protocol}_{n}", "seed": ARGS.seed, "rounds": rounds, "execution": "serial",
        "protocol": protocol, "clients": {"num_clients": n},
    })


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(rows: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Median seconds per round over the rounds after the first (all of them for a 1-round run)."""
    timed = rows[1:] if len(rows) > 1 else rows
    secs = [float(r["seconds"]) for r in rows]
    work = [float(r["client_work_seconds"]) for r in timed if r.get("client_work_seconds") is not None]
    return {
        "rounds": len(rows),
        "timed_rounds": len(timed),
        "s_per_round": statistics.median(float(r["seconds"]) for r in timed),
        "first_round_s": secs[0],
        "round_seconds": secs,
        "client_work_s": statistics.median(work) if work else None,
        "wall_s": wall,
        "setup_s": wall - sum(secs),
        "test_accuracy": rows[-1].get("test_accuracy"),
        "skipped_rounds": sum(1 for r in rows if r.get("skipped")),
    }


def run_engine(cfg: ExperimentConfig, tmp: Path) -> dict[str, Any]:
    out = tmp / "engine"
    t0 = time.perf_counter()
    run_experiment(cfg, out, overwrite=True, quiet=True)
    return summarize(read_rows(out), time.perf_counter() - t0)


def run_inprocess(cfg: ExperimentConfig, tmp: Path) -> dict[str, Any]:
    from fedsafe.flower import client_app
    from fedsafe.flower.server import run_over_flower

    out = tmp / "flower_inprocess"
    grid = InProcessGrid(client_app(noise_seed="experiment"), cfg.clients.num_clients)
    try:
        t0 = time.perf_counter()
        run_over_flower(cfg, grid, out)
        wall = time.perf_counter() - t0
    finally:
        _reset_task_identity()
    r = summarize(read_rows(out), wall)
    r["exchanges_per_round"] = grid.exchanges / cfg.rounds
    r["messages_per_round"] = grid.messages / cfg.rounds
    r["client_app_s_per_round"] = grid.app_seconds / cfg.rounds  # the first round's node build included
    return r


def run_simulation(cfg: ExperimentConfig, tmp: Path) -> dict[str, Any]:
    from flwr.simulation import run_simulation as flwr_run_simulation

    from fedsafe.flower import client_app, server_app

    out = tmp / "flower_simulation"
    backend = {"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2, "include_dashboard": False}}
    try:
        t0 = time.perf_counter()
        flwr_run_simulation(
            server_app(config=cfg, out_dir=out), client_app(noise_seed="experiment"),
            num_supernodes=cfg.clients.num_clients, backend_config=backend,
        )
        wall = time.perf_counter() - t0
    finally:
        _reset_task_identity()
    if not (out / "metrics.jsonl").is_file():
        raise RuntimeError(f"the Flower simulation wrote no metrics under {out}")
    return summarize(read_rows(out), wall)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'n':>3} {'protocol':<8} {'variant':<18} {'ms/round':>9} {'x engine':>9} {'1st ms':>8} "
          f"{'work ms':>8} {'app ms':>7} {'exch':>5} {'msgs':>5} {'wall s':>7} {'setup s':>8} {'acc':>6}")
    for r in results:
        x = r.get("x_engine")
        print(f"{r['n']:>3} {r['protocol']:<8} {r['variant']:<18} {_ms(r['s_per_round']):>9} "
              f"{'-' if x is None else f'{x:.2f}':>9} {_ms(r['first_round_s']):>8} {_ms(r['client_work_s']):>8} "
              f"{_ms(r.get('client_app_s_per_round')):>7} "
              f"{'-' if 'exchanges_per_round' not in r else format(r['exchanges_per_round'], '.0f'):>5} "
              f"{'-' if 'messages_per_round' not in r else format(r['messages_per_round'], '.0f'):>5} "
              f"{r['wall_s']:>7.2f} {r['setup_s']:>8.2f} "
              f"{'-' if r['test_accuracy'] is None else format(r['test_accuracy'], '.3f'):>6}", flush=True)


def _pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry from ``repeats`` runs of a variant: medians over the pooled timed rounds."""
    if len(runs) == 1:
        return runs[0]
    timed = [s for r in runs for s in (r["round_seconds"][1:] if len(r["round_seconds"]) > 1 else r["round_seconds"])]
    out = dict(runs[0])
    out["s_per_round"] = statistics.median(timed)
    out["timed_rounds"] = len(timed)
    out["round_seconds"] = [r["round_seconds"] for r in runs]
    for key in ("first_round_s", "client_work_s", "wall_s", "setup_s", "client_app_s_per_round",
                "exchanges_per_round", "messages_per_round"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        if key in out:
            out[key] = statistics.median(vals) if vals else None
    out["repeats"] = len(runs)
    return out


def main() -> None:
    args = ARGS
    torch.set_num_threads(args.threads)
    if importlib.util.find_spec("flwr") is None:
        raise SystemExit("flower_overhead.py needs Flower: pip install 'fedsafe[flower]'")
    simulation = args.simulation
    notes = []
    if simulation and importlib.util.find_spec("ray") is None:
        simulation = False
        notes.append("flower_simulation skipped: Ray is not installed")
    import flwr

    load_start = os.getloadavg()
    results: dict[str, Any] = {
        "meta": {
            "python": platform.python_version(), "torch": torch.__version__, "flwr": flwr.__version__,
            "fedsafe": fedsafe_version, "machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
            "n": args.n, "protocols": args.protocols, "simulation": simulation, "quick": args.quick,
            "seed": args.seed, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": load_start,
            "timing": "median of the metrics rows' seconds over the rounds after the first (pooled over repeats)",
        },
        "notes": notes,
        "results": [],
    }
    cells = [(n, protocol) for n in args.n for protocol in args.protocols]
    entries: dict[tuple[int, str, str], dict[str, Any]] = {}

    def record(n: int, protocol: str, variant: str, r: dict[str, Any]) -> None:
        r.update(n=n, protocol=protocol, variant=variant)
        entries[n, protocol, variant] = r
        runs = r.get("repeats", 1)
        print(f"# n={n} {protocol} {variant}: {r['s_per_round'] * 1e3:.1f} ms/round, wall {r['wall_s']:.1f} s"
              + ("" if runs == 1 else f" (median over {runs} runs)"), flush=True)

    # In-process variants first, alternating run by run (load from other processes hits both
    # alike); the simulations after them, so that no Ray process winding down slows these.
    for n, protocol in cells:
        cfg = config(n, protocol, args.rounds)
        runs: dict[str, list[dict[str, Any]]] = {"engine": [], "flower_inprocess": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="fedsafe-flower-overhead-") as tmp:
                runs["engine"].append(run_engine(cfg, Path(tmp)))
                runs["flower_inprocess"].append(run_inprocess(cfg, Path(tmp)))
        for variant, rs in runs.items():
            record(n, protocol, variant, _pool(rs))
    if simulation:
        for n, protocol in cells:
            with tempfile.TemporaryDirectory(prefix="fedsafe-flower-overhead-") as tmp:
                record(n, protocol, "flower_simulation", run_simulation(config(n, protocol, args.rounds), Path(tmp)))

    rows: list[dict[str, Any]] = results["results"]
    for n, protocol in cells:
        base = entries[n, protocol, "engine"]
        for variant in VARIANTS:
            r = entries.get((n, protocol, variant))
            if r is None:
                continue
            if variant != "engine":
                r["x_engine"] = r["s_per_round"] / base["s_per_round"]
                if r["test_accuracy"] != base["test_accuracy"]:
                    r["note"] = "final test accuracy differs from the engine's"
                    notes.append(f"n={n} {protocol} {variant}: final test accuracy differs from the engine's")
            rows.append(r)
    results["meta"]["loadavg_end"] = load_end = os.getloadavg()

    print()
    print_table(rows)
    print(f"ms/round: median metrics-row seconds after round 1 ({args.rounds} rounds x {args.repeats} runs in "
          f"process{', 1 simulation' if simulation else '; no simulation'}); work: client_work_seconds; app: time inside the ClientApp per round, "
          f"exch / msgs: send_and_receive calls / messages per round (in-process grid); setup: wall - sum of rounds; {args.threads} torch threads, {os.cpu_count()} CPUs, "
          f"load {load_start[0]:.1f} -> {load_end[0]:.1f}")
    for note in notes:
        print(note)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
