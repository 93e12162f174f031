"""Accounting over dp-accounting: ε against events built by hand on fresh accountants, against
closed forms (analytic Gaussian mechanism, Gaussian RDP), calibration, heterogeneous
composition, checkpoints and errors."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from scipy import optimize
from scipy.stats import norm

from fedsafe.privacy.dp import accounting
from fedsafe.privacy.dp.accounting import (
    RDP_ORDERS,
    Accountant,
    UnsupportedAccountingError,
    calibrate_noise,
    epsilon,
    epsilon_local,
    epsilon_table,
    gaussian_round_event,
)

NR = dpa.NeighboringRelation
DELTA = 1e-5
VDI = 1e-3  # a fixed PLD interval, passed to fedsafe too where a test compares call for call


def _pld(rel: dpa.NeighboringRelation = NR.ADD_OR_REMOVE_ONE) -> pld.PLDAccountant:
    return pld.PLDAccountant(rel, value_discretization_interval=VDI)


def _rdp(rel: dpa.NeighboringRelation = NR.ADD_OR_REMOVE_ONE) -> rdp.RdpAccountant:
    return rdp.RdpAccountant(list(RDP_ORDERS), rel)


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Balle & Wang 2018, Thm 8: the Gaussian mechanism N(f(D), σ²) with L2 sensitivity Δ is
    (ε, δ)-DP iff Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ; solve for the smallest ε."""

    def delta_of(eps: float) -> float:
        a, b = sensitivity / (2 * sigma), eps * sigma / sensitivity
        return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b)

    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 500.0, xtol=1e-12)


def rdp_gaussian_epsilon(rdp_per_alpha, delta: float, orders=RDP_ORDERS) -> tuple[float, float]:
    """ε from an RDP curve ε(α): the bound dp-accounting uses (Canonne–Kamath–Steinke 2020 /
    Asoodeh et al. 2021): min_α ε(α) + log(1 − 1/α) − log(δα)/(α − 1); and Mironov's standard
    bound min_α ε(α) + log(1/δ)/(α − 1)."""
    a = np.asarray(orders)
    r = np.array([rdp_per_alpha(x) for x in a])
    improved = r + np.log1p(-1 / a) - np.log(delta * a) / (a - 1)
    standard = r + np.log(1 / delta) / (a - 1)
    return float(improved.min()), float(standard.min())


# --------------------------------------------------------------------------- ε vs dp-accounting by hand


@pytest.mark.parametrize("name", ["pld", "rdp"])
def test_poisson_matches_dp_accounting(name: str) -> None:
    z, q, T = 1.1, 0.02, 300
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), T)
    ref = (_pld() if name == "pld" else _rdp()).compose(event).get_epsilon(DELTA)
    got = epsilon(z, q, T, DELTA, "poisson", name, value_discretization_interval=VDI if name == "pld" else None)
    assert got == pytest.approx(ref, rel=1e-12)
    assert f"{got:.4f}" == f"{ref:.4f}"


def test_fixed_size_matches_dp_accounting_rdp_replace_one() -> None:
    z, N, m, T = 1.5, 200, 10, 40
    # fedsafe's z is s/C with ‖x_i‖ ≤ C; replace-one moves the sum by 2C, and dp-accounting's
    # RDP accountant (≤ 0.6, issue #378) reads the Gaussian's z as s / sensitivity, hence z/2.
    # Whether the installed version does: at q = 1, order 2, z = 1 it returns 2/(2·1²) = 1.
    probe = rdp.RdpAccountant([2.0], NR.REPLACE_ONE)
    probe.compose(dpa.SampledWithoutReplacementDpEvent(1, 1, dpa.GaussianDpEvent(1.0)))
    z_event = z / 2 if probe.rdp[0] == pytest.approx(1.0) else z
    event = dpa.SampledWithoutReplacementDpEvent(N, m, dpa.GaussianDpEvent(z_event))
    ref = _rdp(NR.REPLACE_ONE).compose(event, T).get_epsilon(DELTA)
    got = epsilon(z, m / N, T, DELTA, "fixed", "rdp", num_clients=N)
    assert got == pytest.approx(ref, rel=1e-12)
    assert epsilon(z, None, T, DELTA, "fixed", "rdp", num_clients=N, sample_size=m) == got


def test_fixed_size_full_sample_is_gaussian_with_sensitivity_2C() -> None:
    # m = N: no amplification, each round is the Gaussian mechanism with sensitivity 2C:
    # RDP ε(α) = T α (2C)² / (2 (zC)²) = 2Tα/z², independently of dp-accounting.
    z, T, N = 3.0, 5, 50
    closed, _ = rdp_gaussian_epsilon(lambda a: 2 * T * a / z**2, DELTA)
    got = epsilon(z, None, T, DELTA, "fixed", "rdp", num_clients=N, sample_size=N)
    assert got == pytest.approx(closed, rel=1e-9)


