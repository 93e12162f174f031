"""Byzantine attacks: ``attack(honest[n_h, d], *, ctx: AttackContext, **params) -> [f, d]``.

Attacks are omniscient: they see the round's honest updates, the server's aggregation pipeline
(``ctx.aggregate``) and the number of Byzantine vectors to produce. Data-poisoning attacks
(label flipping) declare a label transform; the engine then trains the Byzantine clients on
their poisoned data and hands those updates to the attack as ``ctx.own_updates``.

Conventions shared by every attack here (docs/architecture.md):

- inputs are never modified; the result is a fresh ``(ctx.f, d)`` tensor with the floating dtype
  and the device of ``honest``; ``ctx.f == 0`` gives an empty ``(0, d)`` tensor (and a round with
  ``f == 0`` is not observed by stateful attacks);
- all Byzantine clients send the same vector unless the attack's docstring says otherwise;
- ``mean`` and ``std`` are coordinate-wise over the honest rows, ``std`` the population one
  (divide by ``n_h``);
- FOE/IPM is ``(1 - tau) * mean``; sign flip is FOE with ``tau = 2``;
- randomness comes only from ``ctx.generator``; state that must survive rounds lives in
  ``ctx.state`` as tensors, ints, floats and lists, so it can be checkpointed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedsafe.core.registry import Registry

ATTACKS: Registry = Registry("attack", reserved=("ctx",))

# Attacks that poison the Byzantine clients' own data: name -> label transform (y, C) -> y'.
LABEL_TRANSFORMS: dict[str, Callable[[Tensor, int], Tensor]] = {}


@dataclass
class AttackContext:
    """What an omniscient attacker knows in one round."""

    f: int  # number of Byzantine vectors to return
    n: int  # participants this round, honest + Byzantine
    round: int
    generator: torch.Generator  # the round's seeded stream for randomised attacks
    aggregate: Callable[[Tensor], Tensor]  # the server's pre-aggregators + rule over (n, d)
    state: dict = field(default_factory=dict)  # persistent across rounds, checkpointed
    own_updates: Tensor | None = None  # Byzantine clients' updates on their own (poisoned) data
    # Client ids of the rows of ``honest`` (same order). Optional; only ``mimic`` uses it, to keep
    # copying the same *client* when participants are sampled and rows change meaning per round.
    honest_ids: tuple[int, ...] | None = None
    # The server's own update on its root dataset this round (FLTrust's g0), or None when the rule
    # has none. Only the adaptive attacks on FLTrust read it: they assume, as Cao et al.'s adaptive
    # attack does, an attacker who knows the root dataset and so the server's update.
    server_update: Tensor | None = None


#: Attacks whose Byzantine clients train on backdoored data (fedsafe.robust.backdoor).
BACKDOOR_ATTACKS: frozenset[str] = frozenset({
    "pattern_backdoor", "model_replacement", "constrain_and_scale",
    "dba", "neurotoxin", "edge_case_backdoor", "adaptive_flame",
})


def needs_own_updates(name: str) -> bool:
    """Whether attack ``name`` needs the Byzantine clients' own (possibly poisoned) updates."""
    return name in LABEL_TRANSFORMS or name in BACKDOOR_ATTACKS


# --------------------------------------------------------------------------------------------
# helpers


def _check(honest: Tensor, ctx: AttackContext, name: str, *, need_honest: bool = True) -> None:
    if honest.ndim != 2:
        raise ValueError(
            f"attack {name!r}: honest updates must be a 2-D (n_h, d) tensor, got shape "
            f"{tuple(honest.shape)}"
        )
    if ctx.f < 0:
        raise ValueError(f"attack {name!r}: ctx.f must be >= 0, got {ctx.f}")
    if need_honest and ctx.f > 0 and honest.shape[0] == 0:
        raise ValueError(f"attack {name!r}: needs at least one honest update, got none")


def _dtype(honest: Tensor) -> torch.dtype:
    return honest.dtype if honest.is_floating_point() else torch.get_default_dtype()


def _empty(honest: Tensor) -> Tensor:
    return torch.empty((0, honest.shape[1]), dtype=_dtype(honest), device=honest.device)


def _repeat(vector: Tensor, honest: Tensor, f: int) -> Tensor:
    """``f`` copies of ``vector`` as a fresh (f, d) tensor (not a view: callers may write to it)."""
    return vector.to(dtype=_dtype(honest), device=honest.device).unsqueeze(0).repeat(f, 1)


def _mean_std(honest: Tensor) -> tuple[Tensor, Tensor]:
    """Coordinate-wise mean and population std (float64) of the honest rows."""
    x = honest.to(torch.float64)
    return x.mean(dim=0), x.std(dim=0, correction=0)


def _positive_int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def _deviation(honest: Tensor, ctx: AttackContext, byz: Tensor, target: Tensor) -> float:
    """‖ctx.aggregate(honest ∪ f copies of byz) − target‖₂; NaN counts as the worst (−inf)."""
    rows = torch.cat([honest, _repeat(byz, honest, ctx.f)], dim=0)
    value = float(torch.linalg.vector_norm(ctx.aggregate(rows).to(torch.float64) - target))
    return -math.inf if math.isnan(value) else value


