"""A user's own ``torch.nn.Module`` as a fedsafe model: what is checked before round 1.

fedsafe trains a model through ``torch.func.functional_call`` with one flat vector of its
parameters (``ParamLayout``), under ``vmap`` in the vectorized backend. Any module that
``functional_call`` can run works, with four requirements checked here, each refused with an
error naming the module and what to change:

* it has parameters, every one a floating-point tensor on the CPU (they are trained as float32;
  a float64 or CUDA module is refused rather than silently converted);
* every parameter is trained (``requires_grad``): the flat vector holds all of them, so a
  frozen parameter would be updated anyway;
* no BatchNorm layer that tracks running statistics: those statistics are module state that
  ``functional_call`` under ``vmap`` would update in place, shared by every client (use
  ``GroupNorm``/``LayerNorm``, or BatchNorm with ``track_running_stats=False``);
* on a batch of two zero inputs of the dataset's shape it returns logits of shape
  ``(2, num_classes)``.

The module is deep-copied: the run never modifies the caller's object. ``check_model`` keeps
the module's weights; ``fedsafe.Experiment`` first draws them again from the run's
``model.init`` stream (:func:`fedsafe.models.seed_parameters`) unless it is given
``model_init="module"`` or the module has a part that cannot be initialised
(:func:`fedsafe.models.uninitialisable`), so that ``seed`` fixes the run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from fedsafe.core.errors import FedsafeError


class ModelError(FedsafeError, ValueError):
    """A user's module that fedsafe cannot train (the message says why and what to change)."""


def check_model(model: nn.Module, input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """A float32 CPU deep copy of ``model`` after the checks of the module docstring, or
    :class:`ModelError`."""
    if not isinstance(model, nn.Module):
        raise ModelError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    kind = type(model).__name__
    params = list(model.named_parameters())
    if not params:
        raise ModelError(f"model {kind} has no parameters to train")
    for name, p in params:
        if not p.is_floating_point() or p.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise ModelError(f"model {kind}: parameter {name!r} is {p.dtype}; fedsafe trains floating-point parameters")
        if p.dtype != torch.float32:
            raise ModelError(
                f"model {kind}: parameter {name!r} is {p.dtype}; fedsafe trains float32 models: pass model.float()"
            )
        if p.device.type != "cpu":
            raise ModelError(
                f"model {kind}: parameter {name!r} is on {p.device}; pass the model on the CPU (model.cpu())"
            )
        if not p.requires_grad:
            raise ModelError(
                f"model {kind}: parameter {name!r} has requires_grad=False; fedsafe trains every parameter "
                "of the model it is given (wrap the trainable part in its own module and keep the frozen "
                "part as a preprocessing step of your data)"
            )
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            raise ModelError(
                f"model {kind}: {name or 'the model'} is {type(m).__name__} with running statistics, which "
                "clients would share and update in place; use nn.GroupNorm or nn.LayerNorm, or "
                "track_running_stats=False"
            )
    net = copy.deepcopy(model).train()
    shape = tuple(int(s) for s in input_shape)
    try:
        with torch.no_grad():
            out = net(torch.zeros((2, *shape)))
    except Exception as e:  # the user's forward: any error is a model/data mismatch to report
        raise ModelError(
            f"model {kind} fails on a batch of inputs of shape (2, {', '.join(map(str, shape))}) "
            f"(the dataset's samples): {type(e).__name__}: {e}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(
            f"model {kind} must return logits of shape (batch, {num_classes}) for the dataset's "
            f"{num_classes} classes; on a batch of 2 it returned {got}"
        )
    return net
