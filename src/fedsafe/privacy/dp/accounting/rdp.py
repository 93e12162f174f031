"""The RDP engine (``accountant = "rdp"``): dp-accounting's ``RdpAccountant`` curves, summed.

ε from the RDP curve at :data:`RDP_ORDERS` with dp-accounting's conversion
(Canonne–Kamath–Steinke / Asoodeh et al., tighter than Mironov's ε = RDP(α) + log(1/δ)/(α−1)).
RDP composes additively, so the ε of the grouped rounds is the conversion of Σ count·curve, each
distinct round's curve computed by dp-accounting once per process (:func:`_rdp_curve`).

How an event gets its curve is :func:`round_rdp`, dispatched on the event type: a
:class:`GaussianRound` has one; a :class:`DistributedRound` has none (the engine refuses it, and
the PLD engine's RDP guard leaves it out). Register another event type with
``round_rdp.register(MyRound)``.

Replace-one sensitivity (google/differential-privacy issue #378): GaussianDpEvent's z is s/C
for values with ‖v_i‖ ≤ C, and replacing a client moves the sum by 2C. dp-accounting's RDP
accountant treats z as std / L2-sensitivity, so under REPLACE_ONE it would understate the RDP by
4×; this engine passes z/2 to the Gaussian inside — only if the installed dp-accounting shows that
behaviour (probed once, :func:`_rdp_replace_one_halves`), so a fixed release is not corrected twice.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import rdp
from dp_accounting.rdp import rdp_privacy_accountant as _rdp_impl

from .common import NEIGHBORING, NR, EpsilonDetails, UnsupportedAccountingError, _unsupported_message
from .engines import ACCOUNTANT_ENGINES, AccountingEngine
from .events import DistributedRound, GaussianRound, RoundRecord


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


def accounting_event(event: dpa.DpEvent, neighboring: str) -> dpa.DpEvent:
    """``event`` (canonical convention) as an ``RdpAccountant`` under ``neighboring`` must receive it."""
    if NEIGHBORING[neighboring] is NR.REPLACE_ONE:
        return _rdp_replace_one_event(event)
    return event


def fresh(orders: Sequence[float], neighboring: str) -> dpa.PrivacyAccountant:
    return rdp.RdpAccountant(list(orders), NEIGHBORING[neighboring])


@functools.lru_cache(maxsize=4096)
def _rdp_curve(orders: tuple[float, ...], neighboring: str, rec: RoundRecord) -> np.ndarray:
    """dp-accounting's RDP curve of one round, cached per process (read-only array)."""
    curve = fresh(orders, neighboring).compose(accounting_event(rec.event(), neighboring)).rdp
    curve.setflags(write=False)
    return curve


# --------------------------------------------------------------------------- per-event curves


@functools.singledispatch
def round_rdp(event: RoundRecord, orders: tuple[float, ...], neighboring: str) -> tuple[np.ndarray, bool] | None:
    """The RDP curve of one round at ``orders`` and whether it is a valid bound under
    ``neighboring`` (else an estimate only); None where the event has no RDP curve."""
    return None


@round_rdp.register(GaussianRound)
def _(event: GaussianRound, orders: tuple[float, ...], neighboring: str) -> tuple[np.ndarray, bool] | None:
    if event.sampling == "poisson" and neighboring == "replace_one":
        # dp-accounting's RDP cannot account this relation: an estimate only (add/remove with z/2)
        return _rdp_curve(orders, "add_or_remove_one", replace(event, z=event.z / 2)), False
    return _rdp_curve(orders, neighboring, event), True


@round_rdp.register(DistributedRound)
def _(event: DistributedRound, orders: tuple[float, ...], neighboring: str) -> tuple[np.ndarray, bool] | None:
    return None  # the mixture over the share count has no RDP curve: PLD accounts it


# Why a distributed round is refused by every engine but the incremental PLD one.
NO_RDP = (
    "a distributed round (noise_shares) is accounted by this module's PLD only: it needs "
    "accountant='pld', neighboring='add_or_remove_one' and a value_discretization_interval "
    "(distributed_interval chooses one)"
)


def has_rdp(event: RoundRecord) -> bool:
    """Whether :func:`round_rdp` gives ``event`` a curve (its type has a handler that is not the
    refusal of :class:`DistributedRound` or the default)."""
    return round_rdp.dispatch(type(event)) not in _NO_CURVE


_NO_CURVE = (round_rdp.dispatch(RoundRecord), round_rdp.dispatch(DistributedRound))


def rdp_epsilon(
    records: dict[RoundRecord, int] | Iterable[tuple[RoundRecord, int]],
    neighboring: str,
    delta: float,
    orders: tuple[float, ...],
) -> tuple[float, bool]:
    """RDP ε of the grouped rounds at ``orders``, and whether it is a valid bound for this
    relation. RDP composes additively: the sum RdpAccountant.compose forms, each distinct round's
    curve computed by dp-accounting once. Where dp-accounting's RDP cannot account the relation
    (Poisson under replace-one) the value is an estimate only: add/remove with z/2. Rounds
    without a curve (distributed rounds) are left out (they are accounted by PLD)."""
    items = records.items() if isinstance(records, dict) else records
    total: Any = 0.0
    valid = True
    for rec, count in items:
        got = round_rdp(rec, orders, neighboring)
        if got is None:
            continue
        curve, ok = got
        valid = valid and ok
        total = total + count * curve
    return float(_rdp_impl.compute_epsilon(orders, total, delta)[0]), valid


@ACCOUNTANT_ENGINES.register("rdp")
class RdpEngine(AccountingEngine):
    """dp-accounting's RDP accountant (``RdpAccountant(orders, relation)``): sums each distinct
    round's curve (cached per process, so a per-round ε costs milliseconds) and converts. An
    upper bound, usually looser than PLD."""

    name = "rdp"
    epsilon_every_round = True

    def check(self, event: RoundRecord) -> None:
        if not has_rdp(event):
            raise UnsupportedAccountingError(f"the RDP accountant cannot account a {type(event).__name__}: {NO_RDP}")
        probe = replace(event, z=event.z or 1.0)  # NonPrivate is always supported; check the shape
        if not self.fresh().supports(self.accounting_event(probe.event())):
            raise UnsupportedAccountingError(_unsupported_message("rdp", self.neighboring, event.sampling))

    def epsilon_details(self, delta: float) -> EpsilonDetails:
        return EpsilonDetails(rdp_epsilon(self.records, self.neighboring, delta, self.orders)[0], "rdp")

    def fresh(self, interval: float | None = None) -> dpa.PrivacyAccountant:
        return fresh(self.orders, self.neighboring)

    def accounting_event(self, event: dpa.DpEvent) -> dpa.DpEvent:
        return accounting_event(event, self.neighboring)

    @staticmethod
    def gaussian_epsilon(mu: float, delta: float, orders: Sequence[float]) -> float:
        """dp-accounting's conversion of the RDP curve αμ²/2 at ``orders``."""
        a = np.asarray(orders, dtype=float)
        return float(_rdp_impl.compute_epsilon(a, a * mu * mu / 2, delta)[0])
