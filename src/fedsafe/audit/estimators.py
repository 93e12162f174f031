"""Empirical ε from canary cosines (Andrew et al., "One-shot empirical privacy estimation").

The attack: predict that canary ``j`` took part iff its cosine ``g_j ≥ a``. With ``F0``/``F1``
the CDFs of the cosine for absent / present canaries, threshold ``a`` certifies (their Eq. 1)

    ε(a) = max( log((F0(a) − δ) / F1(a)),  log((1 − δ − F1(a)) / (1 − F0(a))) ),

i.e. ``max(log((1−δ−FPR)/FNR), log((1−δ−FNR)/FPR))``. Three point estimators turn fitted
distributions into ε; two statistics use the empirical rates directly, and only the second of
them is a confidence bound:

``equal_variance_epsilon`` (the default, ``eps_est_*``)
    Model both as Gaussians with the *null's* spread: the shift ``μ = (mean(g¹) − μ0)/σ0`` makes
    the test a μ-GDP Gaussian mechanism, whose ε is exact (Balle & Wang). This is the reading of
    the paper's Theorem 3.3 ("we recover the Gaussian mechanism with noise multiplier
    (1/√d)/μ̂"), and it is the only one of the three that reproduces Table 1 (ε = 1, 3, 10 →
    0.996 ± 0.145, 2.99 ± 0.164, 9.97 ± 0.208 over 50 trials; paper 0.972 ± 0.148,
    3.04 ± 0.137, 9.98 ± 0.190). Using the canaries' own σ̂ as the unit instead (μ̂/σ̂) is also
    unbiased but noisier (± 0.36 at ε = 10).
``likelihood_ratio_epsilon`` (``eps_est_*_fitted``: the paper's fitted-σ̂ estimate)
    The exact (ε, δ) curve between the null and ``N(μ̂, σ̂²)`` with the canaries' own fitted
    spread (optimal rejection regions, not just thresholds). Equal to the analytic Gaussian when
    the variances match; with unequal fitted variances it is ≥ the threshold search (at small δ
    the second rejection tail adds ~nothing, so the two agree closely). Biased upward like the
    threshold search: on ``recipes/audit_dpfedavg.toml`` it is 1.1–3.1× the default (where that
    is nonzero).
``threshold_epsilon`` (``eps_threshold_*``: the paper's literal line search, Algorithm 1 line 13)
    Max of ε(a) over ``a`` between ``N(0, 1/d)`` and ``N(μ̂, σ̂²)``. With ``σ̂`` fitted from
    k = 1000 samples (±2.2%), whichever tail is heavier wins at δ = 1e-6, so the maximum is
    biased *upward* (ε = 1 → 1.35 ± 0.34; ε = 10 → 10.6 ± 0.54), outside Table 1's spread.
``empirical_lower_bound`` (``eps_lo_*``: the paper's ε_lo; optimistic, NOT a confidence bound)
    Eq. (1) with one-sided 95% Jeffreys upper bounds on the rates, *maximised over every
    threshold* on the same cosines, with no correction for that choice. The paper calls it a
    95% lower bound; it is not one: on pure-null cosines (true ε = 0) it is > 0 in 65% of
    trials (final model, 200 canaries) and ~22% (all iterates, 200 + 200), where a 95% bound
    may be > 0 in at most 5% (``tests/audit/test_audit_lower_bounds.py``). Kept for comparison
    with the paper's Table 3.
``held_out_lower_bound`` (``eps_lo_valid_*``: a valid 95% lower bound)
    The threshold is chosen on one half of the canaries (and of the unobserved ones), and
    Eq. (1) is evaluated at that one threshold on the other, held-out half with one-sided
    Clopper–Pearson upper bounds on the rates, the ``alpha`` split between FNR and FPR
    (Bonferroni) when both are counted. With probability ≥ 1 − alpha it is ≤ the true ε at δ
    of the canary-membership test, given the premise of the whole method that the canaries'
    cosines are independent draws (exact for never-inserted canaries, i.i.d. given the
    training run; inserted ones all shape that run, a coupling no method here corrects for).

Everything is computed from logarithms of tail probabilities (``log_ndtr``, ``log_beta_tail``),
so the all-iterates estimates that reach tens of thousands (Table 3: 46400) do not overflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.special import betaincinv, log_ndtr

from fedsafe.audit.analytic import analytic_gaussian_epsilon, gdp_epsilon
from fedsafe.audit.distributions import CosineNull, Normal
from fedsafe.audit.logspace import log1mexp, log_sub

__all__ = [
    "DEFAULT_ESTIMATOR",
    "audit_summary",
    "clopper_pearson_upper",
    "empirical_lower_bound",
    "epsilon_at_threshold",
    "equal_variance_epsilon",
    "equal_variance_mu",
    "held_out_lower_bound",
    "jeffreys_upper",
    "likelihood_ratio_epsilon",
    "threshold_epsilon",
]

DEFAULT_ESTIMATOR = "equal_variance"


class TailDistribution(Protocol):
    def logcdf(self, x: np.ndarray | float) -> np.ndarray: ...
    def logsf(self, x: np.ndarray | float) -> np.ndarray: ...
    def quantile(self, p: float) -> float: ...
    def upper_quantile(self, p: float) -> float: ...


def _as_array(x: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    if a.size < 2:
        raise ValueError(f"{what}: need at least 2 cosines, got {a.size}")
    if not np.isfinite(a).all():
        raise ValueError(f"{what}: cosines must be finite")
    return a


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


# --- the default: equal variances, i.e. a Gaussian mechanism -------------------------------


def equal_variance_mu(observed: Sequence[float] | np.ndarray, null_mean: float, null_std: float) -> float:
    """``μ = (mean(observed) − null_mean) / null_std``: the GDP parameter of the fitted test."""
    if not null_std > 0:
        raise ValueError(f"null_std must be > 0, got {null_std}")
    g = _as_array(observed, "observed")
    return float((g.mean() - null_mean) / null_std)


def equal_variance_epsilon(
    observed: Sequence[float] | np.ndarray, delta: float, *, null_mean: float = 0.0, null_std: float
) -> float:
    """ε of ``N(null_mean, null_std²)`` vs ``N(mean(observed), null_std²)``: the analytic
    Gaussian ε at ``μ = (mean − null_mean)/null_std`` (0 when the canaries sit at or below the
    null). For the final model the null is exactly mean 0, std ``1/√d``."""
    _check_delta(delta)
    return gdp_epsilon(equal_variance_mu(observed, null_mean, null_std), delta)


# --- the paper's threshold line search ------------------------------------------------------


def epsilon_at_threshold(
    a: np.ndarray | float, null: TailDistribution, alt: TailDistribution, delta: float
) -> np.ndarray:
    """Eq. (1) at threshold(s) ``a`` ("present iff cosine ≥ a"), from log tails; ≥ 0."""
    log_delta = math.log(delta)
    a = np.asarray(a, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        t1 = log_sub(null.logcdf(a), log_delta) - alt.logcdf(a)  # (1 − δ − FPR) / FNR
        t2 = log_sub(alt.logsf(a), log_delta) - null.logsf(a)  # (1 − δ − FNR) / FPR
        eps = np.fmax(t1, t2)
    return np.where(np.isnan(eps), 0.0, np.maximum(eps, 0.0))


def threshold_epsilon(null: TailDistribution, alt: TailDistribution, delta: float, *, grid: int = 4097) -> float:
    """``max_a ε(a)`` (Andrew et al., Algorithm 1 line 13 / Algorithm 2 line 19).

    Thresholds outside ``[min quantile δ, max upper-quantile δ]`` of the two distributions
    certify nothing (one of the ``1 − δ − ·`` numerators is ≤ 0 there), so a grid over that
    range brackets the maximum, which a bounded Brent search then refines.
    """
    _check_delta(delta)
    lo = min(null.quantile(delta), alt.quantile(delta))
    hi = max(null.upper_quantile(delta), alt.upper_quantile(delta))
    xs = np.linspace(lo, hi, grid)
    vals = epsilon_at_threshold(xs, null, alt, delta)
    i = int(np.argmax(vals))
    best = float(vals[i])
    left, right = xs[max(i - 1, 0)], xs[min(i + 1, grid - 1)]
    if right > left:
        res = minimize_scalar(
            lambda x: -float(epsilon_at_threshold(x, null, alt, delta)),
            bounds=(left, right),
            method="bounded",
            options={"xatol": (right - left) * 1e-9},
        )
        best = max(best, -float(res.fun))
    return best


# --- the exact two-Gaussian trade-off -------------------------------------------------------


def _log_interval(d: Normal, lo: float, hi: float) -> float:
    """``log P(lo < X < hi)`` for ``X ~ d``, stable in both tails."""
    if not hi > lo:
        return -math.inf
    zl, zh = (lo - d.mean) / d.std, (hi - d.mean) / d.std
    if zl > 0:  # both in the upper tail: difference of survivals
        return float(log_sub(log_ndtr(-zl), log_ndtr(-zh)))
    return float(log_sub(log_ndtr(zh), log_ndtr(zl)))


def _log_hockey_stick(p: Normal, q: Normal, eps: float) -> float:
    """``log sup_S [P(S) − e^ε Q(S)]`` for Gaussians; ``S = {x : log p/q > ε}`` solved exactly.

    ``log p(x) − log q(x) − ε = A x² + B x + C`` with ``A = 1/(2σq²) − 1/(2σp²)``; the set where
    it is positive is a half-line (A = 0), one interval (A < 0) or two tails (A > 0).
    """
    mp, sp, mq, sq = p.mean, p.std, q.mean, q.std
    A = 0.5 / sq**2 - 0.5 / sp**2
    B = mp / sp**2 - mq / sq**2
    C = 0.5 * mq**2 / sq**2 - 0.5 * mp**2 / sp**2 + math.log(sq / sp) - eps
    inf = math.inf
    if abs(A) * max(sp, sq) ** 2 < 1e-12:  # equal variances: a half-line
        if B == 0:
            return -inf
        x0 = -C / B
        pieces = [(x0, inf)] if B > 0 else [(-inf, x0)]
    else:
        disc = B * B - 4 * A * C
        if disc <= 0:
            pieces = [(-inf, inf)] if A > 0 else []
        else:
            r = math.sqrt(disc)
            # roots without cancellation
            qq = -0.5 * (B + math.copysign(r, B))
            x1, x2 = sorted((qq / A, C / qq if qq != 0 else -qq / A))
            pieces = [(-inf, x1), (x2, inf)] if A > 0 else [(x1, x2)]
    if not pieces:
        return -inf
    lp = np.logaddexp.reduce([_log_interval(p, lo, hi) for lo, hi in pieces])
    lq = np.logaddexp.reduce([_log_interval(q, lo, hi) for lo, hi in pieces])
    if np.isneginf(lp):
        return -inf
    # On S, p > e^ε q pointwise, so the difference is ≥ 0 up to rounding.
    return float(lp + log1mexp(min(eps + lq - lp, 0.0)))


def likelihood_ratio_epsilon(null: Normal, alt: Normal, delta: float) -> float:
    """The smallest ε with both hockey-stick divergences ``D_{e^ε}(alt‖null)`` and
    ``D_{e^ε}(null‖alt)`` at most δ: the exact privacy of "observe one draw of N(μ0,σ0²) or
    N(μ1,σ1²)". With σ0 = σ1 this is ``gdp_epsilon(|μ1 − μ0|/σ)``."""
    _check_delta(delta)
    target = math.log(delta)
    best = 0.0
    for p, q in ((alt, null), (null, alt)):

        def f(e: float, p: Normal = p, q: Normal = q) -> float:
            return max(_log_hockey_stick(p, q, e), -1e5) - target

        if f(0.0) <= 0:
            continue
        hi = 1.0
        while f(hi) > 0:
            hi *= 2.0
        best = max(best, float(brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-14, maxiter=500)))
    return best


