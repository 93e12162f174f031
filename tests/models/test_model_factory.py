"""Your own model named in a config: ``model.name = "package.module:Factory"`` (imported by module
path, so TOML, ``fedsafe run`` and every process that builds the model can name it) and
``fedsafe.register_model``. A factory ``(cfg, input_shape, num_classes) -> nn.Module`` named in
TOML trains exactly what ``fedsafe.Experiment(model=Factory(cfg, input_shape, num_classes))``
trains; a name that is not a model fails at validation with an error naming ``model.name``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import tomli_w
import torch

import fedsafe
from fedsafe.config import ConfigError, load, validate
from fedsafe.engine.run import run_experiment
from fedsafe.models import MODELS, build_model
from fedsafe.models.config import ModelConfig

FACTORY = '''
from torch import nn


class Factory(nn.Module):
    """A small MLP with a LayerNorm (a layer fedsafe draws through its own reset_parameters)."""

    def __init__(self, cfg, input_shape, num_classes):
        super().__init__()
        d = 1
        for s in input_shape:
            d *= s
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(d, 16), nn.LayerNorm(16), nn.ReLU(),
                                 nn.Linear(16, num_classes))

    def forward(self, x):
        return self.net(x)


def not_a_module(cfg, input_shape, num_classes):
    return "no"


NOT_CALLABLE = 3
'''
CFG = {"rounds": 2, "seed": 4, "eval_every": 1, "execution": "serial",
       "clients": {"num_clients": 4}, "data": {"name": "digits"}}


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module on sys.path holding ``Factory``; its name, unique to the test."""
    name = f"fedsafe_test_factory_{uuid.uuid4().hex[:8]}"
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / f"{name}.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    yield name
    sys.modules.pop(name, None)


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_toml_factory_trains_what_experiment_with_the_module_trains(factory_module: str, tmp_path: Path) -> None:
    toml = tmp_path / "exp.toml"
    toml.write_text(tomli_w.dumps({**CFG, "model": {"name": f"{factory_module}:Factory"}}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_experiment(load(toml), tmp_path / "toml", overwrite=True, quiet=True)
        module = sys.modules[factory_module]
        fedsafe.Experiment(CFG, model=module.Factory(ModelConfig(), (1, 8, 8), 10)).run(tmp_path / "api")
    finally:
        torch.set_num_threads(threads)
    a, b = torch.load(tmp_path / "toml" / "model.pt"), torch.load(tmp_path / "api" / "model.pt")
    assert list(a) == ["net.1.weight", "net.1.bias", "net.2.weight", "net.2.bias", "net.4.weight", "net.4.bias"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    keys = ("train_loss", "test_loss", "test_accuracy")
    assert [[r[k] for k in keys] for r in _rows(tmp_path / "toml")] == [[r[k] for k in keys] for r in _rows(tmp_path / "api")]
    # the run's model.json names the factory, so the trained model can be rebuilt by name
    meta = json.loads((tmp_path / "toml" / "model.json").read_text())
    assert meta["model"]["name"] == f"{factory_module}:Factory"
    rebuilt = fedsafe.load_model(tmp_path / "toml")
    assert all(torch.equal(p, a[k]) for k, p in rebuilt.state_dict().items())


def test_factory_weights_follow_the_seed_and_leave_torch_rng_alone(factory_module: str) -> None:
    cfg = ModelConfig(name=f"{factory_module}:Factory")
    state = torch.random.get_rng_state()
    m1 = build_model(cfg, (1, 8, 8), 10, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(123)  # the global RNG's state does not matter
    m2 = build_model(cfg, (1, 8, 8), 10, generator=torch.Generator().manual_seed(1))
    m3 = build_model(cfg, (1, 8, 8), 10, generator=torch.Generator().manual_seed(2))
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    assert not torch.equal(m1.net[1].weight, m3.net[1].weight)


@pytest.mark.parametrize(("name", "match"), [
    ("fedsafe_no_such_module_x:Factory", r"model\.name = 'fedsafe_no_such_module_x:Factory': cannot import module "
                                         r"'fedsafe_no_such_module_x' \(ModuleNotFoundError"),
    ("{mod}:Missing", r"model\.name = '{mod}:Missing': module '{mod}' has no attribute 'Missing'"),
    ("{mod}:NOT_CALLABLE", r"model\.name = '{mod}:NOT_CALLABLE': expected a factory \(cfg, input_shape, num_classes\)"),
    (":Factory", r"model\.name = ':Factory': write your factory as 'package\.module:Factory'"),
    ("resnet", r"model\.name = 'resnet': no such model; built in or registered: cnn_cifar, cnn_fmnist, lenet, logreg, mlp"),
])
def test_a_name_that_is_not_a_model_fails_at_validation_naming_model_name(
    factory_module: str, name: str, match: str,
) -> None:
    name, match = name.format(mod=factory_module), match.format(mod=factory_module)
    with pytest.raises(ConfigError) as err:
        validate({**CFG, "model": {"name": name}})
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("model.name = ")
    assert re.match(match, err.value.problems[0]), err.value.problems[0]


def test_a_factory_that_returns_no_module_fails_naming_model_name(factory_module: str) -> None:
    cfg = ModelConfig(name=f"{factory_module}:not_a_module")  # importable and callable: valid until built
    with pytest.raises(ValueError, match=rf"model\.name = '{factory_module}:not_a_module': model must be a torch\.nn\.Module"):
        build_model(cfg, (1, 8, 8), 10)


def test_the_command_line_takes_a_factory_and_names_model_name_for_a_bad_one(
    factory_module: str, tmp_path: Path,
) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text(tomli_w.dumps({**CFG, "rounds": 1}))
    common = [sys.executable, "-m", "fedsafe", "run", str(exp), "--out"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkgs"), "OMP_NUM_THREADS": "1"}
    ok = subprocess.run([*common, str(tmp_path / "cli"), "--set", f"model.name={factory_module}:Factory"],
                        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads((tmp_path / "cli" / "model.json").read_text())["model"]["name"] == f"{factory_module}:Factory"
    bad = subprocess.run([*common, str(tmp_path / "bad"), "--set", f"model.name={factory_module}:Nope"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0
    assert f"model.name = '{factory_module}:Nope': module '{factory_module}' has no attribute 'Nope'" in bad.stderr + bad.stdout


def test_register_model(factory_module: str) -> None:
    module = sys.modules.get(factory_module) or __import__(factory_module)
    name = f"tiny_{factory_module}"
    try:
        assert fedsafe.register_model(name)(module.Factory) is module.Factory
        assert validate({**CFG, "model": {"name": name}}).model.name == name
        assert isinstance(build_model(ModelConfig(name=name), (1, 8, 8), 10), module.Factory)
        with pytest.raises(ValueError, match="already registered; pass replace=True"):
            fedsafe.register_model(name, module.Factory)
        fedsafe.register_model(name, module.Factory, replace=True)
        with pytest.raises(ValueError, match="'mlp' is built in"):
            fedsafe.register_model("mlp", module.Factory, replace=True)
        with pytest.raises(ValueError, match="without ':'"):
            fedsafe.register_model("a:b", module.Factory)
        with pytest.raises(TypeError, match=r"must take \(cfg, input_shape, num_classes\)"):
            fedsafe.register_model("two_args", lambda cfg, shape: None)
    finally:
        if name in MODELS:
            MODELS.unregister(name)
