"""RDP → (ε, δ) conversions against dp-accounting, optimal KOV composition against brute-force
enumeration of the k-fold randomized response, both composition routes monotone in rounds, and
the continuous optimisation over α against a fine-grid reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from fedsafe.privacy.inherent import (
    DEFAULT_ALPHAS,
    audit_round,
    calibrate_sigma2,
    compose_rdp,
    cumulative_epsilon,
    epsilon_schedule,
    kov_compose,
    kov_optimal_delta,
    kov_optimal_epsilon,
    rdp_table1,
    rdp_theorem4,
    rdp_to_dp,
)

KW = dict(num_users=50, sigma2=0.05, clip=10.0, dataset_size=1200, batch_size=32)


def test_rdp_to_dp_classic_and_improved_against_dp_accounting():
    orders = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0])
    z, steps, delta = 1.3, 50, 1e-6
    rdp = compose_rdp([orders / (2 * z * z)] * steps)  # T Gaussian mechanisms
    eps_imp, a_imp = rdp_to_dp(orders, rdp, delta, conversion="improved")
    ref_eps, ref_order = rdp_lib.compute_epsilon(orders, rdp, delta)
    assert eps_imp == pytest.approx(ref_eps, rel=1e-12) and a_imp == ref_order
    eps_cls, _ = rdp_to_dp(orders, rdp, delta)
    assert eps_cls == pytest.approx(np.min(rdp + np.log(1 / delta) / (orders - 1)), rel=1e-12)
    assert eps_imp <= eps_cls
    assert rdp_to_dp(orders, np.full(8, np.inf), delta) == (np.inf, pytest.approx(np.nan, nan_ok=True))


def _brute_force_delta(eps: float, k: int, eps_total: float) -> float:
    """Hockey-stick divergence of k-fold ε-randomized response, by enumerating {0,1}^k."""
    p = np.exp(eps) / (1 + np.exp(eps))
    total = 0.0
    for x in itertools.product((0, 1), repeat=k):
        ones = sum(x)
        px = p ** (k - ones) * (1 - p) ** ones
        qx = (1 - p) ** (k - ones) * p**ones
        total += max(0.0, px - np.exp(eps_total) * qx)
    return total


@pytest.mark.parametrize("k", [1, 3, 6, 9])
def test_kov_optimal_matches_enumeration(k):
    eps = 0.4
    for eps_total in np.linspace(0, k * eps, 7):
        assert kov_optimal_delta(eps, 0.0, k, eps_total) == pytest.approx(_brute_force_delta(eps, k, eps_total), abs=1e-13)
    # with δ > 0: 1 − (1 − δ)^k (1 − δ_RR)
    d = 1e-3
    assert kov_optimal_delta(eps, d, k, 0.5) == pytest.approx(1 - (1 - d) ** k * (1 - _brute_force_delta(eps, k, 0.5)))


def test_kov_bound_is_between_optimal_and_naive():
    for eps, k, slack in [(0.1, 100, 1e-5), (0.5, 30, 1e-6), (1.0, 10, 1e-3)]:
        bound, total_delta = kov_compose([eps] * k, [0.0] * k, slack)
        assert total_delta == pytest.approx(slack)
        assert bound <= k * eps + 1e-12
        assert kov_optimal_epsilon(eps, 0.0, k, slack) <= bound + 1e-12
    assert kov_compose([0.1, np.inf], [0, 0], 1e-5)[0] == np.inf


@pytest.mark.parametrize("composition", ["kov", "rdp"])
@pytest.mark.parametrize("source", ["gsgd+wf_na", "gsgd+isotropic", "gd+isotropic", "sgd_iid+isotropic"])
def test_epsilon_schedule_monotone_in_rounds(source, composition):
    eps = epsilon_schedule(source, 30, 1e-4, composition=composition, **KW)
    assert eps.shape == (30,) and np.all(np.isfinite(eps))
    assert np.all(np.diff(eps) > 0)


def test_kov_route_is_floored_by_the_per_round_conversion_and_rows_without_dp_are_infinite():
    """Theorem 4's α domain ends at α_max = Nσ²D/(2C²) (15 here), so converting each round to
    (ε_t, δ_t) costs at least log(1/δ_t)/(α_max − 1) ≈ 1 per round before KOV composes them;
    summing RDP first avoids that floor. (The paper's Figure 5 uses the KOV route.)"""
    rounds, delta = 100, 1e-4
    kov = epsilon_schedule("gsgd+wf_na", rounds, delta, composition="kov", **KW)
    rdp = epsilon_schedule("gsgd+wf_na", rounds, delta, composition="rdp", **KW)
    alpha_max = KW["num_users"] * KW["sigma2"] * KW["dataset_size"] / (2 * KW["clip"] ** 2)
    floor = np.log(2 * rounds / delta) / (alpha_max - 1)
    assert kov[0] >= floor
    assert rdp[-1] < 0.1 * kov[-1]
    assert np.isinf(epsilon_schedule("sgd_iid+wf_na", 5, 1e-4, **KW)).all()
    amp = epsilon_schedule("sgd_iid+isotropic", 20, 1e-4, composition="rdp", amplified=True, **KW)
    plain = epsilon_schedule("sgd_iid+isotropic", 20, 1e-4, composition="rdp", **KW)
    assert np.all(amp <= plain)


def test_cumulative_epsilon_heterogeneous_rounds_monotone():
    curves = [rdp_theorem4(DEFAULT_ALPHAS, **{**KW, "sigma2": s2}) for s2 in (0.05, 0.2, 0.02, 0.1)]
    for method in ("rdp", "kov"):
        eps = cumulative_epsilon(DEFAULT_ALPHAS, curves, 1e-5, method=method)
        assert np.all(np.diff(eps) > 0)
    per_round = [rdp_to_dp(DEFAULT_ALPHAS, c, 1e-5 / 8)[0] for c in curves]
    direct = kov_compose(per_round, [1e-5 / 8] * 4, 1e-5 - 4 * 1e-5 / 8)
    assert eps[-1] == pytest.approx(direct[0], rel=1e-12) and direct[1] <= 1e-5
    single = cumulative_epsilon(DEFAULT_ALPHAS, curves[:1], 1e-5)[0]
    assert single == pytest.approx(rdp_to_dp(DEFAULT_ALPHAS, curves[0], 1e-5)[0])


def test_calibrate_sigma2_hits_the_target():
    base = {k: v for k, v in KW.items() if k != "sigma2"}
    s2 = calibrate_sigma2(2.0, "gsgd+wf_na", 50, 1e-4, **base)
    at = epsilon_schedule("gsgd+wf_na", 50, 1e-4, sigma2=s2, **base)[-1]
    below = epsilon_schedule("gsgd+wf_na", 50, 1e-4, sigma2=s2 * 0.99, **base)[-1]
    assert at <= 2.0 < below
    with pytest.raises(ValueError, match="stays above"):
        calibrate_sigma2(1.0, "gd+wf_na", 5, 1e-4, **base)


# ----------------------------------------------------------------------------- the α optimisation


def _theorem4(a, *, num_users, sigma2, clip, dataset_size, batch_size, reading):
    """Theorem 4 written out again (Eq. 35 / last line of Eq. 43) on the stated domain."""
    c2, n, b, ns2 = clip**2, dataset_size, batch_size, num_users * sigma2
    shrink = b * n if reading == "eq35" else n
    return (2 * a * c2 / n**2 + 2 * a * c2 / ((a - 1) * b * n)) / (ns2 - 2 * a * c2 / shrink)


def _continuous_optimum(rounds, delta, reading, **kw):
    """min over α in the stated domain (1, Nσ²D/(2C²)) of T·ε(α) + log(1/δ)/(α − 1), on 4·10⁵
    orders: log-spaced in α − 1, and log-spaced in the distance to the open end of the domain."""
    edge = kw["num_users"] * kw["sigma2"] * kw["dataset_size"] / (2 * kw["clip"] ** 2)
    a = np.concatenate([1 + (edge - 1) * np.geomspace(1e-9, 1 - 1e-12, 2 * 10**5), edge - (edge - 1) * np.geomspace(1e-12, 0.5, 2 * 10**5)])
    a = a[(a > 1) & (a < edge)]
    obj = rounds * _theorem4(a, reading=reading, **kw) + np.log(1 / delta) / (a - 1)
    return float(obj.min())


SWEEP = dict(num_users=50, clip=10.0, dataset_size=32, batch_size=32)  # the recipe's setting


@pytest.mark.parametrize("reading", ["conservative", "eq35"])
def test_theorem4_epsilon_is_the_continuous_optimum_not_the_grid_one(reading):
    """Near the end of Theorem 4's α domain the default grid's orders are ~10% apart, which cost
    up to ~5% (conservative reading) or ~20% (Eq. 35, whose optimum can sit at the open end) in
    ε; the refined ε is within 0.5% (in fact 1e-6) of the continuous optimum, never above the
    grid one, and is the bound's value at the order it reports."""
    delta, worst_grid = 1e-4, 0.0
    # around the worst grid loss (α_max ≈ 2.2), and the σ² the recipe calibrates to for ε = 1…8
    for sigma2 in (0.2, 0.2746, 0.2801, 0.5, 1.05, 2.5, 7.1):
        kw = dict(SWEEP, sigma2=float(sigma2))
        for rounds in (1, 30):
            ref = _continuous_optimum(rounds, delta, reading, **kw)
            rdp = rdp_table1("gsgd+wf_na", DEFAULT_ALPHAS, reading=reading, **kw)
            grid_eps = rdp_to_dp(DEFAULT_ALPHAS, rounds * rdp, delta)[0]
            eps = epsilon_schedule("gsgd+wf_na", rounds, delta, composition="rdp", reading=reading, **kw)[-1]
            assert eps <= grid_eps * (1 + 1e-12)
            assert abs(eps - ref) <= 1e-6 * ref, (sigma2, rounds, eps, ref)
            worst_grid = max(worst_grid, grid_eps / ref - 1)
            # the reported order lies in the domain and gives the reported ε
            e2, a_star = rdp_to_dp(
                DEFAULT_ALPHAS, rounds * rdp, delta,
                rdp_fn=lambda a: rounds * rdp_theorem4(a, reading=reading, **kw),
            )
            assert e2 == pytest.approx(eps, rel=1e-12)
            edge = kw["num_users"] * sigma2 * kw["dataset_size"] / (2 * kw["clip"] ** 2)
            assert 1 < a_star < edge
            assert e2 == pytest.approx(rounds * _theorem4(a_star, reading=reading, **kw) + np.log(1 / delta) / (a_star - 1), rel=1e-12)
    assert worst_grid > (0.04 if reading == "conservative" else 0.15)  # what the grid alone loses


def test_per_round_kov_and_audit_epsilons_are_refined_too():
    kw = dict(SWEEP, sigma2=0.28)  # α_max ≈ 2.24: the grid alone loses ~5% here
    rounds, delta = 10, 1e-4
    d_round = delta / (2 * rounds)
    ref = _continuous_optimum(1, d_round, "eq35", **kw)
    kov = epsilon_schedule("gsgd+wf_na", rounds, delta, composition="kov", **kw)
    single = kov_compose([ref], [d_round], delta - d_round)[0]
    assert kov[0] == pytest.approx(single, rel=1e-6)
    users = [np.eye(3)[None, k % 3].repeat(32, 0) * 10.0 for k in range(50)]  # 50 users, D = 32, C = 10
    a = audit_round(users, mechanism="gsgd", noise="wf_na", sigma2=0.28, batch_size=32, clip=10.0, delta=1e-5)
    assert a.epsilon["theorem4"] == pytest.approx(_continuous_optimum(1, 1e-5, "eq35", **kw), rel=1e-6)
