"""Deterministic re-initialisation of a model's parameters from a ``torch.Generator``."""

from __future__ import annotations

import math

import torch
from torch import nn


_KNOWN = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.GroupNorm)


def _init_known(module: nn.Module, own: dict[str, nn.Parameter], generator: torch.Generator) -> None:
    """Draw the parameters ``own`` of a Linear, Conv or GroupNorm ``module`` from ``generator``."""
    if isinstance(module, nn.GroupNorm):
        for name, p in own.items():
            p.fill_(1.0 if name == "weight" else 0.0)
        return
    w = module.weight
    fan_in = w.shape[1] * math.prod(w.shape[2:])
    bound = 1.0 / math.sqrt(fan_in)
    for p in own.values():  # weight then bias, in registration order
        draw = torch.rand(p.shape, generator=generator, dtype=torch.float32)
        p.copy_(draw.mul_(2 * bound).sub_(bound))


@torch.no_grad()
def init_parameters(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Re-initialise every parameter of ``model`` in place from ``generator``; return ``model``.

    Same distributions as PyTorch's defaults, but from an explicit generator:

    - Linear and Conv weights and biases: U(-b, b) with b = 1/sqrt(fan_in), fan_in = inputs
      per output unit (in_features, or in_channels/groups * kernel area). This equals torch's
      kaiming_uniform_(a=sqrt(5)) weight bound and its bias bound.
    - GroupNorm: weight 1, bias 0.

    Draws happen on the CPU in ``model.parameters()`` order, so the result depends only on the
    generator's state, not on the device the model lives on. A parameterised module of any
    other type raises TypeError rather than silently keeping its old values.
    """
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        if isinstance(module, _KNOWN):
            _init_known(module, own, generator)
        else:
            raise TypeError(
                f"init_parameters does not know how to initialise {type(module).__name__} "
                f"(parameters: {', '.join(own)})"
            )
    return model


def uninitialisable(model: nn.Module) -> list[str]:
    """The submodules of ``model`` that :func:`seed_parameters` cannot initialise, as
    ``"name (Type)"``: those that hold parameters of their own, are not Linear, Conv or
    GroupNorm, and have no ``reset_parameters()`` method (e.g. an ``nn.Parameter`` set directly
    on your own module, or ``nn.MultiheadAttention``). Empty: every parameter can be drawn."""
    out = []
    for name, module in model.named_modules():
        if next(module.parameters(recurse=False), None) is None or isinstance(module, _KNOWN):
            continue
        if not callable(getattr(module, "reset_parameters", None)):
            out.append(f"{name or 'the model'} ({type(module).__name__})")
    return out


@torch.no_grad()
def seed_parameters(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Re-initialise every parameter of a user's ``model`` in place from ``generator``, so
    that its initial weights depend on the run's seed and not on the state of torch's global
    RNG when the module was constructed; return ``model``.

    Module by module, in ``model.modules()`` order: Linear, Conv and GroupNorm are drawn as
    :func:`init_parameters` draws them (so a module with the architecture of a built-in model
    starts from exactly the built-in model's weights); any other module that holds parameters
    is reset by its own ``reset_parameters()`` (LayerNorm, Embedding, LSTM, PReLU, ... : torch's
    own initialisation), run with torch's CPU RNG seeded by a draw from ``generator`` and
    restored afterwards (``torch.random.fork_rng``), so the global RNG is left as it was.

    A module that holds parameters and has no ``reset_parameters()``
    (:func:`uninitialisable`) raises TypeError before anything is changed.
    """
    missing = uninitialisable(model)
    if missing:
        raise TypeError(
            f"seed_parameters cannot initialise {', '.join(missing)}: no reset_parameters() method"
        )
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        if isinstance(module, _KNOWN):
            _init_known(module, own, generator)
            continue
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module.reset_parameters()
    return model
