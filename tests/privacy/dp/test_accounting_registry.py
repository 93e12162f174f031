"""The accounting package's split (issue #27, item 3): events describe what happened, engines in a
registry compose them. A new accountant is added by registering an engine, a new kind of round
by registering handlers for its event type, with no branch edited; each is checked against an
independent reference (a closed form, dp-accounting composing the same events)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import pytest
from dp_accounting import pld
from scipy import optimize
from scipy.stats import norm

from fedsafe.core.errors import FedsafeError
from fedsafe.privacy.dp import accounting
from fedsafe.privacy.dp.accounting import (
    ACCOUNTANT_ENGINES,
    Accountant,
    AccountingEngine,
    DistributedRound,
    GaussianRound,
    RoundRecord,
    UnsupportedAccountingError,
    make_round_record,
)
from fedsafe.privacy.dp.accounting import pld as pld_engine

DELTA = 1e-5


def balle_wang_epsilon(mu: float, delta: float) -> float:
    """The exact ε of a Gaussian mechanism with sensitivity/std = μ (Balle & Wang 2018, Thm 8)."""

    def gap(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-13)


def test_the_builtin_engines_are_registered_and_looked_up_by_name() -> None:
    assert accounting.ACCOUNTANTS == ("pld", "rdp")
    assert set(ACCOUNTANT_ENGINES.names()) >= {"pld", "rdp"}
    assert isinstance(Accountant(DELTA, "pld").engine, accounting.PldEngine)
    assert isinstance(Accountant(DELTA, "rdp").engine, accounting.RdpEngine)
    with pytest.raises(ValueError, match=r"unknown accountant 'moments'; valid: pld, rdp"):
        Accountant(DELTA, "moments")


def test_events_convert_to_dp_accounting_events() -> None:
    assert make_round_record(1.3, 0.1) == GaussianRound(1.3, "poisson", q=0.1)
    assert make_round_record(1.3, 0.1).event() == dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.3))
    fixed = make_round_record(1.3, None, "fixed", 100, 10)
    assert fixed.event() == dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.3))
    assert make_round_record(0.0, None, "none").event() == dpa.NonPrivateDpEvent()
    shared = make_round_record(1.3, 0.1, "poisson", 50, noise_shares=5)
    assert isinstance(shared, DistributedRound) and shared.event() == dpa.UnsupportedDpEvent()
    # the checkpoint keys are those of the records saved before the split
    assert shared.as_dict() == {"z": 1.3, "sampling": "poisson", "q": 0.1, "num_clients": 50, "sample_size": None,
                                "noise_shares": 5}
    assert "noise_shares" not in make_round_record(1.3, 0.1).as_dict()


def test_an_engine_refuses_an_event_it_has_no_handler_for() -> None:
    shared = make_round_record(1.3, 0.1, "poisson", 50, noise_shares=5)
    for acc in (Accountant(DELTA, "rdp"), Accountant(DELTA, "pld")):  # PLD only incrementally
        with pytest.raises(UnsupportedAccountingError, match="distributed round"):
            acc.compose_record(shared)
    Accountant(DELTA, "pld", value_discretization_interval=1e-2).compose_record(shared)  # accepted

    @dataclass(frozen=True)
    class Unknown(RoundRecord):
        pass

    for name in ("pld", "rdp"):
        with pytest.raises(UnsupportedAccountingError, match="Unknown") as err:
            Accountant(DELTA, name).compose_record(Unknown(1.0, "none"))
        assert isinstance(err.value, FedsafeError) and isinstance(err.value, ValueError)


class ExactGaussianEngine(AccountingEngine):
    """A test accountant: unsampled Gaussian rounds compose to one Gaussian, μ² = Σ count/z²."""

    name = "exact-gaussian"

    def check(self, event: RoundRecord) -> None:
        if not (isinstance(event, GaussianRound) and event.sampling == "none"):
            raise UnsupportedAccountingError("exact-gaussian accounts unsampled Gaussian rounds only")

    def epsilon_details(self, delta: float) -> accounting.EpsilonDetails:
        mu = math.sqrt(sum(count / rec.z**2 for rec, count in self.records.items()))
        return accounting.EpsilonDetails(accounting.exact_gaussian_epsilon(mu, delta), self.name)


@pytest.fixture
def exact_engine():
    ACCOUNTANT_ENGINES.register("exact-gaussian")(ExactGaussianEngine)
    yield
    ACCOUNTANT_ENGINES.unregister("exact-gaussian")


def test_a_registered_accountant_is_usable_by_name(exact_engine) -> None:
    acc = Accountant(DELTA, "exact-gaussian")
    acc.compose_round(2.0, None, "none", count=30).compose_round(3.0, None, "none", count=20)
    mu = math.sqrt(30 / 4 + 20 / 9)
    assert acc.epsilon() == pytest.approx(balle_wang_epsilon(mu, DELTA), rel=1e-9)
    # dp-accounting's PLD composing the same rounds converges to it from above
    assert acc.epsilon() <= Accountant(DELTA, "pld").compose_round(2.0, None, "none", count=30).compose_round(
        3.0, None, "none", count=20).epsilon() <= acc.epsilon() * 1.01
    # its state is the Accountant's: the same records, re-accounted on load
    again = Accountant(DELTA, "exact-gaussian")
    again.load_state_dict(acc.state_dict())
    assert again.epsilon() == acc.epsilon()
    with pytest.raises(UnsupportedAccountingError, match="unsampled"):
        acc.compose_round(1.0, 0.1)


@dataclass(frozen=True)
class LaplaceRound(RoundRecord):
    """A test event: a Laplace release of a sum of sensitivity 1 with scale ``z``."""

    def event(self) -> dpa.DpEvent:
        return dpa.LaplaceDpEvent(self.z)


@pld_engine.round_pld.register(LaplaceRound)
def _laplace_pld(event: LaplaceRound, interval: float, neighboring: str):
    # sensitivity 1 under add/remove (the only relation this test event is composed under)
    return pld.privacy_loss_distribution.from_laplace_mechanism(event.z, value_discretization_interval=interval)


@pld_engine.pld_check.register(LaplaceRound)
def _laplace_check(event: LaplaceRound, engine) -> None:
    if not engine.incremental:
        raise UnsupportedAccountingError("a LaplaceRound is accounted by the incremental PLD")


def test_a_new_event_type_is_accounted_by_registering_its_handlers() -> None:
    h = 1e-3
    acc = Accountant(DELTA, "pld", value_discretization_interval=h)
    ref = pld.PLDAccountant(value_discretization_interval=h)
    for t, scale in enumerate([2.0, 2.0, 3.0, 2.0, 5.0] * 4, 1):
        acc.compose_record(LaplaceRound(scale, "none"))
        ref.compose(dpa.LaplaceDpEvent(scale))
        assert acc.epsilon() == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)
    with pytest.raises(UnsupportedAccountingError, match="LaplaceRound"):
        Accountant(DELTA, "rdp").compose_record(LaplaceRound(2.0, "none"))
    with pytest.raises(UnsupportedAccountingError, match="incremental"):
        Accountant(DELTA, "pld").compose_record(LaplaceRound(2.0, "none"))


def test_a_checkpoint_written_before_the_split_resumes() -> None:
    """The state of an incremental PLD accountant as the single-module accounting wrote it (format
    Accountant/1: records, interval, steps), loaded and continued, against dp-accounting."""
    old = {
        "format": "fedsafe.privacy.dp.accounting.Accountant/1", "accountant": "pld",
        "neighboring": "add_or_remove_one", "delta": DELTA,
        "records": [{"z": 1.0, "sampling": "poisson", "q": 0.05, "num_clients": None, "sample_size": None,
                     "count": 5},
                    {"z": 1.3, "sampling": "poisson", "q": 0.05, "num_clients": None, "sample_size": None,
                     "count": 2}],
        "interval": 2e-3, "steps": [[0, 3], [1, 1], [0, 2], [1, 1]],
    }
    acc = Accountant(DELTA, value_discretization_interval=2e-3)
    acc.load_state_dict(old)
    acc.compose_round(1.0, 0.05)
    ref = pld.PLDAccountant(value_discretization_interval=2e-3)
    for z, count in [(1.0, 3), (1.3, 1), (1.0, 2), (1.3, 1), (1.0, 1)]:
        ref.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(z)), count))
    assert acc.epsilon() == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)
    assert acc.state_dict()["steps"] == [[0, 3], [1, 1], [0, 2], [1, 1], [0, 1]]


def test_a_spy_set_on_the_package_sees_the_calls_made_inside_it(monkeypatch) -> None:
    calls = []
    real = accounting.compose_pld
    monkeypatch.setattr(accounting.pld, "compose_pld", lambda a, b: calls.append(1) or real(a, b))
    assert pld_engine.compose_pld is not real
    acc = Accountant(DELTA, value_discretization_interval=5e-3)
    acc.compose_round(1.0, 0.1).compose_round(1.2, 0.1)
    acc.epsilon()
    assert calls == [1]
    monkeypatch.undo()
    assert pld_engine.compose_pld is real and accounting.compose_pld is real
