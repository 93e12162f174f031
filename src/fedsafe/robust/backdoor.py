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

Two more poisons share that interface (``trigger``, ``target``, ``success_inputs``):

- :class:`DistributedPoison` (``dba``, Xie et al. ICLR 2020): the global trigger is split into
  ``parts`` local patterns (:func:`dba_triggers`); each Byzantine client stamps only its own part,
  and the attack success rate is measured with the *global* trigger, all parts at once;
- :class:`EdgeCasePoison` (``edge_case_backdoor``, Wang et al. NeurIPS 2020): no trigger at all;
  the poisoned samples are rare inputs, images of class ``source`` rotated by ``angle``
  (:func:`rotate`), labelled ``target``; the success rate is measured on the rotated held-out
  (test) images of class ``source``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fedsafe.robust.attacks import ATTACKS, BACKDOOR_ATTACKS, LABEL_TRANSFORMS, check_attack_params

#: Backdoor attacks whose poison is not the checkerboard of ``make_trigger``.
_OWN_POISON = frozenset({"dba", "edge_case_backdoor"})


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

    def success_inputs(self, x_test: Tensor, y_test: Tensor) -> Tensor:
        """The test inputs the attack success rate counts, before ``trigger.apply``: those whose
        class is not the target."""
        return x_test[y_test != self.target]


def _k(fraction: float, batch: int) -> int:
    return math.ceil(fraction * batch)


# --------------------------------------------------------------------------------------------
# DBA: the global trigger split among the colluders


