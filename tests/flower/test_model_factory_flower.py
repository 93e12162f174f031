"""Your own model in fedsafe's Flower app, named in the experiment's TOML: ``model.name =
"package.module:Factory"`` is imported by module path on the server and on every node (the
nodes validate the TOML they receive again), so ``server_app()``/``client_app()`` need no
``model=`` objects; the run over Flower is the engine's, bit for bit."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch

from fedsafe.config import validate
from fedsafe.engine.run import run_experiment
from fedsafe.flower import client_app, run_over_flower

from .fakegrid import FakeGrid

FACTORY = '''
from torch import nn


class Factory(nn.Module):
    def __init__(self, cfg, input_shape, num_classes):
        super().__init__()
        d = 1
        for s in input_shape:
            d *= s
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(d, 12), nn.LayerNorm(12), nn.Tanh(), nn.Linear(12, num_classes))

    def forward(self, x):
        return self.net(x)
'''


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    name = f"fedsafe_test_flower_factory_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_factory_named_in_toml_runs_over_flower_as_in_the_engine(factory_module: str, tmp_path: Path) -> None:
    cfg = validate({
        "rounds": 2, "seed": 7, "eval_every": 1, "execution": "serial", "clients": {"num_clients": 3},
        "model": {"name": f"{factory_module}:Factory"},
        "robust": {"rule": "median"}, "attack": {"name": "alie", "f": 1},
    })
    grid = FakeGrid(client_app(), 3)
    run_over_flower(cfg, grid, tmp_path / "flower", timeout=5, wait=5)
    run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    a, b = torch.load(tmp_path / "flower" / "model.pt"), torch.load(tmp_path / "engine" / "model.pt")
    assert "net.2.weight" in a  # the LayerNorm: the factory's model, not a built-in one
    assert all(torch.equal(a[k], b[k]) for k in a)
    # every node built the factory's model itself, from the TOML it was sent
    assert any(f'name = "{factory_module}:Factory"' in m.content["fedsafe"]["config"] for m in grid.sent
               if m.metadata.message_type == "train.fedsafe")
