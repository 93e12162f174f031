"""The PLD engine (``accountant = "pld"``): dp-accounting's privacy loss distributions.

Pessimistic (connect-the-dots) discretization, so ε is an upper bound at every interval; a
coarse interval overstates it (at q = 2.2e-4, z = 1.625, T = 26,104, δ = 1e-5 the old fixed 1e-3
gave 0.170 against a converged 0.0726). Two modes (:class:`PldEngine`):

- *per call* (no interval): :func:`pld_epsilon` chooses the interval for each ε — start at
  h₀ = 0.05·ε_RDP/√T on the ladder 1e-2·2^-k (ε_RDP, the RDP bound, is a cheap estimate; the
  scale was fitted so h₀ is usually already converged), halve h until two successive values
  agree within 0.5 % (:data:`PLD_REFINE_TOL`), and report the finer one. Each distinct round's
  one-round PLD is built once per interval and cached per process.
- *incremental* (an interval given; the engine passes ``planned_interval``'s): the engine keeps
  the running ``PrivacyLossDistribution`` and composes onto it only the rounds added since the
  last ε (consecutive equal rounds as one self-composed step), so ε after a new round costs one
  composition and one ε query, which reads the losses above the last ε (ε only grows) and a few
  more, not the whole distribution (:func:`_pmf_epsilon`'s ``hint``). Each composition is
  dp-accounting's FFT convolution with its pessimistic tail truncation (:func:`compose_pld`,
  vectorised, both directions in one batched transform), so the running PLD is at every round
  what a ``PLDAccountant`` composing the same events at that interval holds, up to FFT rounding
  (the shorter direction is transformed at the longer one's length). A
  checkpoint stores the composition steps, and a resumed run replays them once: the same ε, bit
  for bit.

Two guards keep PLD affordable: when the RDP bound already exceeds :data:`PLD_EPSILON_LIMIT`
(10,000), PLD is not run and ε is the RDP bound (∞ where RDP cannot account the relation); and
refinement stops before a one-round PLD would exceed :data:`PLD_MAX_POINTS` points.

How an event becomes a PLD is :func:`round_pld` (and whether the engine accounts it,
:func:`pld_check`), dispatched on the event type: :class:`GaussianRound` here, the distributed
round in ``accounting.distributed``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld
from dp_accounting.pld import pld_pmf
from scipy import fft as sp_fft
from scipy import optimize, special

from .common import (
    NEIGHBORING,
    PLD_EPSILON_LIMIT,
    PLD_INTERVAL_SCALE,
    PLD_MAX_INTERVAL,
    PLD_MAX_POINTS,
    PLD_MAX_REFINEMENTS,
    PLD_REFINE_TOL,
    PLD_TAIL_MASS_TRUNCATION,
    RDP_ESTIMATE_ORDERS,
    EpsilonDetails,
    UnsupportedAccountingError,
    _check_count,
    _unsupported_message,
)
from .engines import ACCOUNTANT_ENGINES, AccountingEngine
from .events import GaussianRound, RoundRecord, _record_order
from .rdp import has_rdp, rdp_epsilon, round_rdp

PLD = pld.privacy_loss_distribution.PrivacyLossDistribution

def _one_round_points(z: float, interval: float) -> float:
    """Rough size of a one-round PLD: the Gaussian privacy loss (x − ½)/z² (sensitivity 1) over
    the ±10z range dp-accounting keeps (log-mass truncation −50) spans 20/z + 1/z²."""
    return (20.0 / z + 1.0 / z**2) / interval


@functools.lru_cache(maxsize=256)
def _one_round_pld(rec: RoundRecord, neighboring: str, interval: float) -> Any:
    """dp-accounting's PLD of one Poisson-sampled Gaussian round — the call ``PLDAccountant``
    makes for ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` — built once per (round,
    relation, interval) per process: building it dominates the cost of a PLD ε."""
    return pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=rec.z,
        value_discretization_interval=interval,
        sampling_prob=rec.q,
        neighboring_relation=NEIGHBORING[neighboring],
    )


# (record, relation, interval) -> (count, that record's rounds as one PLD): the parts of the
# last ε computed, kept by an Accountant so the next one recomposes only the records that grew.
PartsCache = dict[tuple[RoundRecord, str, float], tuple[int, Any]]


def _pld_part(rec: RoundRecord, count: int, neighboring: str, interval: float, parts: PartsCache | None) -> Any:
    """``count`` rounds of ``rec`` as one dp-accounting PLD, as ``PLDAccountant`` forms them:
    T Gaussians without sampling as one Gaussian of multiplier z/√T, T Poisson rounds as the
    (cached) one-round PLD self-composed T times."""
    key = (rec, neighboring, interval)
    if parts is not None and key in parts and parts[key][0] == count:
        return parts[key][1]
    if rec.sampling == "none":
        part = pld.privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=rec.z / math.sqrt(count),
            value_discretization_interval=interval,
            neighboring_relation=NEIGHBORING[neighboring],
        )
    elif rec.sampling == "poisson":
        part = _one_round_pld(rec, neighboring, interval).self_compose(count)
    else:
        raise UnsupportedAccountingError(_unsupported_message("pld", neighboring, rec.sampling))
    if parts is not None:
        parts[key] = (count, part)
    return part


def _pld_epsilon_at(
    groups: Sequence[tuple[RoundRecord, int]],
    neighboring: str,
    delta: float,
    interval: float,
    parts: PartsCache | None = None,
) -> float:
    """ε at ``delta`` of the grouped rounds by dp-accounting's PLD at ``interval``: the same
    PLDs and compositions ``PLDAccountant`` forms for their events (:func:`_pld_part`), in the
    canonical record order. ``parts`` reuses the PLD of records whose count has not changed."""
    total = pld.privacy_loss_distribution.identity(value_discretization_interval=interval)
    for rec, count in sorted(groups, key=lambda g: _record_order(g[0])):
        total = total.compose(_pld_part(rec, count, neighboring, interval, parts))
    return float(total.get_epsilon_for_delta(delta))


def first_interval(epsilon_estimate: float, rounds: int) -> float:
    """The first PLD interval tried: the largest 1e-2·2^-k ≤ 0.05·ε/√T (the ladder makes the
    intervals of successive calls coincide, so the cached one-round PLDs are reused)."""
    target = PLD_INTERVAL_SCALE * max(epsilon_estimate, 1e-9) / math.sqrt(max(rounds, 1))
    return PLD_MAX_INTERVAL * 2.0 ** -max(0, math.ceil(math.log2(PLD_MAX_INTERVAL / target)))


# --------------------------------------------------------------------------- incremental PLD operations

# The largest losses, for ε, are scanned a block at a time: the first block ends _EPSILON_MARGIN
# points past the caller's hint (else it is _EPSILON_FIRST points long), each next block twice as
# long up to _EPSILON_CHUNK. Each block's running sums start from the sums carried over
# (:func:`_running_sums`), so they are the sequential sums from the largest loss whatever the
# blocks: the same PMF gives the same bits with any hint, and a scan reads the losses above ε and
# a few more (a run's PMF has ~10⁴ points, a few thousand of them above ε).
_EPSILON_FIRST = 1024
_EPSILON_MARGIN = 64
_EPSILON_CHUNK = 8192


def _running_sums(carry: float, values: np.ndarray) -> np.ndarray:
    """[carry, carry + v₀, (carry + v₀) + v₁, …]: the sequential running sums of ``values`` after
    ``carry`` (one array of len + 1; what the ε scan adds up in one block, counted by tests)."""
    out = np.empty(len(values) + 1)
    out[0] = carry
    out[1:] = values
    return np.add.accumulate(out, out=out)


def _tail_sums(values: np.ndarray) -> np.ndarray:
    """``np.cumsum`` of a tail (one function, so tests count the points a scan reads)."""
    return np.cumsum(values)


def _tail_length(values: np.ndarray, end: int, threshold: float) -> int:
    """The length of the longest prefix of ``values`` whose sequential running sums are all at
    most ``threshold``: the sums up to index ``end``, where one is expected to exceed it (the first
    point that alone does), the rest only where none did (negative rounding noise before it)."""
    for part in (values[: end + 1], values):
        over = _tail_sums(part) > threshold
        k = int(over.argmax())
        if over[k]:
            return k
    return len(values)


def _truncate_tails(probs: np.ndarray, tail_mass_truncation: float) -> tuple[int, np.ndarray, float]:
    """dp-accounting's pessimistic ``pld_pmf._truncate_tails``, vectorised (its Python loop over
    the array took half the time of a composition): drop the longest prefix and suffix whose
    sequential running sums are each at most half the budget; the prefix's mass joins the first
    point kept (its losses rounded up) and the suffix's is returned, to go to infinity. A running
    sum exceeds the half budget at the first point that alone does (unless rounding noise before
    it is negative), so each end is summed up to that point, which one comparison over the array
    finds (a run's tails are 0 to ~1,000 points of a ~7,000-point PMF)."""
    threshold, n = tail_mass_truncation / 2, len(probs)
    above = probs > threshold
    first, last = int(above.argmax()), int(above[::-1].argmax())  # the last one, from the end
    left = _tail_length(probs, first, threshold)
    right = max(n - _tail_length(probs[::-1], last, threshold), left + 1)
    left_mass, right_mass = np.sum(probs[:left]), np.sum(probs[right:])
    kept = probs[left:right]
    kept[0] += left_mass
    return left, kept, float(right_mass)


# The spectra of the last few steps at the FFT lengths used: (ids of the step's PMF arrays,
# length) -> (those arrays, their rfft as rows).
_SPECTRA: dict[tuple[Any, ...], tuple[tuple[np.ndarray, ...], np.ndarray]] = {}


def _spectra(rows: tuple[np.ndarray, ...], length: int) -> np.ndarray:
    key = (*map(id, rows), length)
    hit = _SPECTRA.get(key)
    if hit is not None and all(x is y for x, y in zip(hit[0], rows)):
        return hit[1]
    spectra = sp_fft.rfft(_stacked(rows), length, axis=-1)
    if len(_SPECTRA) >= 16:
        _SPECTRA.pop(next(iter(_SPECTRA)))
    _SPECTRA[key] = (rows, spectra)
    return spectra


def _stacked(rows: tuple[np.ndarray, ...]) -> np.ndarray:
    """``rows`` as the rows of one array, zero-padded to the longest."""
    out = np.zeros((len(rows), max(len(r) for r in rows)))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _compose_pmfs(*pairs: tuple[Any, Any]) -> list[Any]:
    """``DensePLDPmf.compose`` of each pair ``(a, b)``, default truncation: the same FFT
    convolution and pessimistic truncation, vectorised, all pairs in one batched transform (the
    two adjacency directions of a round: pocketfft transforms two rows for ~1.3 times the cost of
    one), at the FFT length of the longest; the step's spectra are reused while the length stays."""
    dense = [(a.to_dense_pmf(), b.to_dense_pmf()) for a, b in pairs]
    for a, b in dense:
        a.validate_composable(b)
    sizes = [len(a._probs) + len(b._probs) - 1 for a, b in dense]
    length = sp_fft.next_fast_len(max(sizes), True)
    step = _spectra(tuple(b._probs for _, b in dense), length)
    rows = sp_fft.irfft(sp_fft.rfft(_stacked(tuple(a._probs for a, _ in dense)), length, axis=-1) * step, length, axis=-1)
    out = []
    for (a, b), n, probs in zip(dense, sizes, rows):
        infinity = a._infinity_mass + b._infinity_mass - a._infinity_mass * b._infinity_mass
        offset, kept, right = _truncate_tails(probs[:n], PLD_TAIL_MASS_TRUNCATION)
        out.append(pld_pmf.DensePLDPmf(
            a._discretization, a._lower_loss + b._lower_loss + offset, kept, infinity + right, a._pessimistic_estimate
        ))
    return out


def compose_pld(a: Any, b: Any) -> Any:
    """dp-accounting's ``PrivacyLossDistribution.compose(b)``: both adjacency directions
    convolved (in one batched transform), tails truncated pessimistically (:func:`_compose_pmfs`)."""
    if a._symmetric and b._symmetric:
        return PLD(*_compose_pmfs((a._pmf_remove, b._pmf_remove)))
    return PLD(*_compose_pmfs((a._pmf_remove, b._pmf_remove), (a._pmf_add, b._pmf_add)))


def _pmf_epsilon(pmf: Any, delta: float, hint: float | None = None) -> float:
    """dp-accounting's ``get_epsilon_for_delta`` of one PMF, vectorised for dense PMFs: the same
    scan from the largest loss down, as running sums over a block of losses at a time, stopping
    in the block that holds ε. ``hint``, an ε expected nearby (the last one of a running PLD: ε
    only grows), sizes the first block to end just below it, so the scan reads the losses above
    ε and little more; the result does not depend on it, to the bit (:func:`_running_sums`)."""
    if not isinstance(pmf, pld_pmf.DensePLDPmf):
        return float(pmf.get_epsilon_for_delta(delta))
    upper, lower = pmf._infinity_mass, 0.0  # over the losses scanned (and ∞): Σ p and Σ p·e^(-loss)
    if upper > delta:
        return math.inf
    probs = pmf._probs[::-1]
    n, top, h = len(probs), pmf._lower_loss + len(probs) - 1, pmf._discretization
    size = _EPSILON_FIRST
    if hint is not None and math.isfinite(hint):
        size = max(1, min(n, math.floor(top - hint / h) + _EPSILON_MARGIN))
    start = 0
    while start < n:
        p = probs[start : start + size]
        losses = (top - start - np.arange(len(p))) * h
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            weights = np.exp(-losses)
            ups = _running_sums(upper, p)  # ups[k]: the mass above the k-th point, ups[k + 1] with it
            los = _running_sums(lower, p * weights)
            ups_before, los_before, ups_after, los_after = ups[:-1], los[:-1], ups[1:], los[1:]
            # dp-accounting's scan, k-th largest loss: stop before adding it once the ε the mass
            # above it gives, log((U − δ)/L), is at least that loss, i.e. (U − δ)·e^(-loss) ≥ L;
            # after adding it, return the loss itself if L is still 0 (e^(-loss) underflowed)
            # while U reached δ.
            stop = (ups_before > delta) & (los_before > 0) & ((ups_before - delta) * weights >= los_before)
            tiny = (ups_after >= delta) & (los_after == 0)
        k = int(np.argmax(stop)) if stop.any() else len(p)
        j = int(np.argmax(tiny)) if tiny.any() else len(p)
        if j < k:
            return max(0.0, float(losses[j]))
        if k < len(p):
            upper, lower = float(ups_before[k]), float(los_before[k])
            break
        upper, lower = float(ups[-1]), float(los[-1])
        start += len(p)
        size = min(2 * max(size, _EPSILON_FIRST), _EPSILON_CHUNK)
    if upper <= lower + delta:
        return 0.0
    return float(np.log((upper - delta) / lower))


def pld_epsilon_for_delta(distribution: Any, delta: float, hint: float | None = None) -> float:
    """dp-accounting's ``PrivacyLossDistribution.get_epsilon_for_delta`` (the larger of the two
    adjacency directions), vectorised (:func:`_pmf_epsilon`; ``hint`` sizes its first block and
    changes nothing in the result)."""
    scan = _pmf_epsilon if hint is None else functools.partial(_pmf_epsilon, hint=hint)
    eps = scan(distribution._pmf_remove, delta)
    if distribution._symmetric:
        return eps
    add = distribution._pmf_add
    if isinstance(add, pld_pmf.DensePLDPmf) and add._infinity_mass <= delta:
        if (add._lower_loss + len(add._probs) - 1) * add._discretization <= eps:
            return eps  # the add direction's ε is at most its largest loss: no larger than eps
        if _pmf_delta(add, eps) <= delta * (1 - 1e-9):
            return eps  # δ_add(eps) ≤ δ, and δ_add only falls as ε grows: ε_add ≤ eps (one pass, no scan)
    return max(eps, scan(add, delta))


def _pmf_delta(pmf: Any, epsilon: float) -> float:
    """The hockey-stick δ(ε) = Σ_{loss > ε} p·(1 − e^(ε − loss)) + P(∞) of a dense PMF: the
    quantity :func:`_pmf_epsilon` inverts, in one vectorised pass over the losses above ε."""
    h, lower, probs = pmf._discretization, pmf._lower_loss, pmf._probs
    start = max(0, math.floor(epsilon / h) - lower + 1)  # the first index whose loss exceeds ε
    p = probs[start:]
    if p.size == 0:
        return float(pmf._infinity_mass)
    losses = (lower + start + np.arange(p.size)) * h
    return float(pmf._infinity_mass + np.dot(p, -np.expm1(epsilon - losses)))


# --------------------------------------------------------------------------- distributed rounds, outsider

# --------------------------------------------------------------------------- per-event PLDs


@functools.singledispatch
def round_pld(event: RoundRecord, interval: float, neighboring: str) -> Any:
    """The PLD of one round of ``event`` at ``interval`` (the incremental engine's step is it,
    self-composed). Registered per event type; the default refuses."""
    raise UnsupportedAccountingError(f"the PLD accountant cannot account a {type(event).__name__}")


@round_pld.register(GaussianRound)
def _(event: GaussianRound, interval: float, neighboring: str) -> Any:
    if event.sampling == "poisson":
        return _one_round_pld(event, neighboring, interval)
    raise UnsupportedAccountingError(_unsupported_message("pld", neighboring, event.sampling))


@functools.singledispatch
def pld_check(event: RoundRecord, engine: PldEngine) -> None:
    """Raise :class:`UnsupportedAccountingError` if ``engine`` cannot account ``event``.
    Registered per event type; the default refuses."""
    raise UnsupportedAccountingError(f"the PLD accountant cannot account a {type(event).__name__}")


@pld_check.register(GaussianRound)
def _(event: GaussianRound, engine: PldEngine) -> None:
    probe = event if event.z else GaussianRound(1.0, event.sampling, event.q, event.num_clients, event.sample_size)
    if not engine.fresh().supports(probe.event()):  # NonPrivate is always supported: check the shape
        raise UnsupportedAccountingError(_unsupported_message("pld", engine.neighboring, event.sampling))


@functools.lru_cache(maxsize=64)
def _pld_group(rec: RoundRecord, count: int, neighboring: str, interval: float) -> Any:
    """``count`` rounds of ``rec`` as one dp-accounting PLD at ``interval`` (a step of an
    incremental :class:`PldEngine`): one round's PLD (:func:`round_pld`, cached), self-composed
    when count > 1; T unsampled Gaussians as one of multiplier z/√T."""
    if isinstance(rec, GaussianRound) and rec.sampling == "none":
        return _dense_pld(_pld_part(rec, count, neighboring, interval, None))
    one = round_pld(rec, interval, neighboring)
    return _dense_pld(one if count == 1 else one.self_compose(count))


def _dense_pld(distribution: Any) -> Any:
    """``distribution`` with dense PMFs (a step is composed many times: converting a sparse PMF,
    a Python loop, once)."""
    remove = distribution._pmf_remove.to_dense_pmf()
    if distribution._symmetric:
        return PLD(remove)
    return PLD(remove, distribution._pmf_add.to_dense_pmf())


def pld_epsilon(
    groups: Sequence[tuple[RoundRecord, int]],
    neighboring: str,
    delta: float,
    *,
    rdp_estimate: float,
    rdp_is_bound: bool,
    interval: float | None = None,
    parts: PartsCache | None = None,
) -> EpsilonDetails:
    """PLD ε of the grouped rounds with the discretization chosen as the module docstring says.

    ``rdp_estimate`` is an ε estimate of the same rounds (the RDP bound; ``rdp_is_bound`` says
    whether it is a valid bound for this relation, or only an estimate): it picks the first
    interval and, above :data:`PLD_EPSILON_LIMIT`, replaces PLD (by itself when it is a bound,
    else by ∞). With ``interval`` given, ε is computed at that interval only. ``parts`` (kept by
    the caller between calls) is left holding the parts this call used, and no others.
    """
    rounds = sum(count for _, count in groups)
    if rdp_estimate > PLD_EPSILON_LIMIT:
        eps = rdp_estimate if rdp_is_bound else math.inf
        what = f"the RDP bound {rdp_estimate:.6g}" if rdp_is_bound else "not computed (∞)"
        return EpsilonDetails(
            eps,
            "rdp-bound",
            note=f"PLD not run: RDP gives epsilon = {rdp_estimate:.6g} > {PLD_EPSILON_LIMIT:g}, no meaningful "
            f"guarantee (and PLD's memory grows like 1/z^2); reported: {what}",
        )
    # the smallest multiplier a one-round PLD is built for (T unsampled Gaussians are one of z/√T)
    z_min = min(rec.z / math.sqrt(count) if rec.sampling == "none" else rec.z for rec, count in groups)
    if interval is not None:
        eps = _pld_epsilon_at(groups, neighboring, delta, interval, parts)
        return EpsilonDetails(eps, "pld", interval, ((interval, eps),))
    h = first_interval(rdp_estimate, rounds)
    while _one_round_points(z_min, h) > PLD_MAX_POINTS and h < PLD_MAX_INTERVAL:
        h *= 2
    used = dict(parts or {})
    tried = [(h, _pld_epsilon_at(groups, neighboring, delta, h, used))]
    note = ""
    for _ in range(PLD_MAX_REFINEMENTS):
        h /= 2
        if _one_round_points(z_min, h) > PLD_MAX_POINTS:
            note = (
                f"PLD refinement stopped at interval {tried[-1][0]:.3g}: a finer one-round PLD would exceed "
                f"{PLD_MAX_POINTS} points; the value is an upper bound, possibly not converged"
            )
            break
        tried.append((h, _pld_epsilon_at(groups, neighboring, delta, h, used)))
        (_, prev), (_, cur) = tried[-2], tried[-1]
        if prev == cur or abs(prev - cur) <= PLD_REFINE_TOL * cur:
            break
    else:
        note = f"PLD refinement did not settle within {PLD_MAX_REFINEMENTS} halvings; the value is an upper bound"
    if parts is not None:  # keep only what this call used: the memory of one ε computation
        intervals, current = {t[0] for t in tried}, set(groups)
        parts.clear()
        parts.update({k: v for k, v in used.items() if k[2] in intervals and (k[0], v[0]) in current})
    h, eps = tried[-1]
    return EpsilonDetails(eps, "pld", h, tuple(tried), note)


# --------------------------------------------------------------------------- Accountant


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """ε at ``delta`` of one Gaussian mechanism of sensitivity ``mu`` noise stds, exactly
    (Balle & Wang 2018, Thm 8: the smallest ε with Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) ≤ δ), solved
    to 1e-12 and rounded up; 0 < μ < ∞."""

    def delta_of(eps: float) -> float:
        return float(special.ndtr(mu / 2 - eps / mu) - math.exp(eps + special.log_ndtr(-mu / 2 - eps / mu)))

    d = delta
    if delta_of(0.0) <= d:
        return 0.0
    hi = 1.0
    while delta_of(hi) > d:
        hi *= 2
    eps = optimize.brentq(lambda e: delta_of(e) - d, 0.0, hi, xtol=1e-12, rtol=4 * np.finfo(float).eps)
    eps += 2e-12 + 1e-15 * eps  # above the root by more than brentq's tolerance: an upper bound
    while delta_of(eps) > d:
        eps += 1e-12
    return float(eps)


# --------------------------------------------------------------------------- the engine


@ACCOUNTANT_ENGINES.register("pld")
class PldEngine(AccountingEngine):
    """dp-accounting's privacy loss distributions, per call or incremental (module docstring)."""

    name = "pld"
    plans_interval = True

    def __init__(self, neighboring: str, records: dict[RoundRecord, int], *, interval: float | None,
                 orders: Sequence[float]) -> None:
        super().__init__(neighboring, records, interval=interval, orders=orders)
        self._parts: PartsCache = {}
        self._rdp2_cache: dict[RoundRecord, float] = {}
        self.reset()

    def reset(self) -> None:
        # incremental: rounds not yet sealed into steps, the steps (record, count) in order, how
        # many of them the running PLD holds, and RDP(2) of all rounds (the cheap guard)
        self._pending: list[tuple[RoundRecord, int]] = []
        self._steps: list[tuple[RoundRecord, int]] = []
        self._applied = 0
        self._running: Any = None
        self._rdp2 = 0.0
        self._hints: dict[float, float] = {}  # δ -> the last ε of the running PLD (ε only grows)

    @property
    def incremental(self) -> bool:
        return self.interval is not None

    @property
    def chooses_interval(self) -> bool:
        return self.interval is None

    def check(self, event: RoundRecord) -> None:
        pld_check(event, self)

    def fresh(self, interval: float | None = None) -> dpa.PrivacyAccountant:
        h = interval or self.interval or PLD_MAX_INTERVAL
        return pld.PLDAccountant(self.relation, value_discretization_interval=h)

    @staticmethod
    def gaussian_epsilon(mu: float, delta: float, orders: Sequence[float]) -> float:
        """Exact (Balle & Wang 2018, Thm 8), the value dp-accounting's PLD converges to from above
        (:func:`exact_gaussian_epsilon`)."""
        return exact_gaussian_epsilon(mu, delta)

    # -- composing (incremental mode)

    def compose(self, event: RoundRecord, count: int) -> None:
        if self.incremental:
            self._pending.append((event, count))
            self._rdp2 += count * self._rdp2_of(event)

    def _rdp2_of(self, rec: RoundRecord) -> float:
        """RDP at order 2 of one round (0 for a round without an RDP curve: a distributed round),
        for the guard of :meth:`_over_pld_limit`; computed once per distinct round."""
        value = self._rdp2_cache.get(rec)
        if value is None:
            if rec.z == 0 or not has_rdp(rec):
                value = 0.0
            else:
                curve, _ = round_rdp(rec, RDP_ESTIMATE_ORDERS, self.neighboring)
                value = float(curve[0])  # RDP_ESTIMATE_ORDERS[0] == 2
            self._rdp2_cache[rec] = value
        return value

    def _seal(self) -> None:
        """Turn the rounds pending since the last seal into steps, consecutive equal records merged
        (never into an earlier step: the steps depend only on when ε and checkpoints were taken)."""
        grouped: list[tuple[RoundRecord, int]] = []
        for rec, count in self._pending:
            if grouped and grouped[-1][0] == rec:
                grouped[-1] = (rec, grouped[-1][1] + count)
            else:
                grouped.append((rec, count))
        self._steps.extend(grouped)
        self._pending = []

    def _running_pld(self) -> Any:
        """The running PLD with every round composed: the steps not yet in it, one composition
        each (:func:`compose_pld`), each step's PLD from :func:`_pld_group`."""
        self._seal()
        h = self.interval
        for rec, count in self._steps[self._applied :]:
            part = _pld_group(rec, count, self.neighboring, h)
            self._running = part if self._running is None else compose_pld(self._running, part)
        self._applied = len(self._steps)
        return self._running

    def _over_pld_limit(self, delta: float) -> tuple[float, bool] | None:
        """The RDP bound and whether it is valid, when it exceeds :data:`PLD_EPSILON_LIMIT` (PLD is
        then not run), else None. Cheap first: RDP(2) + log(1/δ) (a valid bound) below the limit
        settles it without converting the whole curve."""
        if self._rdp2 + math.log(1 / delta) <= PLD_EPSILON_LIMIT:
            return None
        if not any(has_rdp(rec) for rec in self.records):
            return None
        rdp_eps, _ = rdp_epsilon(self.records, self.neighboring, delta, RDP_ESTIMATE_ORDERS)
        if rdp_eps <= PLD_EPSILON_LIMIT:
            return None
        return rdp_epsilon(self.records, self.neighboring, delta, self.orders)

    # -- reading

    def epsilon_details(self, delta: float) -> EpsilonDetails:
        if self.incremental:
            over = self._over_pld_limit(delta)
            if over is not None:
                return pld_epsilon([], self.neighboring, delta, rdp_estimate=over[0], rdp_is_bound=over[1])
            h = self.interval
            with np.errstate(over="ignore", divide="ignore"):  # dp-accounting's PLD at huge ε
                eps = pld_epsilon_for_delta(self._running_pld(), delta, self._hints.get(delta))
            self._hints[delta] = eps
            return EpsilonDetails(eps, "pld", h, ((h, eps),))
        rdp_eps, rdp_valid = rdp_epsilon(self.records, self.neighboring, delta, RDP_ESTIMATE_ORDERS)
        if rdp_eps > PLD_EPSILON_LIMIT:  # PLD is skipped: report the tightest RDP bound
            rdp_eps, rdp_valid = rdp_epsilon(self.records, self.neighboring, delta, self.orders)
        with np.errstate(over="ignore", divide="ignore"):  # dp-accounting's PLD at huge ε
            return pld_epsilon(
                list(self.records.items()),
                self.neighboring,
                delta,
                rdp_estimate=rdp_eps,
                rdp_is_bound=rdp_valid,
                parts=self._parts,
            )

    # -- checkpoints

    def state_dict(self, index: dict[RoundRecord, int]) -> dict[str, Any]:
        if not self.incremental:
            return {}
        self._seal()  # the steps so far stay steps: a resumed run composes exactly the same ones
        return {"interval": self.interval, "steps": [[index[rec], count] for rec, count in self._steps]}

    def load_state_dict(self, state: dict[str, Any], parsed: list[tuple[RoundRecord, int]]) -> None:
        """An incremental PLD at the interval the state was saved at replays its steps in order,
        the PLD rebuilt once, lazily; at any other interval it composes the grouped records."""
        self._pending = []
        if not self.incremental:
            return
        steps = state.get("steps")
        totals: dict[RoundRecord, int] = {}
        try:
            if steps is None or state.get("interval") != self.interval:
                raise ValueError("no steps at this interval")
            for i, count in steps:
                rec = parsed[i][0]
                self._steps.append((rec, _check_count("count", count, 1)))
                totals[rec] = totals.get(rec, 0) + count
            if totals != dict(self.records):
                raise ValueError("the steps do not add up to the records")
        except (TypeError, ValueError, IndexError):
            self._steps = sorted(self.records.items(), key=lambda g: _record_order(g[0]))
