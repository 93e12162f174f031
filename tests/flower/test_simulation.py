"""The same experiment through Flower's own simulation runtime (``flwr.simulation``, Ray
actors as SuperNodes, messages serialized as in a deployment) gives the model fedsafe's engine
gives for the same seed: plain, robust under attack, DP with the noise drawn on the nodes from
a fixed seed, and secure aggregation with distributed DP. One simulation runs them all as
variants (Ray starts once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsafe.config import validate
from fedsafe.engine.run import run_experiment

pytest.importorskip("ray", reason="Flower's simulation runtime needs Ray (fedsafe[flower])")

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
    from flwr.simulation import run_simulation

    from fedsafe.flower import client_app, server_app

    cfg = validate(CONFIG)
    run_simulation(
        server_app(config=cfg, out_dir=tmp_path / "flower"), client_app(noise_seed="experiment"), num_supernodes=4,
        backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2, "include_dashboard": False}},
    )
    # Ray runs each SuperNode's ClientApp with one torch thread; the engine runs with the same, as
    # float32 sums in a multi-threaded matmul may be ordered differently.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    finally:
        torch.set_num_threads(threads)
    for name in CONFIG["variants"]:
        a = torch.load(tmp_path / "flower" / name / "model.pt")
        b = torch.load(tmp_path / "engine" / name / "model.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), name
        ra = [json.loads(x) for x in (tmp_path / "flower" / name / "metrics.jsonl").read_text().splitlines()]
        rb = [json.loads(x) for x in (tmp_path / "engine" / name / "metrics.jsonl").read_text().splitlines()]
        for key in ("test_loss", "train_loss", "epsilon", "secagg_survivors"):
            assert [r.get(key) for r in ra] == [r.get(key) for r in rb], (name, key)
    assert json.loads((tmp_path / "flower" / "secagg_dp" / "summary.json").read_text())["execution"] == "flower"
