"""Fang et al.'s local model poisoning attacks against Krum and trimmed mean, against naive
twins written from the paper's description, and their effect on the rules they target."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.attacks import ATTACKS, AttackContext


def _ctx(n, f, rule, seed=1):
    agg = AGGREGATORS.get(rule)
    return AttackContext(f=f, n=n, round=1, generator=torch.Generator().manual_seed(seed),
                         aggregate=lambda u: agg(u, f=f))


def _honest(m=16, d=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, d, generator=g, dtype=torch.float64) + 0.3
    x[:, :5] = -x[:, :5].abs() - 0.1  # some coordinates with a negative honest mean, all negative
    x[:, 5:10] = x[:, 5:10].abs() + 0.1  # some with every honest value positive
    return x


def _naive_trimmed(x, f, b, u):
    """Per coordinate, as Fang et al. describe it, with the same uniform draws u (f, d)."""
    out = np.empty((f, x.shape[1]))
    for j in range(x.shape[1]):
        col = x[:, j]
        mu, lo, hi = col.mean(), col.min(), col.max()
        for r in range(f):
            if mu > 0:
                a, c = (lo / b, lo) if lo > 0 else (b * lo, lo)
            elif mu < 0:
                a, c = (hi, b * hi) if hi > 0 else (hi, hi / b)
            else:
                out[r, j] = mu
                continue
            out[r, j] = a + u[r, j] * (c - a)
    return out


@pytest.mark.parametrize("b", [1.5, 2.0, 4.0])
def test_fang_trimmed_mean_against_naive(b):
    x = _honest()
    ctx = _ctx(20, 4, "trimmed_mean")
    u = torch.rand((4, x.shape[1]), generator=torch.Generator().manual_seed(1), dtype=torch.float64).numpy()
    got = ATTACKS.get("fang_trimmed_mean", {"b": b})(x, ctx=ctx)
    np.testing.assert_allclose(got.numpy(), _naive_trimmed(x.numpy(), 4, b, u), rtol=1e-12)
    mu = x.mean(0)
    assert bool(((got < x.amin(0)) | (mu <= 0)).all()) and bool(((got > x.amax(0)) | (mu >= 0)).all())


def test_fang_trimmed_mean_reverses_the_trimmed_mean_more_than_alie():
    x = _honest(seed=4)
    mu = x.mean(0)
    for rule in ("trimmed_mean", "median"):
        ctx = _ctx(20, 4, rule)
        agg = AGGREGATORS.get(rule)
        attacked = agg(torch.cat([x, ATTACKS.get("fang_trimmed_mean", {})(x, ctx=ctx)]), f=4)
        clean = agg(x, f=4)
        assert float(attacked @ mu) < 0.6 * float(clean @ mu), rule
    with pytest.raises(ValueError, match="b must be > 1"):
        ATTACKS.get("fang_trimmed_mean", {"b": 1.0})(x, ctx=_ctx(20, 4, "trimmed_mean"))


def _naive_lambda0(x, n, f):
    m, d = x.shape
    k = n - f - 2
    sums = []
    for i in range(m):
        dists = sorted(float(np.linalg.norm(x[l] - x[i])) for l in range(m) if l != i)
        sums.append(sum(dists[:k]))
    return min(sums) / ((n - 2 * f - 1) * math.sqrt(d)) + max(np.linalg.norm(r) for r in x) / math.sqrt(d)


def test_fang_krum_is_selected_by_krum_with_the_largest_halving_of_lambda():
    x = _honest()
    n, f = 20, 4
    out = ATTACKS.get("fang_krum", {})(x, ctx=_ctx(n, f, "krum"))
    krum = AGGREGATORS.get("krum")
    assert torch.equal(krum(torch.cat([x, out]), f=f), out[0])
    sign = -torch.sign(x.mean(0))
    lam = float(out[0] @ sign) / x.shape[1]
    torch.testing.assert_close(out[0], lam * sign)
    # lambda is lambda_0 / 2^k for the smallest k at which Krum picks the crafted update
    lam0 = _naive_lambda0(x.numpy(), n, f)
    k = round(math.log2(lam0 / lam))
    assert lam == pytest.approx(lam0 / 2**k, rel=1e-12)
    if k > 0:
        bigger = 2 * lam * sign
        assert not torch.equal(krum(torch.cat([x, bigger.expand(f, -1)]), f=f), bigger)
    assert torch.equal(out[1:], out[:1].expand(f - 1, -1))  # eps = 0: copies


def test_fang_krum_companions_and_parameters():
    x = _honest()
    out = ATTACKS.get("fang_krum", {"eps": 1e-3})(x, ctx=_ctx(20, 4, "krum"))
    assert float((out[1:] - out[0]).abs().max()) <= 1e-3 and not torch.equal(out[1], out[0])
    with pytest.raises(ValueError, match="threshold must be > 0"):
        ATTACKS.get("fang_krum", {"threshold": 0.0})(x, ctx=_ctx(20, 4, "krum"))
    assert ATTACKS.get("fang_krum", {})(x, ctx=_ctx(16, 0, "krum")).shape == (0, x.shape[1])
