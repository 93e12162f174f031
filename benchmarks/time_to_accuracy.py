"""Wall time to a test accuracy: fedsafe's engine against a hand-written loop and a plain Flower app.

Two workloads on MNIST (``data.name = "mnist"``, the file ``make data`` fetched), 100 clients,
SABLE's model 1 (MLP 784-100-10, 79,510 parameters), the same initial weights, data partition
and hyper-parameters for every contender:

* ``fedavg``: IID partition (600 samples per client), every client each round, one local epoch
  of plain SGD (batch 25, so 24 steps, lr ``--fedavg-lr``), the server averages the models.
  Thresholds: 95% test accuracy.
* ``robust_dsgd``: SABLE's MNIST setting as far as it fits 100 clients: Dirichlet(1) label
  heterogeneity, batch 25, one gradient per client per round, local momentum β = 0.99, L2
  10⁻⁴, server lr 0.5, coordinate-wise trimmed mean (SABLE's CWTM) with f = 10 of the 100
  clients Byzantine, running ALIE (Baruch et al.: mean + z·std of the honest momentums,
  z = Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − f). Thresholds: ``--paper-accuracy`` and 95%. SABLE
  plots its MNIST accuracies (Figures 1, 3–7) but states no number in the text, so the
  paper's accuracy is an option (default 0.90, our choice, not a figure quoted from
  the paper).

Contenders:

* ``fedsafe``: ``Federation.run_round()`` (the engine every fedsafe run uses: seeded sampling
  and minibatches, vectorised client work, the plain protocol's checks, the rule, the attack,
  the server step), evaluating on the test set every ``--eval-every`` rounds inside the round;
* ``handwritten``: what a user writes with torch alone: per client, copy the global weights
  into one ``nn.Sequential``, ``torch.optim.SGD`` steps over ``randperm`` minibatches (FedAvg)
  or one ``backward`` and the momentum on the flattened gradient (Robust-DSGD), then the mean,
  or ALIE and the trimmed mean written naively (``std``, ``sort``), and a test-set forward;
* ``flower`` (FedAvg only): a plain Flower app written here (Message API ``FedAvg`` strategy,
  every node trains, the server evaluates with ``evaluate_fn``), whose ClientApp runs the
  hand-written loop's very ``local_train`` on the node's partition, run by Flower's
  simulation runtime as ``benchmarks/flower_overhead.py`` runs it (a ``--simulation``
  SuperLink on 127.0.0.1 and ``flwr run`` with ``num-supernodes=100``; Ray actors with one
  CPU and one thread each). It stops training once the last threshold is reached. Plain
  Flower has no Byzantine clients, ALIE or robust rule, so Robust-DSGD has no Flower
  contender.

fedsafe and the hand-written loop run in this process, interleaved round by round (the order
alternating every round, so that load from other processes hits both alike); each one's time
is the sum of its own rounds (training and evaluation), from round 1 to the evaluation that
first reaches the threshold. The Flower run follows them (``--repeats`` > 1: the next repeat
runs Flower first, then the pair). Its time is the server's, from the end of the initial
evaluation to the end of the evaluation that reaches the threshold; Ray's start-up and the
app's are reported as ``setup_s``. If the Flower run is capped (``--flower-rounds``) before
it reaches a threshold, its seconds per round times the hand-written loop's rounds to that
threshold (the same algorithm and batches) is reported, marked ``extrapolated``.

    python benchmarks/time_to_accuracy.py [--workloads fedavg robust_dsgd] [--repeats 1]
        [--threads 2] [--eval-every 1 robust_dsgd=5 ...] [--max-rounds fedavg=60 robust_dsgd=1000]
        [--flower-rounds N] [--no-flower] [--paper-accuracy 0.90] [--fedavg-lr 0.1]
        [--data mnist.pkl.gz] [--out benchmarks/results/time_to_accuracy.json] [--quick]

``--threads`` (default 2) sets torch's threads and ``OMP_NUM_THREADS`` (printed first). On a
machine that other jobs keep busy, use ``--threads 1``: two OpenMP threads per op spin while the
other core is taken (on this project's 2-core machine at load 12–17 a 2-thread FedAvg round cost
several times the CPU seconds of a 1-thread one); Flower's Ray actors run one thread each.

``--quick`` runs both workloads on a tiny synthetic stand-in written in mnist.pkl.gz's format
(10 clients, f = 2, thresholds 0.5 / 0.6, at most 15 rounds, no Flower unless ``--flower``): a
smoke run of a few seconds whose numbers mean nothing; it never needs MNIST.
"""

