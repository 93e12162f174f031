"""Secure aggregation under DP (issue #25, item 5): the encoding ranges come from the DP clip norm
and the clients' noise, so the noise the accountant credits is the noise the server decodes.

Reference throughout: the plaintext sum of the very messages the clients handed to the protocol
(what the sum would be without secure aggregation), and the noise std the DP plan accounts.
Before the fix (one range [-1, 1] for every coordinate) the adaptive-clipping bits of unclipped
clients decoded as 0.749 on average, and the count noise had std 1.17 where 2.0 is accounted."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import optimize
from scipy.stats import chi2, norm

from fedsafe.config import apply_overrides, validate
from fedsafe.core.types import Messages, RoundContext
from fedsafe.engine.federation import Federation
from fedsafe.protocols.secagg import SecAggConfig, run_round
from fedsafe.protocols.secagg.fixedpoint import Ranges
from fedsafe.protocols.secagg.ranges import NoisyRun, clip_probability, derive, tail_factor

N, D = 10, 32  # clients per round (all sampled: n_s = 10 noise shares) and update coordinates
Z, SIGMA_B, C = 2.0, 2.0, 1.0  # the count noise: σ_b = 2, so each share has std 2/√10 = 0.632
T = 80  # rounds of the statistical tests
ALPHA = 1e-6  # two-sided level of each statistical test (the DP noise is secret: draws differ every run)


def experiment(**over):
    raw = {
        "seed": 0, "rounds": 3, "eval_every": 3,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": N, "sampling": "all", "algorithm": "fedavg", "local_steps": 1, "lr": 0.1},
        "protocol": "secagg",
        "dp": {"enabled": True, "placement": "distributed", "noise_multiplier": Z, "clip": C,
               "adaptive": True, "count_stddev": SIGMA_B},
    }
    return validate(apply_overrides(raw, over))


def secure_round(fed, t: int, x: torch.Tensor):
    """One round of the DP clients' transform and the secure aggregation, outside the engine (so
    the updates are the test's): the messages the clients sent, and the protocol's aggregate."""
    dp = fed.plugins[0]
    ids = np.arange(x.shape[0])
    ctx = RoundContext(t, 0, tuple(range(x.shape[0])), 0)
    msgs = dp.transform_honest(x, ctx, ids)
    return msgs, fed.protocol.aggregate(Messages(ids, msgs), fed.pipeline, ctx), ctx


def chi2_bounds(df: int) -> tuple[float, float]:
    return chi2.ppf(ALPHA / 2, df), chi2.ppf(1 - ALPHA / 2, df)


@pytest.fixture(scope="module")
def trials():
    """T rounds of N unclipped clients (‖x‖ ≈ 0.06 < C, so every bit is 1) under secagg."""
    fed = Federation(experiment())
    plan = fed.plugins[0].plan
    bit_noise, value_noise, gaps, metrics = [], [], [], []
    for t in range(1, T + 1):
        x = torch.randn(N, D, generator=torch.Generator().manual_seed(t), dtype=torch.float64) * 0.01
        msgs, agg, _ = secure_round(fed, t, x)
        decoded = agg.vector * agg.count  # the decoded sum
        plain = msgs.sum(0)  # the plaintext sum of the same messages
        gaps.append((float((decoded - plain).abs().max()), N * agg.metrics["secagg_quant_error_bound"]))
        bit_noise.append(float(decoded[-1]) - N)
        value_noise.append((decoded[:-1] - x.sum(0)).numpy())
        metrics.append(agg.metrics)
    return {"plan": plan, "fed": fed, "bits": np.array(bit_noise), "values": np.concatenate(value_noise),
            "gaps": gaps, "metrics": metrics}


def test_the_decoded_sum_is_the_plaintext_sum_of_the_noisy_messages(trials):
    # Nothing is clipped: the secure sum differs from the plaintext one by quantization only.
    for gap, bound in trials["gaps"]:
        assert gap <= bound + 1e-12
    for m in trials["metrics"]:
        assert m["secagg_clipped_clients"] == 0 and m["secagg_clipped_coordinates"] == 0
        assert m["secagg_clipped_fraction"] == 0 and m["secagg_uncredited_shares"] == 0
        assert m["secagg_clip_probability"] <= 1e-15 * (1 + 1e-6)


def test_adaptive_bits_of_unclipped_clients_decode_as_one(trials):
    # (1) Each client's bit is 1 plus its share N(0, σ_b²/n_s): the mean decoded bit per client is
    # 1 within the ALPHA quantile, 4.9 standard errors σ_b/(N √T) = 0.022 (it was 0.749: 11 SE off).
    per_client = 1 + trials["bits"].mean() / N
    se = SIGMA_B / (N * math.sqrt(T))
    assert abs(per_client - 1) < norm.isf(ALPHA / 2) * se, per_client


def test_count_noise_std_is_the_accounted_sigma_b(trials):
    # (2) The decoded count minus the true count N is the sum of the N shares: N(0, σ_b²), σ_b = 2
    # (it had std 1.17 about a mean 2.5 below the count: rms 3.0). Σ r²/σ_b² ~ χ²(T).
    plan = trials["plan"]
    assert plan.count_stddev == SIGMA_B and plan.noise_shares == N
    r = trials["bits"]
    lo, hi = chi2_bounds(T)
    assert lo < (r**2).sum() / SIGMA_B**2 < hi, r.std()


def test_value_noise_std_is_the_accounted_one(trials):
    # (3) Each update coordinate of the decoded sum carries N(0, (z_Δ C)²) (z_Δ = 2.31 here).
    plan = trials["plan"]
    v = trials["values"]
    lo, hi = chi2_bounds(v.size)
    assert lo < (v**2).sum() / (plan.value_z * C) ** 2 < hi, v.std()


def test_auto_ranges_are_the_clip_norm_and_bit_widened_by_the_tail_factor(trials):
    fed, plan = trials["fed"], trials["plan"]
    ranges, p = fed.protocol.ranges(D + 1, N)
    # k from scipy: N (D + 1) coordinates, each clipped with probability 2 Φ(-k), 1e-15 in all
    k = norm.isf(1e-15 / (2 * N * (D + 1)))
    s_v, s_b = plan.value_z * C / math.sqrt(N), SIGMA_B / math.sqrt(N)
    (n1, lo1, hi1), (n2, lo2, hi2) = ranges.runs
    assert (n1, n2) == (D, 1)
    assert lo1 == pytest.approx(-(C + k * s_v), rel=1e-9) and hi1 == pytest.approx(C + k * s_v, rel=1e-9)
    assert lo2 == pytest.approx(-k * s_b, rel=1e-9) and hi2 == pytest.approx(1 + k * s_b, rel=1e-9)
    assert p == pytest.approx(1e-15, rel=1e-6)
    # The quantization step stays far below the noise it rounds (q = 28 for 10 clients in 32 bits).
    m = trials["metrics"][0]
    assert m["secagg_quant_bits"] == 28
    step = (hi1 - lo1) / (2**28 - 1)
    assert m["secagg_quant_step_to_noise"] == pytest.approx(max(step / s_v, (hi2 - lo2) / (2**28 - 1) / s_b))
    assert m["secagg_quant_step_to_noise"] < 1e-6


def test_coarse_quantization_keeps_the_sum_exact_and_reports_the_step_against_the_noise():
    fed = Federation(experiment(**{"secagg.bits": 16}))
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 0.01
    msgs, agg, _ = secure_round(fed, 1, x)
    q = fed.protocol.config.effective_quant_bits(N)
    assert q == 12 and N * (2**q - 1) < 2**16  # the sum of N encodings cannot overflow Z_{2^16}
    ranges, _ = fed.protocol.ranges(D + 1, N)
    steps = ranges.steps(q)
    plan = fed.plugins[0].plan
    ratio = max(steps[0] / (plan.value_z * C / math.sqrt(N)), steps[1] / (SIGMA_B / math.sqrt(N)))
    assert agg.metrics["secagg_quant_step_to_noise"] == pytest.approx(ratio)
    assert ratio < 0.01  # the rounding error (std step/√12 per client) is below 0.3% of the noise
    decoded = agg.vector * agg.count
    assert float((decoded - msgs.sum(0)).abs().max()) <= N * agg.metrics["secagg_quant_error_bound"] + 1e-12


# --- clipping: counted securely, and its shares not credited ---------------------------------------


def test_forced_clipping_is_counted_exactly_and_its_shares_are_not_credited():
    over = {"secagg.clip": 0.5, "dp.adaptive": False, "dp.noise_multiplier": 0.01}
    with pytest.warns(UserWarning, match=r"secagg\.clip = 0\.5 clips the clients' DP noise"):
        fed = Federation(experiment(**over))
    dp = fed.plugins[0]
    # Clients 0-3 hold one coordinate outside [-0.5, 0.5], clients 4 and 5 two; the noise (std
    # 0.01/√10) moves no coordinate across the range's edge. Every norm is below C = 1.
    x = torch.full((N, D), 0.01, dtype=torch.float64)
    x[:4, 0] = 0.9
    x[4:6, :2] = -0.6
    assert bool((x.norm(dim=1) < C).all())
    msgs, agg, ctx = secure_round(fed, 1, x)
    m = agg.metrics
    assert m["secagg_clipped_clients"] == 6 and m["secagg_clipped_coordinates"] == 8
    assert m["secagg_clipped_fraction"] == pytest.approx(8 / (N * D))
    assert m["secagg_clip_probability"] == 1.0  # the range does not even hold the update's [-C, C]
    assert m["secagg_uncredited_shares"] == 6
    # the user's range is respected: the aggregate is the mean of the messages clipped to it
    ref = msgs.clamp(-0.5, 0.5).mean(0)
    assert float((agg.vector - ref).abs().max()) <= m["secagg_quant_error_bound"] + 1e-12
    # the accountant credits the 4 shares that were not clipped, not the 10 in the sum
    dp.transform_aggregate(agg.vector, ctx, agg)
    row = dp.on_round_end(fed, {"round": 1})
    assert row["dp_noise_shares"] == 4
    exact = 0.01 * math.sqrt(4 / N)
    assert exact * 2 ** (-1 / 256) < row["effective_noise_multiplier"] <= exact


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Balle & Wang 2018, Thm 8, sensitivity 1: the smallest ε of a Gaussian of std σ."""

    def delta_of(eps: float) -> float:
        a, b = 1 / (2 * sigma), eps * sigma
        return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b)

    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 500.0, xtol=1e-12)


