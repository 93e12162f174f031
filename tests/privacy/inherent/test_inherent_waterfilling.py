"""WF-NA (§5.1): the noise's empirical covariance matches Σ_+ − Σ within sampling error, the sum
with the gradient covariance reaches the target (eigenvalues lifted to ≥ σ², directions kept),
the exact plan never forms d × d, and the block-diagonal variant is only a heuristic.

References are built independently with numpy: Σ = GᵀG/(BD) explicitly, ``eigh``, and the lift
``U max(λ, σ²) Uᵀ``."""

from __future__ import annotations

import numpy as np
import torch

from fedsafe.privacy.inherent import gsgd, wf_na_noise, wf_na_plan


def _lift(cov: np.ndarray, sigma2: float) -> np.ndarray:
    w, u = np.linalg.eigh(cov)
    return (u * np.maximum(w, sigma2)) @ u.T


def _grads(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return g * torch.linspace(0.3, 1.5, d, dtype=torch.float64)  # spread the spectrum


def _assert_cov_close(samples: np.ndarray, target: np.ndarray, k: float = 6.0) -> None:
    """Entrywise within k standard errors: Var(x_a x_b) = T_aa T_bb + T_ab² for centred Gaussians."""
    m = samples.shape[0]
    emp = samples.T @ samples / m
    se = np.sqrt((np.outer(np.diag(target), np.diag(target)) + target**2) / m)
    assert np.all(np.abs(emp - target) <= k * se + 1e-12), np.max(np.abs(emp - target) / (se + 1e-300))


def test_exact_noise_covariance_matches_target_and_keeps_directions():
    n, d, b = 4, 6, 2  # rank 4 < 6: two zero eigenvalues to fill
    g = _grads(n, d, 0)
    cov = (g.T @ g).numpy() / (b * n)
    w, u = np.linalg.eigh(cov)
    sigma2 = float(np.sort(w)[-2] * 0.9)  # the top two eigenvalues stay above σ², the rest get lifted
    target_noise = _lift(cov, sigma2) - cov

    plan = wf_na_plan(g, b, sigma2)
    torch.testing.assert_close(plan.noise_covariance(), torch.from_numpy(target_noise), rtol=1e-10, atol=1e-12)
    x = plan.sample(torch.Generator().manual_seed(1), num=200_000).numpy()
    _assert_cov_close(x, target_noise)

    # gradient covariance + empirical noise covariance: eigenvalues lifted to >= σ², directions kept
    total = cov + x.T @ x / x.shape[0]
    wt = np.linalg.eigvalsh(total)
    assert wt.min() >= sigma2 * 0.98
    kept = u[:, w >= sigma2]
    assert kept.shape[1] == 2
    assert np.abs(x @ kept).max() < 1e-10  # no noise at all along eigen-directions already >= σ²
    np.testing.assert_allclose(kept.T @ total @ kept, np.diag(w[w >= sigma2]), atol=1e-10)
    assert np.isclose(plan.added_variance(), np.trace(target_noise))


def test_gsgd_plus_wf_na_update_has_the_lifted_covariance():
    n, d, b = 5, 4, 3
    g = _grads(n, d, 2)
    cov = (g.T @ g).numpy() / (b * n)
    sigma2 = float(np.median(np.linalg.eigvalsh(cov)))
    gen = torch.Generator().manual_seed(4)
    m = 150_000
    x = gsgd(g, b, generator=gen, num=m) + wf_na_noise(g, b, sigma2, generator=gen, num=m)
    _assert_cov_close((x - g.mean(0)).numpy(), _lift(cov, sigma2))


def test_block_equals_exact_when_the_covariance_is_block_diagonal():
    n, d, b, k = 12, 6, 2, 3
    g = _grads(n, d, 3)
    mask = torch.zeros(n, d, dtype=torch.float64)
    for j in range(n):  # each record touches one block only, so Σ is block-diagonal
        blk = j % k
        mask[j, 2 * blk : 2 * blk + 2] = 1
    g = g * mask
    sigma2 = float(np.median(np.linalg.eigvalsh((g.T @ g).numpy() / (b * n))))
    exact = wf_na_plan(g, b, sigma2).noise_covariance()
    block = wf_na_plan(g, b, sigma2, method="block", num_blocks=k).noise_covariance()
    torch.testing.assert_close(block, exact, rtol=1e-10, atol=1e-12)


def test_block_heuristic_can_leave_the_covariance_singular():
    # one record along (1, 1): Σ has eigenvalue 0 along (1, -1); each 1×1 block already has
    # variance >= σ², so the block plan adds nothing and Σ + noise stays singular.
    g = torch.tensor([[0.6, 0.6]], dtype=torch.float64)
    b, sigma2 = 1, 0.1
    cov = (g.T @ g).numpy() / b
    exact = cov + wf_na_plan(g, b, sigma2).noise_covariance().numpy()
    block = cov + wf_na_plan(g, b, sigma2, method="block", num_blocks=2).noise_covariance().numpy()
    assert np.linalg.eigvalsh(exact).min() >= sigma2 - 1e-12
    assert np.linalg.eigvalsh(block).min() < 1e-12


def test_exact_plan_never_forms_the_d_by_d_matrix():
    n, d, b, sigma2 = 8, 200_000, 4, 0.5  # a dense d×d float64 would need 320 GB
    g = _grads(n, d, 5) / 300
    plan = wf_na_plan(g, b, sigma2)
    x = plan.sample(torch.Generator().manual_seed(0), num=3)
    assert x.shape == (3, d) and torch.isfinite(x).all()
    eig = torch.linalg.svdvals(g / np.sqrt(b * n)) ** 2
    expected = (d - n) * sigma2 + float(torch.clamp(sigma2 - eig, min=0).sum())
    assert np.isclose(plan.added_variance(), expected)
    assert abs(float((x * x).sum(1).mean()) / expected - 1) < 0.02  # ||n||² concentrates


def test_eq38_fails_but_lifting_is_frobenius_nonexpansive():
    """The paper's Eq. (38) claims −vvᵀ ⪯ ΔΣ_Δ ⪯ uuᵀ for the change of the water-filling noise;
    it fails (eigenvalue clipping is not operator monotone). What Theorem 4 needs survives:
    h(S) = U max(Λ, σ²) Uᵀ is the Frobenius projection onto {X ⪰ σ²I}, so 1-Lipschitz."""
    rng = np.random.default_rng(0)
    violations = 0
    for _ in range(300):
        d = 3
        k = rng.normal(size=(2, d))
        base = k.T @ k
        u, v = rng.normal(size=d), rng.normal(size=d)
        s2 = float(rng.uniform(0.1, 2.0))
        s1, s2m = base + np.outer(u, u), base + np.outer(v, v)
        h1, h2 = _lift(s1, s2), _lift(s2m, s2)
        d_delta = (h2 - s2m) - (h1 - s1)
        if np.linalg.eigvalsh(np.outer(u, u) - d_delta).min() < -1e-9:
            violations += 1
        assert np.linalg.norm(h2 - h1) <= np.linalg.norm(s2m - s1) * (1 + 1e-9)
    assert violations > 0