def test_no_amplification_matches_dp_accounting() -> None:
    z, T = 2.0, 30
    for name, acc in (("pld", _pld()), ("rdp", _rdp())):
        ref = acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), T)).get_epsilon(DELTA)
        h = VDI if name == "pld" else None
        assert epsilon(z, None, T, DELTA, "none", name, value_discretization_interval=h) == pytest.approx(ref, rel=1e-12)
        assert epsilon(z, 0.3, T, DELTA, "none", name, value_discretization_interval=h) == pytest.approx(ref, rel=1e-12)


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("z", [0.8, 2.0, 5.0])
def test_gaussian_pld_t1_matches_analytic_gaussian(z: float) -> None:
    exact = analytic_gaussian_epsilon(z, DELTA)
    got = epsilon(z, None, 1, DELTA, "none", "pld")
    assert exact - 1e-9 <= got <= exact + 1e-3  # pessimistic discretization: an upper bound


def test_gaussian_pld_composition_matches_analytic_gaussian() -> None:
    # T Gaussians with multiplier z compose to one with z/√T
    z, T = 4.0, 16
    exact = analytic_gaussian_epsilon(z / math.sqrt(T), DELTA)
    got = epsilon(z, None, T, DELTA, "none", "pld")
    assert exact - 1e-9 <= got <= exact + 2e-3


def test_gaussian_rdp_matches_closed_form() -> None:
    z, T = 3.0, 50
    improved, standard = rdp_gaussian_epsilon(lambda a: T * a / (2 * z**2), DELTA)
    got = epsilon(z, None, T, DELTA, "none", "rdp")
    assert got == pytest.approx(improved, rel=1e-9)
    assert got < standard  # the conversion is tighter than Mironov's
    # on a dense enough grid the order minimum is close to the continuous one (α* ≈ 1 + z√(2 log(1/δ)/T))
    cont = optimize.minimize_scalar(
        lambda a: T * a / (2 * z**2) + math.log1p(-1 / a) - math.log(DELTA * a) / (a - 1),
        bounds=(1.01, 100),
        method="bounded",
    ).fun
    assert got == pytest.approx(cont, rel=1e-3)


def test_local_dp_is_gaussian_with_sensitivity_2C() -> None:
    z = 2.0
    exact = analytic_gaussian_epsilon(z, DELTA, sensitivity=2.0)
    assert exact - 1e-9 <= epsilon_local(z, 1, DELTA, "pld") <= exact + 1e-3
    closed, _ = rdp_gaussian_epsilon(lambda a: 3 * a * 4 / (2 * z**2), DELTA)
    assert epsilon_local(z, 3, DELTA, "rdp") == pytest.approx(closed, rel=1e-9)


def test_replace_one_pld_poisson_is_supported_and_weaker() -> None:
    add_remove = epsilon(1.0, 0.05, 20, DELTA, "poisson", "pld")
    replace = epsilon(1.0, 0.05, 20, DELTA, "poisson", "pld", neighboring="replace_one", value_discretization_interval=VDI)
    ref = _pld(NR.REPLACE_ONE).compose(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(1.0)), 20).get_epsilon(DELTA)
    assert replace == pytest.approx(ref, rel=1e-12)
    assert replace > add_remove


def test_edge_values() -> None:
    assert epsilon(0.0, 0.1, 10, DELTA) == math.inf
    assert epsilon(0.0, 0.1, 10, DELTA, accountant="rdp") == math.inf
    assert epsilon(1.0, 0.1, 0, DELTA) == 0.0
    assert epsilon(1.0, 1.0, 3, DELTA, "poisson", "rdp") == pytest.approx(epsilon(1.0, None, 3, DELTA, "none", "rdp"))


# --------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("name", ["pld", "rdp"])
def test_calibrate_noise_round_trip(name: str) -> None:
    q, T, target = 0.02, 200, 2.0
    z = calibrate_noise(target, q, T, DELTA, "poisson", name)
    eps = epsilon(z, q, T, DELTA, "poisson", name)
    assert target - 0.01 < eps <= target  # from below, tight
    assert epsilon(z - 5e-3, q, T, DELTA, "poisson", name) > target  # (near-)minimal


def test_calibrate_noise_no_amplification_closed_form() -> None:
    # one Gaussian release: the calibrated z is the analytic Gaussian's σ for (ε, δ)
    z = calibrate_noise(1.0, None, 1, DELTA, "none", "pld")
    sigma = optimize.brentq(lambda s: analytic_gaussian_epsilon(s, DELTA) - 1.0, 0.5, 20, xtol=1e-10)
    assert z == pytest.approx(sigma, abs=5e-3)
    assert epsilon(z, None, 1, DELTA, "none", "pld") <= 1.0


