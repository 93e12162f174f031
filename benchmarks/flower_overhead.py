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
* ``flower_simulation``: Flower's simulation runtime, as ``tests/flower/test_simulation.py`` runs
  it: a SuperLink started with ``--simulation`` on 127.0.0.1 and ``flwr run examples/flower_app``
  with ``--federation-config "num-supernodes=n client-resources-num-cpus=1
  init-args-num-cpus=2"`` (Ray actors as SuperNodes; ``flwr.simulation.run_simulation`` is
  deprecated in Flower 1.42).

* ``deployed_fedsafe`` and ``deployed_flower``: a real deployment on this machine, as
  ``tests/flower/test_deployment.py`` starts it: one SuperLink and ``--deploy-n`` SuperNodes, each
  its own process group on 127.0.0.1, every ClientApp in the fresh process Flower starts for each
  message. ``deployed_fedsafe`` submits ``examples/flower_app`` with the same experiment;
  ``deployed_flower`` is the anchor, a plain Flower app written here with the same model
  (logistic regression, 650 parameters), the same data (digits, read as fedsafe reads them) and
  one local SGD step per round: for ``plain``, Flower's ``FedAvg`` (Message API, every node
  trains, the server evaluates); for ``secagg``, Flower's own secure aggregation (the SecAgg+
  workflow with ``secaggplus_mod``, every node a participant). The two alternate on the same
  SuperLink and SuperNodes (anchor, fedsafe, fedsafe, anchor, ...), ``--deploy-repeats`` runs
  each, and ``x_flower`` is fedsafe's seconds per round over the anchor's. Round times are the
  server's: fedsafe's metrics rows, the anchor's time between the ends of its server-side
  evaluations. ``--task-poll`` sets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` on every process
  (Flower's default is 1 s; 0.25 here, as in the tests and the README).

Every in-process variant writes the engine's run directory; seconds per round are the metrics rows'
``seconds`` (the server's wall time for the round, evaluation included), median over the rounds
after the first (the first loads the data on the nodes and warms up). The two in-process
variants run ``--repeats`` times each, alternating, their timed rounds pooled (a round here
takes milliseconds); each simulation runs once, after all the in-process runs, so that no Ray
process winding down slows those. Also reported: the median ``client_work_seconds`` (the
round's local work as the server sees it; over Flower, the train messages' round trip), and
for the in-process grid the seconds spent inside the ClientApp and the exchanges
(``send_and_receive`` calls) and messages per round; for the simulation and the deployed runs,
the wall time from ``flwr run`` to the run's end (the run's process and Ray start-up, node
discovery included) and that less the rounds (``setup_s``). Ratios (``x_engine``) are against ``engine`` for the same n and protocol.

    python benchmarks/flower_overhead.py [--n 4 8] [--rounds 4] [--repeats 3] [--protocols plain secagg]
        [--threads 1] [--out benchmarks/results/flower_overhead.json] [--quick] [--simulation]
        [--no-simulation] [--deployment | --no-deployment] [--deploy-n 3] [--deploy-rounds 4]
        [--deploy-repeats 2] [--task-poll 0.25]

``--threads`` defaults to 1: Flower's simulation runs each ClientApp in a Ray actor with one
torch thread, and on a shared 2-core machine two OpenMP threads per op stall for tens of
milliseconds whenever the other core is busy, which swamps millisecond rounds. ``--quick``
(n = 4, 2 rounds, one run, no simulation unless ``--simulation`` and no deployment unless
``--deployment``: Ray's start-up alone takes several seconds, a deployment minutes) checks
that the script runs; its ratios mean little.
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
    dep = p.add_mutually_exclusive_group()
    dep.add_argument("--deployment", dest="deployment", action="store_true", default=None,
                     help="run the deployed variants (SuperLink + SuperNodes on 127.0.0.1) even with --quick")
    dep.add_argument("--no-deployment", dest="deployment", action="store_false", help="skip the deployed variants")
    p.add_argument("--deploy-n", type=int, nargs="+", default=[3], help="SuperNodes of the deployed variants (default 3)")
    p.add_argument("--deploy-rounds", type=int, default=None, help="rounds per deployed run (default 4; --quick 2)")
    p.add_argument("--deploy-repeats", type=int, default=None,
                   help="runs of each deployed variant, alternating (default 2; --quick 1)")
    p.add_argument("--task-poll", type=float, default=0.25,
                   help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the deployment's processes (Flower's default: 1)")
    p.add_argument("--deploy-limit", type=float, default=900.0, help="seconds one deployed run may take")
    a = p.parse_args()
    a.n = a.n or ([4] if a.quick else [4, 8])
    a.deploy_rounds = a.deploy_rounds or (2 if a.quick else 4)
    a.deploy_repeats = a.deploy_repeats or (1 if a.quick else 2)
    if a.deployment is None:
        a.deployment = not a.quick
    if a.deploy_rounds < 1 or a.deploy_repeats < 1 or min(a.deploy_n) < 2 or not 0.01 <= a.task_poll <= 60:
        p.error("--deploy-rounds and --deploy-repeats must be >= 1, --deploy-n >= 2, --task-poll in [0.01, 60]")
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

VARIANTS = ("engine", "flower_inprocess", "flower_simulation", "deployed_flower", "deployed_fedsafe")
REPO = Path(__file__).resolve().parents[1]
FEDSAFE_APP = REPO / "examples" / "flower_app"


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
    """Flower's simulation runtime as Flower 1.42 runs it (``run_simulation`` is deprecated): a
    SuperLink in simulation mode on 127.0.0.1 and ``flwr run examples/flower_app`` with
    ``--federation-config "num-supernodes=n ..."``."""
    Deployment = _deployment_class()
    out = tmp / "flower_simulation"
    exp = tmp / "flower_simulation.toml"
    exp.write_text(cfg.to_toml())
    n = cfg.clients.num_clients
    dep = Deployment(tmp / "runtime", n, simulation=True, task_poll=ARGS.task_poll)
    try:
        dep.start(timeout=120.0)
        t0 = time.perf_counter()
        run_id = dep.submit(
            FEDSAFE_APP, f'fedsafe-config="{exp}" fedsafe-out="{out}" fedsafe-noise-seed="experiment"',
            federation_config=f"num-supernodes={n} client-resources-num-cpus=1 init-args-num-cpus=2",
        )
        status = dep.wait(run_id, ARGS.deploy_limit, done=(out / "summary.json").is_file)
        wall = time.perf_counter() - t0
    finally:
        dep.close()
    if status != "finished:completed" or not (out / "metrics.jsonl").is_file():
        raise RuntimeError(f"the Flower simulation ended {status} and wrote no metrics under {out}")
    return summarize(read_rows(out), wall)


# --- the deployed variants -----------------------------------------------------------------------
# The anchor: a plain Flower app, written into a temporary directory and submitted with `flwr run`.

ANCHOR_TASK = '''"""The anchor's model, data and local step: what a plain Flower PyTorch app has (fedsafe's
default model on digits: multinomial logistic regression, 650 parameters)."""

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(64, 10)


def load(partition_id: int | None, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits read from the CSV it ships (as fedsafe reads them); an IID share,
    or (partition_id None) a held-out fifth for the server's evaluation."""
    spec = importlib.util.find_spec("sklearn")
    csv = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(csv, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    order = np.random.default_rng(0).permutation(len(table))
    test, train = order[: len(order) // 5], order[len(order) // 5 :]
    rows = test if partition_id is None else np.array_split(train, num_partitions)[partition_id]
    return torch.from_numpy(table[rows, :-1] / 16.0), torch.from_numpy(table[rows, -1].astype(np.int64))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1, batch: int = 32) -> float:
    """One minibatch SGD step (fedsafe's default client does one step of batch 32)."""
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))[:batch]
    loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    return loss.item()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
'''

PYPROJECT = '''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["{pkg}"]

[tool.flwr.app]
publisher = "fedsafe"

[tool.flwr.app.components]
serverapp = "{pkg}.server_app:app"
clientapp = "{pkg}.client_app:app"

[tool.flwr.app.config]
num-rounds = 4
num-nodes = 3
out-file = "times.json"
'''

# The server's side of both anchors: round times are taken when the server's evaluation of
# the new global model ends (evaluate_fn runs after the initial model and after every round).
TIMES = '''
import json
import time


class Times:
    def __init__(self, progress: str) -> None:
        self.ends: list[float] = []
        self.accuracy: float | None = None
        self.progress = progress  # a line per evaluation, as it happens (the benchmark watches it)

    def mark(self, accuracy: float) -> None:
        self.ends.append(time.perf_counter())
        self.accuracy = accuracy
        with open(self.progress, "a") as f:
            f.write(f"{len(self.ends)}\\n")

    def write(self, path: str) -> None:
        rounds = [b - a for a, b in zip(self.ends, self.ends[1:])]
        with open(path, "w") as f:
            json.dump({"round_seconds": rounds, "test_accuracy": self.accuracy}, f)
'''

PLAIN_CLIENT = '''"""A plain Flower ClientApp (Message API): load this node's partition, one local step."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from {pkg}.task import load, make_model, train

app = ClientApp()


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    loss = train(model, x, y)
    metrics = MetricRecord({{"train_loss": loss, "num-examples": len(y)}})
    return Message(RecordDict({{"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}}), reply_to=msg)
'''

PLAIN_SERVER = '''"""A plain Flower ServerApp: FedAvg over every node, the server evaluates each round."""

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from {pkg}.task import accuracy, load, make_model
from {pkg}.times import Times

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    n = int(rc["num-nodes"])
    x, y = load(None, 1)
    times = Times(str(rc["out-file"]) + ".rounds")

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = make_model()
        model.load_state_dict(arrays.to_torch_state_dict())
        acc = accuracy(model, x, y)
        times.mark(acc)
        return MetricRecord({{"accuracy": acc}})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(make_model().state_dict()),
                   num_rounds=int(rc["num-rounds"]), evaluate_fn=evaluate)
    times.write(str(rc["out-file"]))
'''

SECAGG_CLIENT = '''"""A Flower ClientApp with Flower's own secure aggregation (SecAgg+, ``secaggplus_mod``)."""

from flwr.app import Context
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp

from {pkg}.task import load, make_model, train


class Client(NumPyClient):
    def __init__(self, pid: int, n: int) -> None:
        self.pid, self.n = pid, n

    def fit(self, parameters, config):
        import torch

        model = make_model()
        with torch.no_grad():
            for p, v in zip(model.parameters(), parameters):
                p.copy_(torch.from_numpy(v))
        x, y = load(self.pid, self.n)
        loss = train(model, x, y)
        return [p.detach().numpy() for p in model.parameters()], len(y), {{"train_loss": loss}}


def client_fn(context: Context):
    return Client(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])).to_client()


app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
'''

SECAGG_SERVER = '''"""A Flower ServerApp with Flower's own secure aggregation: FedAvg through the SecAgg+
workflow (every node a participant, all of them sharing keys), the server evaluates each round."""

from flwr.app import Context
from flwr.common import ndarrays_to_parameters
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from {pkg}.task import accuracy, load, make_model
from {pkg}.times import Times

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    import torch

    rc = context.run_config
    n = int(rc["num-nodes"])
    x, y = load(None, 1)
    times = Times(str(rc["out-file"]) + ".rounds")

    def evaluate(server_round, parameters, config):
        model = make_model()
        with torch.no_grad():
            for p, v in zip(model.parameters(), parameters):
                p.copy_(torch.from_numpy(v))
        acc = accuracy(model, x, y)
        times.mark(acc)
        return 0.0, {{"accuracy": acc}}

    initial = ndarrays_to_parameters([p.detach().numpy() for p in make_model().parameters()])
    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n, min_available_clients=n,
                      initial_parameters=initial, evaluate_fn=evaluate)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=int(rc["num-rounds"])), strategy=strategy)
    DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=n, reconstruction_threshold=max(2, n - 1)))(grid, legacy)
    times.write(str(rc["out-file"]))
'''


def write_anchor(root: Path, protocol: str) -> Path:
    """The anchor app for ``protocol`` (plain: FedAvg; secagg: Flower's SecAgg+) under ``root``."""
    pkg = "anchor_plain" if protocol == "plain" else "anchor_secaggplus"
    app = root / pkg.replace("_", "-")
    (app / pkg).mkdir(parents=True, exist_ok=True)
    client, server = (PLAIN_CLIENT, PLAIN_SERVER) if protocol == "plain" else (SECAGG_CLIENT, SECAGG_SERVER)
    files = {
        "pyproject.toml": PYPROJECT.format(name=pkg.replace("_", "-"), pkg=pkg), f"{pkg}/__init__.py": "",
        f"{pkg}/task.py": ANCHOR_TASK, f"{pkg}/times.py": TIMES,
        f"{pkg}/client_app.py": client.format(pkg=pkg), f"{pkg}/server_app.py": server.format(pkg=pkg),
    }
    for name, text in files.items():
        (app / name).write_text(text)
    return app


def _deployment_class() -> Any:
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.flower.deployment import Deployment  # the tests' local deployment (127.0.0.1 only)

    return Deployment


class Progress:
    """Called while a deployed run goes on: notes the deployment's CPU seconds when a round ends
    (``count()``, the rounds ended so far, grows), so that a round's CPU seconds are known."""

    def __init__(self, dep: Any, count: Any) -> None:
        self.dep, self.count, self.marks = dep, count, []

    def __call__(self) -> None:
        n = self.count()
        if n > len(self.marks):
            cpu = self.dep.cpu_seconds()
            self.marks += [cpu] * (n - len(self.marks))

    def cpu_per_round(self) -> list[float]:
        """CPU seconds of each round after the first (between the ends of successive rounds)."""
        return [b - a for a, b in zip(self.marks[1:], self.marks[2:])]


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def _with_cpu(r: dict[str, Any], progress: Progress) -> dict[str, Any]:
    cpu = progress.cpu_per_round()
    r["cpu_round_seconds"] = cpu
    r["cpu_s_per_round"] = statistics.median(cpu) if cpu else None
    return r


def _round_summary(rounds: list[float], wall: float, accuracy: float | None) -> dict[str, Any]:
    timed = rounds[1:] if len(rounds) > 1 else rounds
    return {
        "rounds": len(rounds), "timed_rounds": len(timed), "s_per_round": statistics.median(timed),
        "first_round_s": rounds[0], "round_seconds": rounds, "client_work_s": None, "wall_s": wall,
        "setup_s": wall - sum(rounds), "test_accuracy": accuracy, "skipped_rounds": 0,
    }


def run_deployed_anchor(dep: Any, app: Path, n: int, rounds: int, tmp: Path, limit: float) -> dict[str, Any]:
    out = tmp / f"anchor_{time.monotonic_ns()}.json"
    progress = Progress(dep, lambda: max(0, _lines(Path(f"{out}.rounds")) - 1))  # less the initial evaluation
    t0 = time.perf_counter()
    run_id = dep.submit(app, f'num-rounds={rounds} num-nodes={n} out-file="{out}"')
    status = dep.wait(run_id, limit, done=out.is_file, poll=progress)
    wall = time.perf_counter() - t0
    if status != "finished:completed" or not out.is_file():
        raise RuntimeError(f"the anchor app ended {status}: {dep.log('superlink')[-3000:]}")
    times = json.loads(out.read_text())
    if len(times["round_seconds"]) != rounds:
        raise RuntimeError(f"the anchor app timed {len(times['round_seconds'])} of {rounds} rounds")
    return _with_cpu(_round_summary(times["round_seconds"], wall, times["test_accuracy"]), progress)


def run_deployed_fedsafe(dep: Any, cfg: ExperimentConfig, tmp: Path, limit: float) -> dict[str, Any]:
    run_dir = tmp / f"fedsafe_{time.monotonic_ns()}"
    exp = run_dir.with_suffix(".toml")
    exp.write_text(cfg.to_toml())
    progress = Progress(dep, lambda: _lines(run_dir / "metrics.jsonl"))
    t0 = time.perf_counter()
    run_id = dep.submit(FEDSAFE_APP, f'fedsafe-config="{exp}" fedsafe-out="{run_dir}" fedsafe-timeout=300')
    status = dep.wait(run_id, limit, done=(run_dir / "summary.json").is_file, poll=progress)
    wall = time.perf_counter() - t0
    if status != "finished:completed" or not (run_dir / "metrics.jsonl").is_file():
        raise RuntimeError(f"fedsafe's app ended {status}: {dep.log('superlink')[-3000:]}")
    return _with_cpu(summarize(read_rows(run_dir), wall), progress)


def run_deployments(args: argparse.Namespace, protocols: list[str], record: Any) -> None:
    """The deployed variants: per SuperNode count, one deployment; per protocol, the anchor and
    fedsafe alternate (A B B A ...) on it."""
    Deployment = _deployment_class()
    for n in args.deploy_n:
        with tempfile.TemporaryDirectory(prefix="fedsafe-flower-deployed-") as tmp_name:
            tmp = Path(tmp_name)
            dep = Deployment(tmp / "flower", n, task_poll=args.task_poll)
            try:
                t0 = time.perf_counter()
                dep.start(timeout=120.0)
                print(f"# deployment: SuperLink + {n} SuperNodes up in {time.perf_counter() - t0:.1f} s", flush=True)
                for protocol in protocols:
                    cfg = config(n, protocol, args.deploy_rounds)
                    app = write_anchor(tmp, protocol)
                    runs: dict[str, list[dict[str, Any]]] = {"deployed_flower": [], "deployed_fedsafe": []}
                    for k in range(args.deploy_repeats):
                        order = ("deployed_flower", "deployed_fedsafe")[:: 1 if k % 2 == 0 else -1]
                        for variant in order:
                            load = os.getloadavg()[0]
                            if variant == "deployed_flower":
                                r = run_deployed_anchor(dep, app, n, args.deploy_rounds, tmp, args.deploy_limit)
                            else:
                                r = run_deployed_fedsafe(dep, cfg, tmp, args.deploy_limit)
                            r["loadavg"] = [load, os.getloadavg()[0]]
                            cpu = r.get("cpu_s_per_round")
                            print(f"#   n={n} {protocol} {variant} run {k + 1}: {r['s_per_round']:.2f} s/round "
                                  f"{[round(x, 2) for x in r['round_seconds']]}, "
                                  f"{'-' if cpu is None else f'{cpu:.2f}'} CPU s/round, load {load:.1f}", flush=True)
                            runs[variant].append(r)
                    for variant, rs in runs.items():
                        pooled = _pool(rs)
                        pooled["exchanges_per_round"] = float(_exchanges(variant, protocol, cfg))
                        pooled["loadavg"] = [x for r in rs for x in r["loadavg"]]
                        record(n, protocol, variant, pooled)
            finally:
                dep.close()


def _exchanges(variant: str, protocol: str, cfg: ExperimentConfig) -> int:
    """Message exchanges (server -> every node -> server) per round."""
    if protocol == "plain":
        return 1
    return 4 if variant == "deployed_flower" else 1 + len(cfg.secagg.stages)  # SecAgg+: setup, share, collect, unmask


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


def print_deployed(results: list[dict[str, Any]]) -> None:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    print(f"{'n':>3} {'protocol':<8} {'variant':<18} {'s/round':>8} {'x flower':>9} {'cpu s/rd':>9} {'x cpu':>6} "
          f"{'1st s':>7} {'exch':>5} {'s/exch':>7} {'wall s':>7} {'setup s':>8} {'load':>5} {'acc':>6}")
    for r in results:
        ex = r.get("exchanges_per_round") or 1
        load = statistics.mean(r["loadavg"]) if r.get("loadavg") else None
        print(f"{r['n']:>3} {r['protocol']:<8} {r['variant']:<18} {r['s_per_round']:>8.2f} "
              f"{num(r.get('x_flower'), '.2f'):>9} {num(r.get('cpu_s_per_round'), '.2f'):>9} "
              f"{num(r.get('x_flower_cpu'), '.2f'):>6} {r['first_round_s']:>7.2f} {ex:>5.0f} {r['s_per_round'] / ex:>7.2f} "
              f"{r['wall_s']:>7.1f} {r['setup_s']:>8.1f} {num(load, '.1f'):>5} {num(r['test_accuracy'], '.3f'):>6}", flush=True)


def _pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One entry from ``repeats`` runs of a variant: medians over the pooled timed rounds."""
    if len(runs) == 1:
        return runs[0]
    timed = [s for r in runs for s in (r["round_seconds"][1:] if len(r["round_seconds"]) > 1 else r["round_seconds"])]
    out = dict(runs[0])
    out["s_per_round"] = statistics.median(timed)
    out["timed_rounds"] = len(timed)
    out["round_seconds"] = [r["round_seconds"] for r in runs]
    if any("cpu_round_seconds" in r for r in runs):
        cpu = [c for r in runs for c in r.get("cpu_round_seconds") or []]
        out["cpu_round_seconds"] = [r.get("cpu_round_seconds") for r in runs]
        out["cpu_s_per_round"] = statistics.median(cpu) if cpu else None
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
            "deployment": args.deployment, "deploy_n": args.deploy_n, "deploy_rounds": args.deploy_rounds,
            "deploy_repeats": args.deploy_repeats, "task_poll": args.task_poll,
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
    if args.deployment:
        run_deployments(args, args.protocols, record)

    rows: list[dict[str, Any]] = results["results"]
    for n, protocol in dict.fromkeys([(n, p) for n, p, _ in entries]):
        base = entries.get((n, protocol, "engine"))
        for variant in VARIANTS:
            r = entries.get((n, protocol, variant))
            if r is None:
                continue
            if variant == "deployed_fedsafe":
                anchor = entries[n, protocol, "deployed_flower"]
                r["x_flower"] = r["s_per_round"] / anchor["s_per_round"]
                if r.get("cpu_s_per_round") and anchor.get("cpu_s_per_round"):
                    r["x_flower_cpu"] = r["cpu_s_per_round"] / anchor["cpu_s_per_round"]
            if variant != "engine" and base is not None:
                r["x_engine"] = r["s_per_round"] / base["s_per_round"]
                if variant != "deployed_flower" and r["test_accuracy"] != base["test_accuracy"]:
                    r["note"] = "final test accuracy differs from the engine's"
                    notes.append(f"n={n} {protocol} {variant}: final test accuracy differs from the engine's")
            rows.append(r)
    results["meta"]["loadavg_end"] = load_end = os.getloadavg()

    print()
    print_table([r for r in rows if not r["variant"].startswith("deployed")])
    deployed = [r for r in rows if r["variant"].startswith("deployed")]
    if deployed:
        print()
        print_deployed(deployed)
        print(f"deployed: SuperLink + SuperNodes on 127.0.0.1, a ClientApp process per message, "
              f"FLWR_SUPEREXEC_TASK_POLL_INTERVAL={args.task_poll:g}; s/round: median server seconds per round after "
              f"round 1 ({args.deploy_rounds} rounds x {args.deploy_repeats} runs, alternating); cpu s/rd: CPU seconds of "
              f"all the deployment's processes per round (after round 1; insensitive to other load on the machine); "
              f"x flower / x cpu: fedsafe over the plain Flower app (FedAvg; secagg: Flower's SecAgg+); load: 1-min load average")
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
