"""The Python API (fedsafe.api): configs in every form, a user's own model, data and loss,
callbacks, records, saved models, and registration that works from TOML and the command.

The reference for "your own model / your own data" is fedsafe's own path: the same module and
the same arrays given through the API must train exactly as the config-built run does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import fedsafe
from fedsafe.config import validate
from fedsafe.core.errors import ConfigError
from fedsafe.core.streams import torch_stream
from fedsafe.data import load_federated
from fedsafe.engine.federation import Federation
from fedsafe.models import build_model, flatten_params

BASE = {
    "rounds": 3, "seed": 1, "eval_every": 1, "checkpoint_every": 0,
    "data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 16},
    "clients": {"num_clients": 8, "batch_size": 16},
}


def _builtin(cfg_raw=BASE):
    """The config's own dataset and model, as fedsafe builds them."""
    cfg = validate(cfg_raw)
    data = load_federated(cfg.data, cfg.clients.num_clients, cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes, generator=torch_stream(cfg.seed, "model.init"))
    return cfg, data, model


def _params(result) -> torch.Tensor:
    return result.federation.state.params


# --- configs --------------------------------------------------------------------------------


def test_config_forms_agree(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(validate(BASE).to_toml())
    forms = [
        fedsafe.Experiment(BASE).config,
        fedsafe.Experiment(path).config,
        fedsafe.Experiment(str(path)).config,
        fedsafe.Experiment(validate(BASE)).config,
        fedsafe.Experiment(**BASE).config,
        fedsafe.Experiment({"rounds": 3, "seed": 1}, eval_every=1, checkpoint_every=0, data={"name": "digits"},
                           model={"name": "mlp"}, clients={"num_clients": 8, "batch_size": 16},
                           overrides={"model.hidden": 16}).config,
    ]
    assert all(f == forms[0] for f in forms)
    # sections merge key by key: the file's other model keys survive
    assert fedsafe.Experiment(path, model={"activation": "hardswish"}).config.model.hidden == 16


def test_config_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="robust.rule"):
        fedsafe.Experiment(BASE, robust={"rule": "no_such_rule"})
    with pytest.raises(ConfigError, match="no such TOML file"):
        fedsafe.Experiment(tmp_path / "missing.toml")
    with pytest.raises(TypeError, match="config must be"):
        fedsafe.Experiment(42)


def test_variants_must_be_chosen():
    raw = {**BASE, "variants": {"median": {"robust.rule": "median"}}}
    with pytest.raises(ConfigError, match="variant='NAME'"):
        fedsafe.Experiment(raw)
    assert fedsafe.Experiment(raw, variant="median").config.robust.rule == "median"
    assert fedsafe.Experiment(raw, variant="base").config.robust.rule == "mean"
    with pytest.raises(ConfigError, match="unknown variant 'median2'; valid: base, median"):
        fedsafe.Experiment(raw, variant="median2")
    with pytest.raises(ConfigError, match="no \\[variants\\]"):
        fedsafe.Experiment(BASE, variant="x")


# --- your own model, data and loss ------------------------------------------------------------


def test_own_model_and_arrays_train_exactly_as_the_config_run():
    cfg, data, model = _builtin()
    want = fedsafe.Experiment(BASE).run()
    got = fedsafe.Experiment(
        BASE, model=model, data=(data.x_train.numpy(), data.y_train.numpy()),
        test_data=(data.x_test, data.y_test), client_indices=data.client_indices,
    ).run()
    assert torch.equal(_params(got), _params(want))
    assert [r["test_accuracy"] for r in got.rows] == [r["test_accuracy"] for r in want.rows]
    assert model.training and not torch.equal(next(model.parameters()).flatten(), _params(got)[:16])  # not modified