def test_calibrate_noise_errors() -> None:
    with pytest.raises(ValueError, match="target_eps"):
        calibrate_noise(0.0, 0.1, 10, DELTA)
    with pytest.raises(ValueError, match="already met"):
        calibrate_noise(1e5, 0.01, 10, DELTA, accountant="rdp")
    with pytest.raises(UnsupportedAccountingError, match="PLD"):
        calibrate_noise(1.0, 0.1, 10, DELTA, "fixed", "pld", num_clients=100)
    assert calibrate_noise(1.0, 0.1, 0, DELTA) == 0.0


# --------------------------------------------------------------------------- errors and support


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(z=-1.0), r"z \(noise multiplier\) must be a finite number >= 0"),
        (dict(z=float("nan")), "z .noise multiplier"),
        (dict(q=0.0), r"q \(sampling probability\) must be in \(0, 1\]"),
        (dict(q=1.5), r"q \(sampling probability\) must be in \(0, 1\]"),
        (dict(q=None), "q .sampling probability. is required for sampling='poisson'"),
        (dict(rounds=-1), "rounds must be an integer >= 0"),
        (dict(rounds=2.5), "rounds must be an integer >= 0"),
        (dict(delta=0.0), r"delta must be in \(0, 1\)"),
        (dict(delta=1.0), r"delta must be in \(0, 1\)"),
        (dict(sampling="shuffle"), "unknown sampling 'shuffle'; valid: poisson, fixed, none"),
        (dict(accountant="moments"), "unknown accountant 'moments'; valid: pld, rdp"),
        (dict(neighboring="replace_special"), "replace_special is not offered"),
        (dict(sampling="fixed", accountant="rdp"), "needs num_clients"),
        (dict(sampling="fixed", accountant="rdp", q=0.001, num_clients=100), r"round\(q\*N\)"),
        (dict(sampling="fixed", accountant="rdp", q=0.5, num_clients=100, sample_size=10), "disagrees"),
        (dict(sampling="fixed", accountant="rdp", num_clients=10, sample_size=11), "exceeds num_clients"),
    ],
)
def test_errors(kwargs: dict, match: str) -> None:
    args = dict(z=1.0, q=0.1, rounds=10, delta=DELTA)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        epsilon(**args)


def test_unsupported_combinations_name_accountant_and_relation() -> None:
    with pytest.raises(UnsupportedAccountingError, match=r"PLD accountant.*REPLACE_ONE.*use accountant='rdp'"):
        epsilon(1.0, 0.1, 10, DELTA, "fixed", "pld", num_clients=100)
    with pytest.raises(UnsupportedAccountingError, match=r"RDP.*ADD_OR_REMOVE_ONE.*only under REPLACE_ONE"):
        epsilon(1.0, 0.1, 10, DELTA, "fixed", "rdp", num_clients=100, neighboring="add_or_remove_one")
    with pytest.raises(UnsupportedAccountingError, match=r"RDP.*REPLACE_ONE.*ADD_OR_REMOVE_ONE; use .*'pld'"):
        epsilon(1.0, 0.1, 10, DELTA, "poisson", "rdp", neighboring="replace_one")


def test_epsilon_table() -> None:
    table = epsilon_table(1.0, 0.01, 100, DELTA)
    assert table["epsilon"]["rdp"] == pytest.approx(epsilon(1.0, 0.01, 100, DELTA, accountant="rdp"))
    assert table["epsilon"]["pld"] == pytest.approx(epsilon(1.0, 0.01, 100, DELTA, accountant="pld"))
    assert table["epsilon"]["pld"] < table["epsilon"]["rdp"] and table["unsupported"] == {}
    text = accounting.format_epsilon_table(table)
    assert "RDP: epsilon = " in text and "PLD: epsilon = " in text
    fixed = epsilon_table(1.0, 0.1, 5, DELTA, "fixed", 50)
    assert fixed["epsilon"]["pld"] is None and "PLD accountant" in fixed["unsupported"]["pld"]
    assert fixed["epsilon"]["rdp"] > 0 and fixed["neighboring"] == "replace_one"
    assert "PLD: unsupported" in accounting.format_epsilon_table(fixed)


# --------------------------------------------------------------------------- Accountant


ROUNDS = [  # (z, q, count): heterogeneous z (a schedule / adaptive split) and q
    (1.0, 0.02, 30),
    (1.3, 0.02, 20),
    (1.3, 0.05, 10),
    (1.0, 0.02, 5),
]