# --- lower bounds from the empirical rates (after Jagielski et al. 2020) ---------------------


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")


def _check_failures(x: np.ndarray, trials: int) -> None:
    if np.any(x < 0) or np.any(x > trials):
        raise ValueError(f"failures must be in [0, {trials}]")


def jeffreys_upper(failures: np.ndarray | int, trials: int, alpha: float = 0.05) -> np.ndarray:
    """One-sided ``1 − alpha`` Jeffreys upper confidence bound on a binomial rate: the
    ``1 − alpha`` quantile of ``Beta(x + ½, n − x + ½)``, and 1 when ``x = n``. Its coverage is
    only approximately ``1 − alpha`` (below it for some rates)."""
    _check_alpha(alpha)
    x = np.asarray(failures, dtype=float)
    _check_failures(x, trials)
    with np.errstate(invalid="ignore"):
        up = betaincinv(x + 0.5, np.maximum(trials - x, 0.0) + 0.5, 1.0 - alpha)
    return np.where(x >= trials, 1.0, up)


def clopper_pearson_upper(failures: np.ndarray | int, trials: int, alpha: float = 0.05) -> np.ndarray:
    """One-sided ``1 − alpha`` Clopper–Pearson upper confidence bound on a binomial rate: the
    ``1 − alpha`` quantile of ``Beta(x + 1, n − x)``, and 1 when ``x = n``. Exact: for every
    true rate ``p``, ``P(p ≤ bound) ≥ 1 − alpha``."""
    _check_alpha(alpha)
    x = np.asarray(failures, dtype=float)
    _check_failures(x, trials)
    with np.errstate(invalid="ignore"):
        up = betaincinv(x + 1.0, np.maximum(trials - x, 0.0), 1.0 - alpha)
    return np.where(x >= trials, 1.0, up)


