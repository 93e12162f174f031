"""Privacy accounting for DP-FedAvg over dp-accounting's DpEvents (no accountant is
re-implemented here): ε of a run, noise calibration, and a round-by-round ``Accountant`` the
engine checkpoints.

Vocabulary (docs/architecture.md): noise multiplier ``z`` = noise std / clip norm C, sampling probability
``q``, rounds ``T``, ``delta``. One round of DP-FedAvg is one Gaussian release of the sum of
client updates clipped to C (``fedsafe.privacy.dp.mechanisms``); with adaptive clipping the round is still
one Gaussian release with the *total* z (Andrew et al. 2021, Thm 1; ``dp.adaptive_clip_split``),
so it is composed exactly like a fixed-clip round. A round maps to a DpEvent
(:func:`gaussian_round_event`) by the client-sampling scheme:

=========== ================================================== =========================
sampling    DpEvent (one round)                                 fedsafe ``clients.sampling``
=========== ================================================== =========================
``poisson`` ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``        ``poisson`` (q = sample_rate)
``fixed``   ``SampledWithoutReplacementDpEvent(N, m, Gaussian(z))``  ``fixed`` (m = sample_size)
``none``    ``GaussianDpEvent(z)`` (no amplification claimed)       ``all``
=========== ================================================== =========================

``z = 0`` is ``NonPrivateDpEvent`` (ε = ∞). T rounds are ``SelfComposedDpEvent(event, T)``;
heterogeneous rounds (different z or q) are a ``ComposedDpEvent`` of such groups.

What dp-accounting 0.6 supports for these events, by accountant and neighbouring relation
(checked with ``PrivacyAccountant.supports``; ✓ supported, ✗ refused by dp-accounting)::

    event                           accountant  ADD_OR_REMOVE_ONE  REPLACE_ONE  REPLACE_SPECIAL
    GaussianDpEvent                 RDP         ✓                  ✓ (*)        ✓
                                    PLD         ✓                  ✓            ✓
    PoissonSampledDpEvent(Gauss.)   RDP         ✓                  ✗            ✓
                                    PLD         ✓                  ✓            ✓
    SampledWithoutReplacement(G.)   RDP         ✗                  ✓ (*)        ✗
                                    PLD         ✗                  ✗            ✗

What fedsafe offers and refuses:

- Relations: ``add_or_remove_one`` (default for ``poisson`` and ``none``: a client takes part or
  not) and ``replace_one`` (default for ``fixed``: a fixed-size sample of a population of known
  size N only makes sense when N is public). ``REPLACE_SPECIAL`` is not offered: for these
  Gaussian events it gives the same numbers as add/remove.
- ``fixed`` needs ``accountant="rdp"`` with ``replace_one``; ``fixed`` with PLD, and ``fixed``
  under add/remove, are refused. ``poisson`` with ``rdp`` under ``replace_one`` is refused
  (``pld`` supports it). Errors name the accountant and relation and the combination that works.
- (*) Sensitivity under replace-one. GaussianDpEvent's z is defined as s/C for values with
  ‖v_i‖ ≤ C (dp-accounting's own docstring, and fedsafe's z). Replacing a client can move the
  sum by 2C. dp-accounting's PLD accountant accounts for that (its REPLACE adjacency shifts by
  ±C), but its RDP accountant treats z as std / L2-sensitivity, so under REPLACE_ONE it would
  understate the RDP by 4× (google/differential-privacy issue #378). fedsafe keeps the events in
  the documented s/C convention and, when composing into an RDP accountant under
  ``replace_one``, passes z/2 to the Gaussian inside — only if the installed dp-accounting shows
  that behaviour (probed once, :func:`_rdp_replace_one_halves`), so a fixed release is not
  corrected twice.

Accountants:

- ``rdp``: ``RdpAccountant(RDP_ORDERS, relation)``; ε from the RDP curve at :data:`RDP_ORDERS`
  with dp-accounting's conversion (Canonne–Kamath–Steinke / Asoodeh et al., tighter than
  Mironov's ε = RDP(α) + log(1/δ)/(α−1)). The orders are dense where the optimum sits for
  practical (z, q, T): 1.1…1.4 by 0.1, 1.5…3 by 0.05, 3.1…11 by 0.1, 12…64, then 72…1024.
  RDP is an upper bound, usually looser than PLD.
- ``pld``: dp-accounting's privacy loss distributions with the pessimistic (connect-the-dots)
  discretization, so ε is an upper bound at every interval; a coarse interval overstates it
  (at q = 2.2e-4, z = 1.625, T = 26,104, δ = 1e-5 the old fixed 1e-3 gave 0.170 against a
  converged 0.0726). The interval is therefore chosen per call (:func:`pld_epsilon`): start at
  h₀ = 0.05·ε_RDP/√T on the ladder 1e-2·2^-k (ε_RDP, the RDP bound, is a cheap estimate; the
  scale was fitted so h₀ is usually already converged), halve h until two successive values
  agree within 0.5 % (:data:`PLD_REFINE_TOL`), and report the finer one. The error of the
  pessimistic estimate shrinks at least linearly in h in every case measured, so the reported ε
  is then within ~0.5 % of the converged value (the tests check 1 % against dp-accounting at a
  much finer interval). Each distinct round's one-round PLD is built once per interval and
  cached per process, so recomputing ε as rounds accrue costs only the FFT self-compositions.
  Pass ``value_discretization_interval`` to fix the interval instead.

  Two guards keep PLD affordable: when the RDP bound already exceeds
  :data:`PLD_EPSILON_LIMIT` (10,000: no meaningful guarantee, and tiny z makes PLD's support, and
  its memory, explode — z = 0.01, q = 1, T = 1000 needed 4.4 GB and 2 minutes), PLD is not run
  and ε is the RDP bound (∞ where RDP cannot account the relation); and refinement stops before
  a one-round PLD would exceed :data:`PLD_MAX_POINTS` points (ε is then the last, still valid,
  upper bound). :meth:`Accountant.epsilon_details` says which happened.

Rounds are grouped by equal records whatever their order (composition commutes), so a run whose
per-round noise multiplier varies (distributed DP, ``fedsafe.privacy.dp.plugin``) costs one
PLD/RDP term per distinct multiplier, not per round. Such callers round each multiplier down to
the grid 2^(k/256) (:func:`grid_floor`): less noise is accounted than present (an upper bound on
ε, by ≤ 0.28 % in z), and the number of distinct records stays bounded.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp
from dp_accounting.rdp import rdp_privacy_accountant as _rdp_impl

NR = dpa.NeighboringRelation

SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "none")
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
NEIGHBORING: dict[str, dpa.NeighboringRelation] = {
    "add_or_remove_one": NR.ADD_OR_REMOVE_ONE,
    "replace_one": NR.REPLACE_ONE,
}
# fedsafe's clients.sampling -> the accounting sampling scheme.
CLIENT_SAMPLING: dict[str, str] = {"poisson": "poisson", "fixed": "fixed", "all": "none"}

RDP_ORDERS: tuple[float, ...] = (
    (1.1, 1.2, 1.3, 1.4)  # coarse: only large-ε regimes need them, and dp-accounting's series for
    # fractional orders this close to 1 converge slowly (or not, with a logged warning) at small z
    + tuple(round(1.5 + k / 20, 2) for k in range(0, 31))  # 1.5 .. 3.0
    + tuple(round(3 + k / 10, 1) for k in range(1, 81))  # 3.1 .. 11.0
    + tuple(float(a) for a in range(12, 65))
    + (72.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)
)
# Orders for the quick RDP estimate that picks PLD's first interval: integers only, whose RDP
# dp-accounting computes in closed form (the fractional orders' series cost ~8x as much).
RDP_ESTIMATE_ORDERS: tuple[float, ...] = tuple(a for a in RDP_ORDERS if a >= 2 and a == int(a))
# PLD discretization (see the module docstring): the coarsest interval on the ladder, the scale of
# the first one tried (h0 = scale * eps_RDP / sqrt(T)), the agreement that stops the refinement,
# how many halvings at most, the RDP bound above which PLD is not run, and the most points a
# one-round PLD may have (2^23 float64: 64 MiB per array).
PLD_MAX_INTERVAL: float = 1e-2
PLD_INTERVAL_SCALE: float = 0.05
PLD_REFINE_TOL: float = 0.005
PLD_MAX_REFINEMENTS: int = 12
PLD_EPSILON_LIMIT: float = 1e4
PLD_MAX_POINTS: int = 2**23
# Per-round multipliers that vary are rounded down to 2^(k / Z_GRID_PER_OCTAVE) (grid_floor).
Z_GRID_PER_OCTAVE: int = 256
CALIBRATION_TOL: float = 1e-4
# Calibration refuses targets met with less noise than this: ε there is in the hundreds and PLD
# slows down sharply (its support grows like 1/z).
_Z_FLOOR = 0.125
_Z_CEIL = 2.0**30


class UnsupportedAccountingError(ValueError):
    """A (sampling, accountant, neighbouring relation) combination dp-accounting cannot account."""


# --------------------------------------------------------------------------- validation


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return d


def _check_z(z: float) -> float:
    if isinstance(z, bool):
        raise ValueError(f"z (noise multiplier) must be a finite number >= 0, got {z!r}")
    v = float(z)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"z (noise multiplier) must be a finite number >= 0 (0 gives epsilon = inf), got {z!r}")
    return v


def _check_q(q: float | None, *, required: bool, sampling: str) -> float | None:
    if q is None:
        if required:
            raise ValueError(f"q (sampling probability) is required for sampling={sampling!r}")
        return None
    v = float(q)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"q (sampling probability) must be in (0, 1], got {q!r}")
    return v


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_interval(interval: float | None) -> float | None:
    if interval is None:
        return None
    v = float(interval)
    if not (math.isfinite(v) and 0 < v <= PLD_MAX_INTERVAL):
        raise ValueError(
            f"value_discretization_interval must be in (0, {PLD_MAX_INTERVAL:g}] (coarser intervals make "
            f"dp-accounting's PLD numerically unreliable), or None to choose it; got {interval!r}"
        )
    return v


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; valid: {', '.join(ACCOUNTANTS)}")
    return accountant


def _check_sampling(sampling: str) -> str:
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; valid: {', '.join(SAMPLINGS)}")
    return sampling


def _check_neighboring(neighboring: str) -> str:
    if neighboring not in NEIGHBORING:
        extra = (
            " (replace_special is not offered: for Gaussian sums it equals add_or_remove_one)"
            if neighboring == "replace_special"
            else ""
        )
        raise ValueError(
            f"unknown neighboring relation {neighboring!r}; valid: {', '.join(NEIGHBORING)}{extra}"
        )
    return neighboring


def natural_neighboring(sampling: str) -> str:
    """The relation fedsafe uses by default for a sampling scheme: ``replace_one`` for
    ``fixed`` (the only one dp-accounting accounts it under), ``add_or_remove_one`` otherwise."""
    return "replace_one" if _check_sampling(sampling) == "fixed" else "add_or_remove_one"


# --------------------------------------------------------------------------- round records


@dataclass(frozen=True)
class RoundRecord:
    """One round's mechanism as plain numbers: a Gaussian release with noise multiplier ``z``
    under ``sampling`` (``q`` for poisson; ``num_clients`` N and ``sample_size`` m for fixed)."""

    z: float
    sampling: str
    q: float | None = None
    num_clients: int | None = None
    sample_size: int | None = None

    def event(self) -> dpa.DpEvent:
        """The canonical DpEvent (dp-accounting's convention: z = s/C, ‖v_i‖ ≤ C)."""
        if self.z == 0:
            return dpa.NonPrivateDpEvent()
        gauss = dpa.GaussianDpEvent(self.z)
        if self.sampling == "poisson":
            return dpa.PoissonSampledDpEvent(self.q, gauss)
        if self.sampling == "fixed":
            return dpa.SampledWithoutReplacementDpEvent(self.num_clients, self.sample_size, gauss)
        return gauss

    def as_dict(self) -> dict[str, Any]:
        return {
            "z": self.z,
            "sampling": self.sampling,
            "q": self.q,
            "num_clients": self.num_clients,
            "sample_size": self.sample_size,
        }


def make_round_record(
    z: float,
    q: float | None,
    sampling: str = "poisson",
    num_clients: int | None = None,
    sample_size: int | None = None,
) -> RoundRecord:
    """Validate one round's parameters into a :class:`RoundRecord`.

    ``poisson`` needs q; ``fixed`` needs ``num_clients`` N and either ``sample_size`` m or q
    (m = round(q·N); when both are given they must agree to rounding); ``none`` ignores q (it
    is still range-checked when given) — no amplification is claimed, e.g. every client takes
    part, or the sample is not secret from the adversary.
    """
    z = _check_z(z)
    sampling = _check_sampling(sampling)
    if sampling == "poisson":
        return RoundRecord(z, "poisson", q=_check_q(q, required=True, sampling=sampling))
    if sampling == "none":
        _check_q(q, required=False, sampling=sampling)
        return RoundRecord(z, "none")
    if num_clients is None:
        raise ValueError(
            "sampling='fixed' needs num_clients (the population size N) and sample_size m "
            "(or q, with m = round(q*N))"
        )
    n = _check_count("num_clients", num_clients, 1)
    qv = _check_q(q, required=sample_size is None, sampling=sampling)
    if sample_size is None:
        m = round(qv * n)
        if not 1 <= m <= n:
            raise ValueError(f"sampling='fixed': sample size round(q*N) = round({qv}*{n}) = {m} must be in [1, {n}]")
    else:
        m = _check_count("sample_size", sample_size, 1)
        if m > n:
            raise ValueError(f"sample_size={m} exceeds num_clients={n}")
        if qv is not None and abs(qv * n - m) > 0.5:
            raise ValueError(f"q={qv} disagrees with sample_size/num_clients = {m}/{n}; give one of them")
    return RoundRecord(z, "fixed", num_clients=n, sample_size=m)


def gaussian_round_event(
    z: float,
    q: float | None,
    sampling: str = "poisson",
    num_clients: int | None = None,
    sample_size: int | None = None,
) -> dpa.DpEvent:
    """The DpEvent of one DP-FedAvg round (see the module table), in dp-accounting's documented
    convention z = s/C. Compose it through :class:`Accountant` (or :func:`epsilon`), which
    corrects the replace-one sensitivity for the RDP accountant; composing it into a bare
    ``RdpAccountant(neighboring_relation=REPLACE_ONE)`` would understate ε."""
    return make_round_record(z, q, sampling, num_clients, sample_size).event()


# --------------------------------------------------------------------------- dp-accounting glue


@functools.cache
def _rdp_replace_one_halves(kind: str) -> bool:
    """Whether the installed RdpAccountant reads GaussianDpEvent's z as std / L2-sensitivity
    under REPLACE_ONE (dp-accounting ≤ 0.6, issue #378), so fedsafe must pass z/2.

    Probe at order 2, z = 1, no subsampling (q = m/N = 1): with values in the unit ball the
    replace-one sensitivity is 2, whose Gaussian RDP is 2·2²/(2·1²) = 4; the affected versions
    return 2/(2·1²) = 1.
    """
    acc = rdp.RdpAccountant([2.0], NR.REPLACE_ONE)
    gauss = dpa.GaussianDpEvent(1.0)
    acc.compose(gauss if kind == "gaussian" else dpa.SampledWithoutReplacementDpEvent(1, 1, gauss))
    value = float(acc.rdp[0])
    if math.isclose(value, 4.0, rel_tol=1e-9):
        return False
    if math.isclose(value, 1.0, rel_tol=1e-9):
        return True
    raise RuntimeError(f"unexpected RDP {value} from dp-accounting's replace-one Gaussian probe ({kind})")


def _rdp_replace_one_event(event: dpa.DpEvent) -> dpa.DpEvent:
    """Rewrite a canonical event for an RDP accountant under REPLACE_ONE (sensitivity 2C)."""
    if isinstance(event, dpa.GaussianDpEvent):
        return dpa.GaussianDpEvent(event.noise_multiplier / 2) if _rdp_replace_one_halves("gaussian") else event
    if isinstance(event, dpa.SampledWithoutReplacementDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        if not _rdp_replace_one_halves("wor"):
            return event
        inner = dpa.GaussianDpEvent(event.event.noise_multiplier / 2)
        return dpa.SampledWithoutReplacementDpEvent(event.source_dataset_size, event.sample_size, inner)
    if isinstance(event, dpa.SelfComposedDpEvent):
        return dpa.SelfComposedDpEvent(_rdp_replace_one_event(event.event), event.count)
    if isinstance(event, dpa.ComposedDpEvent):
        return dpa.ComposedDpEvent([_rdp_replace_one_event(e) for e in event.events])
    return event


def _unsupported_message(accountant: str, neighboring: str, sampling: str) -> str:
    rel = NEIGHBORING[neighboring].name
    head = f"the {accountant.upper()} accountant cannot account sampling={sampling!r} under {rel} ({neighboring})"
    if sampling == "fixed" and accountant == "pld":
        why = (
            "dp-accounting's PLD accountant does not support SampledWithoutReplacementDpEvent under "
            "any neighbouring relation; use accountant='rdp' with neighboring='replace_one'"
        )
    elif sampling == "fixed":
        why = (
            "dp-accounting accounts SampledWithoutReplacementDpEvent only under REPLACE_ONE; "
            "use neighboring='replace_one' (or Poisson sampling for add/remove)"
        )
    elif sampling == "poisson" and accountant == "rdp":
        why = (
            "dp-accounting's RDP accountant supports PoissonSampledDpEvent only under "
            "ADD_OR_REMOVE_ONE; use neighboring='add_or_remove_one', or accountant='pld'"
        )
    else:
        why = "dp-accounting does not support this event"
    return f"{head}: {why}"


# --------------------------------------------------------------------------- PLD over grouped rounds


def grid_floor(z: float) -> float:
    """The largest ``2^(k / Z_GRID_PER_OCTAVE)`` ≤ z (k an integer): z rounded *down* to a
    geometric grid of ratio 2^(1/256) ≈ 1.0027, so accounting it states less noise than present
    (an upper bound on ε) while the multipliers of a run fall on few distinct values. 0 stays 0."""
    z = _check_z(z)
    if z == 0:
        return 0.0
    k = math.floor(math.log2(z) * Z_GRID_PER_OCTAVE)
    g = 2.0 ** (k / Z_GRID_PER_OCTAVE)
    while g > z:  # floating-point guard: the grid value must not exceed z
        k -= 1
        g = 2.0 ** (k / Z_GRID_PER_OCTAVE)
    return g


def _record_order(rec: RoundRecord) -> tuple[Any, ...]:
    """A canonical order of records, so ε does not depend on the order rounds arrived in."""
    return (rec.sampling, rec.q or 0.0, rec.num_clients or 0, rec.sample_size or 0, rec.z)


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


@dataclass(frozen=True)
class EpsilonDetails:
    """How an ε was obtained: ``method`` is ``"rdp"``, ``"pld"``, or ``"rdp-bound"`` (PLD not run:
    the RDP bound exceeded :data:`PLD_EPSILON_LIMIT`), ``interval`` the PLD discretization of the
    reported value, ``intervals`` every (interval, ε) computed, ``note`` a sentence for users."""

    epsilon: float
    method: str
    interval: float | None = None
    intervals: tuple[tuple[float, float], ...] = ()
    note: str = ""


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


class Accountant:
    """(ε, δ) of the rounds composed so far, for the engine to compose round by round.

    ``Accountant(delta, accountant="pld"|"rdp", neighboring="add_or_remove_one"|"replace_one")``;
    :meth:`compose_round` adds rounds as plain numbers, :meth:`compose` takes DpEvents built
    from the round events (Gaussian, Poisson- or fixed-size-sampled Gaussian, their
    compositions, NoOp/NonPrivate); :meth:`epsilon` is ε at ``delta`` for everything composed.
    Rounds with different z (a schedule, distributed DP's per-round multipliers) or different q
    compose correctly; equal rounds are grouped as ``SelfComposedDpEvent(event, count)`` whatever
    their order (composition commutes), so the cost grows with the distinct rounds, not all.

    ε is recomputed from the grouped records on demand (memoised until the next compose):
    RDP sums dp-accounting's per-event RDP curves (cached per process for each distinct round,
    so a per-round ``epsilon()`` costs milliseconds) and converts with dp-accounting; PLD runs
    :func:`pld_epsilon` (discretization chosen per call, one-round PLDs cached), 0.05–0.5 s at
    T = 1000 — the engine asks for it on evaluation rounds only.

    :meth:`state_dict` holds the records (z, sampling, q, N, m, count) as plain Python numbers;
    :meth:`load_state_dict` rebuilds by re-composing them. The accountant's own settings
    (kind, relation, delta, interval) come from the constructor, so a checkpoint can be
    re-accounted under other settings.
    """

    STATE_FORMAT = "fedsafe.privacy.dp.accounting.Accountant/1"

    def __init__(
        self,
        delta: float,
        accountant: str = "pld",
        neighboring: str = "add_or_remove_one",
        *,
        value_discretization_interval: float | None = None,
        orders: Sequence[float] = RDP_ORDERS,
    ) -> None:
        self.delta = _check_delta(delta)
        self.accountant = _check_accountant(accountant)
        self.neighboring = _check_neighboring(neighboring)
        self.value_discretization_interval = _check_interval(value_discretization_interval)
        self.orders = tuple(float(a) for a in orders)
        if not self.orders or min(self.orders) <= 1:
            raise ValueError("RDP orders must be a non-empty list of numbers > 1")
        self._records: dict[RoundRecord, int] = {}
        self._eps_cache: dict[tuple[Any, ...], EpsilonDetails] = {}
        self._pld_parts: PartsCache = {}

    # -- dp-accounting objects

    @property
    def relation(self) -> dpa.NeighboringRelation:
        return NEIGHBORING[self.neighboring]

    def fresh(self, value_discretization_interval: float | None = None) -> dpa.PrivacyAccountant:
        """An empty dp-accounting accountant with this object's settings (PLD: at
        ``value_discretization_interval``, else the constructor's, else the coarsest,
        :data:`PLD_MAX_INTERVAL`)."""
        if self.accountant == "rdp":
            return rdp.RdpAccountant(list(self.orders), self.relation)
        h = value_discretization_interval or self.value_discretization_interval or PLD_MAX_INTERVAL
        return pld.PLDAccountant(self.relation, value_discretization_interval=h)

    def accounting_event(self, event: dpa.DpEvent) -> dpa.DpEvent:
        """``event`` (canonical convention) as this accountant must receive it."""
        if self.accountant == "rdp" and self.relation is NR.REPLACE_ONE:
            return _rdp_replace_one_event(event)
        return event

    def check_supported(self, record: RoundRecord) -> None:
        """Raise :class:`UnsupportedAccountingError` if dp-accounting cannot account ``record``."""
        probe = replace(record, z=record.z or 1.0)  # NonPrivate is always supported; check the shape
        if not self.fresh().supports(self.accounting_event(probe.event())):
            raise UnsupportedAccountingError(_unsupported_message(self.accountant, self.neighboring, record.sampling))

    # -- composing

    def _append(self, records: list[tuple[RoundRecord, int]]) -> None:
        for rec, _ in records:
            self.check_supported(rec)
        for rec, count in records:
            if count:
                self._records[rec] = self._records.get(rec, 0) + count
        self._eps_cache.clear()

    def compose_round(
        self,
        z: float,
        q: float | None = None,
        sampling: str = "poisson",
        *,
        num_clients: int | None = None,
        sample_size: int | None = None,
        count: int = 1,
    ) -> Accountant:
        """Compose ``count`` rounds of the Gaussian round event (see :func:`make_round_record`)."""
        count = _check_count("count (rounds)", count, 0)
        self._append([(make_round_record(z, q, sampling, num_clients, sample_size), count)])
        return self

    def compose(self, event: dpa.DpEvent, count: int = 1) -> Accountant:
        """Compose a DpEvent made of round events (canonical convention z = s/C)."""
        count = _check_count("count", count, 0)
        self._append(_records_from_event(event, count))
        return self

    # -- reading

    @property
    def records(self) -> list[dict[str, Any]]:
        """The grouped rounds composed so far (first-seen order), as plain dicts with ``count``."""
        return [{**rec.as_dict(), "count": count} for rec, count in self._records.items()]

    @property
    def rounds(self) -> int:
        return sum(self._records.values())

    @property
    def ledger(self) -> dpa.DpEvent:
        """Everything composed, as one canonical DpEvent."""
        if not self._records:
            return dpa.NoOpDpEvent()
        return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(rec.event(), c) for rec, c in self._records.items()])

    def _rdp_epsilon(self, delta: float, orders: tuple[float, ...]) -> tuple[float, bool]:
        """RDP ε of the rounds at ``orders``, and whether it is a valid bound for this relation.
        RDP composes additively: the sum RdpAccountant.compose forms, each distinct round's curve
        computed by dp-accounting once. Where dp-accounting's RDP cannot account the relation
        (Poisson under replace-one) the value is an estimate only: add/remove with z/2."""
        total, valid = 0.0, True
        for rec, count in self._records.items():
            if rec.sampling == "poisson" and self.neighboring == "replace_one":
                valid = False
                curve = _rdp_curve(orders, "add_or_remove_one", replace(rec, z=rec.z / 2))
            else:
                curve = _rdp_curve(orders, self.neighboring, rec)
            total = total + count * curve
        return float(_rdp_impl.compute_epsilon(orders, total, delta)[0]), valid

    def epsilon_details(self, delta: float | None = None) -> EpsilonDetails:
        """ε at ``delta`` (default: the constructor's) of all rounds composed so far, with how it
        was obtained (:class:`EpsilonDetails`); 0 before any round, ∞ if a round had z = 0."""
        d = self.delta if delta is None else _check_delta(delta)
        key = (tuple(self._records.items()), d)
        if key in self._eps_cache:
            return self._eps_cache[key]
        if not self._records:
            out = EpsilonDetails(0.0, self.accountant)
        elif any(rec.z == 0 for rec in self._records):
            out = EpsilonDetails(math.inf, self.accountant)
        elif self.accountant == "rdp":
            out = EpsilonDetails(self._rdp_epsilon(d, self.orders)[0], "rdp")
        else:
            rdp_eps, rdp_valid = self._rdp_epsilon(d, RDP_ESTIMATE_ORDERS)
            if rdp_eps > PLD_EPSILON_LIMIT:  # PLD is skipped: report the tightest RDP bound
                rdp_eps, rdp_valid = self._rdp_epsilon(d, self.orders)
            with np.errstate(over="ignore", divide="ignore"):  # dp-accounting's PLD at huge ε
                out = pld_epsilon(
                    list(self._records.items()),
                    self.neighboring,
                    d,
                    rdp_estimate=rdp_eps,
                    rdp_is_bound=rdp_valid,
                    interval=self.value_discretization_interval,
                    parts=self._pld_parts,
                )
        self._eps_cache[key] = out
        return out

    def epsilon(self, delta: float | None = None) -> float:
        """ε at ``delta`` (default: the constructor's) of all rounds composed so far;
        0 before any round, ∞ if a round had z = 0 (see :meth:`epsilon_details`)."""
        return self.epsilon_details(delta).epsilon

    # -- checkpointing

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": self.STATE_FORMAT,
            "accountant": self.accountant,
            "neighboring": self.neighboring,
            "delta": self.delta,
            "records": self.records,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the composed rounds by those in ``state`` (re-composed, grouped)."""
        if not isinstance(state, dict) or state.get("format") != self.STATE_FORMAT:
            raise ValueError(f"not an Accountant state (expected format {self.STATE_FORMAT!r})")
        parsed: list[tuple[RoundRecord, int]] = []
        for i, r in enumerate(state.get("records", [])):
            try:
                rec = make_round_record(r["z"], r.get("q"), r["sampling"], r.get("num_clients"), r.get("sample_size"))
                parsed.append((rec, _check_count("count", r["count"], 0)))
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"Accountant state: records[{i}] = {r!r}: {err}") from err
        self._records = {}
        self._append(parsed)


@functools.lru_cache(maxsize=4096)
def _rdp_curve(orders: tuple[float, ...], neighboring: str, rec: RoundRecord) -> np.ndarray:
    """dp-accounting's RDP curve of one round, cached per process (read-only array)."""
    acc = Accountant(0.5, "rdp", neighboring, orders=orders)
    curve = acc.fresh().compose(acc.accounting_event(rec.event())).rdp
    curve.setflags(write=False)
    return curve