from __future__ import annotations

import argparse
import os
import sys

WORKLOADS = ("fedavg", "robust_dsgd")
DEFAULT_MAX_ROUNDS = {"fedavg": 60, "robust_dsgd": 1000}  # robust_dsgd: SABLE's T = 1000 steps
DEFAULT_EVAL_EVERY = {"fedavg": 1, "robust_dsgd": 5}


def _per_workload(values: list[str] | None, default: dict[str, int], what: str) -> dict[str, int]:
    """``N`` (every workload) or ``WORKLOAD=N`` items."""
    out = dict(default)
    for v in values or []:
        name, sep, num = v.rpartition("=")
        if sep and name not in WORKLOADS:
            raise SystemExit(f"{what} {v!r}: unknown workload {name!r} (valid: {', '.join(WORKLOADS)})")
        for w in ([name] if sep else WORKLOADS):
            out[w] = int(num)
        if int(num) < 1:
            raise SystemExit(f"{what} {v!r}: must be >= 1")
    return out


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=1, help="runs of every contender (default 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads (default 2; --quick 1)")
    ap.add_argument("--eval-every", nargs="+", default=None, metavar="[WORKLOAD=]N",
                    help="evaluate every N rounds, the same for every contender (default fedavg=1 robust_dsgd=5)")
    ap.add_argument("--max-rounds", nargs="+", default=None, metavar="[WORKLOAD=]N",
                    help="give up after N rounds (default fedavg=60 robust_dsgd=1000, SABLE's T)")
    ap.add_argument("--flower-rounds", type=int, default=None,
                    help="cap on the Flower run's rounds (default: the workload's --max-rounds)")
    fl = ap.add_mutually_exclusive_group()
    fl.add_argument("--flower", dest="flower", action="store_true", default=None,
                    help="run the Flower contender (default, except with --quick)")
    fl.add_argument("--no-flower", dest="flower", action="store_false", help="skip the Flower contender")
    ap.add_argument("--paper-accuracy", type=float, default=0.90,
                    help="robust_dsgd's second threshold (SABLE states no MNIST number; default 0.90)")
    ap.add_argument("--fedavg-lr", type=float, default=0.1, help="FedAvg's local SGD learning rate")
    ap.add_argument("--clients", type=int, default=None, help="clients (default 100; --quick 10)")
    ap.add_argument("--byzantine", type=int, default=None, help="robust_dsgd's f (default 10; --quick 2)")
    ap.add_argument("--data", default=None, help="an mnist.pkl.gz (default: the file `make data` fetched)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flower-limit", type=float, default=3000.0, help="seconds the Flower run may take")
    ap.add_argument("--out", default="benchmarks/results/time_to_accuracy.json")
    ap.add_argument("--quick", action="store_true", help="smoke run on a tiny synthetic stand-in")
    a = ap.parse_args(argv)
    a.threads = a.threads or (1 if a.quick else 2)
    a.clients = a.clients or (10 if a.quick else 100)
    a.byzantine = a.byzantine if a.byzantine is not None else (2 if a.quick else 10)
    a.eval_every = _per_workload(a.eval_every, {"fedavg": 1, "robust_dsgd": 1} if a.quick else DEFAULT_EVAL_EVERY,
                                 "--eval-every")
    a.max_rounds = _per_workload(a.max_rounds, {w: 15 for w in WORKLOADS} if a.quick else DEFAULT_MAX_ROUNDS,
                                 "--max-rounds")
    if a.flower is None:
        a.flower = not a.quick
    if a.repeats < 1 or a.threads < 1 or not 2 * a.byzantine < a.clients:
        ap.error("--repeats and --threads must be >= 1, and 2 * --byzantine < --clients")
    return a


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import gzip  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedsafe import __version__ as fedsafe_version  # noqa: E402
from fedsafe.config import ExperimentConfig, validate  # noqa: E402
from fedsafe.engine.federation import Federation  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BATCH, BETA, WEIGHT_DECAY, ROBUST_LR, HIDDEN = 25, 0.99, 1e-4, 0.5, 100


