"""Round events: what happened in one round, as small frozen dataclasses of plain numbers.

An event says what was released, never how it is accounted: the accountant engines
(``accounting.rdp``, ``accounting.pld``, ``accounting.distributed``) register, per event type,
how they account it, and an engine that has no handler for an event refuses it with
:class:`~fedsafe.privacy.dp.accounting.common.UnsupportedAccountingError`. A new kind of round
is a new :class:`RoundRecord` subclass plus the handlers of the engines that can account it.

- :class:`GaussianRound`: one Gaussian release of the sum of client updates clipped to C with
  noise multiplier z, under a sampling scheme (``poisson`` q; ``fixed`` N, m; ``none``). Its
  :meth:`~GaussianRound.event` is dp-accounting's DpEvent in the documented convention z = s/C.
  Adaptive clipping adds no event of its own: the count bit and the update sum together are one
  Gaussian release with the *total* z (Andrew et al. 2021, Thm 1; ``dp.adaptive_clip_split``),
  which ``DPPlan`` composes as a :class:`GaussianRound`.
- :class:`DistributedRound`: a distributed-DP (secure-aggregation noise) Poisson round seen by
  an outsider, whose noise is that of the honest shares in the sum (n_s shares give z); it has no
  dp-accounting DpEvent (``UnsupportedDpEvent``): only the PLD engine accounts it
  (``accounting.distributed``).

Checkpoints store events as :meth:`RoundRecord.as_dict` (the keys ``z``, ``sampling``, ``q``,
``num_clients``, ``sample_size`` and, for a distributed round, ``noise_shares``), read back by
:func:`make_round_record`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa

from .common import (
    Z_GRID_PER_OCTAVE,
    _check_count,
    _check_q,
    _check_sampling,
    _check_z,
)


@dataclass(frozen=True)
class RoundRecord:
    """The base of round events: a Gaussian release with noise multiplier ``z`` under
    ``sampling`` (see the subclasses). Fields shared by every event, so checkpoints, grouping
    and ordering read them alike."""

    z: float
    sampling: str
    q: float | None = None
    num_clients: int | None = None
    sample_size: int | None = None

    # A subclass's field that identifies it in :meth:`as_dict` (None: a Gaussian round).
    noise_shares = None

    def event(self) -> dpa.DpEvent:
        """The canonical dp-accounting DpEvent of this round."""
        raise NotImplementedError

    def sort_key(self) -> tuple[Any, ...]:
        """A canonical order of events, so ε does not depend on the order rounds arrived in."""
        return (self.sampling, self.q or 0.0, self.num_clients or 0, self.sample_size or 0, self.z)

    def as_dict(self) -> dict[str, Any]:
        return {
            "z": self.z,
            "sampling": self.sampling,
            "q": self.q,
            "num_clients": self.num_clients,
            "sample_size": self.sample_size,
        }


@dataclass(frozen=True)
class GaussianRound(RoundRecord):
    """One DP-FedAvg round: a Gaussian release of the clipped sum with noise multiplier ``z``
    under ``sampling`` (``q`` for poisson; ``num_clients`` N and ``sample_size`` m for fixed)."""

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


@dataclass(frozen=True)
class DistributedRound(RoundRecord):
    """A *distributed* Poisson round seen by an outsider (see
    ``accounting.distributed.distributed_round_pld``): the noise is that of the realised number
    of honest shares (``noise_shares`` n_s shares give multiplier z), ``num_clients`` is the
    honest population, ``q`` the sampling probability."""

    noise_shares: int | None = None  # type: ignore[assignment]

    def event(self) -> dpa.DpEvent:
        """No dp-accounting event exists (``UnsupportedDpEvent``); z = 0 is ``NonPrivateDpEvent``."""
        if self.z == 0:
            return dpa.NonPrivateDpEvent()
        return dpa.UnsupportedDpEvent()

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "noise_shares": self.noise_shares}


def make_round_record(
    z: float,
    q: float | None,
    sampling: str = "poisson",
    num_clients: int | None = None,
    sample_size: int | None = None,
    *,
    noise_shares: int | None = None,
) -> RoundRecord:
    """Validate one round's parameters into its event: a :class:`GaussianRound`, or with
    ``noise_shares`` n_s a :class:`DistributedRound` (``num_clients`` = the honest population,
    at least 1; q required; see ``accounting.distributed``).

    ``poisson`` needs q; ``fixed`` needs ``num_clients`` N and either ``sample_size`` m or q
    (m = round(q·N); when both are given they must agree to rounding); ``none`` ignores q (it
    is still range-checked when given) — no amplification is claimed, e.g. every client takes
    part, or the sample is not secret from the adversary.
    """
    z = _check_z(z)
    sampling = _check_sampling(sampling)
    if noise_shares is not None:
        if sampling != "poisson" or num_clients is None:
            raise ValueError("noise_shares (a distributed round) needs sampling='poisson' and num_clients (honest clients)")
        return DistributedRound(
            z,
            "poisson",
            q=_check_q(q, required=True, sampling=sampling),
            num_clients=_check_count("num_clients", num_clients, 1),
            noise_shares=_check_count("noise_shares", noise_shares, 1),
        )
    if sampling == "poisson":
        return GaussianRound(z, "poisson", q=_check_q(q, required=True, sampling=sampling))
    if sampling == "none":
        _check_q(q, required=False, sampling=sampling)
        return GaussianRound(z, "none")
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
    return GaussianRound(z, "fixed", num_clients=n, sample_size=m)


def gaussian_round_event(
    z: float,
    q: float | None,
    sampling: str = "poisson",
    num_clients: int | None = None,
    sample_size: int | None = None,
) -> dpa.DpEvent:
    """The DpEvent of one DP-FedAvg round (see the package table), in dp-accounting's documented
    convention z = s/C. Compose it through ``Accountant`` (or ``epsilon``), which corrects the
    replace-one sensitivity for the RDP accountant; composing it into a bare
    ``RdpAccountant(neighboring_relation=REPLACE_ONE)`` would understate ε."""
    return make_round_record(z, q, sampling, num_clients, sample_size).event()


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
    """A canonical order of records (:meth:`RoundRecord.sort_key`)."""
    return rec.sort_key()


def _records_from_event(event: dpa.DpEvent, count: int) -> list[tuple[RoundRecord, int]]:
    """A DpEvent made of round events (canonical convention z = s/C) as (event, count) pairs."""
    if isinstance(event, dpa.NoOpDpEvent):
        return []
    if isinstance(event, dpa.NonPrivateDpEvent):
        return [(GaussianRound(0.0, "none"), count)]
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
