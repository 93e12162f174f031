"""The run config's ``fedsafe-noise-seed`` on the nodes (the shipped app's default is empty): empty
follows the experiment's ``secure_randomness`` (false: the nodes' DP noise is the engine's, so
a run is reproducible), ``"secret"`` overrides it, anything else is refused by every node."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fedsafe.config import validate
from fedsafe.engine.run import run_experiment
from fedsafe.flower import client_app, run_over_flower

from .fakegrid import FakeGrid

CFG = {"rounds": 2, "clients": {"num_clients": 3}, "execution": "serial", "seed": 9, "eval_every": 1,
       "secure_randomness": False,
       "dp": {"enabled": True, "placement": "local", "noise_multiplier": 0.5, "clip": 1.0}}


def _model(path: Path) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in torch.load(path / "model.pt").values()])


def test_an_empty_noise_seed_follows_secure_randomness(tmp_path: Path) -> None:
    cfg = validate(CFG)
    run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    for name, value in (("empty", ""), ("secret", "secret")):
        grid = FakeGrid(client_app(), 3, run_config={"fedsafe-noise-seed": value})
        run_over_flower(cfg, grid, tmp_path / name, timeout=5, wait=5)
    assert torch.equal(_model(tmp_path / "empty"), _model(tmp_path / "engine"))
    assert not torch.equal(_model(tmp_path / "secret"), _model(tmp_path / "engine"))


def test_an_unknown_noise_seed_in_the_run_config_is_refused(tmp_path: Path) -> None:
    grid = FakeGrid(client_app(), 3, run_config={"fedsafe-noise-seed": "zero"})
    run_over_flower(validate({**CFG, "rounds": 1}), grid, tmp_path, timeout=5, wait=5)
    errors = [r.error.reason for r in grid.replies if r.has_error()]
    assert len(errors) == 3 and all("run config fedsafe-noise-seed = 'zero': valid: secret, experiment" in e for e in errors)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert "skipped" in row and row["dropouts"] == 3  # every node refused: nothing was trained
