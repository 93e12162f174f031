"""DP-SGD's hook path (``per_example_clipped_sums(method="hooks")``: per-layer norms and clipped
sums from the layers' inputs and output gradients) against the vmap path (``method="vmap"``:
per-example ``vmap(grad)``, the independent reference, itself tested against a naive loop in
test_dpsgd.py) on linear and convolutional models, and the ``auto`` method's fallbacks."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsafe.core.randomness import RandomSource
from fedsafe.models import ParamLayout, build_model, flatten_params
from fedsafe.models.config import ModelConfig
from fedsafe.privacy.dp import dpsgd

SHAPES = {"logreg": (1, 8, 8), "mlp": (1, 8, 8), "cnn_fmnist": (1, 16, 16), "lenet": (1, 8, 8)}


def _model(name, **kw):
    model = build_model(ModelConfig(name=name, hidden=kw.pop("hidden", 16), **kw), SHAPES[name], 10,
                        generator=torch.Generator().manual_seed(0))
    return model, ParamLayout.from_model(model)


def _data(shape, e, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(e, *shape, generator=g), torch.randint(0, 10, (e,), generator=g)


def _both(model, layout, params, x, y, owner, n, clip, **kw):
    ref = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, n, clip, method="vmap", **kw)
    got = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, n, clip, method="hooks", **kw)
    return got, ref


def _close(got, ref):
    sums, norms, losses = got
    torch.testing.assert_close(norms, ref[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sums, ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, ref[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn_fmnist", "lenet"])
@pytest.mark.parametrize("shared", [True, False])
def test_hooks_equal_vmap(name, shared):
    model, layout = _model(name)
    assert dpsgd.hook_layers(model, layout) is not None
    x, y = _data(SHAPES[name], 13)
    owner = torch.tensor([2, 0, 0, 1, 2, 2, 0, 1, 1, 0, 2, 1, 0])  # not grouped: the path sorts
    g = torch.Generator().manual_seed(5)
    base = flatten_params(model)
    params = base if shared else base + 0.05 * torch.randn(3, layout.dim, generator=g)
    _, norms, _ = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 3, 1.0, method="vmap")
    clip = float(norms.median())  # about half the examples clipped
    got, ref = _both(model, layout, params, x, y, owner, 3, clip)
    _close(got, ref)
    factors = dpsgd.clip_factors(got[1], clip)
    assert (factors < 1).any() and (factors == 1).any()  # both regimes exercised


def test_hooks_clip_factors_every_example_clipped_and_none():
    model, layout = _model("cnn_fmnist")
    x, y = _data(SHAPES["cnn_fmnist"], 6)
    owner = torch.zeros(6, dtype=torch.long)
    params = flatten_params(model)
    for clip in (1e-4, 1e4):  # all clipped; none clipped (the plain sum of gradients)
        got, ref = _both(model, layout, params, x, y, owner, 1, clip)
        _close(got, ref)
    grads, _ = dpsgd.per_example_gradients(model, layout, params, x, y)
    torch.testing.assert_close(got[0][0], grads.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "cnn_fmnist"])
def test_hooks_batch_of_one_and_empty(name):
    model, layout = _model(name)
    params = flatten_params(model)
    x, y = _data(SHAPES[name], 1)
    _close(*_both(model, layout, params, x, y, torch.tensor([1]), 2, 0.3))
    x0, y0 = x[:0], y[:0]
    sums, norms, losses = dpsgd.per_example_clipped_sums(model, layout, params, x0, y0, torch.zeros(0, dtype=torch.long),
                                                         2, 0.3, method="hooks")
    assert sums.shape == (2, layout.dim) and not sums.any()
    assert norms.shape == (0,) and losses.shape == (0,)


def test_hooks_examples_with_zero_gradient():
    # a loss whose gradient vanishes for label-0 examples: norm 0, factor 1, nothing added
    def crit(logits, labels):
        return (logits.square().sum(dim=1) * (labels != 0)).mean()

    model, layout = _model("cnn_fmnist")
    x, y = _data(SHAPES["cnn_fmnist"], 8)
    y[::2] = 0
    owner = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    got, ref = _both(model, layout, flatten_params(model), x, y, owner, 2, 0.5, criterion=crit)
    _close(got, ref)
    assert (got[1][::2] == 0).all() and (got[1][1::2] > 0).all()
    assert (dpsgd.clip_factors(got[1][::2], 0.5) == 1).all()
    # only zero-gradient examples: zero sums
    got, _ = _both(model, layout, flatten_params(model), x[::2], y[::2], owner[::2], 2, 0.5, criterion=crit)
    assert not got[0].any()


def test_hooks_custom_criterion_and_chunks():
    def crit(logits, labels):  # a mean-reduced loss other than plain cross-entropy
        return F.cross_entropy(logits, labels, label_smoothing=0.2) + 0.1 * logits.square().mean()

    model, layout = _model("mlp")
    x, y = _data(SHAPES["mlp"], 21)
    owner = torch.arange(21) % 4
    params = flatten_params(model)
    whole = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 4, 0.2, criterion=crit, method="vmap")
    old = dpsgd._HOOK_FIRST_CHUNK
    try:
        dpsgd._HOOK_FIRST_CHUNK = 5  # chunks of 5, then sized from what a chunk held (here: all the rest)
        chunked = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 4, 0.2, criterion=crit,
                                                 method="hooks", chunk_bytes=4 * 40 * 30)
    finally:
        dpsgd._HOOK_FIRST_CHUNK = old
    _close(chunked, whole)


def test_hooks_linear_on_sequences():
    # nn.Linear on (E, T, in): per-example gradients summed over positions, not an outer product
    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 6)
            self.b = nn.Linear(6 * 8, 10)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x.reshape(x.shape[0], 8, 8))).flatten(1))

    torch.manual_seed(0)
    model = Seq()
    layout = ParamLayout.from_model(model)
    x, y = _data((1, 8, 8), 9)
    _close(*_both(model, layout, flatten_params(model), x, y, torch.arange(9) % 2, 2, 0.4))


def test_hooks_follow_in_place_activations():
    # ReLU(inplace=True) rewrites the first layer's output: its gradient is still the output's
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(inplace=True), nn.Linear(32, 10))
    layout = ParamLayout.from_model(model)
    x, y = _data((1, 8, 8), 7)
    _close(*_both(model, layout, flatten_params(model), x, y, torch.tensor([0, 1, 0, 1, 1, 0, 0]), 2, 0.5))


def test_models_the_hook_path_does_not_cover_use_vmap():
    model, layout = _model("lenet", norm="group")  # GroupNorm parameters
    assert dpsgd.hook_layers(model, layout) is None
    x, y = _data(SHAPES["lenet"], 4)
    owner = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="use method 'vmap'"):
        dpsgd.per_example_clipped_sums(model, layout, flatten_params(model), x, y, owner, 1, 1.0, method="hooks")
    auto = dpsgd.per_example_clipped_sums(model, layout, flatten_params(model), x, y, owner, 1, 1.0)
    ref = dpsgd.per_example_clipped_sums(model, layout, flatten_params(model), x, y, owner, 1, 1.0, method="vmap")
    for a, b in zip(auto, ref):
        assert torch.equal(a, b)


class _Mixing(nn.Module):
    """Linear layers only, but the forward centres the batch: example e's output depends on the
    others, so the summed losses' output gradient row e is not example e's own gradient."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        h = x.flatten(1)
        return self.fc(h - h.mean(dim=0, keepdim=True))


