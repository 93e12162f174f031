"""The ``Accountant`` facade the engine checkpoints, and the distributed-DP observers.

:class:`Accountant` keeps the grouped rounds (events and counts) and hands them to the
composition engine registered under its ``accountant`` name (``accounting.engines``): it holds no
``if accountant == ...`` branch, so a registered engine is usable by name everywhere
(``[dp] accountant``, ``fedsafe privacy epsilon``, calibration). :class:`DistributedAccountant`
reports a distributed-placement run against its two observers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import dp_accounting as dpa

from .common import (
    NEIGHBORING,
    PLD_PLANNED_TOL,
    RDP_ORDERS,
    EpsilonDetails,
    UnsupportedAccountingError,
    _check_count,
    _check_delta,
    _check_interval,
    _check_neighboring,
    _check_sampling,
    _check_z,
)
from .distributed import distributed_interval
from .engines import AccountingEngine, _check_accountant, engine_class
from .events import DistributedRound, RoundRecord, _records_from_event, make_round_record

class Accountant:
    """(ε, δ) of the rounds composed so far, for the engine to compose round by round.

    ``Accountant(delta, accountant="pld"|"rdp", neighboring="add_or_remove_one"|"replace_one")``;
    :meth:`compose_round` adds rounds as plain numbers, :meth:`compose` takes DpEvents built
    from the round events (Gaussian, Poisson- or fixed-size-sampled Gaussian, their
    compositions, NoOp/NonPrivate); :meth:`epsilon` is ε at ``delta`` for everything composed.
    Rounds with different z (a schedule, distributed DP's per-round multipliers) or different q
    compose correctly; equal rounds are grouped as ``SelfComposedDpEvent(event, count)`` whatever
    their order (composition commutes), so the cost grows with the distinct rounds, not all.

    RDP sums dp-accounting's per-event RDP curves (cached per process for each distinct round, so
    a per-round ``epsilon()`` costs milliseconds) and converts with dp-accounting. PLD has two modes:

    - ``value_discretization_interval`` given (the engine passes :func:`planned_interval`'s):
      *incremental*. The accountant keeps the running privacy loss distribution at that interval
      and composes onto it the rounds added since the last ε (consecutive equal rounds as one
      self-composed PLD), so ε after a new round costs one composition and one ε query, whatever
      the run's length. Each step is dp-accounting's convolution with its pessimistic rounding and
      tail truncation (:func:`compose_pld`), so the running PLD is an upper bound at every step
      as a ``PLDAccountant`` composing the same events at that interval is (the same, up to FFT
      rounding).
    - no interval: ε is recomputed from the grouped records by :func:`pld_epsilon`
      (discretization chosen per call, one-round PLDs cached), memoised until the next compose.

    :meth:`state_dict` holds the records (z, sampling, q, N, m, count) as plain Python numbers
    and, for an incremental PLD, the interval and the steps composed in order;
    :meth:`load_state_dict` rebuilds the running PLD once from those steps, so a resumed run
    reports exactly the ε of an uninterrupted one. The accountant's own settings (kind,
    relation, delta, interval) come from the constructor, so a checkpoint can be re-accounted
    under other settings (then from the grouped records).
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
        self._checked: set[RoundRecord] = set()  # events the engine accepted: checked once each
        self.engine: AccountingEngine = engine_class(self.accountant)(
            self.neighboring, self._records, interval=self.value_discretization_interval, orders=self.orders
        )

    # -- dp-accounting objects

    @property
    def relation(self) -> dpa.NeighboringRelation:
        return NEIGHBORING[self.neighboring]

    @property
    def incremental(self) -> bool:
        """Whether ε comes from running state composed round by round (PLD at a fixed interval;
        see the class docstring)."""
        return self.engine.incremental

    @property
    def _running(self) -> Any:
        """The engine's running PLD (None until one is built, or for an engine without one)."""
        return getattr(self.engine, "_running", None)

    def fresh(self, value_discretization_interval: float | None = None) -> dpa.PrivacyAccountant:
        """An empty dp-accounting accountant with this object's settings (PLD: at
        ``value_discretization_interval``, else the constructor's, else the coarsest,
        :data:`PLD_MAX_INTERVAL`)."""
        return self.engine.fresh(value_discretization_interval)

    def accounting_event(self, event: dpa.DpEvent) -> dpa.DpEvent:
        """``event`` (canonical convention) as this accountant must receive it."""
        return self.engine.accounting_event(event)

    def check_supported(self, record: RoundRecord) -> None:
        """Raise :class:`UnsupportedAccountingError` if this accountant's engine cannot account
        ``record`` (each distinct event is checked once: a run's rounds repeat a few events)."""
        if record not in self._checked:
            self.engine.check(record)
            self._checked.add(record)

    # -- composing

    def _append(self, records: list[tuple[RoundRecord, int]]) -> None:
        for rec, _ in records:
            self.check_supported(rec)
        for rec, count in records:
            if count:
                self._records[rec] = self._records.get(rec, 0) + count
                self.engine.compose(rec, count)
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

    def compose_record(self, record: RoundRecord, count: int = 1) -> Accountant:
        """Compose ``count`` rounds of a validated :class:`RoundRecord` (e.g. a distributed round)."""
        self._append([(record, _check_count("count (rounds)", count, 0))])
        return self

    def compose(self, event: dpa.DpEvent, count: int = 1) -> Accountant:
        """Compose a DpEvent made of round events (canonical convention z = s/C)."""
        count = _check_count("count", count, 0)
        self._append(_records_from_event(event, count))
        return self

    # -- the running PLD (incremental mode)

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
        else:
            out = self.engine.epsilon_details(d)
        self._eps_cache[key] = out
        return out

    def epsilon(self, delta: float | None = None) -> float:
        """ε at ``delta`` (default: the constructor's) of all rounds composed so far;
        0 before any round, ∞ if a round had z = 0 (see :meth:`epsilon_details`)."""
        return self.epsilon_details(delta).epsilon

    # -- checkpointing

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "format": self.STATE_FORMAT,
            "accountant": self.accountant,
            "neighboring": self.neighboring,
            "delta": self.delta,
            "records": self.records,
        }
        state.update(self.engine.state_dict({rec: i for i, rec in enumerate(self._records)}))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the composed rounds by those in ``state`` (re-composed, grouped). An
        incremental PLD at the interval the state was saved at replays its steps in order, the
        PLD rebuilt once, lazily; at any other interval it composes the grouped records."""
        if not isinstance(state, dict) or state.get("format") != self.STATE_FORMAT:
            raise ValueError(f"not an Accountant state (expected format {self.STATE_FORMAT!r})")
        parsed: list[tuple[RoundRecord, int]] = []
        for i, r in enumerate(state.get("records", [])):
            try:
                rec = make_round_record(
                    r["z"], r.get("q"), r["sampling"], r.get("num_clients"), r.get("sample_size"),
                    noise_shares=r.get("noise_shares"),
                )
                parsed.append((rec, _check_count("count", r["count"], 0)))
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"Accountant state: records[{i}] = {r!r}: {err}") from err
        self._records.clear()
        self.engine.reset()
        self._append(parsed)
        self.engine.load_state_dict(state, parsed)

    # -- the engine's interface (shared with DistributedAccountant)

    def epsilons(self) -> dict[str, float]:
        """The figures for a metrics row: ``{"epsilon": ε}``."""
        return {"epsilon": self.epsilon()}

    def summary(self) -> dict[str, Any]:
        """Extra keys for ``summary.json`` (none: the last row's ``epsilon`` is the figure)."""
        return {}


def planned_interval(record: RoundRecord, rounds: int, delta: float, neighboring: str) -> float | None:
    """The PLD interval at which a run of ``rounds`` rounds of ``record`` is accounted
    incrementally: the interval :func:`epsilon` settles on for the whole run (its refinement, or
    :func:`distributed_interval`'s), or the one before it, twice as coarse, where their ε already
    agree within :data:`PLD_PLANNED_TOL` (0.05 %; each composition then costs half as much). None
    where PLD is not run (the RDP bound exceeds :data:`PLD_EPSILON_LIMIT`, ε = ∞) or ``rounds``
    < 1: the accountant then recomputes ε per call."""
    if rounds < 1:
        return None
    if isinstance(record, DistributedRound):
        details = distributed_interval(record, rounds, delta)
    else:
        details = Accountant(delta, "pld", neighboring).compose_record(record, rounds).epsilon_details()
    if details.method != "pld" or details.interval is None or not math.isfinite(details.epsilon):
        return None
    if len(details.intervals) >= 2:  # already converged at the coarser one: half the cost per round
        (h0, eps0), (_, eps1) = details.intervals[-2:]
        if abs(eps0 - eps1) <= PLD_PLANNED_TOL * eps1:
            return h0
    return details.interval


def gaussian_epsilon(mu: float, delta: float, accountant: str = "pld", orders: Sequence[float] = RDP_ORDERS) -> float:
    """ε at ``delta`` of one Gaussian mechanism whose sensitivity is ``mu`` times its noise std.
    Gaussians compose to one: rounds with multipliers z_t and sensitivity s (in units of C) give
    μ² = Σ (s/z_t)².

    ``pld``: exact (Balle & Wang 2018, Thm 8: the smallest ε with
    Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) ≤ δ), the value dp-accounting's PLD converges to from above,
    solved to 1e-12 and rounded up; ``rdp``: dp-accounting's conversion of the RDP curve αμ²/2 at
    ``orders``. Each is its engine's ``gaussian_epsilon``. μ = 0 gives 0, μ = ∞ gives ∞.
    """
    d = _check_delta(delta)
    mu = float(mu)
    if mu == 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    return engine_class(accountant).gaussian_epsilon(mu, d, orders)

class DistributedAccountant:
    """ε of a ``distributed``-placement run against each of its two observers.

    Each sampled client adds a noise share N(0, (zC)²/n_s) and secure aggregation sums the
    messages. In high dimension the noise variance of the sum reveals how many shares are in it,
    so both observers below are given the realised count n_t of honest shares.

    - **the secure-aggregation server** (:meth:`epsilon_server`, the headline ``epsilon``) also sees
      who took part, so amplification by sampling does not hold against it, and what it can learn
      about a client is its update (zero-out neighbouring: the client takes part with a null update
      instead; dp-accounting's add/remove numbers for a Gaussian; replace-one, sensitivity 2C, for
      ``fixed`` sampling). Each round a client's update is in the sum is a Gaussian mechanism on it
      with the round's realised multiplier z_t (``DPPlan.round_multiplier``); a client's rounds
      compose to one Gaussian with μ² = Σ (s/z_t)², computed exactly (:func:`gaussian_epsilon`).
      The reported value is the largest over clients; a client's participation is public to the
      server and independent of the data, so conditioning on it is sound.
    - **an outsider who sees the released model only** (:meth:`epsilon_released`): amplification
      by sampling holds, but the count is revealed and depends on whether the target took part.
      ``poisson``: every round is :func:`distributed_round_pld` (the mixture over the count,
      Bin(N_h − 1, q) without the target, with the worst case over the other clients' updates),
      composed incrementally by PLD whatever ``accountant`` says (dp-accounting has no RDP for
      it; an ``Accountant`` at :func:`planned_interval`'s interval). It
      assumes every sampled honest client's share reaches the sum: from the first round where one
      does not (a dropout, a share the protocol did not credit), the released bound is no longer
      reported, and :meth:`summary` says why. ``fixed`` (replace-one): the realised number h_t of
      honest clients in the sum does not depend on the target's data, and given it they are a
      uniform h_t-subset of the N_h honest clients: each round is
      ``SampledWithoutReplacementDpEvent(N_h, h_t, Gaussian(z_t))``. ``none``: every client in
      every round, ``Gaussian(z_t)`` (with the population fixed and public, add/remove is read as
      zero-out: the target's share is in the sum either way).
    """

    STATE_FORMAT = "fedsafe.privacy.dp.accounting.DistributedAccountant/1"

    def __init__(
        self,
        delta: float,
        accountant: str,
        neighboring: str,
        *,
        sampling: str,
        z: float,
        honest_clients: int,
        noise_shares: int,
        rounds: int,
        q: float | None = None,
    ) -> None:
        self.delta = _check_delta(delta)
        self.accountant = _check_accountant(accountant)
        self.neighboring = _check_neighboring(neighboring)
        self.sampling = _check_sampling(sampling)
        self.honest_clients = _check_count("honest_clients", honest_clients, 1)
        self.sensitivity = 2.0 if self.neighboring == "replace_one" else 1.0
        self._sums: dict[int, float] = {}
        self._max = 0.0
        self._rounds = 0
        self._void_round: int | None = None
        self._server_cache: tuple[float, float] | None = None
        self._record: RoundRecord | None = None
        self._released: Accountant | None = None
        self._released_note = ""
        if self.sampling == "poisson":
            if self.neighboring != "add_or_remove_one":
                raise UnsupportedAccountingError(
                    "distributed placement with Poisson sampling is accounted under add_or_remove_one"
                )
            self._record = make_round_record(z, q, "poisson", self.honest_clients, noise_shares=noise_shares)
            interval = planned_interval(self._record, max(1, rounds), self.delta, self.neighboring)
            if interval is None:  # ε_released = ∞, and why
                self._released_note = distributed_interval(self._record, max(1, rounds), self.delta).note
            else:
                self._released = Accountant(self.delta, "pld", self.neighboring, value_discretization_interval=interval)
        else:
            interval = None
            if engine_class(self.accountant).plans_interval and self.sampling == "none":
                interval = planned_interval(make_round_record(z, None, "none"), rounds, self.delta, self.neighboring)
            self._released = Accountant(
                self.delta, self.accountant, self.neighboring, value_discretization_interval=interval
            )

    def compose_round(self, z: float, *, shares: int, sampled: int, clients: Iterable[int]) -> None:
        """One round: ``z`` the realised multiplier (``DPPlan.round_multiplier(shares)``),
        ``shares`` the honest noise shares in the released sum, ``sampled`` the honest clients
        sampled, ``clients`` the honest clients whose updates are in the sum."""
        z = _check_z(z)
        shares = _check_count("shares", shares, 0)
        sampled = _check_count("sampled", sampled, 0)
        self._rounds += 1
        weight = math.inf if z == 0 else z**-2
        for cid in clients:
            total = self._sums.get(int(cid), 0.0) + weight
            self._sums[int(cid)] = total
            self._max = max(self._max, total)
        if self.sampling == "poisson":
            if self._void_round is None and shares < sampled:
                self._void_round = self._rounds
            if self._void_round is None and self._released is not None:
                self._released.compose_record(self._record)
        elif self.sampling == "fixed":
            if shares:  # no honest update in the sum: nothing to protect this round
                self._released.compose_round(
                    z, None, "fixed", num_clients=self.honest_clients, sample_size=min(shares, self.honest_clients)
                )
        else:
            self._released.compose_round(z, None, "none")

    # -- reading

    def epsilon_server(self) -> float:
        """ε against the secure-aggregation server (the largest over clients)."""
        if self._server_cache is None or self._server_cache[0] != self._max:
            mu = self.sensitivity * math.sqrt(self._max)
            self._server_cache = (self._max, gaussian_epsilon(mu, self.delta, self.accountant, RDP_ORDERS))
        return self._server_cache[1]

    def epsilon_released(self) -> float | None:
        """ε against an outsider who sees the released model; None where no valid bound is known
        (see the class docstring), ∞ where the round's PLD is too large to build."""
        if self._void_round is not None:
            return None
        if self._released is None:
            return math.inf
        return self._released.epsilon()

    def epsilon(self) -> float:
        """The headline: ε against the strongest observer, the secure-aggregation server."""
        return self.epsilon_server()

    def epsilons(self) -> dict[str, float]:
        """The figures for a metrics row: ``epsilon`` (= ``epsilon_server``), ``epsilon_server``
        and, while it is known, ``epsilon_released``."""
        server = self.epsilon_server()
        out = {"epsilon": server, "epsilon_server": server}
        released = self.epsilon_released()
        if released is not None:
            out["epsilon_released"] = released
        return out

    def summary(self) -> dict[str, Any]:
        """``summary.json`` keys: the two final figures, and why the released one is missing."""
        out: dict[str, Any] = {k: v for k, v in self.epsilons().items() if k != "epsilon"}
        if self._void_round is not None:
            out["epsilon_released_note"] = (
                f"not reported from round {self._void_round} on: a sampled honest client's noise share was missing "
                "from that round's sum (a dropout, or a share the protocol did not credit), which the released-model "
                "bound (every sampled honest share in the sum) does not cover; epsilon (the server's) still holds"
            )
        elif self._released_note:
            out["epsilon_released_note"] = self._released_note
        return out

    # -- checkpointing

    def state_dict(self) -> dict[str, Any]:
        ids = sorted(self._sums)
        return {
            "format": self.STATE_FORMAT,
            "rounds": self._rounds,
            "clients": ids,
            "sums": [self._sums[i] for i in ids],
            "void_round": self._void_round,
            "released": None if self._released is None else self._released.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != self.STATE_FORMAT:
            raise ValueError(f"not a DistributedAccountant state (expected format {self.STATE_FORMAT!r})")
        ids, sums = state["clients"], state["sums"]
        if len(ids) != len(sums):
            raise ValueError("DistributedAccountant state: clients and sums differ in length")
        self._sums = {int(i): float(v) for i, v in zip(ids, sums)}
        self._max = max(self._sums.values(), default=0.0)
        self._rounds = _check_count("rounds", state["rounds"], 0)
        self._void_round = state.get("void_round")
        self._server_cache = None
        if self._released is not None and state.get("released") is not None:
            self._released.load_state_dict(state["released"])