def _records_from_event(event: dpa.DpEvent, count: int) -> list[tuple[RoundRecord, int]]:
    if isinstance(event, dpa.NoOpDpEvent):
        return []
    if isinstance(event, dpa.NonPrivateDpEvent):
        return [(RoundRecord(0.0, "none"), count)]
    if isinstance(event, dpa.GaussianDpEvent):
        return [(make_round_record(event.noise_multiplier, None, "none"), count)]
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        return [(make_round_record(event.event.noise_multiplier, event.sampling_probability, "poisson"), count)]
    if isinstance(event, dpa.SampledWithoutReplacementDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        rec = make_round_record(
            event.event.noise_multiplier,
            None,
            "fixed",
            num_clients=event.source_dataset_size,
            sample_size=event.sample_size,
        )
        return [(rec, count)]
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _records_from_event(event.event, count * _check_count("SelfComposedDpEvent.count", event.count, 0))
    if isinstance(event, dpa.ComposedDpEvent):
        return [r for e in event.events for r in _records_from_event(e, count)]
    raise ValueError(
        f"Accountant.compose: unsupported event {event!r}; supported: GaussianDpEvent, "
        "PoissonSampledDpEvent(GaussianDpEvent), SampledWithoutReplacementDpEvent(GaussianDpEvent), "
        "SelfComposedDpEvent / ComposedDpEvent of those, NoOpDpEvent, NonPrivateDpEvent"
    )


# --------------------------------------------------------------------------- one-shot functions


def _one_shot(
    z: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str,
    accountant: str,
    num_clients: int | None,
    sample_size: int | None,
    neighboring: str | None,
    value_discretization_interval: float | None,
) -> Accountant:
    rounds = _check_count("rounds", rounds, 0)
    acc = Accountant(
        delta,
        accountant,
        neighboring or natural_neighboring(sampling),
        value_discretization_interval=value_discretization_interval,
    )
    return acc.compose_round(z, q, sampling, num_clients=num_clients, sample_size=sample_size, count=rounds)


def epsilon(
    z: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "pld",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
    value_discretization_interval: float | None = None,
) -> float:
    """ε after ``rounds`` identical DP-FedAvg rounds, at ``delta``.

    ``sampling``: ``poisson`` (q), ``fixed`` (N = ``num_clients``, m = ``sample_size`` or
    round(q·N)), ``none`` (q ignored). ``neighboring`` defaults to :func:`natural_neighboring`.
    z = 0 gives ∞, rounds = 0 gives 0. Unsupported combinations raise
    :class:`UnsupportedAccountingError` (see the module table). PLD chooses its discretization
    unless ``value_discretization_interval`` is given (see the module docstring).
    """
    return _one_shot(
        z, q, rounds, delta, sampling, accountant, num_clients, sample_size, neighboring, value_discretization_interval
    ).epsilon()


def epsilon_local(
    z: float,
    releases: int,
    delta: float,
    accountant: str = "pld",
    *,
    value_discretization_interval: float | None = None,
) -> float:
    """Local-DP ε of one client that released ``releases`` noised updates x̄ + N(0, (zC)²)
    (``local`` placement): Gaussian releases under replace-one (any two inputs of the client,
    sensitivity 2C), no amplification (the server sees who took part)."""
    return epsilon(
        z,
        None,
        releases,
        delta,
        sampling="none",
        accountant=accountant,
        neighboring="replace_one",
        value_discretization_interval=value_discretization_interval,
    )


def _calibrate_at(
    acc: Accountant,
    base: RoundRecord,
    rounds: int,
    delta: float,
    target: float,
    tol: float,
    interval: float | None,
    start: float,
) -> float:
    """The smallest z (within ``tol``) whose ε is at most ``target`` for ``acc``'s accountant
    (PLD at the fixed ``interval``): brackets z by doubling/halving from ``start``, then
    ``dp_accounting.calibrate_dp_mechanism`` (Brent's method, a fresh accountant per trial)."""

    def fresh() -> dpa.PrivacyAccountant:
        return acc.fresh(interval)

    def make_event(z: float) -> dpa.DpEvent:
        return dpa.SelfComposedDpEvent(acc.accounting_event(replace(base, z=float(z)).event()), rounds)

    def gap(z: float) -> float:
        with np.errstate(over="ignore", divide="ignore"):
            return fresh().compose(make_event(z)).get_epsilon(delta) - target

    lo, hi = start, start
    if gap(start) > 0:
        while True:
            lo, hi = hi, hi * 2
            if hi > _Z_CEIL:
                raise ValueError(f"target_eps={target:g} needs z > 2^30; the target is unreachable in practice")
            if gap(hi) <= 0:
                break
    else:
        while True:
            hi, lo = lo, lo / 2
            if lo < _Z_FLOOR:
                raise ValueError(
                    f"target_eps={target:g} is already met with z={hi:g} (epsilon={gap(hi) + target:.4g}); calibration "
                    f"below z={_Z_FLOOR} is refused: such an epsilon is no meaningful privacy guarantee"
                )
            if gap(lo) > 0:
                break
    with np.errstate(over="ignore", divide="ignore"):
        z = dpa.calibrate_dp_mechanism(
            fresh, make_event, target, delta, bracket_interval=dpa.ExplicitBracketInterval(lo, hi), tol=tol
        )
    return float(z)


def calibrate_noise(
    target_eps: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "pld",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
    tol: float = CALIBRATION_TOL,
    value_discretization_interval: float | None = None,
) -> float:
    """The smallest noise multiplier z whose ε after ``rounds`` rounds is at most ``target_eps``.

    Brackets z by doubling/halving from 1, then runs ``dp_accounting.calibrate_dp_mechanism``
    (Brent's method with a fresh accountant per trial). Tolerance: the result is within ``tol``
    (absolute, in z; default 1e-4) of the exact minimum z* for this accountant, and never below
    the budget: ``epsilon(result) <= target_eps`` (dp-accounting re-checks and falls back to
    bisection). Refuses targets that need z < 0.125 (ε in the hundreds) or z > 2^30.
    ``rounds = 0`` returns 0.

    PLD without a fixed interval: calibrate at the interval :func:`epsilon` would report for
    ε = ``target_eps`` when its first refinement settles (half of :func:`first_interval`), then
    check the result with :func:`epsilon` itself — the value the engine and ``fedsafe privacy calibrate`` report. Where that check
    settles on another interval and exceeds the target, recalibrate at that interval (at most
    three times), then raise z by ``tol`` until the check passes.
    """
    t = float(target_eps)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"target_eps must be a finite number > 0, got {target_eps!r}")
    d = _check_delta(delta)
    rounds = _check_count("rounds", rounds, 0)
    tol = float(tol)
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be > 0, got {tol!r}")
    acc = Accountant(
        d,
        accountant,
        neighboring or natural_neighboring(sampling),
        value_discretization_interval=value_discretization_interval,
    )
    base = make_round_record(1.0, q, sampling, num_clients, sample_size)
    acc.check_supported(base)
    if rounds == 0:
        return 0.0
    if acc.accountant == "rdp" or acc.value_discretization_interval is not None:
        return _calibrate_at(acc, base, rounds, d, t, tol, acc.value_discretization_interval, 1.0)

    def checked(z: float) -> EpsilonDetails:
        return Accountant(d, "pld", acc.neighboring).compose_round(
            z, q, sampling, num_clients=num_clients, sample_size=sample_size, count=rounds
        ).epsilon_details()

    z, interval = 1.0, first_interval(t, rounds) / 2  # epsilon() reports after at least one halving
    for _ in range(3):
        z = _calibrate_at(acc, base, rounds, d, t, tol, interval, z)
        result = checked(z)
        if result.epsilon <= t or result.interval is None or result.interval == interval:
            break
        interval = result.interval
    for _ in range(1000):
        if checked(z).epsilon <= t:
            return z
        z += tol
    raise RuntimeError(f"calibration to target_eps={t:g} did not settle (last z={z:g})")


