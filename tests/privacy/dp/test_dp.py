"""DP-FedAvg building blocks (fedsafe.privacy.dp.mechanisms) and the [dp] config, against numpy, hand
computations and empirical noise statistics."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedsafe.privacy.dp import accounting
from fedsafe.privacy.dp.config import DPConfig
from fedsafe.privacy.dp.mechanisms import (
    adaptive_clip_split,
    client_noise,
    clip_updates,
    default_count_stddev,
    distributed_noise_multiplier,
    dp_mean,
    noised_clipped_fraction,
    server_noise,
    unclipped_indicator,
    update_clip,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- clipping


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clip_updates_matches_numpy(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 17)) * rng.uniform(0.01, 5, size=(9, 1))
    x[2] = 0.0  # zero stays zero
    x[4] *= 0.5 / np.linalg.norm(x[4])  # exactly inside
    clip = 1.3
    t = torch.tensor(x, dtype=dtype)
    before = t.clone()
    clipped, norms = clip_updates(t, clip)

    ref_norms = np.linalg.norm(x, axis=1)
    ref = x * np.minimum(1.0, clip / np.where(ref_norms == 0, np.inf, ref_norms))[:, None]
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(clipped.numpy(), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(norms.numpy(), ref_norms, rtol=tol)
    assert torch.equal(t, before), "input modified"
    assert clipped.dtype == dtype
    assert torch.all(clipped[2] == 0)
    assert torch.equal(clipped[4], t[4])  # unclipped rows pass through unchanged
    assert float(torch.linalg.vector_norm(clipped, dim=1).max()) <= clip * (1 + 10 * tol)


def test_clip_updates_errors() -> None:
    x = torch.ones(3, 4)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="clip"):
            clip_updates(x, bad)
    with pytest.raises(ValueError, match="2-D"):
        clip_updates(torch.ones(4), 1.0)
    with pytest.raises(ValueError, match="floating"):
        clip_updates(torch.ones(3, 4, dtype=torch.int64), 1.0)
    y = x.clone()
    y[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"non-finite update rows \[1\]"):
        clip_updates(y, 1.0)


def test_unclipped_indicator_boundary() -> None:
    norms = torch.tensor([0.0, 0.99, 1.0, 1.01])
    assert unclipped_indicator(norms, 1.0).tolist() == [True, True, True, False]


# --------------------------------------------------------------------------- noise


def test_server_noise_std_and_placements() -> None:
    z, clip, d = 1.7, 0.6, 200_000
    g = _gen(1)
    noise = server_noise(d, clip=clip, z=z, placement="central", generator=g)
    assert noise.shape == (d,) and noise.dtype == torch.float32
    # std of a 200k-sample std estimate is ~0.16%: 1% is > 6 standard errors
    assert float(noise.std()) == pytest.approx(z * clip, rel=0.01)
    assert abs(float(noise.mean())) < 5 * z * clip / math.sqrt(d)
    for placement in ("local", "distributed"):
        state = g.get_state()
        out = server_noise(d, clip=clip, z=z, placement=placement, generator=g)
        assert torch.all(out == 0)
        assert torch.equal(g.get_state(), state), "zeros must not consume randomness"
    with pytest.raises(ValueError, match="placement"):
        server_noise(3, clip=1.0, z=1.0, placement="everywhere", generator=g)
    with pytest.raises(ValueError, match="z must be"):
        server_noise(3, clip=1.0, z=-1.0, placement="central", generator=g)


def test_client_noise_local_std_per_client() -> None:
    z, clip, n, d = 0.8, 2.0, 4, 100_000
    noise = client_noise(n, d, clip=clip, z=z, placement="local", generator=_gen(2))
    assert noise.shape == (n, d)
    np.testing.assert_allclose(noise.std(dim=1).numpy(), z * clip, rtol=0.015)
    g = _gen(3)
    state = g.get_state()
    assert torch.all(client_noise(n, 5, clip=clip, z=z, placement="central", generator=g) == 0)
    assert torch.equal(g.get_state(), state)


def test_client_noise_distributed_sum_has_central_variance() -> None:
    z, clip, n, d = 1.3, 0.5, 10, 100_000
    shares = client_noise(n, d, clip=clip, z=z, placement="distributed", generator=_gen(4))
    np.testing.assert_allclose(shares.std(dim=1).numpy(), z * clip / math.sqrt(n), rtol=0.015)
    total = shares.double().sum(dim=0)
    assert float(total.var()) == pytest.approx((z * clip) ** 2, rel=0.02)

    # sized for 16, only 10 arrive: the sum carries (10/16)(zC)^2, i.e. multiplier z*sqrt(10/16)
    shares = client_noise(n, d, clip=clip, z=z, placement="distributed", n_expected=16, generator=_gen(5))
    z_eff = distributed_noise_multiplier(z, n, 16)
    assert z_eff == pytest.approx(z * math.sqrt(10 / 16))
    assert float(shares.double().sum(dim=0).std()) == pytest.approx(z_eff * clip, rel=0.01)
    with pytest.raises(ValueError, match="n_expected"):
        client_noise(n, 3, clip=clip, z=z, placement="distributed", n_expected=0, generator=_gen())


def test_noise_is_reproducible_from_the_generator() -> None:
    a = client_noise(3, 7, clip=1.0, z=1.0, placement="local", generator=_gen(9))
    b = client_noise(3, 7, clip=1.0, z=1.0, placement="local", generator=_gen(9))
    assert torch.equal(a, b)


def test_dp_mean() -> None:
    s = torch.linspace(-1, 1, 6, dtype=torch.float64)
    out = dp_mean(s, clip=1.0, z=0.0, expected_clients=4.0, generator=_gen())
    assert torch.equal(out, s / 4)
    # the noise is exactly server_noise's central draw from the same stream, divided by m
    out = dp_mean(s, clip=0.7, z=1.2, expected_clients=2.5, generator=_gen(11))
    noise = server_noise(6, clip=0.7, z=1.2, placement="central", generator=_gen(11), dtype=torch.float64)
    torch.testing.assert_close(out, (s + noise) / 2.5)
    big = dp_mean(torch.zeros(200_000), clip=0.7, z=1.2, expected_clients=2.5, generator=_gen(12))
    assert float(big.std()) == pytest.approx(1.2 * 0.7 / 2.5, rel=0.01)
    with pytest.raises(ValueError, match="expected_clients"):
        dp_mean(s, clip=1.0, z=1.0, expected_clients=0, generator=_gen())


# --------------------------------------------------------------------------- adaptive clipping


def test_adaptive_clip_split_formula() -> None:
    z, sigma_b = 1.0, 2.5
    z_delta = adaptive_clip_split(z, sigma_b)
    assert z_delta == pytest.approx((1.0 - 1.0 / 25.0) ** -0.5)  # = 1.0206207261596576
    assert z_delta == pytest.approx(1.0206207261596576, rel=1e-14)
    assert z_delta**-2 + (2 * sigma_b) ** -2 == pytest.approx(z**-2)
    assert adaptive_clip_split(0.0, 1.0) == 0.0
    assert default_count_stddev(100) == 5.0


def test_adaptive_split_is_one_gaussian_of_multiplier_z() -> None:
    # Theorem 1 as dp-accounting sees it: the update sum (z_delta) and the centred count
    # (sensitivity 1/2, std sigma_b -> multiplier 2 sigma_b) compose to one Gaussian with z.
    z, sigma_b = 0.9, 1.25
    pair = dpa.ComposedDpEvent([dpa.GaussianDpEvent(adaptive_clip_split(z, sigma_b)), dpa.GaussianDpEvent(2 * sigma_b)])
    orders = [2.0, 8.0, 32.0]
    a = dpa.rdp.RdpAccountant(orders).compose(pair)
    b = dpa.rdp.RdpAccountant(orders).compose(dpa.GaussianDpEvent(z))
    np.testing.assert_allclose(a.rdp, b.rdp, rtol=1e-12)


@pytest.mark.parametrize("z, sigma_b", [(1.0, 0.5), (1.0, 0.4), (3.0, 1.0)])
def test_adaptive_clip_split_refuses_impossible(z: float, sigma_b: float) -> None:
    with pytest.raises(ValueError, match=rf"2\*sigma_b > z.*sigma_b > {z / 2:g}") as err:
        adaptive_clip_split(z, sigma_b)
    assert f"z={z:g}" in str(err.value) and f"sigma_b={sigma_b:g}" in str(err.value)
    with pytest.raises(ValueError, match="sigma_b"):
        adaptive_clip_split(1.0, 0.0)


def test_noised_clipped_fraction() -> None:
    bits = torch.tensor([1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    # no noise: centred sum over the *expected* count
    assert noised_clipped_fraction(bits, sigma_b=0.0, expected_clients=7, generator=_gen()) == pytest.approx(5 / 7)
    assert noised_clipped_fraction(bits, sigma_b=0.0, expected_clients=10, generator=_gen()) == pytest.approx(
        (5 - 3.5) / 10 + 0.5
    )
    # with noise: one float64 standard normal from the generator, times sigma_b
    g_ref = _gen(21)
    eps = float(torch.randn((), generator=g_ref, dtype=torch.float64))
    got = noised_clipped_fraction(bits.float(), sigma_b=0.8, expected_clients=7, generator=_gen(21))
    assert got == pytest.approx((5 - 3.5 + 0.8 * eps) / 7 + 0.5, rel=1e-12)
    g = _gen(22)
    draws = np.array([noised_clipped_fraction(bits, sigma_b=0.8, expected_clients=7, generator=g) for _ in range(4000)])
    assert draws.std() == pytest.approx(0.8 / 7, rel=0.06)
    assert draws.mean() == pytest.approx(5 / 7, abs=4 * 0.8 / 7 / math.sqrt(4000))
    with pytest.raises(ValueError, match="0/1"):
        noised_clipped_fraction(torch.tensor([0.0, 2.0]), sigma_b=1.0, expected_clients=2, generator=_gen())
    with pytest.raises(ValueError, match="1-D"):
        noised_clipped_fraction(torch.ones(2, 2), sigma_b=1.0, expected_clients=2, generator=_gen())


def test_update_clip_formula() -> None:
    assert update_clip(1.0, 0.8, target_quantile=0.5, clip_lr=0.2) == pytest.approx(math.exp(-0.2 * 0.3))
    assert update_clip(2.0, 0.1, target_quantile=0.5, clip_lr=0.2) == pytest.approx(2.0 * math.exp(0.08))
    assert update_clip(3.0, 0.5, target_quantile=0.5, clip_lr=0.2) == 3.0
    with pytest.raises(ValueError, match="target_quantile"):
        update_clip(1.0, 0.5, target_quantile=1.5, clip_lr=0.2)
    with pytest.raises(ValueError, match="clip"):
        update_clip(0.0, 0.5, target_quantile=0.5, clip_lr=0.2)


def test_adaptive_clip_tracks_the_quantile() -> None:
    # noiseless: C converges to the target quantile of the update norms
    norms = torch.linspace(0.1, 10.0, 1000)
    clip = 0.2
    for _ in range(400):
        bits = unclipped_indicator(norms, clip)
        frac = noised_clipped_fraction(bits, sigma_b=0.0, expected_clients=1000, generator=_gen())
        clip = update_clip(clip, frac, target_quantile=0.3, clip_lr=0.2)
    assert clip == pytest.approx(float(torch.quantile(norms, 0.3)), rel=0.03)


# --------------------------------------------------------------------------- [dp] config


def test_dpconfig_defaults_and_ranges() -> None:
    cfg = DPConfig()
    assert not cfg.enabled and cfg.clip == 1.0 and cfg.noise_multiplier is None
    assert cfg.placement == "central" and cfg.delta == 1e-5 and cfg.accountant == "pld"
    assert (cfg.target_quantile, cfg.clip_lr, cfg.count_stddev, cfg.target_epsilon) == (0.5, 0.2, None, None)
    for bad in (
        {"clip": 0},
        {"noise_multiplier": -1},
        {"delta": 1.0},
        {"delta": 0},
        {"target_quantile": 1.5},
        {"clip_lr": 0},
        {"count_stddev": 0},
        {"target_epsilon": 0},
        {"placement": "edge"},
        {"accountant": "moments"},
        {"nosie_multiplier": 1.0},
        {"clip": float("inf")},
    ):
        with pytest.raises(ValidationError):
            DPConfig(**bad)


def test_dpconfig_noise_multiplier_xor_target_epsilon() -> None:
    with pytest.raises(ValidationError, match="either dp.noise_multiplier or dp.target_epsilon"):
        DPConfig(noise_multiplier=1.0, target_epsilon=2.0)
    cfg = DPConfig(enabled=True, target_epsilon=2.0)
    # written back without None (as config.to_dict does) and re-read: still valid
    assert DPConfig.model_validate(cfg.model_dump(exclude_none=True)) == cfg
    with pytest.raises(ValidationError, match="placement = 'local'"):
        DPConfig(adaptive=True, placement="local")


def test_dpconfig_plan() -> None:
    cfg = DPConfig(enabled=True, noise_multiplier=1.1, adaptive=True)
    plan = cfg.plan(sampling="poisson", rounds=100, num_clients=1000, q=0.05)
    assert plan.expected_clients == pytest.approx(50.0)
    assert plan.count_stddev == pytest.approx(2.5)
    assert plan.z == 1.1 and plan.value_z == pytest.approx(adaptive_clip_split(1.1, 2.5))
    assert (plan.sampling, plan.neighboring, plan.q) == ("poisson", "add_or_remove_one", 0.05)
    acc = plan.new_accountant()
    plan.compose_round(acc, count=100)
    assert acc.epsilon() == pytest.approx(accounting.epsilon(1.1, 0.05, 100, 1e-5))

    plain = DPConfig(enabled=True).plan(sampling="all", rounds=10, num_clients=20)
    assert (plain.z, plain.value_z, plain.count_stddev, plain.sampling) == (1.0, 1.0, None, "none")

    # 20 clients -> default sigma_b = 1, so z must be < 2
    with pytest.raises(ValueError, match=r"dp.count_stddev \(default expected_clients/20 = 20/20\).*sigma_b > 1.5"):
        DPConfig(enabled=True, adaptive=True, noise_multiplier=3.0).check(sampling="all", rounds=10, num_clients=20)
    with pytest.raises(ValueError, match="dp.accountant: the PLD accountant"):
        DPConfig(enabled=True).check(sampling="fixed", rounds=10, num_clients=100, sample_size=10)
    fixed = DPConfig(enabled=True, accountant="rdp").plan(sampling="fixed", rounds=10, num_clients=100, sample_size=10)
    assert (fixed.sampling, fixed.neighboring) == ("fixed", "replace_one")
    assert (fixed.sample_size, fixed.expected_clients) == (10, 10.0)
    local = DPConfig(enabled=True, placement="local").plan(sampling="poisson", rounds=10, num_clients=100, q=0.1)
    assert (local.sampling, local.neighboring) == ("none", "replace_one")
    DPConfig(enabled=False, adaptive=True, noise_multiplier=30.0).check(sampling="all", rounds=1, num_clients=2)


def test_dpconfig_target_epsilon_calibrates() -> None:
    cfg = DPConfig(enabled=True, target_epsilon=3.0, accountant="rdp")
    plan = cfg.plan(sampling="poisson", rounds=50, num_clients=500, q=0.04)
    eps = accounting.epsilon(plan.z, 0.04, 50, 1e-5, accountant="rdp")
    assert 2.99 < eps <= 3.0
    with pytest.raises(ValueError, match="dp.target_epsilon"):
        DPConfig(enabled=True, target_epsilon=1e6, accountant="rdp").plan(sampling="all", rounds=1, num_clients=10)