class _Twice(nn.Module):
    """One layer applied twice: its weight gradient is not one outer product per example."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x.flatten(1))))))


@pytest.mark.parametrize("cls", [_Mixing, _Twice])
def test_auto_checks_the_model_once_and_falls_back_to_vmap(cls):
    torch.manual_seed(0)
    model = cls()
    layout = ParamLayout.from_model(model)
    assert dpsgd.hook_layers(model, layout) is not None  # the module tree looks covered ...
    x, y = _data((1, 8, 8), 6)
    owner = torch.zeros(6, dtype=torch.long)
    params = flatten_params(model)
    ref = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 1, 0.5, method="vmap")
    auto = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 1, 0.5)
    assert dpsgd._HOOK_CHECKED[model] is False  # ... but the check sees it is not
    for a, b in zip(auto, ref):
        assert torch.equal(a, b)
    if cls is _Mixing:  # what the check prevents: norms that are not the examples' own
        got = dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 1, 0.5, method="hooks")
        assert not torch.allclose(got[1], ref[1], rtol=1e-3)
    else:
        with pytest.raises(ValueError, match="called twice"):
            dpsgd.per_example_clipped_sums(model, layout, params, x, y, owner, 1, 0.5, method="hooks")


def test_auto_uses_hooks_on_fedsafe_models():
    model, layout = _model("mlp")
    x, y = _data(SHAPES["mlp"], 5)
    dpsgd.per_example_clipped_sums(model, layout, flatten_params(model), x, y, torch.zeros(5, dtype=torch.long), 1, 1.0)
    assert dpsgd._HOOK_CHECKED[model] is True


class _Work:
    def __init__(self, model, layout, x, y, sizes):
        ends = np.cumsum(sizes)
        idx = [np.arange(e - s, e) for s, e in zip(sizes, ends)]
        self.data = type("D", (), {"x_train": x, "y_train": y, "client_indices": idx})()
        self.backend = type("Backend", (), {"model": model, "layout": layout, "loss_fn": None})()


@pytest.mark.parametrize("name", ["mlp", "cnn_fmnist"])
def test_oracle_step_is_the_same_with_either_path(name):
    # same seeded record sample and noise: the released gradients agree to float rounding
    model, layout = _model(name)
    sizes = [30, 12, 20]
    x, y = _data(SHAPES[name], sum(sizes))
    settings = dpsgd.DPSGDSettings(clip=0.5, z=1.1, batch_size=8)
    out = {}
    for method in ("hooks", "vmap"):
        oracle = dpsgd.DPSGDClients(settings, RandomSource.seeded(3), sizes, method=method)
        g = torch.Generator().manual_seed(2)
        rows = flatten_params(model) + 0.01 * torch.randn(3, layout.dim, generator=g)
        out[method] = oracle(_Work(model, layout, x, y, sizes), 1, 2, rows, np.array([0, 1, 2]))
        assert oracle.take_clipped_fraction() is not None
    torch.testing.assert_close(out["hooks"][0], out["vmap"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["hooks"][1], out["vmap"][1], rtol=1e-5, atol=1e-6)