def _log_rates(
    a: np.ndarray,
    g1: np.ndarray,
    *,
    null: TailDistribution | None,
    g0: np.ndarray | None,
    upper_fn: Callable[[np.ndarray, int], np.ndarray],
    upper_fp: Callable[[np.ndarray, int], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log FPR, log(1 − FPR), log FNR)`` of "present iff cosine ≥ a" at thresholds ``a``.

    FNR is ``upper_fn`` of the count of sorted observed ``g1`` below ``a``. FPR is exact from
    ``null`` or, with sorted unobserved ``g0`` instead, ``upper_fp`` of the count at or above.
    """
    fn = np.searchsorted(g1, a, side="left")
    with np.errstate(divide="ignore"):
        log_fnr = np.log(upper_fn(fn, g1.size))
        if null is not None:
            return np.asarray(null.logsf(a), dtype=float), np.asarray(null.logcdf(a), dtype=float), log_fnr
        fpr_hi = upper_fp(g0.size - np.searchsorted(g0, a, side="left"), g0.size)
        return np.log(fpr_hi), np.log1p(-fpr_hi), log_fnr


def _eq1_from_log_rates(log_fpr: np.ndarray, log_tnr: np.ndarray, log_fnr: np.ndarray, delta: float) -> np.ndarray:
    """Eq. (1), ``max(log(1 − FPR − δ) − log FNR, log(1 − FNR − δ) − log FPR)``; NaN or −∞
    where a threshold certifies nothing. Both terms fall as either rate rises, so upper bounds
    on the rates give a lower bound on both terms (and on their maximum) at once."""
    log_delta = math.log(delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = log_sub(log_tnr, log_delta) - log_fnr
        t2 = log_sub(log1mexp(np.minimum(log_fnr, 0.0)), log_delta) - log_fpr
        return np.fmax(t1, t2)


def _check_one_null(null: TailDistribution | None, unobserved: object) -> None:
    if (null is None) == (unobserved is None):
        raise ValueError("give exactly one of null (exact FPR) or unobserved (empirical FPR)")


def empirical_lower_bound(
    observed: Sequence[float] | np.ndarray,
    delta: float,
    *,
    null: TailDistribution | None = None,
    unobserved: Sequence[float] | np.ndarray | None = None,
    alpha: float = 0.05,
) -> float:
    """The paper's ``ε_lo`` (Andrew et al. §5, after Jagielski et al. 2020): Eq. (1) with upper
    confidence bounds on the error rates, *maximised over the thresholds* where a rate changes.

    This is an optimistic, threshold-maximised statistic, **not** a confidence bound: the
    maximum over thousands of thresholds of per-threshold ``1 − alpha`` bounds is positive on
    pure-null cosines (true ε = 0) far more often than ``alpha`` (65% of trials with 200
    canaries and the exact null). :func:`held_out_lower_bound` is the valid bound.

    FNR gets a one-sided ``1 − alpha`` Jeffreys bound (Zanella-Béguelin et al. 2022). FPR is
    exact from ``null`` (the final-model threat model: the Beta cosine null) or, when
    ``unobserved`` cosines are given instead (all-iterates: no closed-form null), also a Jeffreys
    bound. As in the paper, ``alpha`` applies to each rate and the threshold is not corrected for
    selection; 1000 vs 1000 perfectly separated canaries give 6.25 (their Table 3, zero noise:
    ε_lo-all = 6.24).
    """
    _check_delta(delta)
    _check_one_null(null, unobserved)
    g1 = np.sort(_as_array(observed, "observed"))
    g0 = None if unobserved is None else np.sort(_as_array(unobserved, "unobserved"))
    a = g1 if g0 is None else np.unique(np.concatenate([g0, g1]))  # where a count changes

    def jeffreys(x: np.ndarray, n: int) -> np.ndarray:
        return jeffreys_upper(x, n, alpha)

    eps = _eq1_from_log_rates(*_log_rates(a, g1, null=null, g0=g0, upper_fn=jeffreys, upper_fp=jeffreys), delta)
    eps = eps[np.isfinite(eps)]
    return float(max(0.0, eps.max())) if eps.size else 0.0


# The threshold is chosen for the held-out count of failures that Binomial(held size, rate
# predicted by the selection half) stays at or below with this probability (a power
# heuristic, tuned on Gaussian cosines; validity does not depend on it).
SELECTION_QUANTILE = 0.7


def _pessimistic_upper(rate: np.ndarray, held: int, upper: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """``upper`` of the ``SELECTION_QUANTILE`` quantile of ``Binomial(held, rate)`` failures."""
    from scipy.stats import (
        binom,  # here: scipy.stats takes ~1 s to import, and only this needs it
    )

    return upper(binom.ppf(SELECTION_QUANTILE, held, rate), held)


def _fit_or_step(g: np.ndarray) -> Normal:
    """``N(mean, std²)`` of ``g``; identical values get a vanishing std (a step CDF)."""
    std = float(g.std())
    return Normal(float(g.mean()), std if std > 0 else float(np.finfo(float).tiny))


def _midpoints(*samples: np.ndarray) -> np.ndarray:
    """Thresholds halfway between consecutive distinct values of the pooled samples (the value
    itself when there is only one): every way of splitting the samples by a threshold, with
    no threshold sitting on a sample."""
    u = np.unique(np.concatenate(samples))
    return (u[:-1] + u[1:]) / 2 if u.size > 1 else u


def held_out_lower_bound(
    observed: Sequence[float] | np.ndarray,
    delta: float,
    *,
    null: TailDistribution | None = None,
    unobserved: Sequence[float] | np.ndarray | None = None,
    alpha: float = 0.05,
) -> float:
    """A valid one-sided ``1 − alpha`` lower confidence bound on ε at ``delta``.

    1. Split the observed cosines (and the ``unobserved`` ones, when given) into two halves by
       position: even indices select, odd indices are held out. Canaries are i.i.d. and their
       ids carry no information, so the held-out half is independent of the selection half.
    2. On the selection half only, choose one threshold ``a*`` halfway between two of its
       consecutive cosines: fit ``N(μ̂, σ̂²)`` to the selection half's observed (and
       unobserved) cosines, predict each rate at each candidate from the fit, and take the
       candidate that maximises Eq. (1) with the bounds of step 3 applied to the
       ``SELECTION_QUANTILE`` (70%) quantile of ``Binomial(held-out size, predicted rate)``
       failures. Choosing from the selection half's raw counts instead picks tails that hold a
       few selection canaries by luck and that the held-out half then leaves empty (1000
       canaries at ε = 3, δ = 1e-5, exact null: positive in 71% of trials when maximising the
       selection half's own bounds, 95% with its counts at their 90% quantile, 100% this way).
       The choice affects power, never validity.
    3. On the held-out half, count ``fn = #{g¹ < a*}`` (and ``fp = #{g⁰ ≥ a*}``), replace each
       rate by its one-sided Clopper–Pearson upper bound, and return Eq. (1) at ``a*``
       (0 when it certifies nothing).

    Error budget: with ``null`` the FPR is exact (the final-model null), so the FNR bound takes
    all of ``alpha``; with ``unobserved`` the FNR and FPR bounds take ``alpha/2`` each (union
    bound). Whenever the bounds hold, both terms of Eq. (1) are at most their values at the
    true rates, which an (ε, δ)-DP test cannot exceed; so ``P(bound > ε) ≤ alpha``. Clopper–
    Pearson rather than Jeffreys: its coverage is guaranteed for every rate, Jeffreys' is not.
    """
    _check_delta(delta)
    _check_alpha(alpha)
    _check_one_null(null, unobserved)
    g1 = _as_array(observed, "observed")
    sel1, held1 = np.sort(g1[0::2]), np.sort(g1[1::2])
    level = alpha if unobserved is None else alpha / 2

    def cp(x: np.ndarray, n: int) -> np.ndarray:
        return clopper_pearson_upper(x, n, level)

    if unobserved is None:
        sel0 = held0 = None
        candidates = _midpoints(sel1)
    else:
        g0 = _as_array(unobserved, "unobserved")
        sel0, held0 = np.sort(g0[0::2]), np.sort(g0[1::2])
        candidates = _midpoints(sel0, sel1)
    sel_fnr = _pessimistic_upper(np.exp(_fit_or_step(sel1).logcdf(candidates)), held1.size, cp)
    with np.errstate(divide="ignore"):
        if sel0 is None:
            log_fpr = np.asarray(null.logsf(candidates), dtype=float)
            log_tnr = np.asarray(null.logcdf(candidates), dtype=float)
        else:
            sel_fpr = _pessimistic_upper(np.exp(_fit_or_step(sel0).logsf(candidates)), held0.size, cp)
            log_fpr, log_tnr = np.log(sel_fpr), np.log1p(-sel_fpr)
        on_sel = _eq1_from_log_rates(log_fpr, log_tnr, np.log(sel_fnr), delta)
    best = candidates[int(np.argmax(np.where(np.isnan(on_sel), -np.inf, on_sel)))]
    rates = _log_rates(np.array([best]), held1, null=null, g0=held0, upper_fn=cp, upper_fp=cp)
    held = _eq1_from_log_rates(*rates, delta)
    return float(held[0]) if np.isfinite(held[0]) and held[0] > 0 else 0.0


# --- everything an audited run reports ------------------------------------------------------


def _fit(g: np.ndarray) -> Normal:
    return Normal(float(g.mean()), float(g.std()))  # population std: the paper's 1/k Σ (g − μ̂)²


def audit_summary(
    final_obs: Sequence[float] | np.ndarray,
    final_unobs: Sequence[float] | np.ndarray | None,
    all_obs: Sequence[float] | np.ndarray | None,
    all_unobs: Sequence[float] | np.ndarray | None,
    dim: int,
    delta: float,
    *,
    alpha: float = 0.05,
    noise_multiplier: float | None = None,
    repetitions: int = 1,
) -> dict[str, float | int | str | None]:
    """The numbers of Andrew et al.'s Table 3 for one run.

    - ``eps_est_final``: equal-variance ε of the final-model cosines against the exact null
      (mean 0, std ``1/√d``). ``eps_est_final_fitted``: the paper's fitted-σ̂ estimate, the
      exact ε between ``N(0, 1/d)`` and ``N(μ̂, σ̂²)`` (``likelihood_ratio_epsilon``).
    - ``eps_lo_final``: the paper's ε_lo (Jeffreys FNR + exact Beta-null FPR, maximised over
      thresholds): an optimistic statistic, *not* a confidence bound (module doc).
      ``eps_lo_valid_final``: a valid ``1 − alpha`` lower confidence bound on ε at ``delta``
      (``held_out_lower_bound``: threshold chosen on half the canaries, Clopper–Pearson FNR on
      the other half, exact Beta-null FPR).
    - ``eps_est_all``/``eps_est_all_fitted``/``eps_lo_all``/``eps_lo_valid_all``: the same for
      the max-over-rounds cosines, with the null fitted from / counted on the unobserved
      canaries (the valid bound splits ``alpha`` between FNR and FPR); None without them.
    - ``eps_threshold_*``: the paper's literal threshold line search on the same fits (≤ the
      fitted estimate, biased upward like it; see module doc).
    - ``eps_analytical``: the unamplified Gaussian mechanism with ``noise_multiplier``, composed
      over ``repetitions`` participations (exactly ``μ√r``); None without a noise multiplier.
    ``final_unobs`` (optional) checks the null: their ``√d``-scaled mean and std should be ≈ 0, 1.
    """
    _check_delta(delta)
    null = CosineNull(dim)
    g1 = _as_array(final_obs, "final_obs")
    fit1 = _fit(g1)
    gauss_null = Normal(0.0, null.std)
    out: dict[str, float | int | str | None] = {
        "estimator": DEFAULT_ESTIMATOR,
        "delta": float(delta),
        "alpha": float(alpha),
        "dim": int(dim),
        "canaries_observed": int(g1.size),
        "mu_final": equal_variance_mu(g1, 0.0, null.std),
        "eps_est_final": equal_variance_epsilon(g1, delta, null_std=null.std),
        "eps_est_final_fitted": likelihood_ratio_epsilon(gauss_null, fit1, delta) if fit1.std > 0 else math.inf,
        "eps_lo_final": empirical_lower_bound(g1, delta, null=null, alpha=alpha),
        "eps_lo_valid_final": held_out_lower_bound(g1, delta, null=null, alpha=alpha),
        "eps_threshold_final": threshold_epsilon(gauss_null, fit1, delta) if fit1.std > 0 else math.inf,
        "final_obs_mean_sqrt_d": fit1.mean * math.sqrt(dim),
        "final_obs_std_sqrt_d": fit1.std * math.sqrt(dim),
    }
    if final_unobs is not None:
        g0 = _as_array(final_unobs, "final_unobs")
        out["final_unobs_mean_sqrt_d"] = float(g0.mean() * math.sqrt(dim))
        out["final_unobs_std_sqrt_d"] = float(g0.std() * math.sqrt(dim))
    for key in ("mu_all", "eps_est_all", "eps_est_all_fitted", "eps_lo_all", "eps_lo_valid_all", "eps_threshold_all"):
        out[key] = None
    if all_obs is not None and all_unobs is not None:
        a1 = _as_array(all_obs, "all_obs")
        a0 = _as_array(all_unobs, "all_unobs")
        fit0, fitA = _fit(a0), _fit(a1)
        out["canaries_unobserved"] = int(a0.size)
        if fit0.std > 0:
            out["mu_all"] = equal_variance_mu(a1, fit0.mean, fit0.std)
            out["eps_est_all"] = gdp_epsilon(out["mu_all"], delta)
            if fitA.std > 0:
                out["eps_est_all_fitted"] = likelihood_ratio_epsilon(fit0, fitA, delta)
                out["eps_threshold_all"] = threshold_epsilon(fit0, fitA, delta)
        out["eps_lo_all"] = empirical_lower_bound(a1, delta, unobserved=a0, alpha=alpha)
        out["eps_lo_valid_all"] = held_out_lower_bound(a1, delta, unobserved=a0, alpha=alpha)
    out["eps_analytical"] = None
    if noise_multiplier is not None:
        if repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {repetitions}")
        out["eps_analytical"] = analytic_gaussian_epsilon(noise_multiplier / math.sqrt(repetitions), delta)
    return out
