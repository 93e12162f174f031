"""``build_model``: a config name and the dataset's shape -> an initialised model."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from fedsafe.core.registry import Registry
from fedsafe.models.architectures import (
    MIN_IMAGE_SIDE,
    MLP,
    LeNet,
    LogReg,
    SableCNN,
    sable_cnn_out_size,
)
from fedsafe.models.config import LENET_CHANNELS, ModelConfig
from fedsafe.models.initialization import init_parameters

Builder = Callable[[ModelConfig, tuple[int, ...], int], nn.Module]

# Builders take no keyword-only parameters: ModelConfig already validates the knobs, the
# registry only maps names (and lists them in errors).
MODELS: Registry[Builder] = Registry("model")

# Seed used when build_model is given no generator, so a bare call is still reproducible.
DEFAULT_INIT_SEED = 0


def _image_shape(cfg: ModelConfig, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(channels, height, width), or a ValueError saying why the input does not fit."""
    if len(input_shape) != 3:
        raise ValueError(
            f"model.name = {cfg.name!r} needs image inputs shaped (channels, height, width); "
            f"got input shape {input_shape}. Use model.name = 'logreg' or 'mlp' for flat "
            f"features, or a dataset with images"
        )
    c, h, w = input_shape
    side = MIN_IMAGE_SIDE[cfg.name]
    if h < side or w < side:
        raise ValueError(
            f"model.name = {cfg.name!r} needs images of at least {side}x{side}; got input "
            f"shape {input_shape}. Set data.resize = 28 (or larger), or use a model that fits "
            f"small images ('lenet', 'mlp', 'logreg')"
        )
    return c, h, w


@MODELS.register("logreg")
def _logreg(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression (one linear layer; 650 parameters on digits)."""
    return LogReg(math.prod(input_shape), num_classes)


@MODELS.register("mlp")
def _mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """SABLE model 1: in-hidden-classes MLP (``model.hidden``, ``model.activation``; 79,510
    parameters on MNIST)."""
    return MLP(math.prod(input_shape), cfg.hidden, num_classes, act=cfg.activation)


def _sable_cnn(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, int],
    hidden: tuple[int, ...],
) -> nn.Module:
    c, h, w = _image_shape(cfg, input_shape)
    flat = channels[1] * sable_cnn_out_size(h) * sable_cnn_out_size(w)
    return SableCNN(c, channels, hidden, flat, num_classes)


@MODELS.register("cnn_fmnist")
def _cnn_fmnist(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """SABLE model 2: two convolutions and two linear layers (431,080 parameters on
    Fashion-MNIST); images of at least 16×16."""
    # SABLE model 2: C(1,20) R M C(20,50) R M L(800,500) R L(500,10)
    return _sable_cnn(cfg, input_shape, num_classes, (20, 50), (500,))


@MODELS.register("cnn_cifar")
def _cnn_cifar(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """SABLE model 3: two convolutions and three linear layers (712,854 parameters on
    CIFAR-10); images of at least 16×16."""
    # SABLE model 3: C(3,20) R M C(20,200) R M L(5000,120) R L(120,84) R L(84,10)
    return _sable_cnn(cfg, input_shape, num_classes, (20, 200), (120, 84))


@MODELS.register("lenet")
def _lenet(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """BAFFLE's shallow LeNet: two 5×5 convolutions, optional GroupNorm (``model.norm``) and
    Hardswish (``model.activation``); 26,730 parameters on MNIST."""
    c, _, _ = _image_shape(cfg, input_shape)
    if cfg.norm == "group" and any(ch % cfg.groups for ch in LENET_CHANNELS):
        # ModelConfig validates this; repeated for configs built with model_construct.
        raise ValueError(f"model.groups = {cfg.groups} must divide 16 and 64")
    return LeNet(c, num_classes, act=cfg.activation, norm=cfg.norm, groups=cfg.groups)


def build_model(
    cfg: ModelConfig,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """The model ``cfg.name`` for inputs of shape ``(B, *input_shape)`` and ``num_classes``.

    The model outputs logits and lives on the CPU in float32. Its parameters are drawn by
    :func:`init_parameters` from ``generator`` (default: a generator seeded with
    ``DEFAULT_INIT_SEED``), never from torch's global RNG, which this function leaves
    untouched: the same arguments always give the same parameters.
    """
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"input_shape must be non-empty with positive sizes, got {shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    builder = MODELS.entry(cfg.name).impl
    # Built on the meta device so torch's default initialisation draws nothing from the
    # global RNG; init_parameters then fills every parameter from our own generator.
    with torch.device("meta"):
        model = builder(cfg, shape, num_classes)
    model = model.to_empty(device="cpu")
    if generator is None:
        generator = torch.Generator().manual_seed(DEFAULT_INIT_SEED)
    init_parameters(model, generator)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters, d (the length of :func:`flatten_params`)."""
    return sum(p.numel() for p in model.parameters())