def test_own_split_sets_num_clients_and_partitioners_apply():
    _, data, _ = _builtin()
    exp = fedsafe.Experiment({"rounds": 1}, data=(data.x_train, data.y_train), test_data=(data.x_test, data.y_test),
                             client_indices=data.client_indices[:5] + [np.concatenate(data.client_indices[5:])])
    assert exp.config.clients.num_clients == 6 and exp.data.num_clients == 6
    # without a split, the config's partition draws the clients (Dirichlet here)
    x = torch.randn(300, 5)
    y = torch.arange(300) % 3
    exp = fedsafe.Experiment({"rounds": 1, "data": {"partition": "dirichlet", "alpha": 0.1}}, data=(x, y),
                             clients={"num_clients": 6})
    sizes = sorted(len(c) for c in exp.data.client_indices)
    assert exp.data.num_clients == 6 and sum(sizes) == exp.data.x_train.shape[0]
    assert exp.data.x_test.shape[0] == 60  # the stratified 20% held out
    with pytest.raises(ConfigError, match="num_clients = 3 but the dataset"):
        fedsafe.Experiment(
            {"rounds": 1, "clients": {"num_clients": 3}},
            data=fedsafe.federated_data((x, y), num_clients=4),
        ).run()


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def test_torch_dataset_and_arrays_give_the_same_data():
    x, y = torch.randn(120, 2, 3), torch.arange(120) % 4
    a = fedsafe.federated_data((x, y), num_clients=5, seed=3)
    b = fedsafe.federated_data(_Pairs(x, y), num_clients=5, seed=3)
    c = fedsafe.federated_data((x.numpy().astype(np.float64), y.numpy().astype(np.int32)), num_clients=5, seed=3)
    for other in (b, c):
        assert torch.equal(a.x_train, other.x_train) and torch.equal(a.y_test, other.y_test)
        assert all(np.array_equal(p, q) for p, q in zip(a.client_indices, other.client_indices))
    assert a.input_shape == (2, 3) and a.num_classes == 4


def test_hugging_face_dataset_from_local_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    x = np.random.default_rng(0).normal(size=(80, 6)).astype(np.float32)
    y = np.arange(80) % 2
    rows = [{"features": list(map(float, r)), "label": int(c)} for r, c in zip(x, y)]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ds = datasets.load_dataset("json", data_files={"train": str(path), "test": str(path)})
    fd = fedsafe.federated_data(ds, num_clients=4)
    np.testing.assert_allclose(fd.x_train.numpy(), x, rtol=1e-6)
    assert fd.y_test.tolist() == y.tolist()
    with pytest.raises(ValueError, match="no label column 'target'"):
        fedsafe.federated_data(ds["train"], num_clients=4, label="target")


@pytest.mark.parametrize(
    "data, message",
    [
        ((torch.randn(10, 3), torch.randn(10)), "labels must be integers"),
        ((torch.randn(10, 3), -torch.ones(10, dtype=torch.long)), "labels must be >= 0"),
        ((torch.randn(10, 3), torch.zeros(9, dtype=torch.long)), "with 9 samples \\(one per label\\), got \\(10, 3\\)"),
        ((torch.full((10, 3), float("nan")), torch.arange(10) % 2), "NaN"),
        ("not data", "expected \\(x, y\\)"),
    ],
)
def test_bad_data_is_refused_clearly(data, message):
    with pytest.raises((ValueError, TypeError), match=message):
        fedsafe.federated_data(data, num_clients=2)
    with pytest.raises(ConfigError, match=message):
        fedsafe.Experiment({"rounds": 1, "clients": {"num_clients": 2}}, data=data)


class _WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(64)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.bn(x.flatten(1)))


def _frozen():
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    net[1].bias.requires_grad_(False)
    return net


@pytest.mark.parametrize(
    "model, message",
    [
        (_WithBatchNorm(), "BatchNorm1d with running statistics"),
        (_frozen(), "requires_grad=False"),
        (nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).double(), "float64"),
        (nn.Sequential(nn.Flatten(), nn.Linear(64, 7)), r"logits of shape \(batch, 10\)"),
        (nn.Sequential(nn.Linear(5, 10)), "fails on a batch of inputs of shape"),
        (nn.ReLU(), "no parameters"),
        ("a model", "must be a torch.nn.Module"),
    ],
)
def test_models_fedsafe_cannot_train_are_refused(model, message):
    with pytest.raises(ConfigError, match=message):
        fedsafe.Experiment(BASE, model=model)


def test_batchnorm_without_running_stats_is_accepted():
    net = nn.Sequential(nn.Flatten(), nn.BatchNorm1d(64, track_running_stats=False), nn.Linear(64, 10))
    result = fedsafe.Experiment(BASE, rounds=1, model=net).run()
    assert result.rows[0]["test_accuracy"] is not None


