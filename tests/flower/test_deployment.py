"""A real Flower deployment, started with the README's own commands: the suite reads the shell
commands of the README's "Flower deployment" section (``readme.py``), starts the SuperLink and
one SuperNode per client as separate processes on 127.0.0.1 (free ports; everything else as
written), runs the README's ``flwr run`` and ``fedsafe`` commands verbatim, and then submits the
example app (examples/flower_app) once more with an experiment of two variants: robust
aggregation under attack (checked against fedsafe's engine) and secure aggregation with one
SuperNode killed (SIGKILL) during its second round. Bounded in time; every process is ended
and every file is under pytest's tmp_path."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch

from fedsafe.config import load
from fedsafe.engine.run import run_experiment

from . import readme
from .deployment import CONNECTION, Deployment

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "flower_app"
EXPERIMENT = """
name = "deployed"
rounds = 2
seed = 5
eval_every = 1
[clients]
num_clients = {n}
[variants.robust]
robust = {{ rule = "median" }}
attack = {{ name = "alie", f = 1 }}
[variants.secure]
protocol = "secagg"
"""
LIMIT = 600  # seconds for one run


def exchange_timeout(readme_rounds: list[dict]) -> float:
    """Seconds the ServerApp waits for one exchange (a killed node costs one): twice the slowest
    train exchange of the README's run (a secure-aggregation stage costs less), so that a loaded
    machine does not turn slow nodes into dropouts, and within [30, 120]."""
    slowest = max((r["client_work_seconds"] for r in readme_rounds), default=10.0)
    return min(120.0, max(30.0, 2 * slowest))


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_readme_deployment_then_robust_and_secure_aggregation_with_a_node_killed(tmp_path: Path) -> None:
    cmds = readme.flower_commands(readme.README.read_text())
    n = cmds.num_nodes
    dep = Deployment(tmp_path / "flower", num_nodes=n)
    dep.env.update(cmds.env)  # the README's exports
    link, nodes, connection = readme.localize(cmds, dep.port, dep.node_ports)
    with open(dep.home / "config.toml", "a") as f:  # the README's connection, next to the test's own
        f.write("\n" + connection)
    exp = tmp_path / "experiment.toml"
    exp.write_text(EXPERIMENT.format(n=n))
    out = tmp_path / "run"
    measured: list[dict] = []
    try:
        dep.start(superlink=link, supernodes=nodes)

        # The README's commands, as written: the runs from the repository, fedsafe on the server.
        for cmd in cmds.runs:
            r = dep.cli(cmd.argv, cwd=REPO, timeout=LIMIT)
            assert r.returncode == 0, f"{' '.join(cmd.argv)}:\n{r.stdout}\n{r.stderr}"
            rc = readme.run_config(cmd)[1]
            rounds = _rows(dep.dir / rc["fedsafe-out"] / "metrics.jsonl")
            if cmd.follows:  # fedsafe flower run: it returned when the run completed, its rounds streamed
                assert f"round {len(rounds)}/{len(rounds)}" in r.stdout and "finished:completed" in r.stderr, r.stdout
            else:
                run_id = int(re.search(r"started run (\d+)", r.stdout).group(1))
                status = dep.wait(run_id, LIMIT)
                assert status == "finished:completed", f"{' '.join(cmd.argv)}: {status}\n{dep.log('superlink')[-3000:]}"
                rounds = _rows(dep.dir / rc["fedsafe-out"] / "metrics.jsonl")
            assert rounds and not any("skipped" in r for r in rounds), rounds
            measured += rounds
        for cmd in cmds.after:
            r = dep.cli(cmd.argv, cwd=dep.dir)
            assert r.returncode == 0, f"{' '.join(cmd.argv)}:\n{r.stdout}\n{r.stderr}"

        # A run the ServerApp refuses: flwr run would return 0; fedsafe flower run exits 1 and shows why.
        r = dep.cli(["fedsafe", "flower", "run", str(APP), CONNECTION, "--run-config", 'fedsafe-set="robust.rule=krum"',
                     "--every", "1"], cwd=REPO, timeout=LIMIT)
        assert r.returncode == 1 and "krum requires n >= 2f + 3" in r.stdout, f"{r.stdout}\n{r.stderr}"
        assert "finished:failed" in r.stderr

        # Robust aggregation against the engine, and secure aggregation losing a node.
        timeout = exchange_timeout(measured)
        run_id = dep.submit(APP, f'fedsafe-config="{exp}" fedsafe-out="{out}" fedsafe-timeout={timeout:.0f}')
        killed_at = None

        def kill_in_round_2() -> None:
            nonlocal killed_at
            secure = _rows(out / "secure" / "metrics.jsonl")
            if killed_at is None and len(secure) == 1:
                # Round 2 has begun: its local work takes about as long as round 1's; kill a node
                # just after it, inside the secure-aggregation stages.
                time.sleep(secure[0]["client_work_seconds"] + 1.0)
                dep.kill_node(n - 1)
                killed_at = 2

        status = dep.wait(run_id, LIMIT, poll=kill_in_round_2)
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
    assert secure[0]["secagg_survivors"] == float(n) and secure[0]["dropouts"] == 0
    last = secure[1]
    assert "skipped" not in last, last
    lost = last["dropouts"] + last["secagg_dropouts"] + sum(v for k, v in last.items() if k.startswith("secagg_dropped_"))
    assert lost >= 1, last  # the killed node is missing from round 2, the round still completed
    assert last["test_accuracy"] > 0.1
