"""The same experiment through Flower's own simulation runtime (Ray actors as SuperNodes,
messages serialized as in a deployment) gives the model fedsafe's engine gives for the same
seed: plain, robust under attack, DP with the noise drawn on the nodes from a fixed seed, and
secure aggregation with distributed DP. One simulation runs them all as variants (Ray starts
once).

The simulation is started the way Flower 1.42 runs one (``flwr.simulation.run_simulation`` is
deprecated): a SuperLink in simulation mode on 127.0.0.1, and ``flwr run examples/flower_app
<connection> --federation-config "num-supernodes=4 ..."`` submitting the shipped app, its
experiment a TOML file given in the run config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsafe.config import validate
from fedsafe.engine.run import run_experiment

from .deployment import Deployment

pytest.importorskip("ray", reason="Flower's simulation runtime needs Ray (fedsafe[flower])")

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"
LIMIT = 600  # seconds for the whole simulation (Ray's start-up included)
CONFIG = {
    "rounds": 2, "clients": {"num_clients": 4}, "execution": "serial", "seed": 11, "eval_every": 1,
    "secure_randomness": False,  # the server's DP noise and sample seeded too: the runs must be equal
    "variants": {
        "plain": {},
        "robust": {"robust": {"rule": "trimmed_mean", "pre": ["nnm"]}, "attack": {"name": "alie", "f": 1}},
        "dp_local": {"dp": {"enabled": True, "placement": "local", "noise_multiplier": 0.7, "clip": 1.0}},
        "secagg_dp": {"protocol": "secagg",
                      "dp": {"enabled": True, "placement": "distributed", "noise_multiplier": 0.7, "clip": 1.0}},
    },
}


def test_flower_simulation_equals_fedsafe_engine(tmp_path: Path) -> None:
    cfg = validate(CONFIG)
    exp = tmp_path / "experiment.toml"
    exp.write_text(cfg.to_toml())
    out = tmp_path / "flower"
    # OMP_NUM_THREADS=1 (set for every process of the deployment): the ServerApp and each
    # ClientApp run with one torch thread, as the engine below does; float32 sums in a
    # multi-threaded matmul may be ordered differently.
    dep = Deployment(tmp_path / "runtime", num_nodes=4, simulation=True)
    try:
        dep.start()
        run_id = dep.submit(
            APP, f'fedsafe-config="{exp}" fedsafe-out="{out}"',  # the nodes follow secure_randomness = false
            federation_config="num-supernodes=4 client-resources-num-cpus=1 init-args-num-cpus=2",
        )
        status = dep.wait(run_id, LIMIT)
        assert status == "finished:completed", dep.log("superlink")[-3000:]
    finally:
        dep.close()
    assert all(p.poll() is not None for p in dep.procs.values())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    finally:
        torch.set_num_threads(threads)
    for name in CONFIG["variants"]:
        a = torch.load(out / name / "model.pt")
        b = torch.load(tmp_path / "engine" / name / "model.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), name
        ra = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        rb = [json.loads(x) for x in (tmp_path / "engine" / name / "metrics.jsonl").read_text().splitlines()]
        for key in ("test_loss", "train_loss", "epsilon", "secagg_survivors"):
            assert [r.get(key) for r in ra] == [r.get(key) for r in rb], (name, key)
    assert json.loads((out / "secagg_dp" / "summary.json").read_text())["execution"] == "flower"
