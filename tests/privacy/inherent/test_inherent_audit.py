"""The per-round auditor: its spectra against explicit matrices, its RDP curves against the bound
functions, and the verdict for each reason the paper gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.privacy.inherent import (
    audit_round,
    clip_rows,
    dp_table1_closed_form,
    rdp_theorem2,
    rdp_theorem4,
)

C = 1.0


def _users(n_users: int, n: int, d: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [clip_rows(torch.randn(n, d, generator=g, dtype=torch.float64), C) for _ in range(n_users)]


def test_iid_sampling_has_no_dp_without_noise():
    a = audit_round(_users(4, 10, 3), mechanism="sgd_iid", batch_size=2, clip=C, delta=1e-5)
    assert not a.dp_possible and a.primary is None
    assert a.verdict.startswith("no DP without noise: IID minibatch sampling")
    assert "B/D = 0.2" in a.verdict
    assert np.isinf(a.rdp["theorem1"]).all() and a.epsilon["theorem1"] == np.inf


def test_gd_without_noise_is_deterministic():
    a = audit_round(_users(4, 10, 3), mechanism="gd", batch_size=10, clip=C)
    assert not a.dp_possible and "deterministic" in a.verdict


def test_singular_covariance_verdict_with_rank():
    users = _users(3, 4, 20)  # 12 records in d = 20
    a = audit_round(users, mechanism="gsgd", batch_size=2, clip=C, delta=1e-5)
    assert not a.dp_possible
    assert "no DP without noise: singular covariance, rank 12 < d=20" in a.verdict
    assert a.aggregate_rank == 12 and a.aggregate_lambda_min == 0.0
    assert a.ranks.tolist() == [4, 4, 4] and a.Lambda == 0.0
    assert np.isinf(a.rdp["theorem2"]).all()
    assert "theorem3[conditional]" in a.rdp


def test_nonsingular_gsgd_gives_theorem2_epsilon():
    users = _users(6, 60, 3, seed=1)
    b = 2
    # the conservative options (the former defaults): update scale 1/(BD), Λ − s·C²
    a = audit_round(users, mechanism="gsgd", batch_size=b, clip=C, delta=1e-5, scale="update", symmetric=True)
    explicit = [np.linalg.eigvalsh(u.numpy().T @ u.numpy() / (b * 60)).min() for u in users]
    np.testing.assert_allclose(a.lambda_min, explicit, rtol=1e-10)
    assert a.Lambda == pytest.approx(sum(explicit))
    assert a.Lambda_used == pytest.approx(sum(explicit) - C**2 / (b * 60))
    np.testing.assert_array_equal(
        a.rdp["theorem2"], rdp_theorem2(a.alphas, Lambda=a.Lambda_used, clip=C, dataset_size=60, batch_size=b)
    )
    assert a.dp_possible and a.primary == "theorem2"
    assert a.verdict.startswith("DP without added noise (Theorem 2): ε = ")
    assert np.isfinite(a.epsilon["theorem2"])
    # the aggregate λ_min is at least Λ, so its variant is never worse
    assert a.aggregate_lambda_min >= a.Lambda
    assert a.epsilon["theorem2[aggregate]"] <= a.epsilon["theorem2"]
    # the defaults: Eq. (16) scale 1/D and the round's own Λ, less conservative
    e16 = audit_round(users, mechanism="gsgd", batch_size=b, clip=C, delta=1e-5)
    assert e16.scale == "eq16"
    explicit16 = [np.linalg.eigvalsh(u.numpy().T @ u.numpy() / 60).min() for u in users]
    np.testing.assert_allclose(e16.lambda_min, explicit16, rtol=1e-10)
    assert e16.Lambda_used == e16.Lambda == pytest.approx(sum(explicit16))
    np.testing.assert_array_equal(
        e16.rdp["theorem2"], rdp_theorem2(e16.alphas, Lambda=e16.Lambda, clip=C, dataset_size=60, batch_size=b)
    )
    assert e16.epsilon["theorem2"] < a.epsilon["theorem2"]
    assert e16.verdict.startswith("DP without added noise (Theorem 2): ε = ")


def test_lambda_too_small_gives_empty_domain():
    users = _users(2, 30, 3, seed=2)
    # the update scale (B = 50 divides Λ by 50) empties the domain; Eq. (16) does not
    a = audit_round(users, mechanism="gsgd", batch_size=50, clip=C, delta=1e-5, scale="update", symmetric=True)
    assert not a.dp_possible and "domain (1, DΛ/C²) is empty" in a.verdict
    assert audit_round(users, mechanism="gsgd", batch_size=50, clip=C, delta=1e-5).dp_possible
    flat = [u * torch.tensor([1.0, 1.0, 0.05], dtype=torch.float64) for u in users]  # λ_min ≈ 1e-3 < C²/D
    e16 = audit_round(flat, mechanism="gsgd", batch_size=50, clip=C, delta=1e-5)
    assert e16.Lambda < C**2 / 30 and e16.aggregate_lambda_min < C**2 / 30
    assert not e16.dp_possible and "domain (1, DΛ/C²) is empty" in e16.verdict


def test_noise_rows_and_wf_na_verdicts():
    users = _users(5, 8, 6, seed=3)  # singular without noise
    wf = audit_round(users, mechanism="gsgd", noise="wf_na", sigma2=0.5, batch_size=2, clip=C, delta=1e-5)
    assert wf.dp_possible and wf.primary == "theorem4"
    np.testing.assert_array_equal(
        wf.rdp["theorem4"], rdp_theorem4(wf.alphas, num_users=5, sigma2=0.5, clip=C, dataset_size=8, batch_size=2)
    )
    assert wf.verdict.startswith("DP with WF-NA noise (Theorem 4): ε = ")
    for mech in ("sgd_iid", "gd"):
        bad = audit_round(users, mechanism=mech, noise="wf_na", sigma2=0.5, batch_size=2, clip=C)
        assert not bad.dp_possible and "Table 1 rows 2/4" in bad.verdict
    iso = audit_round(users, mechanism="gd", noise="isotropic", sigma2=0.5, batch_size=2, clip=C, delta=1e-5)
    assert iso.epsilon["table1:gd+isotropic"] == pytest.approx(
        dp_table1_closed_form("gd+isotropic", 1e-5, num_users=5, sigma2=0.5, clip=C, dataset_size=8, batch_size=2)
    )
    assert "Table 1, gd+isotropic" in iso.verdict


def test_candidate_span_check_and_input_validation():
    users = _users(3, 3, 8, seed=4)  # 9 records in d = 8: full rank
    rows = torch.cat(users)
    inside = 0.3 * rows[0] + 0.2 * rows[4]
    a = audit_round(users, mechanism="gsgd", batch_size=1, clip=C, candidates=inside[None, :])
    assert a.candidates_in_span.tolist() == [True]
    small = _users(3, 2, 8, seed=5)
    e = torch.zeros(8, dtype=torch.float64)
    e[0] = 1.0
    out = e - torch.cat(small).T @ torch.linalg.lstsq(torch.cat(small).T, e).solution
    b = audit_round(small, mechanism="gsgd", batch_size=1, clip=C, candidates=(out / out.norm())[None, :])
    assert b.candidates_in_span.tolist() == [False]
    assert "outside the span" in b.verdict and "Theorem 1" in b.verdict
    with pytest.raises(ValueError, match="norm .* > clip"):
        audit_round([2 * u for u in users], mechanism="gsgd", batch_size=1, clip=C)
    with pytest.raises(ValueError, match="needs sigma2 > 0"):
        audit_round(users, mechanism="gsgd", noise="wf_na", batch_size=1, clip=C)