def test_a_run_whose_range_clips_every_share_is_accounted_without_them():
    # (4) With every client sampled (no amplification) T rounds of multipliers z_t compose into
    # one Gaussian of multiplier (Σ z_t⁻²)^(-1/2); z_t = z √(max(n_t, 1)/n_s) with n_t the honest
    # shares that survived the encoding.
    over = {"dp.adaptive": False, "dp.noise_multiplier": 1.0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" warns about nothing
        auto = Federation(experiment(**over))
    with pytest.warns(UserWarning, match=r"secagg\.clip = 0\.05"):
        tiny = Federation(experiment(**over, **{"secagg.clip": 0.05}))
    auto.run(), tiny.run()
    delta = auto.cfg.dp.delta
    for fed, shares in ((auto, N), (tiny, 0)):
        for r in fed.rows:
            assert r["dp_noise_shares"] == shares
            assert r["secagg_clipped_clients"] == N - shares and r["secagg_uncredited_shares"] == N - shares
        z_t = [1.0 * math.sqrt(max(r["dp_noise_shares"], 1) / N) for r in fed.rows]
        ref = analytic_gaussian_epsilon(sum(z**-2 for z in z_t) ** -0.5, delta)
        assert ref <= fed.rows[-1]["epsilon"] <= 1.01 * ref
    assert all(r["secagg_clipped_fraction"] > 0.5 for r in tiny.rows)
    assert all(r["secagg_clipped_fraction"] == 0 for r in auto.rows)
    assert tiny.rows[-1]["epsilon"] > 2 * auto.rows[-1]["epsilon"]


def test_the_server_learns_the_clipping_counts_only_as_sums_over_the_survivors():
    ranges = Ranges(((3, -1.0, 1.0), (2, 0.0, 1.0)))
    inputs = {c: np.array([0.5, -0.5, 0.1, 0.5, 0.5]) for c in range(8)}
    inputs[1] = np.array([2.0, -3.0, 0.0, 0.5, 1.5])  # 3 coordinates out of range
    inputs[4] = np.array([0.0, 0.0, 0.0, -0.1, 0.5])  # 1
    inputs[6] = np.array([5.0, 0.0, 0.0, 0.5, 0.5])  # 1, but it drops out before its masked input
    keep = {}
    out = run_round(inputs, SecAggConfig(), ranges=ranges, drop_at={6: "mask"}, keep=keep)
    assert [keep["clients"][c].clipped for c in range(8)] == [0, 3, 0, 0, 1, 0, None, 0]
    assert out.clipped() == (2, 4)
    # the server holds the sums of the statistics words, nothing per client
    server = keep["server"]
    assert server.clip_stats.shape == (2,) and server.total.shape == (5,)
    survivors = [c for c in range(8) if c != 6]
    ref = np.mean([np.clip(inputs[c], [-1, -1, -1, 0, 0], 1.0) for c in survivors], axis=0)
    assert np.abs(out.mean() - ref).max() <= SecAggConfig().quantization_error_bound(7, ranges) * (1 + 1e-9)


# --- "auto" and the user's range ---------------------------------------------------------------


def test_auto_is_the_default_and_without_dp_it_is_the_old_unit_range():
    assert SecAggConfig().clip == "auto" and SecAggConfig().fixed_clip == 1.0
    for bad in ("automatic", "", True, 0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="secagg.clip"):
            SecAggConfig(clip=bad)
    cfg = experiment(**{"dp.enabled": False})
    assert validate(apply_overrides(cfg.to_dict(), {})).secagg.clip == "auto"  # survives a TOML round trip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fed = Federation(cfg)
        explicit = Federation(experiment(**{"dp.enabled": False, "secagg.clip": 0.25}))  # no DP: no warning
    assert fed.protocol.ranges(7, 5) == (Ranges.uniform(7, 1.0), None)
    assert explicit.protocol.ranges(7, 5) == (Ranges.uniform(7, 0.25), None)
    fed.run_round()
    assert "secagg_clip_probability" not in fed.rows[-1] and "secagg_clipped_clients" in fed.rows[-1]


def test_local_dp_ranges_hold_the_full_noise_of_each_client():
    fed = Federation(experiment(**{"dp.placement": "local", "dp.adaptive": False, "dp.noise_multiplier": 0.5}))
    (n, lo, hi), = fed.protocol.ranges(D, N)[0].runs
    k = norm.isf(1e-15 / (2 * N * D))
    assert n == D and hi == pytest.approx(C * (1 + k * 0.5), rel=1e-9) and lo == -hi


def test_the_tail_bound_holds_by_simulation():
    # A loose p so that clipping is frequent enough to count: signals at the edge of [lo, hi].
    runs = [NoisyRun(3, -1.0, 1.0, 0.5), NoisyRun(2, 0.0, 1.0, 0.2)]
    clients, p = 4, 0.2
    ranges, k = derive(runs, clients, p)
    assert k == pytest.approx(norm.isf(p / (2 * clients * 5)))
    assert clip_probability(ranges, runs, clients) == pytest.approx(p, rel=1e-9)
    rng = np.random.default_rng(0)
    trials = 40_000
    signal = np.array([1.0, -1.0, 1.0, 0.0, 1.0])  # at an edge: the worst case of the union bound's terms
    std = np.array([0.5, 0.5, 0.5, 0.2, 0.2])
    noisy = signal + std * rng.standard_normal((trials, clients, 5))
    lo = np.array([lo for n, lo, _ in ranges.runs for _ in range(n)])
    hi = np.array([hi for n, _, hi in ranges.runs for _ in range(n)])
    frequency = ((noisy < lo) | (noisy > hi)).any(axis=(1, 2)).mean()
    # the edge side alone has probability ≈ p/2; the union bound p is never exceeded
    assert 0.4 * p < frequency < p
    # narrower ranges than the derived ones exceed the bound; one not holding the signal is 1
    assert clip_probability(Ranges(((5, -1.2, 1.2),)), runs, clients) > p
    assert clip_probability(Ranges(((5, -0.9, 0.9),)), runs, clients) == 1.0
    assert tail_factor(1e-15, 10**8) == pytest.approx(norm.isf(1e-15 / 2e8))