# --- the workloads -------------------------------------------------------------------------------

def fedsafe_config(workload: str, *, clients: int, f: int, seed: int, data_path: str | None, eval_every: int,
                   fedavg_lr: float = 0.1) -> ExperimentConfig:
    data: dict[str, Any] = {"name": "mnist"}
    if data_path is not None:
        data["path"] = str(data_path)
    common = {"seed": seed, "rounds": 10**6, "eval_every": eval_every, "checkpoint_every": 0,
              "model": {"name": "mlp", "hidden": HIDDEN}}
    if workload == "fedavg":
        return validate({
            **common, "data": {**data, "partition": "iid"},
            "clients": {"num_clients": clients, "algorithm": "fedavg", "batch_size": BATCH, "lr": fedavg_lr,
                        "local_epochs": 1},
            "server": {"lr": 1.0}, "robust": {"rule": "mean"}, "attack": {"name": "none", "f": 0},
        })
    return validate({
        **common, "data": {**data, "partition": "dirichlet", "alpha": 1.0},
        "clients": {"num_clients": clients, "algorithm": "dsgd", "batch_size": BATCH, "momentum": BETA,
                    "weight_decay": WEIGHT_DECAY},
        "server": {"lr": ROBUST_LR}, "robust": {"rule": "trimmed_mean"}, "attack": {"name": "alie", "f": f},
    })


# --- the hand-written contender -----------------------------------------------------------------
# The model and FedAvg's local training, as a plain PyTorch user writes them. The same source is
# the Flower app's task module, so the Flower contender trains exactly as the hand-written loop.

TASK = '''"""The model and the local training of a plain PyTorch federated loop (MNIST, MLP 784-100-10)."""

import torch
from torch import nn
from torch.nn import functional as F


def make_model(in_features: int = 784, hidden: int = 100, classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def epoch_batches(indices: torch.Tensor, batch: int, epochs: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled minibatches of ``indices``, epoch by epoch."""
    out = []
    for _ in range(epochs):
        order = indices[torch.randperm(len(indices), generator=generator)]
        out += list(order.split(batch))
    return out


def local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches, lr: float) -> float:
    """Plain SGD over the given minibatches (index tensors into x, y); the last loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss = torch.zeros(())
    for idx in batches:
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
'''


def task_module() -> types.ModuleType:
    mod = types.ModuleType("tta_task")
    exec(compile(TASK, "<time_to_accuracy task>", "exec"), mod.__dict__)  # noqa: S102 -- our own source above
    return mod


TASK_MOD = task_module()
Batches = Callable[[int, int, int], list[torch.Tensor]]  # (round, client, steps) -> global index tensors


