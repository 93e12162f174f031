"""The sampling mechanisms of Remark 1 / Assumption 2: what each draws, its moments, and its
reproducibility from a seeded generator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.privacy.inherent import client_update, gd, gsgd, sgd_iid


def _grads(n: int = 10, d: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_sgd_iid_is_mean_of_b_distinct_rows():
    n, b = 10, 4
    # row j = 2**j in coordinate 0 encodes which rows were averaged
    g = torch.zeros(n, 2, dtype=torch.float64)
    g[:, 0] = 2.0 ** torch.arange(n, dtype=torch.float64)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        code = int(round(float(sgd_iid(g, b, generator=gen)[0]) * b))
        assert bin(code).count("1") == b  # b distinct rows, each weight 1/B


def test_gd_is_the_mean_and_noise_has_the_right_scale():
    g = _grads()
    torch.testing.assert_close(gd(g), g.mean(0))
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([gd(g, noise_std=0.5, generator=gen) - g.mean(0) for _ in range(1000)])
    assert abs(float(draws.var()) - 0.25) < 0.03  # 3000 values: ~4.6 standard errors


def test_gsgd_moments_match_assumption_2():
    g = _grads(n=6, d=3)
    n, b = g.shape[0], 2
    x = gsgd(g, b, generator=torch.Generator().manual_seed(1), num=200_000)
    mean = x.mean(0)
    cov = torch.cov(x.T, correction=0)
    target = (g.T @ g / (b * n)).numpy()
    se = np.sqrt((np.outer(np.diag(target), np.diag(target)) + target**2) / x.shape[0])
    assert np.all(np.abs(cov.numpy() - target) <= 6 * se + 1e-12)
    torch.testing.assert_close(mean, g.mean(0), atol=6 * math.sqrt(float(target.max()) / x.shape[0]), rtol=0)


def test_seeded_generators_reproduce():
    g = _grads()
    for mech, noise in [("sgd_iid", "isotropic"), ("gsgd", "wf_na"), ("gd", "isotropic")]:
        a = client_update(g, mechanism=mech, noise=noise, sigma=0.3, batch_size=3, generator=torch.Generator().manual_seed(7))
        b = client_update(g, mechanism=mech, noise=noise, sigma=0.3, batch_size=3, generator=torch.Generator().manual_seed(7))
        assert torch.equal(a, b)


def test_client_update_validation():
    g = _grads()
    with pytest.raises(ValueError, match="mechanism must be one of"):
        client_update(g, mechanism="fedavg", batch_size=2)
    with pytest.raises(ValueError, match="noise must be one of"):
        client_update(g, mechanism="gsgd", batch_size=2, noise="laplace", sigma=1.0)
    with pytest.raises(ValueError, match="needs sigma > 0"):
        client_update(g, mechanism="gsgd", batch_size=2, noise="isotropic")
    with pytest.raises(ValueError, match="batch_size B must be in"):
        client_update(g, mechanism="sgd_iid", batch_size=11)