# --------------------------------------------------------------------------- CLI bodies


def epsilon_table(
    z: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
) -> dict[str, Any]:
    """ε under both accountants, for ``fedsafe privacy epsilon``.

    Returns ``{"z", "q", "rounds", "delta", "sampling", "num_clients", "sample_size",
    "neighboring", "epsilon": {"rdp": float | None, "pld": float | None}, "unsupported":
    {accountant: message}, "details": {accountant: EpsilonDetails}}``; an accountant that cannot
    account the combination has ε None and its reason under ``unsupported``. Where PLD is not run
    (huge ε) its ε is the RDP bound and ``details["pld"].note`` says so. Invalid inputs raise
    ValueError.
    """
    rel = neighboring or natural_neighboring(sampling)
    out: dict[str, Any] = {
        "z": z,
        "q": q,
        "rounds": rounds,
        "delta": delta,
        "sampling": sampling,
        "num_clients": num_clients,
        "sample_size": sample_size,
        "neighboring": rel,
        "epsilon": {},
        "unsupported": {},
        "details": {},
    }
    for name in ("rdp", "pld"):
        try:
            acc = _one_shot(z, q, rounds, delta, sampling, name, num_clients, sample_size, rel, None)
            details = acc.epsilon_details()
            out["epsilon"][name] = details.epsilon
            out["details"][name] = details
        except UnsupportedAccountingError as err:
            out["epsilon"][name] = None
            out["unsupported"][name] = str(err)
    return out