class _Normed(nn.Module):
    """Layers fedsafe draws itself (Conv, GroupNorm, Linear) and one it resets through its own
    reset_parameters() (LayerNorm with elementwise affine, PReLU)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm(4 * 6 * 6)
        self.act = nn.PReLU()
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(self.act(self.ln(self.norm(self.conv(x)).flatten(1))))


class _RawParam(nn.Module):
    """A parameter set directly on the module: nothing can re-draw it."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 10) * 0.1)

    def forward(self, x):
        return x.flatten(1) @ self.w


@pytest.mark.parametrize("make", [_Normed, lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(),
                                                                  nn.Linear(16, 10))])
def test_seed_sets_a_users_module_initial_weights(make):
    raw = {**BASE, "rounds": 1}
    torch.manual_seed(123)
    first = fedsafe.Experiment(raw, model=make()).run()
    torch.manual_seed(456)  # torch's global RNG elsewhere: the module is built with other weights
    net = make()
    state = torch.get_rng_state()
    second = fedsafe.Experiment(raw, model=net).run()
    assert torch.equal(_params(first), _params(second))
    assert torch.equal(torch.get_rng_state(), state)  # the seeded draws leave the global RNG alone
    other_seed = fedsafe.Experiment({**raw, "seed": 2}, model=net).run()
    assert not torch.equal(_params(other_seed)[:40], _params(second)[:40])
    # model_init="module" is the module's own weights: they follow torch's global RNG
    torch.manual_seed(123)
    own_a = fedsafe.Experiment(raw, model=make(), model_init="module").run()
    torch.manual_seed(456)
    own_b = fedsafe.Experiment(raw, model=make(), model_init="module").run()
    assert not torch.equal(_params(own_a), _params(own_b))


def test_seeded_user_module_starts_from_the_builtin_models_weights():
    cfg, _, builtin = _builtin()
    torch.manual_seed(99)
    user = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))  # the mlp's layout
    fed = fedsafe.Experiment(BASE, model=user).federation()
    torch.testing.assert_close(fed.state.params, flatten_params(builtin), rtol=0, atol=0)
    assert not torch.equal(flatten_params(user), flatten_params(builtin))  # the caller's module is untouched


def test_a_module_fedsafe_cannot_initialise_keeps_its_weights_and_says_so():
    torch.manual_seed(0)
    net = _RawParam()
    with pytest.warns(UserWarning, match=r"cannot initialise the model \(_RawParam\).*torch.manual_seed"):
        exp = fedsafe.Experiment(BASE, model=net)
    assert exp.model_init == "module"
    torch.testing.assert_close(exp.federation().state.params, flatten_params(net), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fedsafe.Experiment(BASE, model=net, model_init="module")  # said explicitly: no warning
    with pytest.raises(ConfigError, match="model_init: must be 'seed' or 'module'"):
        fedsafe.Experiment(BASE, model=net, model_init="random")


def test_own_loss():
    cfg, data, model = _builtin()
    # cross-entropy passed as a user loss is the default exactly
    plain = fedsafe.Experiment(BASE).run()
    same = fedsafe.Experiment(BASE, loss=lambda z, y: nn.functional.cross_entropy(z, y)).run()
    def untimed(rows):  # the test loss: a sum of batch means instead of one sum, equal to rounding
        return [{k: v for k, v in r.items() if not k.endswith("seconds") and k != "test_loss"} for r in rows]

    assert torch.equal(_params(plain), _params(same)) and untimed(plain.rows) == untimed(same.rows)
    assert [r["test_loss"] for r in same.rows] == pytest.approx([r["test_loss"] for r in plain.rows], rel=1e-6)

    def smooth(z, y):
        return nn.functional.cross_entropy(z, y, label_smoothing=0.2)

    serial = fedsafe.Experiment(BASE, loss=smooth, execution="serial").run()
    vector = fedsafe.Experiment(BASE, loss=smooth, execution="vectorized").run()
    torch.testing.assert_close(_params(serial), _params(vector), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(_params(serial), _params(plain))
    # the reported test loss is the user's loss on the test set (its batch mean)
    fed = serial.federation
    with torch.no_grad():
        logits = serial.model(fed.data.x_test)
    assert serial.rows[-1]["test_loss"] == pytest.approx(float(smooth(logits, fed.data.y_test)), rel=1e-5)
    with pytest.raises(ConfigError, match="loss: must be a function"):
        fedsafe.Experiment(BASE, loss="mse")


# --- callbacks, records, saved models -----------------------------------------------------------


def test_callbacks_records_and_pandas():
    seen, closed = [], []

    class Counter:
        def __call__(self, row):
            seen.append(row["round"])

        def close(self):
            closed.append(True)

    result = fedsafe.Experiment(BASE).run(callbacks=[Counter()])
    assert seen == [1, 2, 3] and closed == [True]
    assert result.summary["rounds"] == 3 and len(result.rows) == 3
    pd = pytest.importorskip("pandas")
    df = result.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df["round"]) == [1, 2, 3]
    assert df["test_accuracy"].tolist() == [r["test_accuracy"] for r in result.rows]
    with pytest.raises(TypeError, match="not callable"):
        fedsafe.Experiment(BASE).run(callbacks=["print"])


def test_tensorboard_logs_every_numeric_metric(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = fedsafe.Experiment(BASE).run(callbacks=[fedsafe.TensorBoard(tmp_path / "tb")])
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    events = acc.Scalars("test_accuracy")
    assert [e.step for e in events] == [1, 2, 3]
    assert [e.value for e in events] == pytest.approx([r["test_accuracy"] for r in result.rows])
    assert "train_loss" in acc.Tags()["scalars"] and "round" not in acc.Tags()["scalars"]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.norm(self.conv(x))).flatten(1))


