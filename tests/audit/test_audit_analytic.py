"""The analytic Gaussian mechanism against Andrew et al.'s numbers, dp-accounting's PLD
accountant, a direct numerical hockey-stick integral, and a 60-digit evaluation."""

from __future__ import annotations

import math

import dp_accounting
import mpmath
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy import integrate, stats

from fedsafe.audit import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    calibrate_analytic_gaussian,
    gdp_epsilon,
)

STACKOVERFLOW_DELTA = 341000**-1.1


@pytest.mark.parametrize(
    ("z", "eps", "digits"),
    [(0.0644, 194, 0.5), (0.1023, 93.8, 0.05), (0.1836, 40.2, 0.05), (0.2344, 28.9, 0.05)],
)
def test_paper_table2_noise_multipliers(z, eps, digits):
    # Andrew et al. Table 2/3: the unamplified Gaussian mechanism applied once, δ = 341000^-1.1.
    assert abs(analytic_gaussian_epsilon(z, STACKOVERFLOW_DELTA) - eps) <= digits


@pytest.mark.parametrize(("eps", "sigma"), [(1.0, 4.22), (3.0, 1.54), (10.0, 0.541)])
def test_paper_table1_calibration(eps, sigma):
    got = calibrate_analytic_gaussian(eps, 1e-6)
    assert got == pytest.approx(sigma, abs=0.005 if sigma > 1 else 0.0005)
    assert analytic_gaussian_epsilon(got, 1e-6) == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize(
    ("z", "delta"),
    [(0.0644, STACKOVERFLOW_DELTA), (0.1023, STACKOVERFLOW_DELTA), (0.1836, STACKOVERFLOW_DELTA),
     (0.2344, STACKOVERFLOW_DELTA), (4.22, 1e-6), (1.54, 1e-6), (0.541, 1e-6)],
)
def test_matches_dp_accounting_pld(z, delta):
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.GaussianDpEvent(z))
    pld = acc.get_epsilon(delta)
    ours = analytic_gaussian_epsilon(z, delta)
    # The PLD accountant is pessimistic by its discretization only.
    assert ours <= pld + 1e-9
    assert ours == pytest.approx(pld, rel=1e-5)


def test_delta_formula_against_numerical_hockey_stick():
    # δ(ε) = ∫ (p − e^ε q)_+ for p = N(1/σ, 1), q = N(0, 1), integrated numerically.
    sigma, eps = 0.8, 1.5
    mu = 1 / sigma
    f = lambda x: max(stats.norm.pdf(x, mu) - math.exp(eps) * stats.norm.pdf(x), 0.0)  # noqa: E731
    x0 = eps / mu + mu / 2  # where the densities' ratio is e^ε
    num = integrate.quad(f, x0, np.inf, epsabs=1e-14)[0]
    assert analytic_gaussian_delta(sigma, eps) == pytest.approx(num, rel=1e-8)


@pytest.mark.parametrize("mu", [50.0, 300.0, 1000.0])
def test_huge_epsilon_in_log_space(mu):
    # ε ~ μ²/2 reaches 5e5; e^ε is never formed. Checked against 60-digit arithmetic.
    delta = 1e-6
    eps = gdp_epsilon(mu, delta)
    assert math.isfinite(eps) and eps > mu * mu / 2
    with mpmath.workdps(60):
        m, e = mpmath.mpf(mu), mpmath.mpf(eps)
        d = mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m)
        assert float(mpmath.log(d)) == pytest.approx(math.log(delta), abs=1e-7)


def test_edge_cases():
    assert analytic_gaussian_epsilon(0.0, 1e-5) == math.inf
    assert gdp_epsilon(0.0, 1e-5) == 0.0
    assert gdp_epsilon(-1.0, 1e-5) == 0.0
    assert gdp_epsilon(1e-4, 0.5) == 0.0  # δ larger than the whole divergence
    assert analytic_gaussian_epsilon(2.0, 1e-5, sensitivity=2.0) == pytest.approx(analytic_gaussian_epsilon(1.0, 1e-5))
    with pytest.raises(ValueError, match="delta"):
        analytic_gaussian_epsilon(1.0, 0.0)
    for eps in (0.1, 1.0, 8.0, 60.0):
        s = calibrate_analytic_gaussian(eps, 1e-7)
        assert analytic_gaussian_delta(s, eps) == pytest.approx(1e-7, rel=1e-8)
