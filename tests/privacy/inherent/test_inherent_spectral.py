"""Gram-trick and Lanczos spectra against numpy.linalg.eigh of the explicit d × d matrix, and
Theorem 1's span check against an explicit least-squares projection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.privacy.inherent import (
    aggregate_spectrum,
    covariance_spectrum,
    span_basis,
    span_check,
    subspace_lambda_min,
)


def _rows(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


@pytest.mark.parametrize("n,d", [(5, 12), (12, 5), (7, 7)])
@pytest.mark.parametrize("method", ["gram", "svd"])
def test_covariance_spectrum_matches_explicit_eigh(n, d, method):
    a = _rows(n, d, n * 100 + d)
    scale = 1 / (3 * n)
    explicit = np.sort(np.linalg.eigh(scale * a.T @ a)[0])[::-1]
    sp = covariance_spectrum(torch.from_numpy(a).float(), scale, method=method)  # float32 input
    k = min(n, d)
    np.testing.assert_allclose(sp.eigenvalues, explicit[:k], rtol=1e-5, atol=1e-12)
    assert sp.rank == np.linalg.matrix_rank(a) == k
    assert sp.singular == (k < d)
    assert sp.lambda_min == (0.0 if k < d else pytest.approx(explicit[-1], rel=1e-5))


def test_rank_deficient_rows_and_zero_matrix():
    a = _rows(3, 6, 1)
    a = np.vstack([a, a[0] + 2 * a[1]])  # 4 rows, rank 3
    sp = covariance_spectrum(a)
    assert sp.rank == 3 and sp.lambda_min == 0.0
    assert sp.smallest_nonzero == pytest.approx(np.sort(np.linalg.eigvalsh(a.T @ a))[-3], rel=1e-9)
    z = covariance_spectrum(np.zeros((3, 4)))
    assert z.rank == 0 and z.lambda_min == 0.0 and z.smallest_nonzero == 0.0


def test_aggregate_dense_lanczos_and_explicit_agree():
    d = 60
    users = [_rows(30, d, s) for s in range(4)]
    scales = [1 / 30, 1 / 60, 1 / 30, 1 / 90]
    explicit = sum(s * u.T @ u for u, s in zip(users, scales))
    w = np.linalg.eigvalsh(explicit)
    dense = aggregate_spectrum(users, scales, method="dense")
    lanczos = aggregate_spectrum(users, scales, method="lanczos")
    assert dense.rank == d and dense.lambda_min == pytest.approx(w[0], rel=1e-10)
    assert lanczos.rank == d and lanczos.lambda_min == pytest.approx(w[0], rel=1e-7)
    assert lanczos.eigenvalues[0] == pytest.approx(w[-1], rel=1e-9)


def test_aggregate_singular_when_fewer_records_than_dimensions():
    users = [_rows(4, 20, s) for s in range(3)]
    sp = aggregate_spectrum(users, [0.5, 0.5, 0.5], method="lanczos")  # n < d: the Gram path
    assert sp.singular and sp.rank == 12 and sp.lambda_min == 0.0
    explicit = np.sort(np.linalg.eigvalsh(0.5 * sum(u.T @ u for u in users)))[::-1]
    np.testing.assert_allclose(sp.eigenvalues, explicit[:12], rtol=1e-9)


def test_span_check_against_explicit_projection():
    rows = _rows(4, 7, 3)
    rng = np.random.default_rng(9)
    inside = rng.normal(size=4) @ rows
    q, _ = np.linalg.qr(rows.T)
    outside = inside + 0.3 * (np.eye(7) - q @ q.T) @ rng.normal(size=7)
    cands = np.vstack([inside, outside, np.zeros(7)])
    ok, rel = span_check(cands, rows)
    assert ok.tolist() == [True, False, True]
    # reference: least-squares residual of g ≈ rowsᵀ c
    coef, *_ = np.linalg.lstsq(rows.T, outside, rcond=None)
    ref = np.linalg.norm(outside - rows.T @ coef) / np.linalg.norm(outside)
    assert rel[1] == pytest.approx(ref, rel=1e-9)
    assert rel[0] < 1e-12


def test_subspace_lambda_min_matches_projected_matrix():
    d, k = 6, 3
    rng = np.random.default_rng(4)
    basis_true, _ = np.linalg.qr(rng.normal(size=(d, k)))
    users = [rng.normal(size=(5, k)) @ basis_true.T, rng.normal(size=(2, k)) @ basis_true.T]
    basis = span_basis(np.vstack(users))
    assert basis.shape == (d, k)
    lam = subspace_lambda_min(users, [0.2, 0.2], basis)
    ref0 = np.linalg.eigvalsh(basis.T @ (0.2 * users[0].T @ users[0]) @ basis).min()
    assert lam[0] == pytest.approx(ref0, rel=1e-9)
    assert lam[1] == 0.0  # two records cannot span the 3-dimensional subspace
