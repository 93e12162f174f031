"""Per-round RDP bounds ε(α) of Theorems 2, 3, 4 and of each row of Table 1.

Every function maps an array of orders ``alphas`` to an array of ε(α), ``+inf`` wherever α is
outside the theorem's domain (including ``α ≤ 1``), so curves from different sources can be
summed over rounds and converted without special cases.

Notation: ``C`` clip norm, ``D`` records per user, ``B`` batch size (for GSGD only the variance
scale of Assumption 2), ``N`` users, ``σ²`` per-user noise variance (isotropic) or eigenvalue
floor (WF-NA), ``Λ = Σ_i λ_{i,min}``. All bounds protect one record of one user ("record-level
DP for each user", §2.4) against the server that sees only the sum.

Readings chosen where the paper is inconsistent. Each default is the tightest reading that has
a proof and holds against the exact Rényi divergence of the two Gaussians the server sees
(tests: hundreds of seeded random rounds with d ≤ 4, nearly singular and rank-deficient
covariances included, adversarial neighbours, both orders, every order of the α grid); the
former, conservative defaults stay available under their names and are never smaller.

1. Covariance scale in Theorems 2–3: ``scale="eq16"`` (default of :func:`.audit.audit_round`)
   or ``"update"``. Eq. (16) defines ``Σ_i = G_iG_iᵀ/D`` and Theorem 2 is stated for its λ_min;
   the released sum's covariance is ``Σ_i Σ_i / B`` (Eq. 18) and the proof (Eqs. 21–30) divides
   by that ``B`` itself, so Eq. (19) takes Λ on the Eq. (16) scale: the default. ``"update"``
   (conservative) feeds it the λ_min of the update covariance ``G_iG_iᵀ/(BD)`` (§5.1's Σ_i, the
   matrix WF-NA lifts), which counts the ``1/B`` twice: Λ is ``B`` times smaller, ε larger, and
   the domain ``α < DΛ/C²`` can be empty where Eq. (16) gives a finite ε (a test: 3 users × 16
   records in d = 2, B = 16: ε = ∞ against 3.5 at δ = 1e-5). Assumption 4's unscaled reading
   would inflate λ by ``D`` and is not offered.
2. Theorem 4's denominator: ``reading="eq35"`` (default) or ``"conservative"``. The theorem's
   statement, Eq. (35), has ``Nσ² − 2αC²/(BD)``; the last line of Eq. (43) has ``Nσ² − 2αC²/D``
   (the line above it still has ``BD``), and the stated domain ``α < Nσ²D/(2C²)`` is where that
   denominator is positive. Reading 4's argument proves Eq. (35) on the stated domain, so it is
   the default; ``"conservative"`` keeps Eq. (43)'s last line. Both use the stated domain (the
   same argument would carry Eq. (35) up to its own pole ``Nσ²BD/(2C²)``; fedsafe keeps the
   theorem's domain).
3. Table 1's GSGD + WF-NA row prints the GSGD + isotropic formula, which is *smaller* than
   Theorem 4 and has no proof for WF-NA (Eq. 38 fails, reading 4). The row is Theorem 4 with the
   reading passed (``"eq35"`` or ``"conservative"``); ``reading="as_printed"`` returns the
   printed row for comparison only.
4. Theorem 4's proof step Eq. (38) (``−uuᵀ ⪯ ΔΣ_Δ ⪯ vvᵀ`` for the change of the water-filling
   noise) is false in general: eigenvalue clipping is not operator monotone (a test exhibits a
   violation). The theorem's conclusion survives: ``Σ ↦ U max(Λ, σ²) Uᵀ`` is the Frobenius
   projection onto the convex set ``{X ⪰ σ²I}``, hence 1-Lipschitz in Frobenius norm, so the
   change ``Δ`` of the lifted covariance satisfies ``||Δ||_op ≤ ||Δ||_F ≤ √2·C²/(BD)``. Then
   ``λ_min(Σ_α) ≥ Nσ² − √2·αC²/(BD)`` and, by concavity of log det,
   ``ln(|Σ_1|^{1−α}|Σ_2|^α/|Σ_α|) ≤ α² tr(Σ_1⁻¹ΔΣ_α⁻¹Δ) ≤ α²||Δ||_F²/(λ_min(Σ_1)λ_min(Σ_α))``;
   both terms are dominated by Eq. (35) wherever its denominator is positive
   (``α < Nσ²BD/(2C²)``), the stated domain included.
   Tests check Theorem 4 against the exact divergence with adversarial neighbours.
5. Data dependence: ``symmetric=False`` (default of the auditor) or ``True``. Theorems 2–3 bound
   ``D_α(M(D_i) ‖ M(D_i'))`` with ``Λ`` of the *first* argument; RDP needs both orders. The
   round's own Λ covers the reverse order too: with ``Σ_1, Σ_2`` the released covariances and
   ``λ = Λ/B``, the reverse order's ``(1−α)Σ_2 + αΣ_1 = Σ_1 + (α−1)(Σ_1 − Σ_2)`` has λ_min at
   least ``λ − (α−1)C²/(BD)`` and ``λ_min(Σ_2) ≥ λ − C²/(BD)``; both exceed the ``λ − αC²/(BD)``
   the forward proof uses in Eqs. (23)–(30), whose steps then go through unchanged. ``True``
   (conservative) uses :func:`symmetric_lambda`, ``Λ − s·C²`` (Weyl's bound on the
   neighbour's Λ). The ε is per-instance (it depends on this round's gradients, as in the
   paper), not a worst case over all datasets.

The conversion to (ε, δ) minimises over α continuously (:func:`.composition.rdp_to_dp` with the
bound as ``rdp_fn``), not only on a grid: near the end of Theorem 4's domain the grid's orders
are ~10% apart, which cost up to ~5% in ε (~20% with Eq. 35, whose optimum can sit at the open
end of the stated domain); tested against a 4·10⁵-order reference.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "TABLE1_ROWS",
    "dp_table1_closed_form",
    "rdp_table1",
    "rdp_theorem2",
    "rdp_theorem3",
    "rdp_theorem4",
    "rdp_sgd_iid_isotropic_amplified",
    "symmetric_lambda",
]

TABLE1_ROWS = (
    "sgd_iid+isotropic",
    "sgd_iid+wf_na",
    "gd+isotropic",
    "gd+wf_na",
    "gsgd+isotropic",
    "gsgd+wf_na",
)


def _alphas(alphas: ArrayLike) -> NDArray[np.float64]:
    a = np.atleast_1d(np.asarray(alphas, dtype=np.float64))
    if np.any(np.isnan(a)):
        raise ValueError("alphas contain NaN")
    return a


def _positive(**kw: float) -> None:
    for k, v in kw.items():
        if not v > 0:
            raise ValueError(f"{k} must be > 0, got {v}")


def _where(valid: NDArray[np.bool_], value_fn, a: NDArray[np.float64]) -> NDArray[np.float64]:
    out = np.full_like(a, np.inf)
    if np.any(valid):
        out[valid] = value_fn(a[valid])
    return out


def rdp_theorem2(
    alphas: ArrayLike, *, Lambda: float, clip: float, dataset_size: int, batch_size: int
) -> NDArray[np.float64]:
    """Theorem 2, Eq. (19): GSGD without added noise, non-singular covariance.

    ``ε(α) = (2αBC²/D² + αC²/((α−1)D)) / (Λ − αC²/D)`` for ``1 < α < DΛ/C²`` (requires
    ``C²/D < Λ``), ``+inf`` elsewhere. ``Λ`` must be computed on the scale the caller chose
    (see the module docstring, reading 1); pass :func:`symmetric_lambda` for both orders.
    """
    _positive(clip=clip, dataset_size=dataset_size, batch_size=batch_size)
    a = _alphas(alphas)
    c2, n, b = clip * clip, float(dataset_size), float(batch_size)
    alpha_max = n * Lambda / c2 if Lambda > 0 else 1.0
    valid = (a > 1) & (a < alpha_max)
    return _where(
        valid, lambda x: (2 * x * b * c2 / n**2 + x * c2 / ((x - 1) * n)) / (Lambda - x * c2 / n), a
    )


def rdp_theorem3(
    alphas: ArrayLike, *, Lambda_star: float, clip: float, dataset_size: int, batch_size: int
) -> NDArray[np.float64]:
    """Theorem 3, Eq. (31): Eq. (19) with ``Λ* = Σ_i λ*_{i,min}``, the per-user covariances
    restricted to the subspace ``S`` of Assumption 4 (same scale reading as Theorem 2).

    Valid only for neighbouring records whose gradients lie in ``S`` (Assumption 4 is a
    hypothesis about *every* possible record, which Theorem 1 shows is needed); for a record
    outside ``S`` the divergence is infinite.
    """
    return rdp_theorem2(
        alphas, Lambda=Lambda_star, clip=clip, dataset_size=dataset_size, batch_size=batch_size
    )


def rdp_theorem4(
    alphas: ArrayLike,
    *,
    num_users: int,
    sigma2: float,
    clip: float,
    dataset_size: int,
    batch_size: int,
    reading: Literal["eq35", "conservative"] = "eq35",
) -> NDArray[np.float64]:
    """Theorem 4: GSGD + WF-NA (exact plan) with eigenvalue floor σ² for each of N users.

    ``eq35`` (default, the theorem's statement): ``ε(α) = (2αC²/D² + 2αC²/((α−1)BD)) /
    (Nσ² − 2αC²/(BD))``; ``conservative``: denominator ``Nσ² − 2αC²/D`` (last line of Eq. 43).
    Both on the stated domain ``1 < α < Nσ²D/(2C²)``. See module docstring, readings 2 and 4.
    """
    _positive(num_users=num_users, sigma2=sigma2, clip=clip, dataset_size=dataset_size, batch_size=batch_size)
    if reading not in ("eq35", "conservative"):
        raise ValueError(f"reading must be 'eq35' or 'conservative', got {reading!r}")
    a = _alphas(alphas)
    c2, n, b, ns2 = clip * clip, float(dataset_size), float(batch_size), num_users * sigma2
    alpha_max = ns2 * n / (2 * c2)
    valid = (a > 1) & (a < alpha_max)
    shrink = n if reading == "conservative" else b * n
    return _where(
        valid, lambda x: (2 * x * c2 / n**2 + 2 * x * c2 / ((x - 1) * b * n)) / (ns2 - 2 * x * c2 / shrink), a
    )


def rdp_table1(
    row: str,
    alphas: ArrayLike,
    *,
    num_users: int,
    sigma2: float,
    clip: float,
    dataset_size: int,
    batch_size: int,
    reading: Literal["eq35", "conservative", "as_printed"] = "eq35",
) -> NDArray[np.float64]:
    """Per-round RDP of a Table 1 row (mechanism + added noise), data-independent.

    - ``sgd_iid+isotropic``: ``2αC²/(B²Nσ²)``, the Gaussian RDP inside the row's ε′ (mean of B
      clipped rows has replace-one sensitivity 2C/B; the sum carries ``Nσ²``). Valid without
      amplification by subsampling (joint convexity); the row's amplified (ε, δ) is
      :func:`dp_table1_closed_form`, an amplified RDP is :func:`rdp_sgd_iid_isotropic_amplified`.
    - ``gd+isotropic``: ``2αC²/(D²Nσ²)`` (sensitivity 2C/D), tight for the worst neighbour.
    - ``gsgd+isotropic``: ``(2αC²/D² + αC²/((α−1)BD)) / (Nσ² − αC²/(BD))``, ``α < Nσ²BD/C²``.
    - ``gsgd+wf_na``: Theorem 4 with ``reading`` ``"eq35"`` (default) or ``"conservative"``
      (module docstring, reading 2); ``"as_printed"`` returns the printed row, which equals the
      ``gsgd+isotropic`` formula and is smaller than Theorem 4 (reading 3).
    - ``sgd_iid+wf_na``, ``gd+wf_na``: no DP guarantee, ``+inf`` for every α.
    """
    if row not in TABLE1_ROWS:
        raise ValueError(f"row must be one of {TABLE1_ROWS}, got {row!r}")
    if reading not in ("eq35", "conservative", "as_printed"):
        raise ValueError(f"reading must be 'eq35', 'conservative' or 'as_printed', got {reading!r}")
    _positive(num_users=num_users, sigma2=sigma2, clip=clip, dataset_size=dataset_size, batch_size=batch_size)
    a = _alphas(alphas)
    c2, n, b, ns2 = clip * clip, float(dataset_size), float(batch_size), num_users * sigma2
    valid = a > 1
    if row in ("sgd_iid+wf_na", "gd+wf_na"):
        return np.full_like(a, np.inf)
    if row == "sgd_iid+isotropic":
        return _where(valid, lambda x: 2 * x * c2 / (b * b * ns2), a)
    if row == "gd+isotropic":
        return _where(valid, lambda x: 2 * x * c2 / (n * n * ns2), a)
    if row == "gsgd+wf_na" and reading != "as_printed":
        return rdp_theorem4(
            a, num_users=num_users, sigma2=sigma2, clip=clip, dataset_size=dataset_size, batch_size=batch_size,
            reading=reading,
        )
    valid = valid & (a < ns2 * b * n / c2)
    return _where(
        valid, lambda x: (2 * x * c2 / n**2 + x * c2 / ((x - 1) * b * n)) / (ns2 - x * c2 / (b * n)), a
    )


def dp_table1_closed_form(
    row: Literal["sgd_iid+isotropic", "gd+isotropic"],
    delta: float,
    *,
    num_users: int,
    sigma2: float,
    clip: float,
    dataset_size: int,
    batch_size: int,
) -> float:
    """Table 1's per-round (ε, δ) for the two rows whose ε is ``min_α log(1/δ)/(α−1) + βα``.

    The minimum over α > 1 is exact: ``β + 2√(β log(1/δ))`` at ``α = 1 + √(log(1/δ)/β)``. For
    ``sgd_iid+isotropic`` (``β = 2C²/(B²Nσ²)``) the row then amplifies by sampling without
    replacement, ``ε = log(1 + (B/D)(e^{ε′} − 1))`` (Balle et al. 2018, substitution relation);
    that theorem's δ is ``(B/D)·δ``, so keeping δ as the table does is conservative. For
    ``gd+isotropic`` ``β = 2C²/(D²Nσ²)``.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    _positive(num_users=num_users, sigma2=sigma2, clip=clip, dataset_size=dataset_size, batch_size=batch_size)
    c2, ns2 = clip * clip, num_users * sigma2
    log_inv = np.log(1 / delta)
    if row == "sgd_iid+isotropic":
        beta = 2 * c2 / (batch_size**2 * ns2)
        eps_base = beta + 2 * np.sqrt(beta * log_inv)
        q = batch_size / dataset_size
        # log(1 + q(e^ε′ − 1)) = log((1 − q) + q e^ε′), in log space so large ε′ cannot overflow
        return float(eps_base if q >= 1 else np.logaddexp(np.log1p(-q), np.log(q) + eps_base))
    if row == "gd+isotropic":
        beta = 2 * c2 / (dataset_size**2 * ns2)
        return float(beta + 2 * np.sqrt(beta * log_inv))
    raise ValueError(f"row must be 'sgd_iid+isotropic' or 'gd+isotropic', got {row!r}")


