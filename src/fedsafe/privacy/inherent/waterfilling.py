"""Water-filling noise addition (WF-NA, §5.1 of Zhang et al.).

User ``i`` estimates the covariance of its GSGD update,

    Σ_i = (1/(B·D)) Σ_j g_{i,j} g_{i,j}ᵀ            (§5.1, "Calculate covariance matrix")

lifts every eigenvalue below ``σ²`` up to ``σ²`` (``Σ_{i,+} = U max(Λ, σ²) Uᵀ``), and adds
``n ~ N(0, Σ_{i,+} − Σ_i)``: noise only in the directions the sampling noise leaves
under-protected, none where an eigenvalue already reaches ``σ²``.

Exact plan. With ``A = G_iᵀ/√(BD)`` in row layout (``D × d``), ``Σ_i = AᵀA``; a thin SVD
``A = U S Vᵀ`` (``V``: ``d × k``, ``k = min(D, d)``) gives the eigenpairs ``(S², V)``; the
remaining ``d − k`` eigenvalues are 0. So ``Σ_{i,+} − Σ_i = V diag((σ² − S²)_+) Vᵀ +
σ² (I − V Vᵀ)``, and a draw is ``V ((σ² − S²)_+^{1/2} ⊙ z₁) + σ (z₂ − V Vᵀ z₂)``. Cost
``O(D·d·k)`` time, ``O(D·d)`` memory; the ``d × d`` matrix is never formed.

Block plan (the paper's speed-up, a heuristic). The coordinates are cut into ``k`` contiguous
blocks; each diagonal block ``Σ_bb`` is lifted on its own and the noise is block-diagonal. The
paper claims this leaves the ε bound unaffected; it does not in general: the off-diagonal blocks
of Σ_i are kept, so the total covariance ``Σ_i + blockdiag(h(Σ_bb) − Σ_bb)`` can keep eigenvalues
below σ² (even 0) when gradients correlate across blocks. Theorem 4 needs ``Σ_{i,+} ⪰ σ² I``, so
only the exact plan carries its guarantee. Tests show both the failure and the block-diagonal
case where the two plans coincide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedsafe.core.randomness import Generator, standard_normal

__all__ = ["WaterFillingPlan", "wf_na_noise", "wf_na_plan"]


@dataclass(frozen=True)
class _Block:
    start: int
    stop: int
    basis: Tensor  # (d_b, k) orthonormal eigenvectors of Σ_bb with the k = min(D, d_b) top eigenvalues
    eigenvalues: Tensor  # (k,) eigenvalues of Σ_bb along ``basis`` (squared singular values)
    lift: Tensor  # (k,) added variance (σ² − λ)_+ along ``basis``

    @property
    def width(self) -> int:
        return self.stop - self.start

    @property
    def full(self) -> bool:  # basis spans the whole block: no complement to fill
        return self.basis.shape[1] == self.width


@dataclass(frozen=True)
class WaterFillingPlan:
    """The WF-NA noise distribution ``N(0, Σ_+ − Σ)`` for one user and one round.

    Attributes:
        sigma2: the eigenvalue floor σ².
        dim: d.
        method: ``"exact"`` (one block, carries Theorem 4) or ``"block"`` (heuristic).
        blocks: per-block eigenbasis and lift.
    """

    sigma2: float
    dim: int
    method: str
    blocks: tuple[_Block, ...]

    def sample(self, generator: Generator | None = None, num: int | None = None) -> Tensor:
        """Draw noise: shape ``(d,)``, or ``(num, d)`` when ``num`` is given. float64."""
        m = 1 if num is None else num
        out = torch.empty(m, self.dim, dtype=torch.float64)
        sigma = math.sqrt(self.sigma2)
        for b in self.blocks:
            k = b.basis.shape[1]
            z1 = standard_normal((m, k), generator, torch.float64)
            part = (z1 * b.lift.sqrt()) @ b.basis.T
            if not b.full:
                z2 = standard_normal((m, b.width), generator, torch.float64)
                part = part + sigma * (z2 - (z2 @ b.basis) @ b.basis.T)
            out[:, b.start : b.stop] = part
        return out[0] if num is None else out

    def noise_covariance(self) -> Tensor:
        """The explicit ``d × d`` covariance ``Σ_+ − Σ`` of :meth:`sample`.

        Forms a dense ``d × d`` matrix: for tests and small-d inspection only.
        """
        cov = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        for b in self.blocks:
            blk = (b.basis * b.lift) @ b.basis.T
            if not b.full:
                blk = blk + self.sigma2 * (torch.eye(b.width, dtype=torch.float64) - b.basis @ b.basis.T)
            cov[b.start : b.stop, b.start : b.stop] = blk
        return cov

    def added_variance(self) -> float:
        """``tr(Σ_+ − Σ) = E||n||²``, the total noise power WF-NA adds (compare ``d·σ²`` isotropic)."""
        total = 0.0
        for b in self.blocks:
            total += float(b.lift.sum())
            if not b.full:
                total += self.sigma2 * (b.width - b.basis.shape[1])
        return total


def _eigenpairs(a: Tensor, rtol: float = 1e-10) -> tuple[Tensor, Tensor]:
    """Nonzero eigenpairs (V, λ) of ``AᵀA`` for ``A`` of shape (n, w), via the smaller Gram matrix.

    With n ≤ w (few records, many parameters): ``AAᵀ = U Λ Uᵀ`` and ``V = AᵀU Λ^{-1/2}`` — an
    n×n eigendecomposition instead of an SVD of the n×w matrix (~10x faster here). Eigenvalues
    below ``rtol·λ_max`` are treated as 0: their directions join the orthogonal complement, which
    the plan fills with σ² anyway, so the noise covariance changes by at most that eigenvalue.
    """
    n, w = a.shape
    if n <= w:
        ev, u = torch.linalg.eigh(a @ a.T)
        keep = ev > rtol * max(float(ev.max()), 0.0)
        ev = ev[keep]
        v = (a.T @ u[:, keep]) / ev.sqrt()
    else:
        ev, v = torch.linalg.eigh(a.T @ a)
        ev = ev.clamp(min=0.0)
    order = torch.argsort(ev, descending=True)
    return v[:, order].contiguous(), ev[order]


def wf_na_plan(
    grads: Tensor,
    batch_size: int,
    sigma2: float,
    *,
    method: Literal["exact", "block"] = "exact",
    num_blocks: int = 1,
) -> WaterFillingPlan:
    """Plan WF-NA noise from one user's clipped per-example gradients (rows of ``grads``).

    Σ_i = GᵀG/(B·D) as in §5.1 (the covariance of the user's GSGD update, Eq. 17: note the
    1/(BD) here versus 1/D in Eq. 16; see the package docstring). ``method="block"`` splits the
    coordinates into ``num_blocks`` contiguous parts (heuristic, see the module docstring).
    """
    if grads.dim() != 2:
        raise ValueError(f"grads: expected shape (D, d), got {tuple(grads.shape)}")
    if sigma2 <= 0:
        raise ValueError(f"sigma2 (the eigenvalue floor σ²) must be > 0, got {sigma2}")
    if batch_size < 1:
        raise ValueError(f"batch_size B must be >= 1, got {batch_size}")
    n, d = grads.shape
    if method == "exact":
        bounds = [(0, d)]
    elif method == "block":
        if not 1 <= num_blocks <= d:
            raise ValueError(f"num_blocks must be in [1, d={d}], got {num_blocks}")
        edges = torch.linspace(0, d, num_blocks + 1).round().long().tolist()
        bounds = [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
    else:
        raise ValueError(f"method must be 'exact' or 'block', got {method!r}")
    a_mat = grads.detach().to(torch.float64) / math.sqrt(batch_size * n)
    blocks = []
    for start, stop in bounds:
        basis, eig = _eigenpairs(a_mat[:, start:stop])
        blocks.append(_Block(start, stop, basis, eig, torch.clamp(sigma2 - eig, min=0.0)))
    return WaterFillingPlan(float(sigma2), d, method, tuple(blocks))


def wf_na_noise(
    grads: Tensor,
    batch_size: int,
    sigma2: float,
    *,
    generator: Generator | None = None,
    method: Literal["exact", "block"] = "exact",
    num_blocks: int = 1,
    num: int | None = None,
) -> Tensor:
    """One draw (or ``num`` draws) of WF-NA noise for this user, in ``grads``' dtype."""
    plan = wf_na_plan(grads, batch_size, sigma2, method=method, num_blocks=num_blocks)
    return plan.sample(generator, num).to(grads.dtype)
