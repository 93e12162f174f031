"""A real Flower deployment: the suite starts a SuperLink and three SuperNodes as separate
processes on 127.0.0.1, submits the example app (examples/flower_app) with ``flwr run``, and
checks the run directory the ServerApp writes. One experiment, two variants: robust
aggregation under attack (checked against fedsafe's engine) and secure aggregation with one
SuperNode killed (SIGKILL) during its second round. Bounded in time; every process is ended
and every file is under pytest's tmp_path."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from fedsafe.config import load
from fedsafe.engine.run import run_experiment

from .deployment import Deployment

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"
EXPERIMENT = """
name = "deployed"
rounds = 2
seed = 5
eval_every = 1
[clients]
num_clients = 3
[variants.robust]
robust = { rule = "median" }
attack = { name = "alie", f = 1 }
[variants.secure]
protocol = "secagg"
"""
TIMEOUT = 30  # seconds the ServerApp waits for one exchange (a killed node costs one)
LIMIT = 420  # the whole deployment


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_deployed_robust_and_secure_aggregation_with_a_node_killed(tmp_path: Path) -> None:
    exp = tmp_path / "experiment.toml"
    exp.write_text(EXPERIMENT)
    out = tmp_path / "run"
    dep = Deployment(tmp_path / "flower", num_nodes=3)
    start = time.monotonic()
    try:
        dep.start()
        run_id = dep.submit(APP, f'fedsafe-config="{exp}" fedsafe-out="{out}" fedsafe-timeout={TIMEOUT}')
        killed_at = None
        status = dep.status(run_id)
        while not status.startswith("finished"):
            assert time.monotonic() - start < LIMIT, f"run still {status}: {dep.log('superlink')[-3000:]}"
            secure = _rows(out / "secure" / "metrics.jsonl")
            if killed_at is None and len(secure) == 1:
                # Round 2 has begun: its local work takes about as long as round 1's; kill a node
                # just after it, inside the secure-aggregation stages.
                time.sleep(secure[0]["client_work_seconds"] + 1.0)
                dep.kill_node(2)
                killed_at = 2
            time.sleep(1.0)
            status = dep.status(run_id)
        assert status == "finished:completed", dep.log("superlink")[-3000:]
    finally:
        dep.close()
    assert all(p.poll() is not None for p in dep.procs.values())

    robust = _rows(out / "robust" / "metrics.jsonl")
    assert [r["round"] for r in robust] == [1, 2] and not any("skipped" in r for r in robust)
    assert all(r["byzantine"] == 1 and r["dropouts"] == 0 for r in robust)
    # the same experiment in fedsafe's engine, one torch thread like the deployed ClientApps
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_experiment(load(exp, variants=["robust"]), tmp_path / "engine", overwrite=True, quiet=True)
    finally:
        torch.set_num_threads(threads)
    a, b = torch.load(out / "robust" / "model.pt"), torch.load(tmp_path / "engine" / "robust" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)

    secure = _rows(out / "secure" / "metrics.jsonl")
    assert killed_at == 2 and [r["round"] for r in secure] == [1, 2]
    assert secure[0]["secagg_survivors"] == 3.0 and secure[0]["dropouts"] == 0
    last = secure[1]
    assert "skipped" not in last, last
    lost = last["dropouts"] + last["secagg_dropouts"] + sum(v for k, v in last.items() if k.startswith("secagg_dropped_"))
    assert lost >= 1, last  # the killed node is missing from round 2, the round still completed
    assert last["test_accuracy"] > 0.1