class HandWritten:
    """A plain torch loop over the clients, from fedsafe's initial weights, data and partition.

    ``batches(round, client, steps)``: the minibatches (global sample indices) a client uses in
    a round; by default what a user writes: ``randperm`` epochs (FedAvg) or the first B of a
    ``randperm`` (Robust-DSGD) from one generator. The tests pass fedsafe's draw instead, to
    compare the two round by round."""

    def __init__(self, workload: str, fed: Federation, *, batches: Batches | None = None, seed: int = 0) -> None:
        cfg = fed.cfg
        self.workload = workload
        data = fed.data
        self.x, self.y = data.x_train, data.y_train
        self.x_test, self.y_test = data.x_test, data.y_test
        self.parts = [torch.from_numpy(np.asarray(p, dtype=np.int64)) for p in data.client_indices]
        self.model = TASK_MOD.make_model(int(np.prod(data.input_shape)), cfg.model.hidden, data.num_classes)
        with torch.no_grad():  # fedsafe's initial weights (same shapes, same order)
            for p, q in zip(self.model.parameters(), fed.model.parameters(), strict=True):
                p.copy_(q)
        self.params = list(self.model.parameters())
        self.n = len(self.parts)
        self.f = cfg.attack.f
        self.byzantine = sorted(fed.byzantine)  # the same clients as fedsafe's run
        self.honest = [c for c in range(self.n) if c not in fed.byzantine]
        self.lr, self.batch, self.round_ = cfg.clients.lr, cfg.clients.batch_size, 0
        self.gen = torch.Generator().manual_seed(seed)
        self.batches = batches or self._user_batches
        if workload == "robust_dsgd":
            d = sum(p.numel() for p in self.params)
            self.momentum = torch.zeros(len(self.honest), d)
            self.beta, self.wd, self.server_lr = cfg.clients.momentum, cfg.clients.weight_decay, cfg.server.lr

    def _user_batches(self, round_: int, client: int, steps: int) -> list[torch.Tensor]:
        part = self.parts[client]
        if self.workload == "fedavg":
            return TASK_MOD.epoch_batches(part, self.batch, 1, self.gen)
        return [part[torch.randperm(len(part), generator=self.gen)[: self.batch]]]

    def run_round(self) -> None:
        self.round_ += 1
        if self.workload == "fedavg":
            self._fedavg_round()
        else:
            self._robust_round()

    def _fedavg_round(self) -> None:
        start = [p.detach().clone() for p in self.params]
        total = [torch.zeros_like(p) for p in self.params]
        for c, part in enumerate(self.parts):
            with torch.no_grad():
                for p, s in zip(self.params, start):
                    p.copy_(s)
            steps = -(-len(part) // self.batch)
            TASK_MOD.local_train(self.model, self.x, self.y, self.batches(self.round_, c, steps), self.lr)
            for t, p in zip(total, self.params):
                t += p.detach()
        with torch.no_grad():
            for p, t in zip(self.params, total):
                p.copy_(t / self.n)

    def _robust_round(self) -> None:
        w = torch.cat([p.detach().reshape(-1) for p in self.params])
        for i, c in enumerate(self.honest):
            (idx,) = self.batches(self.round_, c, 1)
            self.model.zero_grad()
            torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx]).backward()
            g = torch.cat([p.grad.reshape(-1) for p in self.params]) + self.wd * w
            self.momentum[i] = self.beta * self.momentum[i] + (1 - self.beta) * g
        honest = self.momentum
        if self.f:  # ALIE: mean + z * std of the honest vectors, z from n and f (Baruch et al.)
            s = self.n // 2 + 1 - self.f
            z = statistics.NormalDist().inv_cdf((self.n - s) / self.n)
            bad = honest.mean(0) + z * honest.std(0, unbiased=False)
            vectors = torch.cat([honest, bad.expand(self.f, -1)])
        else:
            vectors = honest
        # coordinate-wise trimmed mean: drop the f largest and f smallest of every coordinate
        agg = vectors.sort(dim=0).values[self.f : len(vectors) - self.f].mean(0)
        w = w - self.server_lr * agg
        with torch.no_grad():
            at = 0
            for p in self.params:
                p.copy_(w[at : at + p.numel()].view_as(p))
                at += p.numel()

    def accuracy(self) -> float:
        return TASK_MOD.accuracy(self.model, self.x_test, self.y_test)

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])


class FedsafeContender:
    """fedsafe's engine, round by round; accuracy from the round's own evaluation."""

    def __init__(self, fed: Federation) -> None:
        self.fed = fed
        self.last: float | None = None

    def run_round(self) -> None:
        self.last = self.fed.run_round()["test_accuracy"]

    def accuracy(self) -> float:
        return self.last


# --- timing ----------------------------------------------------------------------------------

class Tracker:
    """One contender's run: seconds per round, accuracies, and when each threshold was met."""

    def __init__(self, thresholds: list[float]) -> None:
        self.thresholds = thresholds
        self.seconds: list[float] = []
        self.accuracy: dict[int, float] = {}
        self.reached: dict[float, tuple[int, float]] = {}

    def record(self, round_: int, seconds: float, acc: float | None) -> None:
        self.seconds.append(seconds)
        if acc is None:
            return
        self.accuracy[round_] = acc
        for t in self.thresholds:
            if t not in self.reached and acc >= t:
                self.reached[t] = (round_, sum(self.seconds))

    @property
    def done(self) -> bool:
        return len(self.reached) == len(self.thresholds)

    def summary(self) -> dict[str, Any]:
        return {
            "rounds_run": len(self.seconds),
            "s_per_round": statistics.median(self.seconds) if self.seconds else None,
            "total_s": sum(self.seconds),
            "final_accuracy": self.accuracy[max(self.accuracy)] if self.accuracy else None,
            "best_accuracy": max(self.accuracy.values()) if self.accuracy else None,
            "thresholds": {
                f"{t:g}": ({"rounds": self.reached[t][0], "seconds": self.reached[t][1]} if t in self.reached
                           else None)
                for t in self.thresholds
            },
            "accuracy": {str(k): v for k, v in self.accuracy.items()},
        }


