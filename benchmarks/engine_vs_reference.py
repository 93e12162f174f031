"""fedsafe's round against what a user would write instead, in one process, alternating.

Each cell trains N clients of one model with Robust-DSGD's client step (one minibatch gradient
at the global model, local momentum β = 0.9, no weight decay), the plain mean, and server SGD
(lr 0.1). Three implementations run the same round on the same data:

- ``fedsafe``: ``Federation.run_round()`` with the configured ``execution`` (no evaluation, no
  checkpoint, no attack): everything the engine does per round, bookkeeping included.
- ``vmap``: a hand-written ``torch.func`` round — ``vmap(grad_and_value(functional_call))``
  over a dict of parameters, momentum and mean per parameter tensor, ``torch.randint`` batches.
- ``loop``: a plain autograd loop — per client ``zero_grad``, ``backward``, momentum on the
  flattened gradient, then the mean.

The three are timed round by round in turn after warm-up rounds, so load from other processes
hits them alike, the order rotating every round (fedsafe, vmap, loop; vmap, loop, fedsafe; ...)
so that each follows each of the others equally often; at least 7 rounds each, and for fast
cells as many as fit in about a second of fedsafe rounds (at most 101), so that the median of
millisecond rounds is not one scheduler hiccup. The median per implementation is
reported, with ``fedsafe / min(vmap, loop)``, the figure the README quotes (target ≤ 1.25).

    python benchmarks/engine_vs_reference.py [--cells mlp100:10,100,1000,5000 ...]
        [--execution auto] [--rounds 7] [--warmup 2] [--threads 2] [--batch 25]
        [--out benchmarks/results/engine_vs_reference.json] [--quick]

Cells are ``MODEL:N,N,...`` with MODEL ``mlp100``, ``mlp1000`` (MLP 64-h-10 on 64 synthetic
features, 10 classes, ~100 samples per client) or ``cnn_fmnist`` (SABLE's Fashion-MNIST CNN,
431,080 parameters, on digits resized to 28×28). ``--quick`` (two tiny cells, 2 timed rounds,
1 thread) checks that the script runs; its ratios mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path

DEFAULT_CELLS = ("mlp100:10,100,1000,5000", "mlp1000:10,100,1000,5000", "cnn_fmnist:10,100,1000")
QUICK_CELLS = ("mlp100:4,8",)
BETA, SERVER_LR = 0.9, 0.1


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="+", default=None, help="MODEL:N,N,... (default: the README's grid)")
    ap.add_argument("--execution", default="auto", help="fedsafe's execution backend (default auto, fedsafe's default)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timed rounds per implementation (default: 7, more for fast cells, up to 101 or about "
                         "1 s of fedsafe rounds, so that a median of millisecond rounds is stable; --quick 2)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (vmap tracing, allocator)")
    ap.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads (default 2; --quick 1)")
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_vs_reference.json"))
    ap.add_argument("--quick", action="store_true", help="smoke run: two tiny cells, 2 rounds, 1 thread")
    a = ap.parse_args()
    a.cells = a.cells or list(QUICK_CELLS if a.quick else DEFAULT_CELLS)
    a.fixed_rounds = a.rounds is not None or a.quick
    a.rounds = a.rounds or (2 if a.quick else 7)
    a.threads = a.threads or (1 if a.quick else 2)
    return a


ARGS = _parse()
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call, grad_and_value, vmap  # noqa: E402

from fedsafe.config import validate  # noqa: E402
from fedsafe.engine.federation import Federation  # noqa: E402


def parse_cells(cells: list[str]) -> list[tuple[str, int]]:
    out = []
    for cell in cells:
        model, _, ns = cell.partition(":")
        if model not in ("mlp100", "mlp1000", "cnn_fmnist") or not ns:
            raise SystemExit(f"--cells {cell!r}: expected MODEL:N,N,... with MODEL mlp100, mlp1000 or cnn_fmnist")
        out += [(model, int(n)) for n in ns.split(",")]
    return out


def config(model: str, n: int, execution: str):
    if model == "cnn_fmnist":
        data, net = {"name": "digits", "resize": 28}, {"name": "cnn_fmnist"}
    else:
        data = {"name": "synthetic", "synthetic_dim": 64, "synthetic_classes": 10, "synthetic_samples": 100}
        net = {"name": "mlp", "hidden": int(model.removeprefix("mlp"))}
    return validate({
        "seed": ARGS.seed, "rounds": 10**6, "eval_every": 10**6, "checkpoint_every": 0, "execution": execution,
        "data": data, "model": net,
        "clients": {"num_clients": n, "algorithm": "dsgd", "batch_size": ARGS.batch, "momentum": BETA},
        "server": {"lr": SERVER_LR}, "robust": {"rule": "mean"}, "attack": {"name": "none", "f": 0},
    })


class VmapRound:
    """The hand-written torch.func round a user would write."""

    def __init__(self, model: torch.nn.Module, data) -> None:
        self.model = model
        self.x, self.y, self.parts = data.x_train, data.y_train, data.client_indices
        self.params = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        self.mom = {k: torch.zeros((len(self.parts), *v.shape)) for k, v in self.params.items()}
        self.gen = torch.Generator().manual_seed(ARGS.seed)
        self.sizes = torch.tensor([len(p) for p in self.parts])
        self.flat_index = torch.cat([torch.from_numpy(p) for p in self.parts])
        self.offsets = torch.cumsum(self.sizes, 0) - self.sizes

        def loss(p, x, y):
            return F.cross_entropy(functional_call(self.model, p, (x,)), y)

        self.grads = vmap(grad_and_value(loss), in_dims=(None, 0, 0))

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        pos = (torch.rand((len(self.parts), ARGS.batch), generator=self.gen) * self.sizes[:, None]).long()
        idx = self.flat_index[self.offsets[:, None] + pos]
        return self.x[idx], self.y[idx]

    def __call__(self) -> None:
        x, y = self.batch()
        g, _ = self.grads(self.params, x, y)
        for k, p in self.params.items():
            m = self.mom[k].mul_(BETA).add_(g[k], alpha=1 - BETA)
            p.sub_(m.mean(0), alpha=SERVER_LR)


class LoopRound:
    """A plain autograd loop over the clients."""

    def __init__(self, model: torch.nn.Module, data) -> None:
        self.model = model
        self.x, self.y, self.parts = data.x_train, data.y_train, data.client_indices
        self.d = sum(p.numel() for p in self.model.parameters())
        self.mom = torch.zeros(len(self.parts), self.d)
        self.gen = torch.Generator().manual_seed(ARGS.seed)

    def __call__(self) -> None:
        for i, part in enumerate(self.parts):
            idx = torch.from_numpy(part)[torch.randint(len(part), (ARGS.batch,), generator=self.gen)]
            self.model.zero_grad()
            F.cross_entropy(self.model(self.x[idx]), self.y[idx]).backward()
            g = torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])
            self.mom[i].mul_(BETA).add_(g, alpha=1 - BETA)
        step = self.mom.mean(0)
        with torch.no_grad():
            at = 0
            for p in self.model.parameters():
                p.sub_(step[at : at + p.numel()].view_as(p), alpha=SERVER_LR)
                at += p.numel()


def time_cell(model: str, n: int) -> dict:
    fed = Federation(config(model, n, ARGS.execution))
    # the references get their own copies of the initial model and fedsafe's data
    impls = {"fedsafe": fed.run_round, "vmap": VmapRound(copy.deepcopy(fed.model), fed.data),
             "loop": LoopRound(copy.deepcopy(fed.model), fed.data)}
    for _ in range(ARGS.warmup):
        for fn in impls.values():
            fn()
    rounds = ARGS.rounds
    if not ARGS.fixed_rounds:  # fast cells: more rounds, about 1 s of fedsafe's
        t0 = time.perf_counter()
        fed.run_round()
        rounds = int(min(101, max(rounds, 1.0 / max(time.perf_counter() - t0, 1e-6))))
    times: dict[str, list[float]] = {k: [] for k in impls}
    names = list(impls)
    for r in range(rounds):
        # the order rotates every round, so that each implementation follows each of the others
        # equally often (whatever ran before leaves the caches and the OpenMP threads in its state)
        for k in names[r % 3:] + names[: r % 3]:
            t0 = time.perf_counter()
            impls[k]()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    best_ref = min(med["vmap"], med["loop"])
    return {
        "model": model, "clients": n, "parameters": fed.state.params.numel(),
        "fedsafe_ms": med["fedsafe"], "vmap_ms": med["vmap"], "loop_ms": med["loop"],
        "ratio_to_best_reference": med["fedsafe"] / best_ref, "target": 1.25,
        "pass": med["fedsafe"] / best_ref <= 1.25, "timed_rounds": rounds,
    }


def main() -> None:
    torch.set_num_threads(ARGS.threads)
    load_start = os.getloadavg()
    rows = [time_cell(model, n) for model, n in parse_cells(ARGS.cells)]
    result = {
        "benchmark": "engine_vs_reference", "execution": ARGS.execution, "threads": ARGS.threads,
        "batch": ARGS.batch, "min_timed_rounds": ARGS.rounds, "quick": ARGS.quick,
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "torch": torch.__version__, "python": platform.python_version(), "cells": rows,
    }
    ARGS.out.parent.mkdir(parents=True, exist_ok=True)
    ARGS.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'model':<11}{'N':>6}{'params':>9}{'fedsafe ms':>12}{'vmap ms':>10}{'loop ms':>10}{'fedsafe/best':>14}")
    for r in rows:
        print(f"{r['model']:<11}{r['clients']:>6}{r['parameters']:>9}{r['fedsafe_ms']:>12.1f}{r['vmap_ms']:>10.1f}"
              f"{r['loop_ms']:>10.1f}{r['ratio_to_best_reference']:>13.2f}x{'' if r['pass'] else '  (> 1.25)'}")
    print(f"execution={ARGS.execution}, {ARGS.threads} threads, load {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}"
          f"  -> {ARGS.out}")


if __name__ == "__main__":
    main()
