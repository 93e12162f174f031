"""The distributed-DP (secure-aggregation noise) round as the outsider sees it, and its PLD.

Each client adds a noise share and secure aggregation sums them; in high dimension the sum's
noise variance reveals how many shares are in it, so ε depends on the realised count, and the
count itself depends on whether the target took part. Against an outsider who sees the released
model, amplification by Poisson sampling holds for the mixture over the count
(:func:`distributed_round_pld`); dp-accounting has no event for it, so this module registers, for
the :class:`DistributedRound` event, the PLD engine's handlers (``pld.round_pld``,
``pld.pld_check``): only an incremental PLD under add/remove accounts it. Against the
secure-aggregation server, which also sees who took part, a client's rounds are Gaussian
mechanisms (``accountant.gaussian_epsilon``, in ``DistributedAccountant``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from scipy import special, stats

from .common import (
    PLD_MAX_INTERVAL,
    PLD_MAX_POINTS,
    PLD_MAX_REFINEMENTS,
    PLD_REFINE_TOL,
    PLD_TAIL_MASS_TRUNCATION,
    EpsilonDetails,
    PLDTooLargeError,
    UnsupportedAccountingError,
)
from .events import DistributedRound, RoundRecord
from .pld import PLD, PldEngine, first_interval, pld_check, pld_epsilon_for_delta, round_pld
from .rdp import NO_RDP

_MIXTURE_TAIL: float = 1e-17
# Replacing another client's clipped update u by the target's x moves the sum by ‖x − u‖ ≤ 2C.
_MIXTURE_SHIFT: float = 2.0


@functools.lru_cache(maxsize=64)
def distributed_round_pld(rec: RoundRecord, interval: float) -> Any:
    """The PLD of one distributed-DP round (``rec.noise_shares`` n_s set) for an outsider who sees
    the released sum, and in it the number c of honest noise shares (in high dimension the noise
    variance reveals it), under add/remove-one with Poisson sampling q over the N = ``num_clients``
    honest clients.

    The mechanism: each honest client is sampled with probability q and adds N(0, (zC)²/n_s); the
    release is the sum of the sampled clients' clipped updates plus the noise of max(c, 1) shares
    (an empty sample gets one share from the server), multiplier σ_c = z·√(max(c, 1)/n_s).
    Without the target (D) the count is c ~ Bin(N − 1, q); with it (D' = D ∪ {target}),
    c ~ Bin(N, q), and given c the target is among the sampled with probability c/N. At equal c,
    D' has the target where D has one more other client: the sums differ by x − u, ‖x − u‖ ≤ 2C,
    and the worst case, u = −x for every other client, is attained. For each c the pair is then a
    subsampled Gaussian with sensitivity 2C, and the pair over (c, y) has the privacy loss

        log Q(c, y)/P(c, y) = log[(1 − q) + (c(1 − q)/(N − c))·exp((2y − 2)/σ_c²)]   (y along x, in C)

    (P(c) and Q(c) differ: the count itself leaks; c = N, everybody sampled, is impossible
    without the target: infinite loss). The hockey-stick divergence δ(ε) of each adjacency
    direction is a closed form (:func:`_distributed_round_deltas`), and the PLD is dp-accounting's
    pessimistic connect-the-dots discretization of it (Doroshenko et al. 2022, the one its own
    Gaussian PLDs use) on the grid ``interval``, from the smallest loss up to where δ ≤
    :data:`PLD_TAIL_MASS_TRUNCATION` (the rest at infinity). Cached per (round, interval).
    """
    n, q, z, n_s, h = rec.num_clients, rec.q, rec.z, rec.noise_shares, interval
    if n is None or q is None or n_s is None:
        raise ValueError(f"distributed_round_pld needs a distributed round record, got {rec!r}")
    if q >= 1.0 or z == 0:  # the count (or the release) gives the target away
        return PLD(pld_pmf.DensePLDPmf(h, 0, np.array([0.0]), 1.0, True))
    lq = math.log1p(-q)

    def deltas(direction: str, ks: np.ndarray) -> np.ndarray:
        return _distributed_round_deltas(n, q, z, n_s, direction, ks * h)

    def grid(direction: str, k_lo: int, k_hi: int | None) -> Any:
        if k_hi is None:  # the smallest k above k_lo with δ(kh) within the tail of δ(∞), by doubling, bisection
            target = float(_distributed_round_deltas(n, q, z, n_s, direction, np.array([1e4]))[0])
            target += PLD_TAIL_MASS_TRUNCATION
            step = 1
            while deltas(direction, np.array([k_lo + step]))[0] > target:
                step *= 2
                if step > PLD_MAX_POINTS:
                    raise PLDTooLargeError(f"a distributed round's PLD needs over {PLD_MAX_POINTS} points at {h:g}")
            lo, hi = k_lo + step // 2, k_lo + step
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if deltas(direction, np.array([mid]))[0] > target else (lo, mid)
            k_hi = hi
        if k_hi - k_lo + 1 > PLD_MAX_POINTS:
            raise PLDTooLargeError(f"a distributed round's PLD needs {k_hi - k_lo + 1} points at interval {h:g}")
        ks = np.arange(k_lo, k_hi + 1)
        d = np.clip(deltas(direction, ks), 0.0, 1.0)
        return pld_pmf.create_pmf_pessimistic_connect_dots(h, ks, np.minimum.accumulate(d))

    # remove (with the target above): every loss is at least log(1 − q); add: at most −log(1 − q),
    # and the grid starts where the losses below carry less than the tail (raised to it: pessimistic)
    remove = grid("remove", math.floor(lq / h), None)
    add_lo = math.floor(_distributed_round_min_add_loss(n, q, z, n_s) / h)
    add = grid("add", min(add_lo, math.floor(-lq / h) - 1), math.ceil(-lq / h))
    return PLD(remove, add)


@functools.lru_cache(maxsize=16)
def _distributed_weights(n: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """P(c) without the target (Bin(N − 1, q)) and with it (Bin(N, q)), c = 0..N (cached: the
    PLD's grid search evaluates δ at many ε for the same round)."""
    counts = np.arange(n + 1)
    w_p, w_q = stats.binom.pmf(counts, n - 1, q), stats.binom.pmf(counts, n, q)
    w_p.flags.writeable = w_q.flags.writeable = False
    return w_p, w_q


def _heavy_counts(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """The counts 1..N−1 whose weight exceeds :data:`_MIXTURE_TAIL`, and the total weight of the
    others (added whole: pessimistic). Around qN ± a few hundred of a population of 10⁵: the
    loops run over these only."""
    inner = weights[1:-1]
    heavy = inner > _MIXTURE_TAIL
    return np.flatnonzero(heavy) + 1, float(inner[~heavy].sum())


def _distributed_round_deltas(n: int, q: float, z: float, n_s: int, direction: str, eps: np.ndarray) -> np.ndarray:
    """δ(ε) of one distributed round (:func:`distributed_round_pld`), exactly: for each count c the
    loss increases with y, so the region where one density exceeds e^ε times the other is a
    half-line, y > y_c(ε) (``remove``: with the target above) or y < y_c(−ε) (``add``), and its
    masses are Gaussian tails. Each count's term ∫(Q − e^ε P)₊ is formed as a·(1 − e^(b−a)) in
    logs (no cancellation); counts lighter than :data:`_MIXTURE_TAIL` add their whole weight."""
    mu, lq = _MIXTURE_SHIFT, math.log1p(-q)
    w_p, w_q = _distributed_weights(n, q)
    eps = np.asarray(eps, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if direction == "remove":  # c = N (infinite loss), c = 0 (loss log(1 − q))
            out = w_q[n] + _excess(w_q[0], w_p[0], eps)
        else:  # c = 0 (loss −log(1 − q))
            out = _excess(w_p[0], w_q[0], eps)
        heavy, light = _heavy_counts(w_q if direction == "remove" else w_p)
        out = out + light  # the light counts: at most their whole mass (pessimistic)
        for c in map(int, heavy):
            upper, lower = (w_q[c], w_p[c]) if direction == "remove" else (w_p[c], w_q[c])
            sigma, pi = z * math.sqrt(c / n_s), c / n
            log_r = math.log(c) + lq - math.log(n - c)
            # the y where the loss is ±ε (the loss exceeds log(1 − q) everywhere)
            level = eps if direction == "remove" else -eps
            inside = level > lq
            y = np.where(inside, sigma**2 / mu * (level + np.log1p(-np.exp(lq - level)) - log_r) + mu / 2, -np.inf)
            if direction == "remove":  # y > y_c(ε): Q's and P's upper tails (everything when ε ≤ log(1 − q))
                log_q = np.logaddexp(
                    math.log1p(-pi) + special.log_ndtr(-y / sigma), math.log(pi) + special.log_ndtr((mu - y) / sigma)
                )
                log_p = special.log_ndtr(-y / sigma)
                a, b = math.log(upper) + log_q, eps + math.log(lower) + log_p
            else:  # y < y_c(−ε): P's and Q's lower tails (nothing when −ε ≤ log(1 − q))
                log_p = special.log_ndtr(y / sigma)
                log_q = np.logaddexp(
                    math.log1p(-pi) + special.log_ndtr(y / sigma), math.log(pi) + special.log_ndtr((y - mu) / sigma)
                )
                a, b = math.log(upper) + log_p, eps + math.log(lower) + log_q
            term = np.where(np.isfinite(a), np.exp(a) * -np.expm1(np.minimum(b - a, 0.0)), 0.0)
            out = out + term
    return out


def _excess(upper: float, lower: float, eps: np.ndarray) -> np.ndarray:
    """(upper − e^ε·lower)₊ for a count of weights ``upper`` and ``lower``; a weight that
    underflowed to 0 (the empty sample, (1 − q)^N, at N of 10⁴ and more) contributes 0, never
    ∞·0 (NaN) at large ε."""
    if lower == 0:
        return np.full_like(eps, upper, dtype=float)
    return np.maximum(0.0, upper - np.exp(eps) * lower)


def _distributed_round_min_add_loss(n: int, q: float, z: float, n_s: int) -> float:
    """A loss below which the ``add`` direction (without the target above) has negligible mass:
    the smallest, over counts heavier than :data:`_MIXTURE_TAIL`, of the loss at y = tσ_c with
    Φ(−t) = tail/weight (the loss decreases in y)."""
    mu, lq = _MIXTURE_SHIFT, math.log1p(-q)
    w_p, _ = _distributed_weights(n, q)
    lowest = -lq
    for c in map(int, _heavy_counts(w_p)[0]):
        sigma = z * math.sqrt(c / n_s)
        t = max(0.0, -float(special.ndtri(_MIXTURE_TAIL / w_p[c])))
        log_r = math.log(c) + lq - math.log(n - c)
        lowest = min(lowest, -float(np.logaddexp(lq, (mu * t * sigma - mu * mu / 2) / sigma**2 + log_r)))
    return lowest


def distributed_interval(rec: RoundRecord, rounds: int, delta: float) -> EpsilonDetails:
    """The PLD interval for ``rounds`` distributed rounds ``rec``, chosen as :func:`pld_epsilon`
    does (no RDP estimate exists for this mixture): ε at the coarsest interval picks the first one
    (:func:`first_interval`), then halve until two successive values agree within
    :data:`PLD_REFINE_TOL` or the round's PLD would exceed :data:`PLD_MAX_POINTS` points. Returns
    the finer interval and its ε (``interval`` None, ε ∞ where even the coarsest is too large)."""
    rounds = max(1, rounds)

    def eps_at(h: float) -> float:
        with np.errstate(over="ignore", divide="ignore"):
            return pld_epsilon_for_delta(distributed_round_pld(rec, h).self_compose(rounds), delta)

    try:
        estimate = eps_at(PLD_MAX_INTERVAL)
    except PLDTooLargeError as err:
        return EpsilonDetails(math.inf, "pld", None, note=f"distributed round not accounted: {err}")
    if not math.isfinite(estimate):
        return EpsilonDetails(
            math.inf, "pld", PLD_MAX_INTERVAL, ((PLD_MAX_INTERVAL, estimate),),
            "infinite: the share count alone gives the target away with probability above delta "
            "(e.g. every honest client sampled, which needs the target)",
        )
    h = first_interval(estimate, rounds)
    tried: list[tuple[float, float]] = []
    note = ""
    for _ in range(PLD_MAX_REFINEMENTS + 1):
        try:
            tried.append((h, eps_at(h)))
        except PLDTooLargeError as err:
            note = f"refinement stopped: {err}; the value is an upper bound, possibly not converged"
            break
        if len(tried) >= 2:
            (_, prev), (_, cur) = tried[-2], tried[-1]
            if prev == cur or abs(prev - cur) <= PLD_REFINE_TOL * cur:
                break
        h /= 2
    if not tried:
        return EpsilonDetails(estimate, "pld", PLD_MAX_INTERVAL, ((PLD_MAX_INTERVAL, estimate),), note)
    h, eps = tried[-1]
    return EpsilonDetails(eps, "pld", h, tuple(tried), note)



@round_pld.register(DistributedRound)
def _(event: DistributedRound, interval: float, neighboring: str) -> Any:
    return distributed_round_pld(event, interval)


@pld_check.register(DistributedRound)
def _(event: DistributedRound, engine: PldEngine) -> None:
    if not (engine.incremental and engine.neighboring == "add_or_remove_one"):
        raise UnsupportedAccountingError(NO_RDP)