def thresholds_for(workload: str, args: argparse.Namespace) -> list[float]:
    if args.quick:
        return [0.5] if workload == "fedavg" else [0.5, 0.6]
    return [0.95] if workload == "fedavg" else sorted({args.paper_accuracy, 0.95})


def run_in_process(workload: str, args: argparse.Namespace, data_path: str | None) -> dict[str, dict[str, Any]]:
    """fedsafe and the hand-written loop, interleaved round by round, until both reach every
    threshold or the round cap."""
    every = args.eval_every[workload]
    t0 = time.perf_counter()
    fed = Federation(fedsafe_config(workload, clients=args.clients, f=args.byzantine, seed=args.seed,
                                    data_path=data_path, eval_every=every, fedavg_lr=args.fedavg_lr))
    setup = {"fedsafe": time.perf_counter() - t0}
    t0 = time.perf_counter()
    hand = HandWritten(workload, fed, seed=args.seed)
    setup["handwritten"] = time.perf_counter() - t0  # fedsafe's loaded data reused: no reading
    contenders = {"fedsafe": FedsafeContender(fed), "handwritten": hand}
    thresholds = thresholds_for(workload, args)
    track = {k: Tracker(thresholds) for k in contenders}
    names = list(contenders)
    load = [os.getloadavg()[0]]
    for r in range(1, args.max_rounds[workload] + 1):
        for k in names[r % 2 :] + names[: r % 2]:
            if track[k].done:
                continue
            t0 = time.perf_counter()
            contenders[k].run_round()
            acc = contenders[k].accuracy() if r % every == 0 else None
            track[k].record(r, time.perf_counter() - t0, acc)
        if r % max(1, args.max_rounds[workload] // 10) == 0:
            load.append(os.getloadavg()[0])
            print(f"#   {workload} round {r}: " + ", ".join(
                f"{k} {track[k].summary()['final_accuracy'] or 0:.4f} ({sum(track[k].seconds):.1f} s)"
                for k in names), flush=True)
        if all(t.done for t in track.values()):
            break
    load.append(os.getloadavg()[0])
    fed.close()
    out = {}
    for k in names:
        out[k] = {**track[k].summary(), "setup_s": setup[k], "loadavg": load}
    return out


# --- the Flower contender --------------------------------------------------------------------

PYPROJECT = '''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tta-flower"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["tta_flower"]

[tool.flwr.app]
publisher = "fedsafe"

[tool.flwr.app.components]
serverapp = "tta_flower.server_app:app"
clientapp = "tta_flower.client_app:app"

[tool.flwr.app.config]
num-rounds = 10
num-nodes = 2
data-dir = "data"
out-file = "times.json"
lr = 0.1
batch = 25
seed = 0
eval-every = 1
target = 0.95
'''

CLIENT_APP = '''"""A plain Flower ClientApp (Message API): this node's partition, one local epoch of SGD."""

from functools import lru_cache

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from tta_flower.task import epoch_batches, local_train, make_model

app = ClientApp()


@lru_cache(maxsize=None)
def partition(data_dir: str, pid: int):
    d = np.load(f"{data_dir}/part_{pid}.npz")
    return torch.from_numpy(d["x"]), torch.from_numpy(d["y"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    rc = context.run_config
    pid = int(context.node_config["partition-id"])
    x, y = partition(str(rc["data-dir"]), pid)
    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"])
    gen = torch.Generator().manual_seed(int(rc["seed"]) * 1_000_003 + rnd * 10_007 + pid)
    batches = epoch_batches(torch.arange(len(y)), int(rc["batch"]), 1, gen)
    loss = local_train(model, x, y, batches, float(rc["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)
'''

SERVER_APP = '''"""A plain Flower ServerApp: FedAvg over every node, the server evaluates on the test set and
stops training once the target accuracy is reached."""

import json
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from tta_flower.task import accuracy, make_model

app = ServerApp()


class FedAvgToTarget(FedAvg):
    """FedAvg that sends no more training once the target is met (the remaining rounds are empty)."""

    reached = False

    def configure_train(self, server_round, arrays, config, grid):
        return [] if self.reached else super().configure_train(server_round, arrays, config, grid)


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    n, every, target = int(rc["num-nodes"]), int(rc["eval-every"]), float(rc["target"])
    d = np.load(f"{rc['data-dir']}/test.npz")
    x, y = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])
    init = np.load(f"{rc['data-dir']}/init.npz")
    model = make_model()
    model.load_state_dict({k: torch.from_numpy(init[k]) for k in model.state_dict()})
    log = {"ends": [], "accuracy": []}
    strategy = FedAvgToTarget(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)

    def evaluate(server_round: int, arrays: ArrayRecord):
        if strategy.reached:
            return None
        acc = None
        if server_round % every == 0:
            model.load_state_dict(arrays.to_torch_state_dict())
            acc = accuracy(model, x, y)
            strategy.reached = server_round > 0 and acc >= target
        log["ends"].append(time.perf_counter())
        log["accuracy"].append(acc)
        with open(str(rc["out-file"]) + ".rounds", "a") as f:
            f.write(f"{server_round} {acc}\\n")
        return None if acc is None else MetricRecord({"accuracy": acc})

    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=int(rc["num-rounds"]),
                   evaluate_fn=evaluate)
    with open(str(rc["out-file"]), "w") as f:
        json.dump(log, f)
'''


def write_flower_app(root: Path, fed: Federation) -> Path:
    """The plain Flower app and its data (fedsafe's partition, test set and initial weights)."""
    app = root / "tta-flower"
    (app / "tta_flower").mkdir(parents=True, exist_ok=True)
    for name, text in {"pyproject.toml": PYPROJECT, "tta_flower/__init__.py": "", "tta_flower/task.py": TASK,
                       "tta_flower/client_app.py": CLIENT_APP, "tta_flower/server_app.py": SERVER_APP}.items():
        (app / name).write_text(text)
    data = root / "data"
    data.mkdir(exist_ok=True)
    x, y = fed.data.x_train.numpy(), fed.data.y_train.numpy()
    for pid, part in enumerate(fed.data.client_indices):
        np.savez(data / f"part_{pid}.npz", x=x[part], y=y[part])
    np.savez(data / "test.npz", x=fed.data.x_test.numpy(), y=fed.data.y_test.numpy())
    model = TASK_MOD.make_model(int(np.prod(fed.data.input_shape)), HIDDEN, fed.data.num_classes)
    keys = list(model.state_dict())
    np.savez(data / "init.npz", **{k: p.detach().numpy() for k, p in zip(keys, fed.model.parameters(), strict=True)})
    return app


def _deployment_class() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.flower.deployment import Deployment  # the tests' local deployment (127.0.0.1 only)

    return Deployment


def run_flower(workload: str, args: argparse.Namespace, data_path: str | None,
               rounds_hint: dict[float, int | None]) -> dict[str, Any]:
    every = args.eval_every[workload]
    thresholds = thresholds_for(workload, args)
    cap = args.flower_rounds or args.max_rounds[workload]
    fed = Federation(fedsafe_config(workload, clients=args.clients, f=args.byzantine, seed=args.seed,
                                    data_path=data_path, eval_every=every, fedavg_lr=args.fedavg_lr))
    Deployment = _deployment_class()
    with tempfile.TemporaryDirectory(prefix="fedsafe-tta-flower-") as tmp_name:
        tmp = Path(tmp_name)
        app = write_flower_app(tmp, fed)
        fed.close()
        del fed
        out = tmp / "times.json"
        dep = Deployment(tmp / "runtime", args.clients, simulation=True)
        load = [os.getloadavg()[0]]
        try:
            t0 = time.perf_counter()
            dep.start(timeout=120.0)
            run_id = dep.submit(
                app,
                f'num-rounds={cap} num-nodes={args.clients} data-dir="{tmp / "data"}" out-file="{out}" '
                f'lr={args.fedavg_lr} batch={BATCH} seed={args.seed} eval-every={every} target={max(thresholds)}',
                federation_config=f"num-supernodes={args.clients} client-resources-num-cpus=1 init-args-num-cpus=2",
            )
            status = dep.wait(run_id, args.flower_limit, done=out.is_file)
            wall = time.perf_counter() - t0
        finally:
            dep.close()
        load.append(os.getloadavg()[0])
        if status != "finished:completed" or not out.is_file():
            raise RuntimeError(f"the Flower run ended {status}: {dep.log('superlink')[-3000:]}")
        log = json.loads(out.read_text())
    ends = log["ends"]
    track = Tracker(thresholds)
    for r in range(1, len(ends)):
        track.record(r, ends[r] - ends[r - 1], log["accuracy"][r])
    res = {**track.summary(), "setup_s": wall - sum(track.seconds), "wall_s": wall, "loadavg": load,
           "initial_accuracy": log["accuracy"][0]}
    for t, hint in rounds_hint.items():
        key = f"{t:g}"
        if res["thresholds"][key] is None and hint is not None and res["s_per_round"]:
            res["thresholds"][key] = {"rounds": hint, "seconds": hint * res["s_per_round"], "extrapolated": True}
    return res


# --- the stand-in data -----------------------------------------------------------------------

def write_standin(path: Path, seed: int = 0, n_train: int = 1200, n_val: int = 200, n_test: int = 400) -> Path:
    """A tiny MNIST in mnist.pkl.gz's format (a gzipped protocol-2 pickle of three (float32 k/256
    images (n, 784), int64 labels) pairs): each class a random 28×28 template, samples the
    template plus noise, so that a model learns it in a few rounds."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, size=(10, 784))

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, size=n)
        x = np.clip(templates[y] + rng.normal(0, 90, size=(n, 784)), 0, 255).astype(np.uint8)
        return x.astype(np.float32) / np.float32(256), y.astype(np.int64)

    with gzip.open(path, "wb") as f:
        pickle.dump((part(n_train), part(n_val), part(n_test)), f, protocol=2)
    return path


# --- the report ------------------------------------------------------------------------------

def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'workload':<12} {'threshold':>9} {'contender':<12} {'rounds':>7} {'seconds':>9} {'s/round':>8} "
          f"{'setup s':>8} {'final acc':>9} {'fedsafe x':>10}")
    for r in rows:
        th = r["threshold"]
        mark = " (extrapolated)" if r.get("extrapolated") else ""
        print(f"{r['workload']:<12} {th:>9g} {r['contender']:<12} {_fmt(r['rounds'], 'd'):>7} "
              f"{_fmt(r['seconds'], '.1f'):>9} {_fmt(r['s_per_round'], '.3f'):>8} {_fmt(r['setup_s'], '.1f'):>8} "
              f"{_fmt(r['final_accuracy'], '.4f'):>9} {_fmt(r.get('fedsafe_over'), '.2f'):>10}{mark}", flush=True)


def table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, threshold, contender), medians over repeats; ``fedsafe_over``:
    fedsafe's seconds to the threshold over this contender's (fedsafe's own row: -)."""
    rows = []
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for res in results:
        by.setdefault((res["workload"], res["contender"]), []).append(res)
    for (workload, contender), runs in by.items():
        for key in runs[0]["thresholds"]:
            hits = [r["thresholds"][key] for r in runs if r["thresholds"][key] is not None]
            rows.append({
                "workload": workload, "threshold": float(key), "contender": contender,
                "rounds": int(statistics.median(h["rounds"] for h in hits)) if hits else None,
                "seconds": statistics.median(h["seconds"] for h in hits) if hits else None,
                "extrapolated": any(h.get("extrapolated") for h in hits),
                "reached": f"{len(hits)}/{len(runs)}",
                "s_per_round": statistics.median(r["s_per_round"] for r in runs if r["s_per_round"] is not None),
                "setup_s": statistics.median(r["setup_s"] for r in runs),
                "final_accuracy": statistics.median(r["final_accuracy"] for r in runs if r["final_accuracy"] is not None)
                if any(r["final_accuracy"] is not None for r in runs) else None,
            })
    base = {(r["workload"], r["threshold"]): r["seconds"] for r in rows if r["contender"] == "fedsafe"}
    for r in rows:
        b = base.get((r["workload"], r["threshold"]))
        if r["contender"] != "fedsafe" and b is not None and r["seconds"]:
            r["fedsafe_over"] = b / r["seconds"]
    order = {"fedsafe": 0, "handwritten": 1, "flower": 2}
    rows.sort(key=lambda r: (WORKLOADS.index(r["workload"]), r["threshold"], order[r["contender"]]))
    return rows


def main() -> None:
    args = ARGS
    torch.set_num_threads(args.threads)
    flower = args.flower and importlib.util.find_spec("flwr") is not None and importlib.util.find_spec("ray") is not None
    notes = []
    if args.flower and not flower:
        notes.append("flower skipped: Flower or Ray is not installed")
    print(f"# threads: torch {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}", flush=True)
    load_start = os.getloadavg()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedsafe-tta-") as tmp:
        data_path = args.data
        if args.quick and data_path is None:
            data_path = str(write_standin(Path(tmp) / "mnist.pkl.gz", args.seed))
        for rep in range(args.repeats):
            for workload in args.workloads:
                with_flower = flower and workload == "fedavg"
                hint: dict[float, int | None] = {}

                def pair() -> None:
                    t0 = time.perf_counter()
                    res = run_in_process(workload, args, data_path)
                    for k, r in res.items():
                        results.append({"workload": workload, "contender": k, "repeat": rep, **r})
                        print(f"# {workload} {k} (repeat {rep + 1}): {r['rounds_run']} rounds, "
                              f"{r['s_per_round']:.3f} s/round, thresholds {r['thresholds']}", flush=True)
                    for key, h in res["handwritten"]["thresholds"].items():
                        hint[float(key)] = None if h is None else h["rounds"]
                    print(f"#   in-process pair: {time.perf_counter() - t0:.0f} s wall", flush=True)

                def flwr_run() -> None:
                    r = run_flower(workload, args, data_path, hint)
                    results.append({"workload": workload, "contender": "flower", "repeat": rep, **r})
                    print(f"# {workload} flower (repeat {rep + 1}): {r['rounds_run']} rounds, "
                          f"{_fmt(r['s_per_round'], '.3f')} s/round, setup {r['setup_s']:.1f} s, "
                          f"thresholds {r['thresholds']}", flush=True)

                steps = [pair] + ([flwr_run] if with_flower else [])
                for step in steps if rep % 2 == 0 else steps[::-1]:
                    step()
    rows = table_rows(results)
    load_end = os.getloadavg()
    out = {
        "benchmark": "time_to_accuracy",
        "meta": {
            "python": platform.python_version(), "torch": torch.__version__, "fedsafe": fedsafe_version,
            "threads": args.threads, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(),
            "clients": args.clients, "byzantine": args.byzantine, "eval_every": args.eval_every,
            "max_rounds": args.max_rounds, "flower_rounds": args.flower_rounds, "repeats": args.repeats,
            "fedavg_lr": args.fedavg_lr, "paper_accuracy": args.paper_accuracy, "quick": args.quick,
            "data": "synthetic stand-in" if args.quick and args.data is None else (args.data or "mnist (fetched)"),
            "seed": args.seed, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_start": load_start,
            "loadavg_end": load_end,
        },
        "notes": notes + ["SABLE states no MNIST accuracy in its text (Figures 1, 3-7 plot it): the second "
                          "robust_dsgd threshold is --paper-accuracy"],
        "rows": rows,
        "runs": results,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print()
    print_table(rows)
    print(f"seconds: from round 1 to the evaluation that first reaches the threshold (evaluation every "
          f"{args.eval_every} rounds); fedsafe x: fedsafe's seconds over the contender's; {args.threads} torch threads, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load {load_start[0]:.1f} -> {load_end[0]:.1f}")
    for note in notes:
        print(note)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
