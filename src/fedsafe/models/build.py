"""``build_model``: a config name and the dataset's shape -> an initialised model."""

from __future__ import annotations

import importlib
import inspect
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


BUILTIN_MODELS = frozenset(MODELS.names())  # registered above; your own: register_model


def register_model(name: str, builder: Builder | None = None, *, replace: bool = False):
    """Register your model under ``name`` (decorator, or called with ``builder``), so that
    ``model.name = "name"`` builds it, from TOML too: ``builder(cfg, input_shape, num_classes)``
    (``cfg`` the :class:`ModelConfig`) returns a ``torch.nn.Module`` that outputs logits.
    Registration lives in the process that made it: where the model is also built elsewhere
    (Ray workers, Flower SuperNodes) name it as ``"package.module:Factory"`` instead, which
    any process imports by itself. ``replace``: overwrite your earlier registration of ``name``
    (re-running a notebook cell); the built-in models cannot be replaced."""

    def deco(builder: Builder) -> Builder:
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"register_model: name must be a non-empty string without ':', got {name!r}")
        _check_factory(builder, f"register_model({name!r})")
        if name in MODELS:
            if name in BUILTIN_MODELS:
                raise ValueError(f"model {name!r} is built in; register yours under another name")
            if not replace:
                raise ValueError(f"model {name!r} is already registered; pass replace=True to overwrite it")
            MODELS.unregister(name)
        MODELS.register(name)(builder)
        return builder

    return deco if builder is None else deco(builder)


def _check_factory(builder: object, what: str) -> None:
    if not callable(builder):
        raise TypeError(f"{what}: expected a factory (cfg, input_shape, num_classes) -> nn.Module, "
                        f"got {type(builder).__name__}")
    try:
        inspect.signature(builder).bind(None, (), 1)
    except TypeError:
        raise TypeError(f"{what}: the factory must take (cfg, input_shape, num_classes)") from None
    except ValueError:  # no signature to read (a builtin): called as it is
        pass


def model_builder(name: str) -> Builder:
    """The factory ``model.name = name`` builds with: a built-in or registered model
    (:data:`MODELS`), or ``"package.module:Factory"``, imported by module path. A ValueError
    names ``model.name`` and what is wrong."""
    if ":" not in name:
        if name in MODELS:
            return MODELS.entry(name).impl
        raise ValueError(
            f"model.name = {name!r}: no such model; built in or registered: {', '.join(MODELS.names())} "
            "(fedsafe.register_model), or your own factory as 'package.module:Factory'"
        )
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ValueError(f"model.name = {name!r}: write your factory as 'package.module:Factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"model.name = {name!r}: cannot import module {module_name!r} ({type(e).__name__}: {e}); it must be "
            "importable wherever the model is built (installed, or on sys.path)"
        ) from None
    factory: object = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise ValueError(f"model.name = {name!r}: module {module_name!r} has no attribute {attr!r}")
        factory = getattr(factory, part)
    try:
        _check_factory(factory, f"model.name = {name!r}")
    except TypeError as e:
        raise ValueError(str(e)) from None
    return factory  # type: ignore[return-value]


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

    Your own model (registered, or ``"package.module:Factory"``) is built by its factory under
    a copy of torch's RNG seeded from ``generator``'s seed, checked as
    :func:`fedsafe.models.check_model` checks a module, and its parameters drawn again by
    :func:`fedsafe.models.seed_parameters` from ``generator`` (exactly what
    ``fedsafe.Experiment(model=factory(cfg, input_shape, num_classes))`` trains); a model with
    a part that cannot be initialised (:func:`fedsafe.models.uninitialisable`) keeps the
    factory's weights, drawn under that seeded RNG.
    """
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"input_shape must be non-empty with positive sizes, got {shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    builder = model_builder(cfg.name)
    if generator is None:
        generator = torch.Generator().manual_seed(DEFAULT_INIT_SEED)
    # torch's default initialisation draws from a forked global RNG, restored afterwards: the
    # global RNG is left as it was (and no meta-device build, whose to_empty costs a second of
    # imports in every fresh process, e.g. each Flower ClientApp).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(generator.initial_seed())
        model = builder(cfg, shape, num_classes)
    if cfg.name in BUILTIN_MODELS:
        init_parameters(model, generator)
        return model
    from fedsafe.models.custom import ModelError, check_model
    from fedsafe.models.initialization import seed_parameters, uninitialisable

    try:
        model = check_model(model, shape, num_classes)
    except ModelError as e:
        raise ValueError(f"model.name = {cfg.name!r}: {e}") from None
    if not uninitialisable(model):
        seed_parameters(model, generator)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters, d (the length of :func:`flatten_params`)."""
    return sum(p.numel() for p in model.parameters())