def test_save_and_load_a_custom_model(tmp_path):
    torch.manual_seed(0)
    result = fedsafe.Experiment(BASE, model=_Net()).run()
    result.save_model(tmp_path / "m")
    loaded = fedsafe.load_model(tmp_path / "m", model=_Net())
    x = result.federation.data.x_test[:5]
    torch.testing.assert_close(loaded(x), result.model(x), rtol=0, atol=0)
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["model"] == {"custom": f"{_Net.__module__}._Net"}
    with pytest.raises(ValueError, match="pass an instance of it"):
        fedsafe.load_model(tmp_path / "m")
    with pytest.raises(ValueError, match="does not match the saved weights"):
        fedsafe.load_model(tmp_path / "m", model=nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))


def test_run_directory_and_resume_with_a_custom_model(tmp_path, interrupted_then_resumed):
    raw = {**BASE, "rounds": 4, "checkpoint_every": 2}
    torch.manual_seed(0)
    net = _Net()
    whole = fedsafe.Experiment(raw, model=net).run(tmp_path / "whole")
    for name in ("config.toml", "metrics.jsonl", "summary.json", "model.pt", "model.json", "checkpoint.pt"):
        assert (tmp_path / "whole" / name).is_file(), name
    # a run stopped after its round-2 checkpoint, then resumed, ends where the whole one does
    cut = tmp_path / "cut"
    resumed = interrupted_then_resumed(lambda: fedsafe.Experiment(raw, model=net), cut)
    assert torch.equal(_params(resumed), _params(whole))
    assert [r["round"] for r in resumed.rows] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="already finished"):
        fedsafe.Experiment(raw, model=net).run(cut, resume=True)
    with pytest.raises(ValueError, match="resume needs the out_dir"):
        fedsafe.Experiment(raw).run(resume=True)


# --- every subsystem on a user's module ---------------------------------------------------------

SUBSYSTEMS = {
    "robust+attack": {"robust": {"rule": "multi_krum", "pre": ["nnm"]}, "attack": {"name": "alie", "f": 2}},
    "dp+audit": {
        "clients": {"algorithm": "fedavg", "local_steps": 1, "lr": 0.5},
        "dp": {"enabled": True, "clip": 1.0, "noise_multiplier": 0.5, "delta": 1e-5},
        "audit": {"canaries": 8, "unobserved": 8},
    },
    "secagg+distributed dp": {
        "protocol": "secagg", "clients": {"algorithm": "fedavg", "local_steps": 1, "lr": 0.5},
        "dp": {"enabled": True, "placement": "distributed", "clip": 1.0, "noise_multiplier": 0.5, "delta": 1e-5},
    },
    "he (SABLE emulator)": {"protocol": "he", "he": {"backend": "emulator"}, "robust": {"rule": "trimmed_mean"},
                            "attack": {"name": "alie", "f": 1}},
    "tee": {"protocol": "tee", "tee": {"processes": False}, "robust": {"rule": "multi_krum"},
            "attack": {"name": "alie", "f": 1}},
    "zeroth order": {"clients": {"gradient": "zeroth_order"}, "zo": {"k": 8, "sigma": 1e-3}},
    "inherent (DP from secure aggregation)": {
        "clients": {"algorithm": "inherent"}, "data": {"test_fraction": 0.1},
        "inherent": {"row": "gsgd+wf_na", "clip": 10.0, "batch_size": 32, "sigma2": 0.01, "max_records": 40},
    },
}