def _manual_event() -> dpa.DpEvent:
    return dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), c) for z, q, c in ROUNDS]
    )


@pytest.mark.parametrize("name", ["pld", "rdp"])
def test_heterogeneous_rounds_match_manual_composition(name: str) -> None:
    ref = (_pld() if name == "pld" else _rdp()).compose(_manual_event()).get_epsilon(DELTA)
    h = VDI if name == "pld" else None
    acc = Accountant(DELTA, name, value_discretization_interval=h)
    for z, q, c in ROUNDS:
        for _ in range(c):  # round by round, as the engine does
            acc.compose_round(z, q, "poisson")
    assert acc.rounds == 65
    # equal rounds are grouped whatever their order: the first and last groups of ROUNDS merge
    assert [(r["z"], r["q"], r["count"]) for r in acc.records] == [(1.0, 0.02, 35), (1.3, 0.02, 20), (1.3, 0.05, 10)]
    assert acc.epsilon() == pytest.approx(ref, rel=1e-9)
    via_event = Accountant(DELTA, name, value_discretization_interval=h).compose(_manual_event())
    assert via_event.records == acc.records and via_event.epsilon() == pytest.approx(ref, rel=1e-9)
    # a different delta on demand
    ref2 = (_pld() if name == "pld" else _rdp()).compose(_manual_event()).get_epsilon(1e-3)
    assert acc.epsilon(1e-3) == pytest.approx(ref2, rel=1e-9)


def test_accountant_epsilon_grows_and_caches() -> None:
    acc = Accountant(DELTA, "rdp")
    assert acc.epsilon() == 0.0 and isinstance(acc.ledger, dpa.NoOpDpEvent)
    eps = []
    for _ in range(5):
        acc.compose_round(1.0, 0.05)
        eps.append(acc.epsilon())
    assert all(a < b for a, b in zip(eps, eps[1:]))
    acc.compose(dpa.NonPrivateDpEvent())
    assert acc.epsilon() == math.inf


def test_state_dict_round_trip() -> None:
    acc = Accountant(DELTA, "rdp", "replace_one")
    acc.compose_round(1.2, None, "fixed", num_clients=100, sample_size=10, count=7)
    acc.compose_round(2.0, None, "none", count=3)
    state = json.loads(json.dumps(acc.state_dict()))  # plain Python numbers only
    again = Accountant(DELTA, "rdp", "replace_one")
    again.load_state_dict(state)
    assert again.records == acc.records and again.rounds == 10
    assert again.epsilon() == pytest.approx(acc.epsilon(), rel=1e-12)
    ref = _rdp(NR.REPLACE_ONE).compose(
        dpa.ComposedDpEvent(
            [
                dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(0.6)), 7),
                dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0), 3),
            ]
        )
    )
    assert again.epsilon() == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)

    # the same records re-accounted with PLD (the fixed rounds are refused there)
    with pytest.raises(UnsupportedAccountingError):
        Accountant(DELTA, "pld", "replace_one").load_state_dict(state)
    with pytest.raises(ValueError, match="not an Accountant state"):
        again.load_state_dict({"records": []})
    bad = dict(state, records=[{"z": -1, "sampling": "none", "count": 1}])
    with pytest.raises(ValueError, match=r"records\[0\]"):
        again.load_state_dict(bad)


def test_pld_state_dict_round_trip() -> None:
    acc = Accountant(DELTA, "pld")
    for z, q, c in ROUNDS[:2]:
        acc.compose_round(z, q, count=c)
    again = Accountant(DELTA, "pld")
    again.load_state_dict(acc.state_dict())
    assert again.epsilon() == acc.epsilon()


def test_gaussian_round_event_and_compose_errors() -> None:
    assert gaussian_round_event(1.0, 0.1, "poisson") == dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0))
    assert gaussian_round_event(1.0, 0.1, "fixed", num_clients=50) == dpa.SampledWithoutReplacementDpEvent(
        50, 5, dpa.GaussianDpEvent(1.0)
    )
    assert gaussian_round_event(1.0, None, "none") == dpa.GaussianDpEvent(1.0)
    assert gaussian_round_event(0.0, 0.1, "poisson") == dpa.NonPrivateDpEvent()
    with pytest.raises(ValueError, match="unsupported event"):
        Accountant(DELTA).compose(dpa.LaplaceDpEvent(1.0))
    acc = Accountant(DELTA, "rdp")
    with pytest.raises(UnsupportedAccountingError):
        acc.compose_round(1.0, 0.1, "fixed", num_clients=10)
    assert acc.rounds == 0  # refused rounds are not recorded
    with pytest.raises(ValueError, match="count"):
        acc.compose_round(1.0, 0.1, count=-1)