def format_epsilon_table(table: dict[str, Any]) -> str:
    """Human-readable lines for :func:`epsilon_table`'s result."""
    head = (
        f"z={table['z']:g} rounds={table['rounds']} delta={table['delta']:g} "
        f"sampling={table['sampling']}"
    )
    if table["sampling"] == "poisson":
        head += f" q={table['q']:g}"
    elif table["sampling"] == "fixed":
        head += f" N={table['num_clients']} " + (
            f"m={table['sample_size']}" if table["sample_size"] is not None else f"q={table['q']:g}"
        )
    lines = [f"{head} neighboring={table['neighboring']}"]
    for name in ("rdp", "pld"):
        eps = table["epsilon"].get(name)
        if eps is None:
            lines.append(f"  {name.upper()}: unsupported — {table['unsupported'].get(name, '')}")
        else:
            details = table.get("details", {}).get(name)
            line = f"  {name.upper()}: epsilon = {eps:.4f}"
            if details is not None and details.method == "pld" and details.interval is not None:
                line += f"  (discretization interval {details.interval:.3g})"
            lines.append(line)
            if details is not None and details.note:
                lines.append(f"    note: {details.note}")
    return "\n".join(lines)


def calibration_report(
    target_eps: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "pld",
    num_clients: int | None = None,
    *,
    sample_size: int | None = None,
    neighboring: str | None = None,
) -> dict[str, Any]:
    """Calibrated z and the ε it achieves, for ``fedsafe privacy calibrate``."""
    rel = neighboring or natural_neighboring(sampling)
    z = calibrate_noise(
        target_eps, q, rounds, delta, sampling, accountant, num_clients, sample_size=sample_size, neighboring=rel
    )
    achieved = epsilon(z, q, rounds, delta, sampling, accountant, num_clients, sample_size=sample_size, neighboring=rel)
    return {
        "target_epsilon": target_eps,
        "z": z,
        "epsilon": achieved,
        "accountant": accountant,
        "neighboring": rel,
        "q": q,
        "rounds": rounds,
        "delta": delta,
        "sampling": sampling,
        "num_clients": num_clients,
        "sample_size": sample_size,
    }


def format_calibration(report: dict[str, Any]) -> str:
    """One line for :func:`calibration_report`; z is rounded *up* to 4 decimals (more noise,
    so the printed value still meets the target)."""
    z_up = math.ceil(report["z"] * 1e4) / 1e4
    return (
        f"z = {z_up:.4f}  ({report['accountant'].upper()}: epsilon = {report['epsilon']:.4f} "
        f"<= target {report['target_epsilon']:g} at delta={report['delta']:g}, "
        f"{report['rounds']} rounds, sampling={report['sampling']}, {report['neighboring']})"
    )