def line_maximize(
    objective: Callable[[float], float], lo: float, hi: float, *, grid: int, refine: int
) -> tuple[float, float]:
    """Deterministic best-effort ``argmax_{x ∈ [lo, hi]} objective(x)``; returns ``(x, value)``.

    1. Evaluate ``grid`` equally spaced points ``lo + k (hi − lo)/(grid − 1)`` (both ends
       included); keep the first best one ``x_k``.
    2. Golden-section search with ``refine`` more evaluations on ``[x_{k−1}, x_{k+1}]`` (clipped
       to the range), which brackets the maximum when the objective is unimodal there.

    The best point evaluated in either phase is returned, so the answer is never worse than the
    coarse grid's best, whatever the shape of the objective. Cost: ``grid + refine`` evaluations.
    """
    if grid < 2:
        raise ValueError(f"grid must be >= 2, got {grid}")
    if not hi > lo:
        raise ValueError(f"search range must have hi > lo, got [{lo}, {hi}]")
    xs = [lo + (hi - lo) * k / (grid - 1) for k in range(grid)]
    vals = [objective(x) for x in xs]
    k = max(range(grid), key=lambda i: (vals[i], -i))  # first maximiser
    best_x, best_v = xs[k], vals[k]
    if refine < 2:
        return best_x, best_v
    a, b = xs[max(k - 1, 0)], xs[min(k + 1, grid - 1)]
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
    fc, fd = objective(c), objective(d)
    for x, v in ((c, fc), (d, fd)):
        if v > best_v:
            best_x, best_v = x, v
    for _ in range(refine - 2):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - inv_phi * (b - a)
            fc = objective(c)
            x, v = c, fc
        else:
            a, c, fc = c, d, fd
            d = a + inv_phi * (b - a)
            fd = objective(d)
            x, v = d, fd
        if v > best_v:
            best_x, best_v = x, v
    return best_x, best_v


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max for n participants of which f are Byzantine.

    Algorithm 3 of Baruch, Baruch, Goldberg (NeurIPS 2019): the number of "supporters" the
    attackers need is ``s = ⌊n/2 + 1⌋ − f``, and ``z_max = max{z : Φ(z) < (n − s)/n}``, i.e.
    ``z = Φ⁻¹((n − s)/n)`` with Φ the standard normal CDF. Example: n = 50, f = 12 gives
    s = 14, Φ⁻¹(0.72) ≈ 0.5828.
    """
    s = n // 2 + 1 - f
    p = (n - s) / n if n > 0 else math.nan
    if not 0.0 < p < 1.0:
        raise ValueError(
            f"ALIE: z = Φ⁻¹((n − s)/n) with s = ⌊n/2 + 1⌋ − f is not finite for n={n}, f={f} "
            f"((n − s)/n = {p}); pass z explicitly"
        )
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))


# --------------------------------------------------------------------------------------------
# data poisoning and no attack


@ATTACKS.register("none")
def none(honest: Tensor, *, ctx: AttackContext) -> Tensor:
    """No attack: the Byzantine clients behave honestly (send their own updates)."""
    return _own_updates(honest, ctx, "none")


LABEL_TRANSFORMS["none"] = lambda y, num_classes: y


def _own_updates(honest: Tensor, ctx: AttackContext, name: str) -> Tensor:
    _check(honest, ctx, name, need_honest=False)
    if ctx.f == 0 and ctx.own_updates is None:
        return _empty(honest)
    if ctx.own_updates is None:
        raise ValueError(
            f"attack {name!r} needs the Byzantine clients' own updates (ctx.own_updates)"
        )
    own = ctx.own_updates
    if own.ndim != 2 or own.shape[0] != ctx.f or own.shape[1] != honest.shape[1]:
        raise ValueError(
            f"attack {name!r}: ctx.own_updates must have shape ({ctx.f}, {honest.shape[1]}), "
            f"got {tuple(own.shape)}"
        )
    return own.to(dtype=_dtype(honest), device=honest.device, copy=True)


@ATTACKS.register("label_flip")
def label_flip(honest: Tensor, *, ctx: AttackContext) -> Tensor:
    """Label flipping: Byzantine clients train honestly on labels ``y ↦ C − 1 − y``.

    Data poisoning (e.g. Allen-Zhu et al. 2021; Karimireddy, He, Jaggi 2022 use ``9 − y`` on
    10 classes). The label transform is ``LABEL_TRANSFORMS["label_flip"]``; the engine trains the
    Byzantine clients on flipped labels and this attack returns those updates (``ctx.own_updates``)
    unchanged, one per Byzantine client.
    """
    return _own_updates(honest, ctx, "label_flip")


LABEL_TRANSFORMS["label_flip"] = lambda y, num_classes: (num_classes - 1) - y


# --------------------------------------------------------------------------------------------
# targeted backdoors (the trigger, the poisoned batches and the attack success rate are in
# fedsafe.robust.backdoor; target, size and fraction describe the poison the engine applies)


def _backdoor_updates(honest: Tensor, ctx: AttackContext, name: str, fraction: float) -> Tensor:
    if not 0 < fraction <= 1:
        raise ValueError(f"attack {name!r}: fraction must lie in (0, 1], got {fraction}")
    return _own_updates(honest, ctx, name)


@ATTACKS.register("pattern_backdoor")
def pattern_backdoor(
    honest: Tensor, *, ctx: AttackContext, target: int = 0, size: int = 3, fraction: float = 0.5, boost: float = 1.0
) -> Tensor:
    """Pixel-pattern backdoor (Gu et al. 2017, BadNets): Byzantine clients train on batches
    whose first ``⌈fraction·B⌉`` samples carry a ``size × size`` checkerboard trigger and the
    label ``target`` (fedsafe.robust.backdoor), and send those updates times ``boost``.

    The naive backdoor of Bagdasaryan et al. 2020: with ``boost = 1`` the poisoned updates are
    averaged away unless many clients send them; see ``model_replacement`` for the boosted one."""
    if not boost > 0:
        raise ValueError(f"attack 'pattern_backdoor': boost must be > 0, got {boost}")
    return _backdoor_updates(honest, ctx, "pattern_backdoor", fraction) * float(boost)


def _replacement_gamma(ctx: AttackContext, boost: float | None, name: str, server_lr: float | None = None) -> float:
    if server_lr is not None:
        if boost is not None:
            raise ValueError(f"attack {name!r}: give boost or server_lr, not both (server_lr sets boost = n/(f·server_lr))")
        if not server_lr > 0:
            raise ValueError(f"attack {name!r}: server_lr must be > 0, got {server_lr}")
        return ctx.n / (max(ctx.f, 1) * float(server_lr))
    if boost is None:
        return ctx.n / max(ctx.f, 1)
    if not boost > 0:
        raise ValueError(f"attack {name!r}: boost must be > 0, got {boost}")
    return float(boost)


@ATTACKS.register("model_replacement")
def model_replacement(
    honest: Tensor, *, ctx: AttackContext, target: int = 0, size: int = 3, fraction: float = 0.5,
    boost: float | None = None, server_lr: float | None = None,
) -> Tensor:
    """Model replacement (Bagdasaryan, Veit, Hua, Estrin, Shmatikov, AISTATS 2020): the
    backdoored update (trained as ``pattern_backdoor``) boosted by ``γ``.

    The paper's server computes ``G + (η/n) Σ_i (L_i − G)`` and its attacker submits
    ``X = γ(L − G) + G`` with ``γ = n/η``, so that (the honest deltas cancelling near
    convergence) the new global model is the backdoored ``L`` itself. fedsafe's server steps by
    ``server.lr`` times the aggregate of n updates, the f Byzantine ones among them. Hence:

    - default (``boost`` and ``server_lr`` unset): ``γ = n/f``. The mean is what it would be if
      every client sent the backdoored update, so the model moves by ``server.lr`` times the
      backdoored update: full replacement only when ``server.lr = 1``, a step η of the way
      towards it otherwise;
    - ``server_lr = η``: ``γ = n/(f·η)``, the paper's ``γ = n/η`` shared among the f attackers:
      an attacker who knows the server's learning rate (set it to the run's ``server.lr``)
      moves the model by the whole backdoored update, the paper's replacement;
    - ``boost``: ``γ`` as given (not together with ``server_lr``).

    The rule then acts on the boosted updates as on any update."""
    gamma = _replacement_gamma(ctx, boost, "model_replacement", server_lr)
    return _backdoor_updates(honest, ctx, "model_replacement", fraction) * gamma


@ATTACKS.register("constrain_and_scale")
def constrain_and_scale(
    honest: Tensor, *, ctx: AttackContext, target: int = 0, size: int = 3, fraction: float = 0.5,
    boost: float | None = None, quantile: float = 0.5,
) -> Tensor:
    """Constrain-and-scale (Bagdasaryan et al. 2020 §4.2): model replacement (``γ`` as there,
    default n/f) whose updates are then constrained to look normal to the server: each one is
    scaled down to at most the ``quantile`` (default: the median) of the honest updates' L2
    norms, so norm filters and clipping at a typical norm do not single it out.

    The paper constrains by adding an anomaly-detection term to the attacker's training loss;
    fedsafe's attackers train with the ordinary loss and enforce the constraint by projection
    onto the norm ball (what the paper's norm-bound variant, "scale and clip", does), a choice
    that needs no knowledge of the server's detector."""
    if not 0 <= quantile <= 1:
        raise ValueError(f"attack 'constrain_and_scale': quantile must lie in [0, 1], got {quantile}")
    gamma = _replacement_gamma(ctx, boost, "constrain_and_scale")
    byz = _backdoor_updates(honest, ctx, "constrain_and_scale", fraction) * gamma
    if byz.shape[0] == 0 or honest.shape[0] == 0:
        return byz
    bound = torch.quantile(torch.linalg.vector_norm(honest.to(torch.float64), dim=1), quantile)
    norms = torch.linalg.vector_norm(byz.to(torch.float64), dim=1)
    scale = torch.where(norms > bound, bound / norms, torch.ones_like(norms))
    return (byz.to(torch.float64) * scale[:, None]).to(byz.dtype)


def _number(value: object, name: str, what: str, lo: float, hi: float, *, lo_open: bool = False,
            hi_open: bool = False) -> float:
    """``value`` as a float inside the range, else ValueError naming the field and the range."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok:
        v = float(value)
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ValueError(f"attack {name!r}: {what} must be a number in {rng}, got {value!r}")
    return float(value)


def check_attack_params(name: str, params: dict) -> None:
    """Check at set-up, before round 1, the numeric parameters of the attacks below that the
    poison does not use (make_poison checks target, size, fraction, parts, gap, source, angle):
    ValueError naming the attack, the field and its valid range; defaults from the signature."""
    spec = _SETUP_CHECKS.get(name)
    if spec is None:
        return
    entry = ATTACKS.entry(name).params
    for key, check in spec.items():
        value = params.get(key, entry[key].default)
        if value is not None:
            check(value)


_POSITIVE = dict(lo=0.0, hi=math.inf, lo_open=True, hi_open=True)


@ATTACKS.register("dba")
def dba(
    honest: Tensor, *, ctx: AttackContext, target: int = 2, parts: int = 4, size: int = 4, gap: int = 2,
    fraction: float = 0.3125, scale: float = 1.0,  # 20 of 64: the reference's poisoning_per_batch
) -> Tensor:
    """Distributed backdoor attack (Xie, Huang, Chen, Li, "DBA: Distributed backdoor attacks
    against federated learning", ICLR 2020): the global trigger is split into ``parts`` local
    patterns and each Byzantine client trains with only its own part; the attack success rate
    is measured with the global trigger, which no client ever trained on.

    Trigger (fedsafe.robust.backdoor.dba_triggers): part k is a 1 × ``size`` white bar at row
    (k // 2)(1 + gap), column (k % 2)(size + gap); the defaults are the reference code's MNIST
    layout (4 bars of 1 × 4, gap 2, top-left). Byzantine client i takes part rank(i) mod parts,
    rank among the sorted Byzantine ids (the reference's ``adversarial_index``). Each batch's
    first ⌈fraction · B⌉ samples are poisoned, relabelled ``target`` (defaults: the reference's
    ``poisoning_per_batch`` = 20 of 64 and ``poison_label_swap`` = 2). The updates are sent times
    ``scale`` (the paper's γ: 100 for its single-shot MNIST attack, 1 = no scaling, for the
    multi-shot attack fedsafe runs every round). Images only; 8 × 8 digits need e.g.
    size = 3, gap = 1."""
    scale = _number(scale, "dba", "scale", 0.0, math.inf, lo_open=True, hi_open=True)
    return _backdoor_updates(honest, ctx, "dba", fraction) * scale


_BENIGN = ("honest_mean", "previous_aggregate")


def neurotoxin_mask(benign: Tensor, ratio: float) -> Tensor:
    """Neurotoxin's mask: True on the ``⌊ratio · d⌋`` coordinates of smallest ``|benign|``
    (those the benign clients update least), False on the rest (the top ``1 − ratio``); ties
    by the lowest index (a stable sort). ``ratio = 1`` keeps every coordinate."""
    d = benign.shape[0]
    keep = int(math.floor(ratio * d))
    order = torch.sort(benign.detach().abs().to(torch.float64), stable=True).indices
    mask = torch.zeros(d, dtype=torch.bool, device=benign.device)
    mask[order[:keep]] = True
    return mask


@ATTACKS.register("neurotoxin")
def neurotoxin(
    honest: Tensor, *, ctx: AttackContext, target: int = 0, size: int = 3, fraction: float = 0.5,
    ratio: float = 0.95, benign: str = "honest_mean", boost: float = 1.0,
) -> Tensor:
    """Neurotoxin (Zhang, Panda, Song, Yang, Mahoney, Mittal, Ramchandran, Gonzalez, ICML 2022,
    "Neurotoxin: durable backdoors in federated learning"): the backdoor is confined to the
    coordinates the honest clients update least, so later honest rounds do not overwrite it.

    The Byzantine clients train on the checkerboard backdoor of ``pattern_backdoor``
    (``target``, ``size``, ``fraction``). Each update is then projected onto the mask of
    :func:`neurotoxin_mask`: the ``⌊ratio · d⌋`` coordinates of smallest magnitude in the
    benign direction are kept, the top ``1 − ratio`` zeroed. ``ratio`` is the reference code's
    ``gradmask_ratio`` (jhcknzzm/Federated-Learning-Backdoor: the fraction *retained*; 1.0 is its
    baseline without a mask; its README runs 0.95, the default here; the paper's "top-k%" is
    ``1 − ratio``), computed over all coordinates at once (its ``aggregate_all_layer = 1``).
    The benign direction (``benign``): ``"honest_mean"``, this round's mean honest update (the
    omniscient attacker's stand-in for the reference code's gradient on clean data at the current
    global model), or ``"previous_aggregate"``, the server's aggregate of the previous round
    (the paper's Algorithm 1, the global update θ_t − θ_{t−1}, up to the server's step size,
    which the magnitudes' order ignores; the first observed round uses the honest mean). The
    result is sent times ``boost``.

    The reference masks the gradient at every local step (projected gradient descent); fedsafe
    masks the update the Byzantine client computed, which is the same for one local gradient
    step (``dsgd``, or ``fedavg`` with one step) and the projection of the whole local update
    otherwise. State (``"previous_aggregate"``): ``ctx.state["previous"]``, a float64 tensor."""
    ratio = _number(ratio, "neurotoxin", "ratio", 0.0, 1.0, lo_open=True)
    boost = _number(boost, "neurotoxin", "boost", 0.0, math.inf, lo_open=True, hi_open=True)
    _check_benign(benign)
    own = _backdoor_updates(honest, ctx, "neurotoxin", fraction)
    if ctx.f == 0:
        return own
    direction = None
    if benign == "previous_aggregate" and "previous" in ctx.state:
        direction = ctx.state["previous"].to(device=honest.device)
    if direction is None or direction.shape[0] != honest.shape[1]:
        if honest.shape[0] == 0:
            raise ValueError("attack 'neurotoxin': needs at least one honest update for the benign direction")
        direction = _mean_std(honest)[0]
    mask = neurotoxin_mask(direction, ratio)
    out = own * mask.to(own.dtype)[None, :] * boost
    if benign == "previous_aggregate":
        ctx.state["previous"] = ctx.aggregate(torch.cat([honest, out], dim=0)).detach().to(torch.float64).cpu()
    return out


@ATTACKS.register("edge_case_backdoor")
def edge_case_backdoor(
    honest: Tensor, *, ctx: AttackContext, source: int = 7, target: int = 1, angle: float = 90.0,
    fraction: float = 0.5, eps: float | None = None, boost: float = 1.0,
) -> Tensor:
    """Edge-case backdoor (Wang, Sreenivasan, Rajput, Vishwakarma, Agarwal, Sohn, Lee,
    Papailiopoulos, NeurIPS 2020, "Attack of the tails"): the poison is rare inputs, not a
    trigger. The Byzantine clients train on batches whose first ⌈fraction · B⌉ samples are
    edge cases, training images of class ``source`` rotated by ``angle`` degrees
    counter-clockwise (fedsafe.robust.backdoor.rotate; fedsafe has no ARDIS, whose
    out-of-distribution 7s the paper labels 1: hence the defaults 7 → 1), labelled ``target``;
    the rest are clean. The attack success rate is measured on the rotated *test* images of
    class ``source``: held-out edge cases, not the whole test set.

    ``eps``: the paper's projected variant, the update projected onto the L2 ball of radius
    ``eps`` around the global model (‖Δ‖ ≤ eps), so a norm bound of eps lets it through; the
    reference projects every few local steps, fedsafe projects the final update (the same
    ball). ``boost``: multiplies the (projected) update, the paper's model replacement
    (n/f for full replacement under server lr 1); "PGD with replacement" is both, and then the
    update's norm is ``boost · eps``."""
    boost = _number(boost, "edge_case_backdoor", "boost", 0.0, math.inf, lo_open=True, hi_open=True)
    if eps is not None:
        eps = _number(eps, "edge_case_backdoor", "eps", 0.0, math.inf, lo_open=True, hi_open=True)
    own = _backdoor_updates(honest, ctx, "edge_case_backdoor", fraction)
    if eps is not None and own.shape[0] > 0:
        x = own.to(torch.float64)
        norms = torch.linalg.vector_norm(x, dim=1)
        scale = torch.where(norms > eps, eps / torch.where(norms > 0, norms, 1.0), torch.ones_like(norms))
        own = (x * scale[:, None]).to(own.dtype)
    return own * boost


def _unit(v: Tensor) -> Tensor:
    n = torch.linalg.vector_norm(v)
    return v / n if n > 0 else v


@ATTACKS.register("adaptive_fltrust")
def adaptive_fltrust(
    honest: Tensor, *, ctx: AttackContext, cos_min: float = 0.1, grid: int = 21, refine: int = 12,
) -> Tensor:
    """An attack on FLTrust by an attacker who knows the rule and the server's root update
    (Cao et al. NDSS 2021, §"adaptive attack": the attacker knows the root dataset): the
    sign-flip direction bent just enough towards the root update to keep a positive trust score.

    With ``g0`` the server's update (``ctx.server_update``; an attacker who does not know it,
    or a rule without one, uses the honest mean as its estimate) and ``a = −mean(honest)`` the
    naive sign-flip direction, let ``a⊥`` be the part of ``a`` orthogonal to ``g0``. Every
    Byzantine client sends ``u(c) = ‖g0‖ (c ĝ0 + √(1 − c²) â⊥)``: cosine exactly ``c`` to
    ``g0`` (trust score c > 0) and norm ``‖g0‖`` (FLTrust's rescaling leaves it unchanged).
    ``c ∈ [cos_min, 1]`` maximises ``‖ctx.aggregate(honest ∪ f × u(c)) −
    ctx.aggregate(honest)‖``, the shift of the server's aggregate (:func:`line_maximize`,
    ``grid + refine`` calls). A naive sign flip has cosine < 0 with ``g0`` whenever the honest
    mean has a positive one, so FLTrust gives it trust 0. (Cao et al. optimise the direction
    by gradient steps within Fang et al.'s framework; fedsafe searches the one angle.)"""
    _check(honest, ctx, "adaptive_fltrust")
    cos_min = _number(cos_min, "adaptive_fltrust", "cos_min", 0.0, 1.0, lo_open=True, hi_open=True)
    if ctx.f == 0:
        return _empty(honest)
    grid = _positive_int(grid, "adaptive_fltrust: grid", 2)
    refine = _positive_int(refine, "adaptive_fltrust: refine", 0)
    mean, _ = _mean_std(honest)
    g0 = mean if ctx.server_update is None else ctx.server_update.to(device=mean.device, dtype=torch.float64)
    if g0.shape != mean.shape:
        raise ValueError(f"adaptive_fltrust: ctx.server_update must have shape {tuple(mean.shape)}, got {tuple(g0.shape)}")
    norm0 = float(torch.linalg.vector_norm(g0))
    if norm0 == 0:
        return _repeat(torch.zeros_like(mean), honest, ctx.f)
    e0 = g0 / norm0
    a = -mean
    perp = a - (a @ e0) * e0
    if float(torch.linalg.vector_norm(perp)) <= 1e-12 * max(float(torch.linalg.vector_norm(a)), 1.0):
        # the honest mean is parallel to g0: any direction orthogonal to it is as good
        z = torch.randn(mean.shape[0], generator=ctx.generator, device=ctx.generator.device, dtype=torch.float64)
        z = z.to(mean.device)
        perp = z - (z @ e0) * e0
    ep = _unit(perp)

    def vector(c: float) -> Tensor:
        return norm0 * (c * e0 + math.sqrt(max(1.0 - c * c, 0.0)) * ep)

    base = ctx.aggregate(honest).to(torch.float64)
    c, _ = line_maximize(lambda c: _deviation(honest, ctx, vector(c), base), cos_min, 1.0, grid=grid, refine=refine)
    return _repeat(vector(c), honest, ctx.f)


@ATTACKS.register("adaptive_flame")
def adaptive_flame(
    honest: Tensor, *, ctx: AttackContext, target: int = 0, size: int = 3, fraction: float = 0.5,
    steps: int = 20,
) -> Tensor:
    """A backdoor on FLAME by an attacker who knows the rule (Nguyen et al. USENIX Security
    2022, §"adaptive attacks": constrain the angular deviation so the clustering admits the
    poisoned model, and its norm so the clipping does not shrink it).

    The Byzantine clients train on the checkerboard backdoor (as ``pattern_backdoor``); with
    ``b̂`` the direction of their mean backdoored update and ``m̂`` that of the honest mean,
    every Byzantine client sends ``v(λ) = S · unit((1 − λ) m̂ + λ b̂)``, ``S`` the median L2
    norm of the honest updates (FLAME clips to the median norm of all updates, which f
    copies of a norm-S vector leave at S). λ is the largest value in [0, 1] for which FLAME's
    own clustering (fedsafe.robust.flame.admitted, which the attacker runs on the honest
    updates and its f copies) admits all f copies: λ = 1 if the scaled backdoor itself passes,
    else a bisection of ``steps`` halvings between an admitted and a refused λ (admission is not
    guaranteed monotone in λ; the bisection returns an admitted one). The naive backdoor
    (``model_replacement``: the update times n/f) sits far from the honest cluster in cosine
    and is refused. Needs the ``hdbscan`` package."""
    steps = _positive_int(steps, "adaptive_flame: steps", 1)
    own = _backdoor_updates(honest, ctx, "adaptive_flame", fraction)
    if ctx.f == 0:
        return own
    if honest.shape[0] == 0:
        raise ValueError("attack 'adaptive_flame': needs at least one honest update")
    from fedsafe.robust.flame import admitted

    x = honest.to(torch.float64)
    m = _unit(x.mean(dim=0))
    b = _unit(own.to(torch.float64).mean(dim=0))
    s = float(torch.quantile(torch.linalg.vector_norm(x, dim=1), 0.5))
    n_h, f = x.shape[0], ctx.f

    def vector(lam: float) -> Tensor:
        return s * _unit((1.0 - lam) * m + lam * b)

    def passes(lam: float) -> bool:
        rows = torch.cat([x, vector(lam).unsqueeze(0).expand(f, -1)], dim=0)
        return bool((admitted(rows) >= n_h).sum() == f)

    if passes(1.0):
        return _repeat(vector(1.0), honest, f)
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return _repeat(vector(lo), honest, f)


def _check_benign(value: object) -> None:
    if value not in _BENIGN:
        raise ValueError(f"attack 'neurotoxin': benign {value!r} unknown; valid: {', '.join(_BENIGN)}")


_SETUP_CHECKS: dict[str, dict[str, Callable[[object], object]]] = {
    "dba": {"scale": lambda v: _number(v, "dba", "scale", **_POSITIVE)},
    "neurotoxin": {
        "ratio": lambda v: _number(v, "neurotoxin", "ratio", 0.0, 1.0, lo_open=True),
        "boost": lambda v: _number(v, "neurotoxin", "boost", **_POSITIVE),
        "benign": lambda v: _check_benign(v),
    },
    "edge_case_backdoor": {
        "eps": lambda v: _number(v, "edge_case_backdoor", "eps", **_POSITIVE),
        "boost": lambda v: _number(v, "edge_case_backdoor", "boost", **_POSITIVE),
    },
    "adaptive_fltrust": {
        "cos_min": lambda v: _number(v, "adaptive_fltrust", "cos_min", 0.0, 1.0, lo_open=True, hi_open=True),
        "grid": lambda v: _positive_int(v, "adaptive_fltrust: grid", 2),
        "refine": lambda v: _positive_int(v, "adaptive_fltrust: refine", 0),
    },
    "adaptive_flame": {"steps": lambda v: _positive_int(v, "adaptive_flame: steps", 1)},
}


# --------------------------------------------------------------------------------------------
# fixed model-poisoning attacks


def _foe_vector(honest: Tensor, tau: float) -> Tensor:
    mean, _ = _mean_std(honest)
    return (1.0 - float(tau)) * mean


@ATTACKS.register("sign_flip")
def sign_flip(honest: Tensor, *, ctx: AttackContext) -> Tensor:
    """Sign flip: every Byzantine client sends ``−mean(honest)`` (FOE with τ = 2)."""
    _check(honest, ctx, "sign_flip")
    if ctx.f == 0:
        return _empty(honest)
    return _repeat(_foe_vector(honest, 2.0), honest, ctx.f)


@ATTACKS.register("foe")
def foe(honest: Tensor, *, ctx: AttackContext, tau: float = 1.1) -> Tensor:
    """Fall of Empires / inner-product manipulation: send ``(1 − τ) · mean(honest)``.

    Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product
    Manipulation" (UAI 2020) send ``−ε · mean``; that is this attack with ``τ = 1 + ε``. τ = 2 is
    the sign flip, τ = 1 the zero vector. Default τ = 1.1 (ε = 0.1, the value Xie et al. and
    Karimireddy et al. 2022 use against median/Krum-type rules).
    """
    _check(honest, ctx, "foe")
    if ctx.f == 0:
        return _empty(honest)
    return _repeat(_foe_vector(honest, tau), honest, ctx.f)


@ATTACKS.register("ipm")
def ipm(honest: Tensor, *, ctx: AttackContext, eps: float = 0.1) -> Tensor:
    """Inner-product manipulation (Xie et al. 2020): send ``−ε · mean(honest)``.

    Same as ``foe`` with ``τ = 1 + ε``; default ε = 0.1 as in Xie et al. and Karimireddy,
    He, Jaggi 2022 (ε large, e.g. 100, targets averaging-type rules).
    """
    _check(honest, ctx, "ipm")
    if ctx.f == 0:
        return _empty(honest)
    return _repeat(_foe_vector(honest, 1.0 + float(eps)), honest, ctx.f)


@ATTACKS.register("alie")
def alie(honest: Tensor, *, ctx: AttackContext, z: float | None = None) -> Tensor:
    """A Little Is Enough (Baruch, Baruch, Goldberg, NeurIPS 2019): send ``mean + z · std``.

    ``mean`` and ``std`` are coordinate-wise over the honest updates (population std). When
    ``z`` is None it is derived from ``n = ctx.n`` and ``f = ctx.f`` as in the paper's
    Algorithm 3: ``s = ⌊n/2 + 1⌋ − f``, ``z = Φ⁻¹((n − s)/n)`` (see :func:`alie_z`).
    """
    _check(honest, ctx, "alie")
    if ctx.f == 0:
        return _empty(honest)
    zz = alie_z(ctx.n, ctx.f) if z is None else float(z)
    mean, std = _mean_std(honest)
    return _repeat(mean + zz * std, honest, ctx.f)


# --------------------------------------------------------------------------------------------
# local model poisoning against Krum and trimmed mean (Fang, Cao, Jia, Gong, USENIX Security 2020)
#
# Full-knowledge attacks, written in fedsafe's update space: the server steps against the
# aggregate, so the honest clients push parameter j along -sign(mu_j) (mu the honest mean) and
# Fang's "direction of change under no attack" s_j is -sign(mu_j). Both attacks push the other
# way: they make the aggregate's coordinates take the sign opposite to mu's.


def _fang_direction(honest: Tensor) -> Tensor:
    """sign(mu_j) of the honest mean (0 where mu_j = 0), float64."""
    return torch.sign(honest.to(torch.float64).mean(dim=0))


@ATTACKS.register("fang_trimmed_mean")
def fang_trimmed_mean(honest: Tensor, *, ctx: AttackContext, b: float = 2.0) -> Tensor:
    """Fang et al.'s attack on trimmed mean and median (USENIX Security 2020, full knowledge):
    per coordinate, values beyond the honest extreme on the side opposite to the honest mean.

    With ``w_max_j`` / ``w_min_j`` the largest / smallest honest value of coordinate j and
    ``mu_j`` the honest mean: where ``mu_j > 0`` each Byzantine value is drawn uniformly from
    ``[w_min_j / b, w_min_j]`` if ``w_min_j > 0``, else from ``[b · w_min_j, w_min_j]`` (below
    every honest value, at most a factor b further); where ``mu_j < 0``, symmetrically from
    ``[w_max_j, b · w_max_j]`` if ``w_max_j > 0``, else ``[w_max_j, w_max_j / b]``; where
    ``mu_j = 0``, the honest mean. Draws come from ``ctx.generator``. Requires ``b > 1``."""
    _check(honest, ctx, "fang_trimmed_mean")
    if ctx.f == 0:
        return _empty(honest)
    if not b > 1:
        raise ValueError(f"attack 'fang_trimmed_mean': b must be > 1, got {b}")
    x = honest.to(torch.float64)
    lo, hi = x.amin(dim=0), x.amax(dim=0)
    direction = _fang_direction(honest)
    # the interval [a, c] on the attacked side of each coordinate
    down_a = torch.where(lo > 0, lo / b, b * lo)  # mu > 0: push below the smallest value
    up_c = torch.where(hi > 0, b * hi, hi / b)  # mu < 0: push above the largest value
    a = torch.where(direction > 0, down_a, hi)
    c = torch.where(direction > 0, lo, up_c)
    u = torch.rand((ctx.f, x.shape[1]), generator=ctx.generator, dtype=torch.float64)
    out = a + u * (c - a)
    out = torch.where(direction == 0, x.mean(dim=0), out)
    return out.to(_dtype(honest))


@ATTACKS.register("fang_krum")
def fang_krum(
    honest: Tensor, *, ctx: AttackContext, threshold: float = 1e-5, eps: float = 0.0
) -> Tensor:
    """Fang et al.'s attack on Krum (USENIX Security 2020, full knowledge): the crafted update
    ``u = -λ · sign(mu)`` (mu the honest mean) with the largest λ for which the server's
    pipeline selects it, and the other f−1 Byzantine updates within ``eps`` of u.

    λ starts at Fang's upper bound, in update space (the previous global model is the zero
    update): ``λ₀ = min_i Σ_{l ∈ N_i} ‖x_l − x_i‖ / ((n − 2f − 1)√d) + max_i ‖x_i‖ / √d`` with
    N_i the n − f − 2 honest updates nearest x_i, and is halved until ``ctx.aggregate`` of the
    round's updates returns u (the pipeline selected it) or λ falls below ``threshold``; the
    last λ tried is sent. The f−1 companions are u plus ``eps``-scaled uniform noise in
    [−1, 1]^d (from ``ctx.generator``); ``eps = 0`` sends copies, which Krum scores best."""
    _check(honest, ctx, "fang_krum")
    if ctx.f == 0:
        return _empty(honest)
    if not threshold > 0:
        raise ValueError(f"attack 'fang_krum': threshold must be > 0, got {threshold}")
    if not eps >= 0:
        raise ValueError(f"attack 'fang_krum': eps must be >= 0, got {eps}")
    x = honest.to(torch.float64)
    m, d = x.shape
    n, f = ctx.n, ctx.f
    dist = torch.cdist(x, x)
    k = max(1, min(m - 1, n - f - 2))
    nearest = torch.sort(dist + torch.diag(torch.full((m,), math.inf, dtype=x.dtype)), dim=1).values[:, :k]
    nearest = torch.where(torch.isfinite(nearest), nearest, torch.zeros_like(nearest))
    lam = float(nearest.sum(dim=1).min()) / (max(1, n - 2 * f - 1) * math.sqrt(d))
    lam += float(torch.linalg.vector_norm(x, dim=1).max()) / math.sqrt(d)
    direction = -_fang_direction(honest)
    noise = eps * (2 * torch.rand((f - 1, d), generator=ctx.generator, dtype=torch.float64) - 1)
    while True:
        crafted = lam * direction
        byz = torch.cat([crafted[None], crafted[None] + noise]).to(_dtype(honest))
        chosen = ctx.aggregate(torch.cat([honest, byz]))
        if torch.allclose(chosen.to(torch.float64), byz[0].to(torch.float64)) or lam / 2 < threshold:
            return byz
        lam /= 2


# --------------------------------------------------------------------------------------------
# adaptive (per-round optimised) attacks


def _optimal(
    honest: Tensor, ctx: AttackContext, name: str, vector: Callable[[float, Tensor, Tensor], Tensor],
    lo: float, hi: float, grid: int, refine: int,
) -> Tensor:
    """Send ``vector(t*, mean, std)`` with t* the :func:`line_maximize` maximiser over [lo, hi]
    of the deviation of the server's aggregate from the honest mean."""
    _check(honest, ctx, name)
    if ctx.f == 0:
        return _empty(honest)
    grid = _positive_int(grid, f"{name}: grid", 2)
    refine = _positive_int(refine, f"{name}: refine", 0)
    mean, std = _mean_std(honest)
    t, _ = line_maximize(
        lambda u: _deviation(honest, ctx, vector(u, mean, std), mean), float(lo), float(hi), grid=grid, refine=refine
    )
    return _repeat(vector(t, mean, std), honest, ctx.f)


@ATTACKS.register("optimal_foe")
def optimal_foe(
    honest: Tensor,
    *,
    ctx: AttackContext,
    tau_min: float = 1.0,
    tau_max: float = 21.0,
    grid: int = 21,
    refine: int = 12,
) -> Tensor:
    """FOE with τ chosen per round to maximise the damage to the server's aggregate.

    Sends ``(1 − τ*) · mean`` with ``τ* ≈ argmax_{τ ∈ [tau_min, tau_max]}
    ‖ctx.aggregate(honest ∪ f × (1 − τ) mean) − mean‖₂`` (the "optimal" IPM of Allouah et al.
    2023 / ByzFL, which line-search ε ≥ 0 in ``−ε · mean``; τ = 1 + ε, so the default range is
    ε ∈ [0, 20]). Search: :func:`line_maximize` — ``grid`` equally spaced τ, then ``refine``
    golden-section evaluations around the best; ``grid + refine`` calls to ``ctx.aggregate``.
    Deterministic.
    """
    return _optimal(honest, ctx, "optimal_foe", lambda t, mean, std: (1.0 - t) * mean, tau_min, tau_max, grid, refine)


@ATTACKS.register("optimal_alie")
def optimal_alie(
    honest: Tensor,
    *,
    ctx: AttackContext,
    z_min: float = 0.0,
    z_max: float = 10.0,
    grid: int = 21,
    refine: int = 12,
) -> Tensor:
    """ALIE with z chosen per round to maximise the damage to the server's aggregate.

    Sends ``mean + z* · std`` with ``z* ≈ argmax_{z ∈ [z_min, z_max]}
    ‖ctx.aggregate(honest ∪ f × (mean + z std)) − mean‖₂`` (population std; the "optimal" ALIE
    of Allouah et al. 2023 / ByzFL, which line-search z ≥ 0). Search: :func:`line_maximize`
    — ``grid`` equally spaced z, then ``refine`` golden-section evaluations around the best;
    ``grid + refine`` calls to ``ctx.aggregate``. Deterministic.
    """
    return _optimal(honest, ctx, "optimal_alie", lambda z, mean, std: mean + z * std, z_min, z_max, grid, refine)


# --------------------------------------------------------------------------------------------
# Shejwalkar & Houmansadr 2021: min-max / min-sum

_DIRECTIONS = ("std", "unit_vec", "sign")


def _perturbation(mean: Tensor, std: Tensor, direction: str) -> Tensor:
    if direction == "std":
        return -std
    if direction == "unit_vec":
        norm = torch.linalg.vector_norm(mean)
        return -mean / norm if norm > 0 else torch.zeros_like(mean)
    if direction == "sign":
        return -torch.sign(mean)
    raise ValueError(
        f"perturbation direction {direction!r} unknown; valid: {', '.join(_DIRECTIONS)}"
    )


def manipulation_gamma(
    honest: Tensor, perturbation: Tensor, *, objective: str, gamma_init: float, tol: float
) -> float:
    """Largest γ ≥ 0 (to ``tol``) with ``mean + γ p`` inside Shejwalkar & Houmansadr's bound.

    With ``x_1..x_m`` the honest updates and ``m(γ) = mean + γ p``:

    - ``objective="minmax"``: ``max_j ‖m(γ) − x_j‖² ≤ max_{i,j} ‖x_i − x_j‖²``;
    - ``objective="minsum"``: ``Σ_j ‖m(γ) − x_j‖² ≤ max_i Σ_j ‖x_i − x_j‖²``.

    Both left sides are convex in γ and hold at γ = 0 (the mean is within the bounds), so the
    feasible γ ≥ 0 form an interval ``[0, γ⁺]``. All distances come from the Gram matrix of the
    centred updates (``‖γp − c_j‖² = γ²‖p‖² − 2γ⟨p, c_j⟩ + ‖c_j‖²``), float64.

    Search: the paper's Algorithm 1 is a halving search started at ``gamma_init`` whose reach
    is capped at ``2 · gamma_init``; we first double γ from ``gamma_init`` while it is feasible
    (so no cap), then bisect the bracket ``[feasible, infeasible]`` until its width is ≤ ``tol``
    and return its feasible end: γ is feasible and ``γ + tol`` is not. ``p = 0`` returns 0.
    """
    if objective not in ("minmax", "minsum"):
        raise ValueError(f"objective must be 'minmax' or 'minsum', got {objective!r}")
    if not gamma_init > 0 or not tol > 0:
        raise ValueError(f"gamma_init and tol must be > 0, got {gamma_init}, {tol}")
    x = honest.to(torch.float64)
    c = x - x.mean(dim=0)
    p = perturbation.to(torch.float64)
    gram = c @ c.T
    sq = gram.diagonal()
    pair = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min(0.0)
    pc = c @ p
    pp = float(p @ p)
    if pp == 0.0:
        return 0.0
    if objective == "minmax":
        bound = float(pair.max())
    else:
        bound = float(pair.sum(dim=1).max())

    def feasible(gamma: float) -> bool:
        dist = (gamma * gamma * pp - 2.0 * gamma * pc + sq).clamp_min(0.0)
        value = dist.max() if objective == "minmax" else dist.sum()
        return float(value) <= bound

    lo, hi = 0.0, float(gamma_init)
    for _ in range(200):  # p ≠ 0 makes the bound fail for γ large enough
        if not feasible(hi):
            break
        lo, hi = hi, 2.0 * hi
    else:
        return lo
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _manipulation(
    honest: Tensor, ctx: AttackContext, name: str, direction: str, gamma_init: float, tol: float
) -> Tensor:
    _check(honest, ctx, name)
    if direction not in _DIRECTIONS:
        raise ValueError(
            f"{name}: direction {direction!r} unknown; valid: {', '.join(_DIRECTIONS)}"
        )
    if ctx.f == 0:
        return _empty(honest)
    mean, std = _mean_std(honest)
    p = _perturbation(mean, std, direction)
    gamma = manipulation_gamma(
        honest, p, objective=name, gamma_init=float(gamma_init), tol=float(tol)
    )
    return _repeat(mean + gamma * p, honest, ctx.f)


@ATTACKS.register("minmax")
def minmax(
    honest: Tensor,
    *,
    ctx: AttackContext,
    direction: str = "std",
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> Tensor:
    """Min-Max (Shejwalkar & Houmansadr, "Manipulating the Byzantine", NDSS 2021).

    Sends ``mean + γ ∇ᵖ`` with the largest γ such that the malicious update is no farther from
    any honest update than the two farthest honest updates are from each other:
    ``max_j ‖mal − x_j‖ ≤ max_{i,j} ‖x_i − x_j‖``. Perturbation ``∇ᵖ`` (``direction``):
    ``"std"`` = −std (population std; default), ``"unit_vec"`` = −mean/‖mean‖,
    ``"sign"`` = −sign(mean). γ by the search of :func:`manipulation_gamma` (``gamma_init`` = 10
    and ``tol`` = 1e-5 as in the authors' code).
    """
    return _manipulation(honest, ctx, "minmax", direction, gamma_init, tol)


@ATTACKS.register("minsum")
def minsum(
    honest: Tensor,
    *,
    ctx: AttackContext,
    direction: str = "std",
    gamma_init: float = 10.0,
    tol: float = 1e-5,
) -> Tensor:
    """Min-Sum (Shejwalkar & Houmansadr, "Manipulating the Byzantine", NDSS 2021).

    Sends ``mean + γ ∇ᵖ`` with the largest γ such that the malicious update's sum of squared
    distances to the honest updates is at most the largest such sum of an honest update:
    ``Σ_j ‖mal − x_j‖² ≤ max_i Σ_j ‖x_i − x_j‖²``. ``direction``, ``gamma_init``, ``tol`` as
    for ``minmax``.
    """
    return _manipulation(honest, ctx, "minsum", direction, gamma_init, tol)


# --------------------------------------------------------------------------------------------
# random and non-finite vectors


@ATTACKS.register("gaussian")
def gaussian(honest: Tensor, *, ctx: AttackContext, std: float = 200.0) -> Tensor:
    """Gaussian noise: each Byzantine client sends its own independent ``N(0, std² I_d)`` draw.

    The f × d draws come from ``ctx.generator`` (on the generator's device, in the output
    dtype), so a seeded round is reproducible. Default std = 200 (as in e.g. Allouah et al. 2023).
    """
    _check(honest, ctx, "gaussian", need_honest=False)
    if ctx.f == 0:
        return _empty(honest)
    g = ctx.generator
    noise = torch.randn(
        (ctx.f, honest.shape[1]), generator=g, device=g.device, dtype=_dtype(honest)
    )
    return (float(std) * noise).to(honest.device)


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@ATTACKS.register("inf_nan")
def inf_nan(honest: Tensor, *, ctx: AttackContext, value: str = "nan") -> Tensor:
    """Non-finite vectors: every coordinate is ``value`` ∈ {"nan", "inf", "-inf"}.

    Checks that the pipeline rejects or survives non-finite inputs rather than propagating them.
    """
    _check(honest, ctx, "inf_nan", need_honest=False)
    if value not in _NON_FINITE:
        raise ValueError(f"inf_nan: value {value!r} unknown; valid: {', '.join(_NON_FINITE)}")
    return torch.full(
        (ctx.f, honest.shape[1]), _NON_FINITE[value], dtype=_dtype(honest), device=honest.device
    )


# --------------------------------------------------------------------------------------------
# attacks below the message level: they corrupt a protocol's encoding, so only that protocol
# can carry them out

#: Attacks that act on a protocol's encoding rather than on the message: name -> the protocols
#: that emulate them (the engine refuses the attack under any other; see check_attack_protocol).
PROTOCOL_ATTACKS: dict[str, frozenset[str]] = {"he_invalid_digits": frozenset({"he"})}


def check_attack_protocol(name: str, protocol: str) -> None:
    """Raise ValueError naming ``attack.name`` and ``protocol`` when attack ``name`` acts on an
    encoding that ``protocol`` does not have (``PROTOCOL_ATTACKS``)."""
    allowed = PROTOCOL_ATTACKS.get(name)
    if allowed is not None and protocol not in allowed:
        raise ValueError(
            f"attack.name = {name!r} needs protocol = {' or '.join(repr(p) for p in sorted(allowed))}: it corrupts "
            f"that protocol's encoding below the message level, which protocol = {protocol!r} does not have"
        )


def invalid_digit_fraction(params: dict) -> float:
    """The checked ``fraction`` of attack ``he_invalid_digits`` (default 1.0), from its params."""
    value = params.get("fraction", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"attack 'he_invalid_digits': fraction must be a number in (0, 1], got {value!r}")
    return float(value)


@ATTACKS.register("he_invalid_digits")
def he_invalid_digits(honest: Tensor, *, ctx: AttackContext, fraction: float = 1.0) -> Tensor:
    """HE only (protocol = "he"): each Byzantine node encrypts digits outside their allowed range
    -- random residues mod p -- on ``fraction`` of its coordinates (default all).

    Every HE node holds the shared key, so it can skip the encoder. The attack acts below the
    message level: this function returns the messages the nodes encode on their other
    coordinates, the honest mean (so nothing but the digits gives them away), and the HE
    protocol, which emulates every node's encoding, replaces the Byzantine nodes' digits on
    ``fraction`` of the coordinates (``fedsafe.protocols.he.protocol``; residues uniform outside
    each digit's range, from the stream ``("he.invalid_digits", round, client id)``). With
    ``he.check_digits`` (default) the homomorphic digit check excludes such nodes; without it
    one of them makes the nodes zero almost every coordinate of the round. The engine refuses
    the attack under any other protocol (``PROTOCOL_ATTACKS``)."""
    _check(honest, ctx, "he_invalid_digits")
    invalid_digit_fraction({"fraction": fraction})
    if ctx.f == 0:
        return _empty(honest)
    mean, _ = _mean_std(honest)
    return _repeat(mean, honest, ctx.f)


# --------------------------------------------------------------------------------------------
# Karimireddy, He, Jaggi 2022: mimic


@ATTACKS.register("mimic")
def mimic(honest: Tensor, *, ctx: AttackContext, warmup: int = 1) -> Tensor:
    """Mimic (Karimireddy, He, Jaggi, "Byzantine-robust learning on heterogeneous datasets via
    bucketing", ICLR 2022): every Byzantine client copies one honest client.

    The target maximises ``⟨x_i, z⟩`` where z estimates the direction of largest variance of the
    honest updates, ``z ≈ argmax_{‖z‖=1} Σ_i ⟨z, x_i − μ⟩²``, by an online power method over the
    first ``warmup`` observed rounds t = 0, 1, …, warmup − 1 (as in the authors' code):

    - t = 0: ``μ ← x̄₀``; ``z₀ ~ N(0, I)`` from ``ctx.generator``;
      ``z ← Σ_i ⟨x_i − μ, z₀⟩ (x_i − μ)``, normalised;
    - 0 < t < warmup: ``μ ← t/(t+1) μ + x̄_t/(t+1)``; ``u = Σ_i ⟨x_i − μ, z⟩ (x_i − μ)``;
      ``z ← t/(t+1) z + u/‖u‖/(t+1)``, normalised;
    - t < warmup: send ``x_{i*}``, ``i* = argmax_i ⟨x_i, z⟩``, and remember i*;
    - t ≥ warmup: z and the target are frozen; send the update of the target remembered in the
      last warm-up round.

    The target is a client id when ``ctx.honest_ids`` is given, otherwise a row index (right
    under full participation with a fixed order). If the target does not take part in a round
    after warm-up, that round falls back to ``argmax_i ⟨x_i, z⟩`` with the frozen z.
    Default ``warmup = 1`` (the authors' code default). State, in ``ctx.state``:
    ``t`` (int, rounds observed), ``mu`` and ``z`` (float64 tensors [d]), ``target`` (int).
    """
    _check(honest, ctx, "mimic")
    warmup = _positive_int(warmup, "mimic: warmup", 1)
    if ctx.f == 0:
        return _empty(honest)
    ids = ctx.honest_ids
    if ids is not None and len(ids) != honest.shape[0]:
        raise ValueError(
            f"mimic: ctx.honest_ids has {len(ids)} ids for {honest.shape[0]} honest updates"
        )
    st = ctx.state
    x = honest.to(torch.float64)
    xbar = x.mean(dim=0)
    t = int(st.get("t", 0))

    def power_step(mu: Tensor, z: Tensor) -> Tensor:
        c = x - mu
        u = c.T @ (c @ z)
        norm = torch.linalg.vector_norm(u)
        return u / norm if norm > 0 else z

    def normalised(z: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(z)
        return z / norm if norm > 0 else z

    if t == 0:
        g = ctx.generator
        z0 = torch.randn(x.shape[1], generator=g, device=g.device, dtype=torch.float64)
        mu = xbar
        z = normalised(power_step(mu, z0.to(x.device)))
    else:
        mu = st["mu"].to(device=x.device, dtype=torch.float64)
        z = st["z"].to(device=x.device, dtype=torch.float64)
        if t < warmup:
            mu = t / (t + 1) * mu + xbar / (t + 1)
            z = normalised(t / (t + 1) * z + power_step(mu, z) / (t + 1))

    row = None
    if t >= warmup and "target" in st:
        target = int(st["target"])
        if ids is None:
            row = target if target < x.shape[0] else None
        else:
            row = ids.index(target) if target in ids else None
    if row is None:
        row = int(torch.argmax(x @ z))
    if t < warmup:
        st["target"] = int(row if ids is None else ids[row])
        st["mu"] = mu.clone()
        st["z"] = z.clone()
    st["t"] = t + 1
    return _repeat(honest[row], honest, ctx.f)
