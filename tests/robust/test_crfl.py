"""CRFL (Xie et al., ICML 2021): the certified radius against the paper's closed form written
out independently (the reference code's own schedule and loops), its convention differences
from the reference code (each in a test named for it), the model clipping and the noise's
source."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import norm

from fedsafe.core.randomness import RandomSource
from fedsafe.robust.crfl import CLIP_EPS, certified_radius, clip_model, perturb_model, vote_bounds


def _reference_radius(pa, pb, sigma_train, sigma_test, T, t_adv, N, R, n_B, q_B, gamma, eta, samples=60000):
    # the closed form as the reference's cal_prob_bound computes it, for its MNIST settings
    tau = samples / N / n_B
    L_z = math.sqrt(2 + 2 * 3 + 3**2)
    weighted = sum((1 / N) ** 2 for _ in range(R))
    fraction = -math.log(1 - (math.sqrt(pa) - math.sqrt(pb)) ** 2) * sigma_train**2
    denominator = 2 * R * tau**2 * L_z**2 * weighted * gamma**2 * eta**2 * (q_B**2 / n_B**2)
    contract = 1.0
    for epoch in range(t_adv + 1, T):
        contract *= 2 * norm.cdf((epoch * 0.1 + 2) / sigma_train) - 1
    contract *= 2 * norm.cdf((T * 0.1 + 2) / sigma_test) - 1
    return math.sqrt(fraction / (denominator * contract))


@pytest.mark.parametrize("pa,pb", [(0.9, 0.05), (0.6, 0.3), (0.99, 0.001)])
@pytest.mark.parametrize("T,t_adv", [(100, 10), (50, 49), (20, 1)])
def test_radius_against_the_closed_form(pa, pb, T, t_adv):
    N, R, n_B, q_B, gamma, eta, s_train, s_test = 40, 2, 64, 20, 10.0, 0.1, 0.01, 0.02
    got = certified_radius(
        pa, pb, sigma_train=s_train, sigma_test=s_test, rho=[0.1 * t + 2 for t in range(1, T + 1)],
        attack_round=t_adv, attackers=R, weights=[1 / N] * R, local_iters=60000 / N / n_B,
        lipschitz=math.sqrt(17), scale=gamma, lr=eta, poison_fraction=q_B / n_B,
    )
    assert got == pytest.approx(_reference_radius(pa, pb, s_train, s_test, T, t_adv, N, R, n_B, q_B, gamma, eta), rel=1e-12)


def _kw(**over):
    kw = dict(sigma_train=0.01, sigma_test=0.01, rho=[2.0] * 10, attack_round=3, attackers=1, weights=[0.1],
              local_iters=10.0, lipschitz=1.0, scale=5.0, lr=0.1, poison_fraction=0.2)
    kw.update(over)
    return kw


def test_rho_is_the_norm_training_clipped_to_not_the_references_uncapped_schedule():
    # the reference trains with min(0.1t + 2, param_clip_thres) but certifies with 0.1t + 2;
    # fedsafe certifies with the norms passed, so a cap changes the radius
    capped = certified_radius(0.8, 0.1, **_kw(sigma_train=1.0, sigma_test=1.0, rho=[min(0.1 * t + 2, 2.3) for t in range(1, 11)]))
    uncapped = certified_radius(0.8, 0.1, **_kw(sigma_train=1.0, sigma_test=1.0, rho=[0.1 * t + 2 for t in range(1, 11)]))
    assert capped > uncapped > 0  # tighter clipping contracts more: a larger radius


def test_no_certificate_when_p_a_is_not_above_p_b_where_the_reference_fails():
    assert certified_radius(0.4, 0.4, **_kw()) == 0.0
    assert certified_radius(0.3, 0.5, **_kw()) == 0.0


def test_p_a_one_is_computed_not_the_references_sentinel():
    r = certified_radius(1.0, 0.2, **_kw())
    assert math.isfinite(r) and r != 100000 and r > certified_radius(0.99, 0.2, **_kw())
    assert certified_radius(1.0, 0.0, **_kw()) == math.inf


def test_radius_grows_with_the_noise_and_shrinks_with_the_attack():
    base = certified_radius(0.8, 0.1, **_kw())
    assert certified_radius(0.8, 0.1, **_kw(sigma_train=0.02, sigma_test=0.02)) > base
    assert certified_radius(0.8, 0.1, **_kw(scale=10.0)) == pytest.approx(base / 2)
    assert certified_radius(0.8, 0.1, **_kw(attackers=2, weights=[0.1, 0.1])) == pytest.approx(base / 2)


def test_vote_bounds_as_the_reference_hoeffding():
    lo, hi = vote_bounds(0.9, 0.05, 1000, 0.001)
    h = math.sqrt(math.log(1 / 0.001) / 2 / 1000)
    assert (lo, hi) == (pytest.approx(0.9 - h), pytest.approx(0.05 + h))
    assert vote_bounds(0.0, 1.0, 10, 0.5) == (1e-8, 1 - 1e-8)


def test_clip_model_with_the_references_epsilon():
    w = torch.full((4,), 3.0, dtype=torch.float64)  # norm 6
    out = clip_model(w, 2.0)
    torch.testing.assert_close(out, w * (2.0 / (6.0 + CLIP_EPS)))
    assert float(torch.linalg.vector_norm(out)) < 2.0
    small = torch.tensor([0.1, 0.2])
    same = clip_model(small, 2.0)
    assert torch.equal(same, small) and same is not small


def test_noise_comes_from_the_sources_stream_secure_by_default():
    w = torch.zeros(200_000, dtype=torch.float64)
    seeded = RandomSource.seeded(3)
    a = perturb_model(w, 0.5, seeded.stream("robust.crfl", 1))
    b = perturb_model(w, 0.5, seeded.stream("robust.crfl", 1))
    assert torch.equal(a, b)  # seeded: reproducible (and not private)
    assert float(a.std()) == pytest.approx(0.5, rel=0.01) and abs(float(a.mean())) < 0.01
    s1 = perturb_model(w, 0.5, RandomSource.secure(3).stream("robust.crfl", 1))
    s2 = perturb_model(w, 0.5, RandomSource.secure(3).stream("robust.crfl", 1))
    assert not torch.equal(s1, s2)  # a fresh OS secret each source: not derivable from the seed
    assert float(s1.std()) == pytest.approx(0.5, rel=0.01)
    assert torch.equal(perturb_model(w[:3], 0.0, seeded.stream("x")), w[:3])


@pytest.mark.parametrize("kw,match", [
    (dict(sigma_train=0.0), r"crfl: sigma_train must be > 0, got 0.0"),
    (dict(attack_round=11), r"crfl: attack_round must be an integer in \[1, T\] = \[1, 10\], got 11"),
    (dict(attackers=2), r"crfl: attackers must be an integer >= 1 with one weight each"),
    (dict(rho=[2.0, 2.0, 2.0, -1.0]), r"crfl: rho must be > 0, got -1.0"),
    (dict(lr=math.inf), r"crfl: lr must be a finite number"),
])
def test_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        certified_radius(0.8, 0.1, **_kw(**kw))
    with pytest.raises(ValueError, match=r"crfl: p_a and p_b must be in \[0, 1\]"):
        certified_radius(1.2, 0.1, **_kw())
    with pytest.raises(ValueError, match=r"crfl: samples must be an integer >= 1"):
        vote_bounds(0.5, 0.2, 0, 0.1)
    with pytest.raises(ValueError, match=r"crfl: rho must be > 0"):
        clip_model(torch.ones(2), 0.0)
