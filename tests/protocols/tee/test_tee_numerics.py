"""Decoded distances and Gram matrices against plaintext references, across σ²/Var."""

import math
import warnings
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.tee import (
    TEEConfig,
    TEEPrecisionWarning,
    TEEProtocol,
    estimated_relative_error,
)
from fedsafe.protocols.tee.numerics import RELIABLE, exact_sum, split_bits, split_gram


def pipeline(rule="multi_krum", f=0, **params):
    return SimpleNamespace(rule_name=rule, pre=[], f=f, rule_params=params, previous=None)


def updates(n, d, seed):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def reference_distances(g):
    """‖g_i − g_j‖² by direct differences in float64 (no Gram expansion)."""
    g = g.double()
    return ((g[:, None, :] - g[None, :, :]) ** 2).sum(-1)


def decode_round(g, *, rho, arithmetic):
    n = g.shape[0]
    clip = float(torch.linalg.vector_norm(g.double(), dim=1).max())  # nothing clipped; Var = clip²/d
    cfg = TEEConfig(noise_ratio=rho, clip=clip, arithmetic=arithmetic, processes=False)
    with TEEProtocol(cfg) as proto:
        agg = proto.aggregate([Message(i, g[i]) for i in range(n)], pipeline(), RoundContext(1, 0, tuple(range(n)), 0))
        gram, dist = proto.session.enclave.handler.last_decoded
    return agg, gram, dist


def max_rel_offdiag(a, b):
    off = ~torch.eye(a.shape[0], dtype=torch.bool)
    return float(((a - b).abs()[off] / b.abs()[off]).max())


@pytest.mark.parametrize("rho", [1e2, 1e4, 1e6, 1e8])
def test_exact_decoding_matches_plaintext_distances_and_gram(rho):
    g = updates(10, 2000, seed=int(math.log10(rho)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TEEPrecisionWarning)  # exact mode must not warn
        agg, gram, dist = decode_round(g, rho=rho, arithmetic="exact")
    err = max_rel_offdiag(dist, reference_distances(g))
    assert err < 1e-9
    assert err <= estimated_relative_error(rho, 2000, "exact")
    g64 = g.double()
    ref_gram = g64 @ g64.T
    assert float((gram - ref_gram).abs().max() / ref_gram.abs().max()) < 1e-9
    assert agg.metrics["decode_error_estimate"] < RELIABLE


@pytest.mark.parametrize("rho", [1e2, 1e4, 1e6, 1e8])
def test_float64_decoding_error_grows_with_rho_and_is_warned(rho):
    g = updates(10, 2000, seed=10 + int(math.log10(rho)))
    estimate = estimated_relative_error(rho, 2000, "float64")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, dist = decode_round(g, rho=rho, arithmetic="float64")
    err = max_rel_offdiag(dist, reference_distances(g))
    assert err <= estimate  # the estimate that drives the warning is not optimistic
    assert err > 1e-17 * rho  # ...and the cancellation is real: ≈ u·ρ at least
    warned = any(issubclass(w.category, TEEPrecisionWarning) for w in caught)
    assert warned == (estimate > RELIABLE)
    if rho == 1e8:
        assert warned and err > 1e-9  # the paper's scheme misses 1e-9 here; exact mode does not


def test_split_gram_high_part_is_exact_and_total_accurate():
    rng = np.random.default_rng(1)
    n, d = 5, 40
    y = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-3, 4, size=(n, 1)) * 1e4
    hi, lo = split_gram(torch.from_numpy(y))
    beta = split_bits(d)
    assert d * 4**beta <= 2**53
    fy = [[Fraction(v) for v in row] for row in y]
    for i in range(n):
        for j in range(n):
            exact = sum(a * b for a, b in zip(fy[i], fy[j]))
            total = Fraction(float(hi[i, j])) + Fraction(float(lo[i, j]))
            scale = max(abs(v) for v in y[i]) * max(abs(v) for v in y[j]) * d
            assert abs(float(total - exact)) <= 2.0**-53 * 2.0**-beta * scale * 4
    # the high part alone equals the exact Gram of the rounded rows (checked by re-splitting)
    unit = 2.0 ** (np.frexp(np.abs(y).max(axis=1))[1] - beta)
    yh = np.round(y / unit[:, None]) * unit[:, None]
    fyh = [[Fraction(v) for v in row] for row in yh]
    for i in range(n):
        for j in range(n):
            assert Fraction(float(hi[i, j])) == sum(a * b for a, b in zip(fyh[i], fyh[j]))


def test_exact_sum_matches_math_fsum():
    rng = np.random.default_rng(2)
    big = rng.standard_normal((6, 4, 4)) * 1e12
    terms = [big[0], big[1], -big[0], rng.standard_normal((4, 4)), -big[1], big[2], -big[2] + 1e-3]
    got = exact_sum([torch.from_numpy(t) for t in terms]).numpy()
    want = np.array([[math.fsum(t[i, j] for t in terms) for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)


def test_gram_identity_of_the_encoding():
    """⟨Y¹_i,Y¹_j⟩ + ⟨Y²_i,Y²_j⟩ = 2⟨g_i,g_j⟩ + C·[i=j] on what the accelerators received."""
    g = updates(6, 500, seed=3)
    agg, _, _ = decode_round(g, rho=1e4, arithmetic="exact")
    y1, y2 = agg.seen["accelerator_1"]["Y"], agg.seen["accelerator_2"]["Y"]
    clip = float(torch.linalg.vector_norm(g.double(), dim=1).max())
    c = 2 * 1e4 * clip**2
    lhs = y1 @ y1.T + y2 @ y2.T
    g64 = g.double()
    rhs = 2 * g64 @ g64.T + c * torch.eye(6, dtype=torch.float64)
    assert float((lhs - rhs).abs().max()) < 1e-12 * c
