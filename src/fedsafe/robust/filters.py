"""Norm and cosine filters: robust rules that need nothing but the Gram matrix ``G = X Xᵀ``.

The TEE decodes ``G`` exactly (``⟨Y¹_i,Y¹_j⟩ + ⟨Y²_i,Y²_j⟩ = 2⟨g_i,g_j⟩ + C·[i=j]``), so it can
run any selection written in terms of ``G``. Each filter is split like ``robust.distances``: a
``*_select(G, f, ...)`` returning the kept indices (ascending), used by the enclave, and a
plaintext rule ``(updates, *, f, ...) -> [d]`` (for the robust registry) that computes ``G`` in
float64 and calls the same selection, so plaintext and TEE runs keep the same updates.

* ``norm_filter`` — keep ``{i : ‖x_i‖ ≤ factor · M}`` with ``‖x_i‖ = √G_ii`` and ``M`` their
  median (even n: mean of the two middle norms); output the mean of the kept updates.
  Requires ``n > 2f`` (so ``M`` lies between honest norms) and ``factor ≥ 1`` (so at least
  the ⌈n/2⌉ updates at or below the median are kept). Bounds the norm of the aggregate by
  ``factor · M``; does not catch small, misdirected updates.
* ``cosine_filter`` — ``c_ij = G_ij / √(G_ii G_jj)`` (0 when either norm is 0),
  ``s_i = median_{j ≠ i} c_ij`` (even count: mean of the two middle); keep the ``n − f``
  updates with the highest ``s_i`` (ties: lowest index) and output their mean. Requires
  ``n > 2f``: then for every ``i`` fewer than half of the ``n − 1`` others are Byzantine, so
  ``s_i`` lies within the range of ``i``'s cosines to honest updates. Catches updates pointing
  away from the honest direction (sign flip, IPM); blind to scaling.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsafe.robust.distances import gram
from fedsafe.robust.rows import average_rows, check_matrix, require
from fedsafe.robust.rowwise import row_sq_norms


def _check(rule: str, g: Tensor, f: int) -> int:
    if g.ndim != 2 or g.shape[0] != g.shape[1] or g.shape[0] == 0:
        raise ValueError(f"{rule}: the Gram matrix must be a non-empty square matrix, got shape {tuple(g.shape)}")
    n = g.shape[0]
    require(rule, n, f, 2 * f < n, "n > 2f")
    return n


def _median(sorted_vals: Tensor) -> Tensor:
    """Median along the last dim of already sorted values (even count: mean of the middle two)."""
    k = sorted_vals.shape[-1]
    h = k // 2
    return sorted_vals[..., h] if k % 2 else (sorted_vals[..., h - 1] + sorted_vals[..., h]) / 2


def norm_filter_select(g: Tensor, f: int, factor: float = 2.0) -> Tensor:
    """Indices (ascending) of the updates with ``‖x_i‖ ≤ factor · median_j ‖x_j‖``."""
    _check("norm_filter", g, f)
    return _norm_keep(torch.diagonal(g), f, factor)


def _norm_keep(sq_norms: Tensor, f: int, factor: float) -> Tensor:
    """The selection of :func:`norm_filter_select` from the squared norms alone."""
    if not factor >= 1:
        raise ValueError(f"norm_filter: factor must be >= 1, got {factor}")
    norms = sq_norms.to(torch.float64).clamp_min(0).sqrt()
    m = _median(torch.sort(norms).values)
    return torch.nonzero(norms <= factor * m).flatten()


def cosine_filter_select(g: Tensor, f: int) -> Tensor:
    """Indices (ascending) of the ``n − f`` updates with the highest median cosine to the
    others; ties by lowest index."""
    n = _check("cosine_filter", g, f)
    if n == 1:
        return torch.zeros(1, dtype=torch.long)
    g = g.to(torch.float64)
    norms = torch.diagonal(g).clamp_min(0).sqrt()
    denom = norms[:, None] * norms[None, :]
    cos = torch.where(denom > 0, g / torch.where(denom > 0, denom, 1.0), torch.zeros_like(g))
    others = cos[~torch.eye(n, dtype=torch.bool)].reshape(n, n - 1)
    score = _median(torch.sort(others, dim=1).values)
    keep = torch.sort(-score, stable=True).indices[: n - f]
    return torch.sort(keep).values


def norm_filter(updates: Tensor, *, f: int, factor: float = 2.0) -> Tensor:
    """Plaintext norm filter: mean of the updates whose norm is at most ``factor`` times the
    median norm. Requires ``n > 2f`` and ``factor ≥ 1`` (module doc).

    Needs only the Gram matrix's diagonal: the squared norms in one pass, in float64
    (``rowwise.row_sq_norms``), the same values as the float64 Gram's diagonal up to the order
    of the sums."""
    n = check_matrix(updates, "norm_filter", floating=False)
    require("norm_filter", n, f, 2 * f < n, "n > 2f")
    return average_rows(updates, _norm_keep(row_sq_norms(updates), f, factor))


def cosine_filter(updates: Tensor, *, f: int) -> Tensor:
    """Plaintext cosine filter: mean of the ``n − f`` updates with the highest median cosine
    similarity to the other updates. Requires ``n > 2f`` (module doc)."""
    return average_rows(updates, cosine_filter_select(gram(updates, dtype=torch.float64), f))
