"""fedsafe.models: parameter counts against the papers, shapes, errors, flat-parameter round
trips under functional_call / vmap, and generator-driven initialisation."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from fedsafe.models import (
    MODELS,
    ModelConfig,
    ParamLayout,
    build_model,
    count_parameters,
    flatten_params,
    init_parameters,
)

MNIST = (1, 28, 28)
DIGITS = (1, 8, 8)
CIFAR = (3, 32, 32)
SYNTH = (60,)

# (name, input shape) pairs each model must accept.
VALID = [
    ("logreg", DIGITS), ("logreg", MNIST), ("logreg", CIFAR), ("logreg", SYNTH),
    ("mlp", DIGITS), ("mlp", MNIST), ("mlp", CIFAR), ("mlp", SYNTH),
    ("cnn_fmnist", MNIST), ("cnn_fmnist", CIFAR),
    ("cnn_cifar", MNIST), ("cnn_cifar", CIFAR),
    ("lenet", DIGITS), ("lenet", MNIST), ("lenet", CIFAR),
]


def linear(i: int, o: int) -> int:
    return i * o + o


def conv(i: int, o: int, k: int = 5) -> int:
    return i * o * k * k + o


# ---------------------------------------------------------------- parameter counts

def test_mlp_matches_sable_model_1() -> None:
    m = build_model(ModelConfig(name="mlp", hidden=100), MNIST, 10)
    assert count_parameters(m) == 79_510 == linear(784, 100) + linear(100, 10)


def test_cnn_fmnist_matches_sable_model_2() -> None:
    m = build_model(ModelConfig(name="cnn_fmnist"), MNIST, 10)
    assert count_parameters(m) == 431_080
    assert count_parameters(m) == conv(1, 20) + conv(20, 50) + linear(800, 500) + linear(500, 10)


def test_cnn_cifar_matches_sable_model_3() -> None:
    m = build_model(ModelConfig(name="cnn_cifar"), CIFAR, 10)
    assert count_parameters(m) == 712_854
    assert count_parameters(m) == (
        conv(3, 20) + conv(20, 200) + linear(5000, 120) + linear(120, 84) + linear(84, 10)
    )


@pytest.mark.parametrize("shape", [DIGITS, MNIST])
def test_lenet_count_on_mnist_channels(shape: tuple[int, ...]) -> None:
    # Global average pooling makes the count independent of the image size.
    expected = conv(1, 16) + conv(16, 64) + linear(64, 10)
    assert expected == 26_730  # BAFFLE reports ~2.7e4 for its LeNet
    m = build_model(ModelConfig(name="lenet"), shape, 10)
    assert count_parameters(m) == expected
    g = build_model(ModelConfig(name="lenet", norm="group", groups=4), shape, 10)
    assert count_parameters(g) == expected + 2 * (16 + 64) == 26_890


def test_lenet_count_on_cifar() -> None:
    m = build_model(ModelConfig(name="lenet"), CIFAR, 10)
    assert count_parameters(m) == conv(3, 16) + conv(16, 64) + linear(64, 10) == 27_530


def test_logreg_and_mlp_on_flat_features() -> None:
    assert count_parameters(build_model(ModelConfig(name="logreg"), SYNTH, 3)) == linear(60, 3)
    m = build_model(ModelConfig(name="mlp", hidden=7), SYNTH, 3)
    assert count_parameters(m) == linear(60, 7) + linear(7, 3)


def test_count_equals_flat_length() -> None:
    m = build_model(ModelConfig(name="lenet", norm="group"), MNIST, 10)
    assert flatten_params(m).shape == (count_parameters(m),)
    assert ParamLayout.from_model(m).dim == count_parameters(m)


# ---------------------------------------------------------------- shapes and architecture

@pytest.mark.parametrize(("name", "shape"), VALID)
@pytest.mark.parametrize("num_classes", [2, 10])
def test_output_is_logits_of_right_shape(name: str, shape: tuple[int, ...], num_classes: int) -> None:
    m = build_model(ModelConfig(name=name), shape, num_classes)
    x = torch.randn(5, *shape, generator=torch.Generator().manual_seed(0))
    out = m(x)
    assert out.shape == (5, num_classes)
    assert out.dtype == torch.float32
    # Logits, not log-probabilities: rows need not log-sum-exp to 0.
    assert not torch.allclose(torch.logsumexp(out, dim=1), torch.zeros(5), atol=1e-3)


def test_no_batchnorm_and_activation_choice() -> None:
    for name, shape in VALID:
        for norm in ("none", "group"):
            m = build_model(ModelConfig(name=name, norm=norm), shape, 10)
            assert not any(isinstance(mod, nn.modules.batchnorm._BatchNorm) for mod in m.modules())
    hs = build_model(ModelConfig(name="lenet", activation="hardswish"), MNIST, 10)
    assert sum(isinstance(mod, nn.Hardswish) for mod in hs.modules()) == 2
    assert not any(isinstance(mod, nn.ReLU) for mod in hs.modules())
    mlp = build_model(ModelConfig(name="mlp", activation="hardswish"), MNIST, 10)
    assert any(isinstance(mod, nn.Hardswish) for mod in mlp.modules())
    gn = build_model(ModelConfig(name="lenet", norm="group", groups=8), MNIST, 10)
    norms = [mod for mod in gn.modules() if isinstance(mod, nn.GroupNorm)]
    assert [(n.num_groups, n.num_channels) for n in norms] == [(8, 16), (8, 64)]


def test_outputs_do_not_depend_on_batch_composition() -> None:
    # No cross-sample statistics (BatchNorm-free): a sample's logits are the same alone or batched.
    m = build_model(ModelConfig(name="lenet", norm="group"), MNIST, 10)
    x = torch.randn(4, *MNIST, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m(x)[2:3], m(x[2:3]))


def test_forward_does_not_modify_input() -> None:
    for name, shape in VALID:
        m = build_model(ModelConfig(name=name, activation="hardswish"), shape, 10)
        x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(2))
        before = x.clone()
        m(x)
        assert torch.equal(x, before)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("name", ["cnn_fmnist", "cnn_cifar"])
@pytest.mark.parametrize("shape", [DIGITS, (1, 15, 15), (3, 32, 12)])
def test_too_small_images_are_refused_clearly(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError) as err:
        build_model(ModelConfig(name=name), shape, 10)
    msg = str(err.value)
    assert "model.name" in msg and repr(name) in msg
    assert str(shape) in msg
    assert "16x16" in msg
    assert "data.resize = 28" in msg


@pytest.mark.parametrize("name", ["cnn_fmnist", "cnn_cifar"])
def test_smallest_accepted_image(name: str) -> None:
    m = build_model(ModelConfig(name=name), (1, 16, 16), 10)
    assert m(torch.zeros(2, 1, 16, 16)).shape == (2, 10)


def test_lenet_too_small() -> None:
    with pytest.raises(ValueError, match=r"at least 2x2.*\(1, 1, 1\).*data.resize = 28"):
        build_model(ModelConfig(name="lenet"), (1, 1, 1), 10)
    assert build_model(ModelConfig(name="lenet"), (1, 2, 2), 10)(torch.zeros(1, 1, 2, 2)).shape == (1, 10)


@pytest.mark.parametrize("name", ["cnn_fmnist", "cnn_cifar", "lenet"])
@pytest.mark.parametrize("shape", [SYNTH, (28, 28)])
def test_cnns_refuse_non_image_input(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"model.name = .*\(channels, height, width\).*'logreg' or 'mlp'"):
        build_model(ModelConfig(name=name), shape, 10)


def test_bad_shapes_and_classes() -> None:
    with pytest.raises(ValueError, match="input_shape"):
        build_model(ModelConfig(), (), 10)
    with pytest.raises(ValueError, match="input_shape"):
        build_model(ModelConfig(), (0, 5), 10)
    with pytest.raises(ValueError, match="num_classes"):
        build_model(ModelConfig(), SYNTH, 0)


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("groups", [3, 5, 32, 64])
def test_groups_must_divide_16_and_64(groups: int) -> None:
    with pytest.raises(pydantic.ValidationError, match=r"model.groups = \d+ must divide .*16 and 64.*valid: 1, 2, 4, 8, 16"):
        ModelConfig(name="lenet", norm="group", groups=groups)


@pytest.mark.parametrize("groups", [1, 2, 4, 8, 16])
def test_valid_groups(groups: int) -> None:
    m = build_model(ModelConfig(name="lenet", norm="group", groups=groups), DIGITS, 10)
    assert m(torch.zeros(2, *DIGITS)).shape == (2, 10)


@pytest.mark.parametrize(
    "kwargs",
    [{"groups": 0}, {"hidden": 0}, {"name": "resnet"}, {"activation": "gelu"},
     {"norm": "batch"}, {"width": 3}],
)
def test_config_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(pydantic.ValidationError):
        ModelConfig(**kwargs)


def test_config_defaults() -> None:
    cfg = ModelConfig()
    assert (cfg.name, cfg.hidden, cfg.activation, cfg.norm, cfg.groups) == ("logreg", 100, "relu", "none", 4)


def test_config_accepts_every_registered_model() -> None:
    from fedsafe.models.build import BUILTIN_MODELS

    assert sorted(BUILTIN_MODELS) == ["cnn_cifar", "cnn_fmnist", "lenet", "logreg", "mlp"]
    for name in MODELS.names():
        assert ModelConfig(name=name).name == name


# ---------------------------------------------------------------- flat parameters

ALL_CONFIGS = [
    (ModelConfig(name="logreg"), SYNTH),
    (ModelConfig(name="mlp", activation="hardswish"), MNIST),
    (ModelConfig(name="cnn_fmnist"), MNIST),
    (ModelConfig(name="cnn_cifar"), CIFAR),
    (ModelConfig(name="lenet"), DIGITS),
    (ModelConfig(name="lenet", norm="group", activation="hardswish"), MNIST),
]
IDS = [f"{c.name}-{c.norm}-{c.activation}" for c, _ in ALL_CONFIGS]


@pytest.mark.parametrize(("cfg", "shape"), ALL_CONFIGS, ids=IDS)
def test_flatten_unflatten_round_trip(cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    m = build_model(cfg, shape, 10)
    layout = ParamLayout.from_model(m)
    flat = flatten_params(m)
    assert flat.dtype == torch.float32 and flat.dim() == 1
    assert layout.names == tuple(n for n, _ in m.named_parameters())
    assert layout.numel == tuple(p.numel() for p in m.parameters())
    params = layout.unflatten(flat)
    assert list(params) == list(layout.names)
    for name, p in m.named_parameters():
        assert params[name].shape == p.shape
        assert torch.equal(params[name], p)
    assert torch.equal(layout.flatten(params), flat)
    # flatten_params is a copy, unflatten returns views of the flat vector.
    flat[0] += 1.0
    assert not torch.equal(flatten_params(m), flat)
    assert params[layout.names[0]].reshape(-1)[0] == flat[0]


@pytest.mark.parametrize(("cfg", "shape"), ALL_CONFIGS, ids=IDS)
def test_functional_call_equals_module(cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    m = build_model(cfg, shape, 10)
    layout = ParamLayout.from_model(m)
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(3))
    out = functional_call(m, layout.unflatten(flatten_params(m)), (x,))
    torch.testing.assert_close(out, m(x), rtol=0, atol=0)


@pytest.mark.parametrize(("cfg", "shape"), ALL_CONFIGS, ids=IDS)
def test_vmap_over_flat_parameter_vectors(cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    m = build_model(cfg, shape, 10)
    layout = ParamLayout.from_model(m)
    g = torch.Generator().manual_seed(4)
    base = flatten_params(m)
    flats = base + 0.05 * torch.randn(3, base.numel(), generator=g)
    x = torch.randn(4, *shape, generator=g)

    def logits(flat: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(m, layout.unflatten(flat), (inputs,))

    batched = vmap(logits, in_dims=(0, None))(flats, x)
    separate = torch.stack([logits(f, x) for f in flats])
    assert batched.shape == (3, 4, 10)
    torch.testing.assert_close(batched, separate, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(separate[0], separate[1])

    # Each client its own data as well as its own parameters (the vectorized backend).
    xs = torch.randn(3, 4, *shape, generator=g)
    both = vmap(logits)(flats, xs)
    torch.testing.assert_close(both, torch.stack([logits(f, xi) for f, xi in zip(flats, xs)]),
                               rtol=1e-5, atol=1e-5)


def test_unflatten_rejects_wrong_length() -> None:
    layout = ParamLayout.from_model(build_model(ModelConfig(), SYNTH, 3))
    with pytest.raises(ValueError, match=f"length {layout.dim}"):
        layout.unflatten(torch.zeros(layout.dim + 1))
    with pytest.raises(ValueError, match="1-D"):
        layout.unflatten(torch.zeros(2, layout.dim))


def test_layout_is_frozen() -> None:
    layout = ParamLayout.from_model(build_model(ModelConfig(), SYNTH, 3))
    with pytest.raises(Exception):
        layout.names = ()  # type: ignore[misc]


# ---------------------------------------------------------------- initialisation

@pytest.mark.parametrize(("cfg", "shape"), ALL_CONFIGS, ids=IDS)
def test_init_is_deterministic_from_generator(cfg: ModelConfig, shape: tuple[int, ...]) -> None:
    a = build_model(cfg, shape, 10, generator=torch.Generator().manual_seed(7))
    b = build_model(cfg, shape, 10, generator=torch.Generator().manual_seed(7))
    c = build_model(cfg, shape, 10, generator=torch.Generator().manual_seed(8))
    assert torch.equal(flatten_params(a), flatten_params(b))
    assert not torch.equal(flatten_params(a), flatten_params(c))
    # Re-initialising in place reproduces the same draw.
    init_parameters(c, torch.Generator().manual_seed(7))
    assert torch.equal(flatten_params(a), flatten_params(c))


def test_build_without_generator_is_reproducible_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a = build_model(ModelConfig(name="lenet", norm="group"), MNIST, 10)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)
    b = build_model(ModelConfig(name="lenet", norm="group"), MNIST, 10)
    assert torch.equal(flatten_params(a), flatten_params(b))


def test_init_distribution_matches_torch_default_bounds() -> None:
    m = build_model(ModelConfig(name="lenet", norm="group"), MNIST, 10,
                    generator=torch.Generator().manual_seed(0))
    for name, p in m.named_parameters():
        if "norm" in name:
            expected = torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)
            assert torch.equal(p, expected), name
    for layer, fan_in in [(m.conv1, 1 * 25), (m.conv2, 16 * 25), (m.fc, 64)]:
        bound = 1 / math.sqrt(fan_in)
        for p in (layer.weight, layer.bias):
            assert p.abs().max() <= bound
        # U(-b, b): mean 0, variance b^2/3; conv2 has 25,600 draws.
        w = layer.weight.detach()
        if w.numel() > 10_000:
            assert abs(w.mean().item()) < 0.02 * bound
            assert w.var().item() == pytest.approx(bound**2 / 3, rel=0.03)
            assert w.abs().max() > 0.99 * bound


def test_init_on_other_module_types_fails_loudly() -> None:
    with pytest.raises(TypeError, match="LayerNorm"):
        init_parameters(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)), torch.Generator())