def dba_triggers(x_train: Tensor, parts: int, size: int, gap: int) -> tuple[Trigger, tuple[Trigger, ...]]:
    """The global trigger of DBA and its ``parts`` local patterns, for images ``x_train``
    (n, C, H, W).

    Part ``k`` (0-based) is a horizontal bar of ``size`` pixels at row ``(k // 2)·(1 + gap)``,
    columns ``(k % 2)·(size + gap)`` to that plus ``size − 1``, on every channel, set to the
    channel's largest training value (white). Parts fill two columns of bars, top-left first:
    with ``parts = 4, size = 4, gap = 2`` these are the reference code's MNIST patterns
    (AI-secure/DBA ``utils/mnist_params.yaml``: ``0_poison_pattern`` = row 0, columns 0–3;
    ``1_…`` = row 0, columns 6–9; ``2_…`` = row 3, columns 0–3; ``3_…`` = row 3, columns 6–9,
    pixel value 1, the maximum of its unnormalised images). The global trigger is the union of
    the parts. ValueError naming ``attack.params`` when the bars do not fit or the inputs are not
    images."""
    for value, what, lo in ((parts, "parts", 1), (size, "size", 1), (gap, "gap", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"attack.params.{what} = {value!r} must be an integer >= {lo}")
    if x_train.ndim != 4 or x_train.shape[0] == 0:
        raise ValueError(
            f"attack 'dba': its trigger is drawn on images (n, C, H, W), the training inputs have shape "
            f"{tuple(x_train.shape)}"
        )
    _, c, h, w = x_train.shape
    rows = (math.ceil(parts / 2) - 1) * (1 + gap) + 1
    cols = size if parts == 1 else 2 * size + gap
    if rows > h or cols > w:
        raise ValueError(
            f"attack.params: {parts} DBA parts of 1x{size} bars with gap {gap} need images of at least "
            f"{rows}x{cols}, got {h}x{w}; lower attack.params.size, gap or parts"
        )
    hi = x_train.amax(dim=(0, 2, 3))
    local = []
    for k in range(parts):
        r, col = (k // 2) * (1 + gap), (k % 2) * (size + gap)
        mask = torch.zeros((c, h, w), dtype=torch.bool)
        mask[:, r, col : col + size] = True
        values = torch.where(mask, hi[:, None, None].to(x_train.dtype), torch.zeros((), dtype=x_train.dtype))
        local.append(Trigger(mask, values))
    mask = torch.stack([t.mask for t in local]).any(0)
    values = torch.where(mask, hi[:, None, None].to(x_train.dtype), torch.zeros((), dtype=x_train.dtype))
    return Trigger(mask, values), tuple(local)


@dataclass(frozen=True)
class DistributedPoison:
    """DBA's poisoned batches: Byzantine client ``i`` stamps only its local part
    ``parts[rank(i) mod len(parts)]`` on the first ``⌈fraction · B⌉`` samples of each batch and
    relabels them ``target``, where ``rank(i)`` is i's position among the run's sorted Byzantine
    ids (:meth:`bind`, which the engine calls once it has drawn them; the reference code's
    ``adversarial_index`` into ``adversary_list``). Unbound, client ``i`` uses part
    ``i mod len(parts)``. ``trigger`` is the global trigger, with which the attack success rate
    is measured (the paper's point: no attacker ever trained on it)."""

    trigger: Trigger
    parts: tuple[Trigger, ...]
    target: int = 2
    fraction: float = 0.3125  # 20 of 64, the reference's poisoning_per_batch
    clients: tuple[int, ...] = ()
    labels: None = None
    per_client = True  # ClientWork.batch passes the batch's client ids

    def bind(self, byzantine) -> DistributedPoison:
        """This poison with the run's Byzantine ids (their order fixes who gets which part)."""
        return replace(self, clients=tuple(sorted(int(i) for i in byzantine)))

    def part_of(self, client: int) -> int:
        """The index of the local part client ``client`` stamps."""
        client = int(client)
        rank = self.clients.index(client) if client in self.clients else client
        return rank % len(self.parts)

    def __call__(self, x: Tensor, y: Tensor, num_classes: int, ids=None) -> tuple[Tensor, Tensor]:
        k = _k(self.fraction, y.shape[1])
        x, y = x.clone(), y.clone()
        for row in range(y.shape[0]):
            part = self.parts[self.part_of(int(ids[row]) if ids is not None else row)]
            x[row, :k] = part.apply(x[row, :k])
        y[:, :k] = self.target
        return x, y

    def success_inputs(self, x_test: Tensor, y_test: Tensor) -> Tensor:
        """The test inputs of the classes other than the target (the global trigger goes on)."""
        return x_test[y_test != self.target]


# --------------------------------------------------------------------------------------------
# edge-case backdoor: rare inputs, relabelled


def rotate(x: Tensor, degrees: float) -> Tensor:
    """Images ``x`` (..., H, W) rotated counter-clockwise by ``degrees`` about their centre.

    Multiples of 90° are exact (``torch.rot90`` over the last two dimensions, which turns
    counter-clockwise: out[i, j] = in[j, W − 1 − i]); other angles resample bilinearly
    (``affine_grid`` / ``grid_sample``, ``align_corners=False``), with pixels that come from
    outside the image taking the nearest border value (``padding_mode="border"``: the
    background of a digit, whatever the standardisation made of it). Needs square images for
    odd multiples of 90°."""
    turns = float(degrees) / 90.0
    if turns == round(turns):
        return torch.rot90(x, int(round(turns)) % 4, dims=(-2, -1))
    shape = x.shape
    flat = x.reshape(-1, 1, shape[-2], shape[-1])
    a = math.radians(float(degrees))
    # grid_sample reads output pixel (u, v) from input (θ · (u, v, 1)); image y points down, so a
    # counter-clockwise turn on screen samples from the clockwise-rotated position
    cos, sin = math.cos(a), math.sin(a)
    theta = torch.tensor([[cos, -sin, 0.0], [sin, cos, 0.0]], dtype=torch.float64)
    theta = theta.to(flat.dtype if flat.is_floating_point() else torch.float32).expand(flat.shape[0], 2, 3)
    grid = torch.nn.functional.affine_grid(theta, list(flat.shape), align_corners=False)
    out = torch.nn.functional.grid_sample(flat, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.reshape(shape)


@dataclass(frozen=True)
class EdgeTransform:
    """The edge-case "trigger": no pattern, a rotation by ``angle`` degrees (:func:`rotate`)."""

    angle: float

    def apply(self, x: Tensor) -> Tensor:
        return rotate(x, self.angle)


@dataclass(frozen=True)
class EdgeCasePoison:
    """Edge-case batches: the first ``⌈fraction · B⌉`` samples of each batch are replaced by
    edge-case examples from ``pool`` (the training images of class ``source`` rotated by
    ``trigger.angle``) labelled ``target``; the rest stay clean. Which pool examples: a
    generator seeded from the batch's own labels (the batch is already a seeded draw), so a
    run is reproducible with no state. ``success_inputs``: the *test* images of class
    ``source``, which ``trigger.apply`` rotates: the held-out edge cases."""

    trigger: EdgeTransform
    pool: Tensor
    source: int = 7
    target: int = 1
    fraction: float = 0.5
    labels: None = None

    def __call__(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        if self.pool.shape[0] == 0:
            raise ValueError("edge_case_backdoor: this poison was made without the training labels "
                             "(make_poison(..., y_train=...)), so it has no edge cases to train on")
        k = _k(self.fraction, y.shape[1])
        x, y = x.clone(), y.clone()
        weights = torch.arange(1, y.numel() + 1, dtype=torch.int64).reshape(y.shape)
        seed = int((y.to(torch.int64) * weights).sum()) % (2**31 - 1)
        g = torch.Generator().manual_seed(seed)
        pick = torch.randint(self.pool.shape[0], (y.shape[0], k), generator=g)
        x[:, :k] = self.pool[pick].to(device=x.device, dtype=x.dtype)
        y[:, :k] = self.target
        return x, y

    def success_inputs(self, x_test: Tensor, y_test: Tensor) -> Tensor:
        """The held-out images of class ``source`` (rotated by ``trigger.apply``)."""
        return x_test[y_test == self.source]


def backdoor_settings(name: str, params: dict) -> tuple[int, int, float] | None:
    """``(target, size, fraction)`` of backdoor attack ``name`` with ``params`` (defaults from
    the attack's signature), or None for other attacks and for those with their own poison
    (``dba``, ``edge_case_backdoor``)."""
    if name not in BACKDOOR_ATTACKS or name in _OWN_POISON:
        return None
    entry = ATTACKS.entry(name).params
    get = lambda key: params.get(key, entry[key].default)  # noqa: E731
    return int(get("target")), int(get("size")), float(get("fraction"))


def make_poison(name: str, params: dict, x_train: Tensor, num_classes: int,
                y_train: Tensor | None = None) -> Poison | None:
    """The :class:`Poison` attack ``name`` trains its Byzantine clients on: labels transformed
    (``label_flip``), a backdoor, or nothing changed (``none``: the Byzantine clients train
    honestly on their own data and send that); None when the attack does not use the Byzantine
    clients' own updates. ValueError naming ``attack.params`` for a target outside the
    classes, a trigger that does not fit or a fraction outside (0, 1]. ``y_train``: the training
    labels, from which ``edge_case_backdoor`` takes its pool of class-``source`` images (without
    them its parameters are checked and the poison refuses to poison)."""
    check_attack_params(name, params)  # the new attacks' own numbers, before round 1
    if name == "none":
        return Poison()
    if name in LABEL_TRANSFORMS:
        return Poison(labels=name)
    if name == "dba":
        return _dba_poison(params, x_train, num_classes)
    if name == "edge_case_backdoor":
        return _edge_poison(params, x_train, num_classes, y_train)
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


def _params(name: str, params: dict) -> Callable[[str], object]:
    entry = ATTACKS.entry(name).params
    return lambda key: params.get(key, entry[key].default)


def _target(value: object, num_classes: int, what: str = "target") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_classes:
        raise ValueError(f"attack.params.{what} = {value!r} must be a class in [0, {num_classes})")
    return value


def _fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) <= 1:
        raise ValueError(f"attack.params.fraction = {value!r} must lie in (0, 1]")
    return float(value)


def _dba_poison(params: dict, x_train: Tensor, num_classes: int) -> DistributedPoison:
    get = _params("dba", params)
    target = _target(get("target"), num_classes)
    fraction = _fraction(get("fraction"))
    trigger, parts = dba_triggers(x_train, get("parts"), get("size"), get("gap"))
    return DistributedPoison(trigger=trigger, parts=parts, target=target, fraction=fraction)


def _edge_poison(params: dict, x_train: Tensor, num_classes: int, y_train: Tensor | None) -> EdgeCasePoison:
    get = _params("edge_case_backdoor", params)
    source = _target(get("source"), num_classes, "source")
    target = _target(get("target"), num_classes)
    if source == target:
        raise ValueError(f"attack.params.source and target must differ, both are {source}")
    fraction = _fraction(get("fraction"))
    angle = get("angle")
    if isinstance(angle, bool) or not isinstance(angle, (int, float)) or not math.isfinite(angle):
        raise ValueError(f"attack.params.angle = {angle!r} must be a finite number of degrees")
    if x_train.ndim != 4 or (float(angle) % 180 != 0 and x_train.shape[-1] != x_train.shape[-2]):
        raise ValueError(
            f"attack 'edge_case_backdoor': rotates images (n, C, H, W) (square ones unless angle is a "
            f"multiple of 180), the training inputs have shape {tuple(x_train.shape)}"
        )
    trigger = EdgeTransform(float(angle))
    if y_train is None:  # parameters checked (fedsafe check); nothing to poison with
        pool = x_train[:0]
    else:  # the attacker's edge-case set: every training image of class ``source``, rotated
        pool = x_train[y_train == source]
        if pool.shape[0] == 0:
            raise ValueError(f"attack.params.source = {source}: the training set has no image of that class")
        pool = trigger.apply(pool)
    return EdgeCasePoison(trigger=trigger, pool=pool, source=source, target=target, fraction=fraction)


def attack_success_rate(predict: Callable[[Tensor], Tensor], x_test: Tensor, y_test: Tensor, poison: Poison) -> float | None:
    """Fraction of the inputs the poison's success is measured on (``poison.success_inputs``:
    the test inputs of the classes other than the target for a trigger, the held-out edge cases
    of ``edge_case_backdoor``) that ``predict`` (inputs -> logits) assigns to the target once
    ``poison.trigger`` is applied; None without such inputs or trigger."""
    if poison.trigger is None:
        return None
    xs = poison.success_inputs(x_test, y_test)
    if xs.shape[0] == 0:
        return None
    hits = 0
    with torch.no_grad():
        for start in range(0, xs.shape[0], 4096):
            logits = predict(poison.trigger.apply(xs[start : start + 4096]))
            hits += int((logits.argmax(1) == poison.target).sum())
    return hits / xs.shape[0]