@pytest.mark.parametrize("name", list(SUBSYSTEMS))
def test_every_subsystem_runs_a_users_module_as_its_own(name):
    # seeded noise, so the two runs draw the same noise and can be compared bit for bit
    raw = fedsafe.Experiment(BASE, rounds=2, secure_randomness=False, **SUBSYSTEMS[name]).config.model_dump(
        mode="python", exclude_none=True
    )
    _, _, model = _builtin(raw)
    want = fedsafe.Experiment(raw).run()
    got = fedsafe.Experiment(raw, model=model).run()
    assert torch.equal(_params(got), _params(want)), name
    if name == "dp+audit":
        assert got.summary["epsilon"] == want.summary["epsilon"] > 0


def test_protocol_refusals_hold_for_a_users_module():
    tiny = nn.Sequential(nn.Flatten(), nn.Linear(64, 2, bias=False), nn.Linear(2, 10, bias=False))  # d = 148
    raw = {**BASE, "clients": {"num_clients": 200, "batch_size": 4}, "protocol": "tee", "robust": {"rule": "krum"},
           "tee": {"processes": False}}
    with pytest.raises(ConfigError, match="protocol"):
        fedsafe.Experiment(raw, model=tiny).run()


# --- registration ------------------------------------------------------------------------------


@pytest.fixture
def registered():
    """Names registered by a test, removed afterwards (registries are process-wide)."""
    from fedsafe.data.config import DATASETS
    from fedsafe.robust.aggregators import AGGREGATORS
    from fedsafe.robust.attacks import ATTACKS, LABEL_TRANSFORMS

    before = {r: set(r.names()) for r in (AGGREGATORS, ATTACKS, DATASETS)}
    yield
    for r, names in before.items():
        for extra in set(r.names()) - names:
            r.unregister(extra)
            LABEL_TRANSFORMS.pop(extra, None)


def test_register_rule_works_from_toml_and_is_checked(tmp_path, registered):
    @fedsafe.register_rule("halfway_median")
    def halfway_median(updates, *, f, weight=0.5):
        """halfway between the mean and the coordinate median"""
        return weight * updates.median(dim=0).values + (1 - weight) * updates.mean(dim=0)

    path = tmp_path / "exp.toml"
    path.write_text('[robust]\nrule = "halfway_median"\nparams = { weight = 0.0 }\n')
    mine = fedsafe.Experiment(path, **BASE).run()  # 0 · median + 1 · mean: the mean, exactly
    mean = fedsafe.Experiment(BASE, robust={"rule": "mean"}).run()
    assert torch.equal(_params(mine), _params(mean))
    assert not torch.equal(_params(fedsafe.Experiment(path, **BASE, robust={"params": {"weight": 1.0}}).run()), _params(mean))
    with pytest.raises(ConfigError, match="unknown parameter"):
        fedsafe.Experiment(BASE, robust={"rule": "halfway_median", "params": {"wieght": 1}})
    with pytest.raises(ValueError, match="already registered; pass replace=True"):
        fedsafe.register_rule("halfway_median", halfway_median)
    fedsafe.register_rule("halfway_median", halfway_median, replace=True)
    with pytest.raises(ValueError, match="built in"):
        fedsafe.register_rule("median", halfway_median, replace=True)
    with pytest.raises(TypeError, match="keyword-only parameter 'f'"):
        fedsafe.register_rule("bad", lambda updates: updates.mean(0))