def rdp_sgd_iid_isotropic_amplified(
    alphas: ArrayLike,
    *,
    num_users: int,
    sigma2: float,
    clip: float,
    dataset_size: int,
    batch_size: int,
) -> NDArray[np.float64]:
    """Amplified RDP of ``sgd_iid+isotropic``: dp-accounting's ``SampledWithoutReplacementDpEvent``
    (Wang, Balle, Kasiviswanathan 2019, replace-one) around a Gaussian with noise multiplier
    ``√(Nσ²) / (2C/B)``. Not in the paper; at most the unamplified row (``B = D`` equal)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    _positive(num_users=num_users, sigma2=sigma2, clip=clip, dataset_size=dataset_size, batch_size=batch_size)
    a = _alphas(alphas)
    valid = a > 1
    out = np.full_like(a, np.inf)
    if not np.any(valid):
        return out
    z = np.sqrt(num_users * sigma2) / (2 * clip / batch_size)
    acc = rdp_lib.RdpAccountant(
        orders=list(a[valid]), neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    acc.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(
            int(dataset_size), int(batch_size), dp_accounting.GaussianDpEvent(float(z))
        )
    )
    out[valid] = acc.rdp
    return out


def symmetric_lambda(Lambda: float, *, clip: float, scale: float) -> float:
    """``Λ − s·C²``: a lower bound on every neighbour's λ-sum (reading 5's conservative option).

    Replacing one record ``g → g'`` of user i turns ``Σ_i`` into ``Σ_i − s·ggᵀ + s·g'g'ᵀ ⪰
    Σ_i − s·C² I``, so by Weyl the neighbour's ``Λ'`` is at least ``Λ − s·C²`` (s the changed
    user's covariance scale; pass the largest over users). Clamped at 0. Not needed for RDP in
    both orders (the round's own Λ covers them, reading 5); kept as a named option.
    """
    return max(0.0, Lambda - scale * clip * clip)
