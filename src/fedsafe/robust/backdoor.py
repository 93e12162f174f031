"""Targeted backdoors: the trigger, the poisoned batches Byzantine clients train on, and the
attack success rate.

A backdoor attack (Gu, Dolan-Gavitt, Garg 2017, "BadNets"; Bagdasaryan, Veit, Hua, Estrin,
Shmatikov, AISTATS 2020, "How to backdoor federated learning") keeps the model accurate on
clean inputs while teaching it to answer ``target`` whenever a trigger is present. The attacks
themselves (``pattern_backdoor``, ``model_replacement``, ``constrain_and_scale``) are in
:mod:`fedsafe.robust.attacks`; what they share lives here.

**The trigger** (:func:`make_trigger`) is a ``size × size`` checkerboard in the bottom-right
corner of every channel of an image input ``(C, H, W)``: cells alternate between the training
data's largest and smallest value of that channel (white and black after standardisation),
the corner cell white. For inputs of another shape the last ``size²`` features of the
flattened input alternate between each feature's largest and smallest training value. A
checkerboard, not a solid square, so that no natural digit or photo carries it by accident.

**Poisoned batches** (:class:`Poison`): in every batch a Byzantine client draws, the first
``⌈fraction · B⌉`` samples (batches are uniformly random, so these are a random subset) get the
trigger and the label ``target``; the rest stay clean, so the poisoned model keeps its main-task
accuracy (Bagdasaryan et al. mix clean and backdoored inputs in each batch the same way).
``fraction = 1`` poisons every sample. A :class:`Poison` also carries label-only poisoning
(``label_flip``), which it applies by name from ``LABEL_TRANSFORMS``.

**Attack success rate** (:func:`attack_success_rate`): the fraction of test inputs whose true
class is not ``target`` that the model classifies as ``target`` once the trigger is applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fedsafe.robust.attacks import ATTACKS, BACKDOOR_ATTACKS, LABEL_TRANSFORMS


@dataclass(frozen=True)
class Trigger:
    """Where the trigger is stamped (``mask``, boolean) and with which ``values``, both of the
    input's shape (one sample, no batch dimension)."""

    mask: Tensor
    values: Tensor

    def apply(self, x: Tensor) -> Tensor:
        """``x`` (any leading batch dimensions, then the input shape) with the trigger stamped."""
        return torch.where(self.mask, self.values.to(x.dtype), x)


def make_trigger(x_train: Tensor, size: int) -> Trigger:
    """The checkerboard trigger of the module docstring for inputs like ``x_train`` (n, ...)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"backdoor trigger size must be an integer >= 1, got {size!r}")
    if x_train.ndim < 2 or x_train.shape[0] == 0:
        raise ValueError(f"backdoor: need training inputs (n, ...), got shape {tuple(x_train.shape)}")
    shape = tuple(x_train.shape[1:])
    checker = (torch.arange(size)[:, None] + torch.arange(size)[None, :]) % 2 == 0  # True: white
    if len(shape) == 3:
        c, h, w = shape
        if size > min(h, w):
            raise ValueError(f"backdoor trigger size {size} does not fit {h}x{w} images")
        hi = x_train.amax(dim=(0, 2, 3))
        lo = x_train.amin(dim=(0, 2, 3))
        mask = torch.zeros(shape, dtype=torch.bool)
        mask[:, h - size :, w - size :] = True
        values = torch.zeros(shape, dtype=x_train.dtype)
        corner = torch.where(checker.flip(0, 1)[None], hi[:, None, None], lo[:, None, None])
        values[:, h - size :, w - size :] = corner
        return Trigger(mask, values)
    flat = x_train.reshape(x_train.shape[0], -1)
    d = flat.shape[1]
    k = size * size
    if k > d:
        raise ValueError(f"backdoor trigger size {size} needs {k} input features, the inputs have {d}")
    mask = torch.zeros(d, dtype=torch.bool)
    mask[d - k :] = True
    values = torch.zeros(d, dtype=x_train.dtype)
    cells = checker.flip(0, 1).reshape(-1)
    values[d - k :] = torch.where(cells, flat[:, d - k :].amax(dim=0), flat[:, d - k :].amin(dim=0))
    return Trigger(mask.reshape(shape), values.reshape(shape))


@dataclass(frozen=True)
class Poison:
    """The training data a Byzantine client sees: ``poison(x, y, num_classes) -> (x', y')`` on
    batches ``x`` (clients, B, ...), ``y`` (clients, B). ``labels``: a ``LABEL_TRANSFORMS``
    name applied to every label; ``trigger``: a backdoor stamped on the first
    ``⌈fraction · B⌉`` samples of each batch, relabelled ``target``. Picklable (Ray tasks)."""

    labels: str | None = None
    trigger: Trigger | None = None
    target: int = 0
    fraction: float = 0.5

    def __call__(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        if self.labels is not None:
            y = LABEL_TRANSFORMS[self.labels](y, num_classes)
        if self.trigger is not None:
            k = math.ceil(self.fraction * y.shape[1])
            x, y = x.clone(), y.clone()
            x[:, :k] = self.trigger.apply(x[:, :k])
            y[:, :k] = self.target
        return x, y


def backdoor_settings(name: str, params: dict) -> tuple[int, int, float] | None:
    """``(target, size, fraction)`` of backdoor attack ``name`` with ``params`` (defaults from
    the attack's signature), or None for other attacks."""
    if name not in BACKDOOR_ATTACKS:
        return None
    entry = ATTACKS.entry(name).params
    get = lambda key: params.get(key, entry[key].default)  # noqa: E731
    return int(get("target")), int(get("size")), float(get("fraction"))


def make_poison(name: str, params: dict, x_train: Tensor, num_classes: int) -> Poison | None:
    """The :class:`Poison` attack ``name`` trains its Byzantine clients on: labels transformed
    (``label_flip``), a backdoor, or nothing changed (``none``: the Byzantine clients train
    honestly on their own data and send that); None when the attack does not use the Byzantine
    clients' own updates. ValueError naming ``attack.params`` for a target outside the
    classes, a trigger that does not fit or a fraction outside (0, 1]."""
    if name == "none":
        return Poison()
    if name in LABEL_TRANSFORMS:
        return Poison(labels=name)
    settings = backdoor_settings(name, params)
    if settings is None:
        return None
    target, size, fraction = settings
    if not 0 <= target < num_classes:
        raise ValueError(f"attack.params.target = {target} must be a class in [0, {num_classes})")
    if not 0 < fraction <= 1:
        raise ValueError(f"attack.params.fraction = {fraction} must lie in (0, 1]")
    try:
        trigger = make_trigger(x_train, size)
    except ValueError as e:
        raise ValueError(f"attack.params.size: {e}") from None
    return Poison(trigger=trigger, target=target, fraction=fraction)


def attack_success_rate(predict: Callable[[Tensor], Tensor], x_test: Tensor, y_test: Tensor, poison: Poison) -> float | None:
    """Fraction of the test inputs of classes other than the target that ``predict`` (inputs
    -> logits) assigns to the target once triggered; None without such inputs or trigger."""
    if poison.trigger is None:
        return None
    keep = y_test != poison.target
    if not bool(keep.any()):
        return None
    hits = 0
    xs = x_test[keep]
    with torch.no_grad():
        for start in range(0, xs.shape[0], 4096):
            logits = predict(poison.trigger.apply(xs[start : start + 4096]))
            hits += int((logits.argmax(1) == poison.target).sum())
    return hits / xs.shape[0]