def test_register_attack_with_and_without_data_poisoning(registered):
    @fedsafe.register_attack("sign_flip_x")
    def sign_flip_x(honest, *, ctx, scale=1.0):
        return (-scale * honest.mean(dim=0)).expand(ctx.f, -1).clone()

    want = fedsafe.Experiment(BASE, attack={"name": "sign_flip", "f": 2}).run()
    got = fedsafe.Experiment(BASE, attack={"name": "sign_flip_x", "f": 2}).run()
    torch.testing.assert_close(_params(got), _params(want))

    fedsafe.register_attack("own_flip", lambda honest, *, ctx: ctx.own_updates,
                            label_transform=lambda y, c: (c - 1) - y)
    want = fedsafe.Experiment(BASE, attack={"name": "label_flip", "f": 2}).run()
    got = fedsafe.Experiment(BASE, attack={"name": "own_flip", "f": 2}).run()
    assert torch.equal(_params(got), _params(want))


def test_register_dataset_from_toml_with_params(tmp_path, registered):
    x = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)

    @fedsafe.register_dataset("blobs")
    def blobs(*, seed, shift=3.0):
        """two Gaussian blobs"""
        y = np.arange(200) % 2
        return x + shift * y[:, None], y

    path = tmp_path / "exp.toml"
    path.write_text('rounds = 10\n[data]\nname = "blobs"\nparams = { shift = 5.0 }\npartition = "dirichlet"\n'
                    '[clients]\nnum_clients = 4\n')
    exp = fedsafe.Experiment(path)
    ref = fedsafe.federated_data((x + 5.0 * (np.arange(200) % 2)[:, None], np.arange(200) % 2), num_clients=4,
                                 partition_name="dirichlet", partition_params={"alpha": 0.5})
    assert torch.equal(exp.data.x_train, ref.x_train)
    assert all(np.array_equal(a, b) for a, b in zip(exp.data.client_indices, ref.client_indices))
    assert exp.run().summary["final_accuracy"] > 0.9
    with pytest.raises(ConfigError, match="unknown parameter"):
        fedsafe.Experiment(path, data={"params": {"shfit": 1}})
    with pytest.raises(ConfigError, match="data.params applies to datasets registered"):
        fedsafe.Experiment(BASE, data={"params": {"a": 1}})
    with pytest.raises(ValueError, match="already registered"):
        fedsafe.register_dataset("digits", blobs)
    with pytest.raises(TypeError, match="keyword-only"):
        fedsafe.register_dataset("bad", lambda seed, n: None)


def test_command_imports_the_module_that_registers(tmp_path):
    (tmp_path / "my_rules.py").write_text(textwrap.dedent('''
        import fedsafe

        @fedsafe.register_rule("first_row")
        def first_row(updates, *, f):
            """the first client's update"""
            return updates[0].clone()
    '''))
    (tmp_path / "exp.toml").write_text(
        'name = "mine"\nrounds = 2\n[clients]\nnum_clients = 4\n[robust]\nrule = "first_row"\n'
    )
    cmd = [sys.executable, "-m", "fedsafe"]
    res = subprocess.run([*cmd, "--import", "my_rules", "run", "exp.toml", "--out", "out", "-q"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["pipeline"] == "first_row"
    res = subprocess.run([*cmd, "run", "exp.toml", "--out", "out2", "-q"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "first_row" in res.stderr and "unknown" in res.stderr
    res = subprocess.run([*cmd, "--import", "no_such_module", "list", "rules"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 2 and "--import no_such_module: ModuleNotFoundError" in res.stderr


def test_sweep_over_a_registered_rule(tmp_path, registered):
    fedsafe.register_rule("first_row", lambda updates, *, f: updates[0].clone())
    records = fedsafe.sweep(BASE, {"robust.rule": ["mean", "first_row"]}, tmp_path / "sweep", rounds=1)
    assert [r["robust.rule"] for r in records] == ["mean", "first_row"]
    assert all(r["final_accuracy"] is not None for r in records)
    assert (tmp_path / "sweep" / "sweep.csv").is_file()
    with pytest.raises(ValueError, match="non-empty lists"):
        fedsafe.sweep(BASE, {"robust.rule": "mean"}, tmp_path / "s2")


def test_top_level_names_resolve():
    for name in fedsafe.__all__:
        assert getattr(fedsafe, name) is not None, name
    assert fedsafe.Federation is Federation
