"""Krum-family selections over squared distances: Krum, Multi-Krum, Bulyan's selection phase.

Each takes ``D`` (``D_ij = ‖x_i − x_j‖²``, from :func:`fedsafe.robust.distances.pairwise_sq_distances`
or decoded by the TEE) and returns indices, so plaintext and TEE runs select identically. Ties
are broken by the lowest index (stable sorts, first argmin).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.distances import check_d2 as _check_d2
from fedsafe.robust.rows import require as _require


def _krum_scores_k(d2: Tensor, k: int) -> Tensor:
    """Σ of the k smallest off-diagonal entries of each row, summed smallest first."""
    others = d2.clone()
    others.fill_diagonal_(float("inf"))
    return torch.sort(others, dim=1).values[:, :k].sum(dim=1)


def krum_scores(d2: Tensor, f: int) -> Tensor:
    """Krum scores: ``s_i = Σ_{j ∈ N_i} D_ij`` over the ``n − f − 2`` nearest *other* updates
    ``N_i`` (Blanchard et al., 2017). Requires ``n ≥ 2f + 3`` (at least one neighbour)."""
    n = _check_d2(d2, "krum")
    _require("krum", n, f, n >= 2 * f + 3, "n >= 2f + 3")
    return _krum_scores_k(d2, n - f - 2)


def krum_select(d2: Tensor, f: int) -> int:
    """Index of the update with the lowest Krum score; ties go to the lowest index.
    Requires ``n ≥ 2f + 3``."""
    return int(torch.argmin(krum_scores(d2, f)))  # argmin returns the first minimum


def multi_krum_select(d2: Tensor, f: int, m: int | None = None) -> Tensor:
    """Indices of the ``m`` updates with the lowest Krum scores (default ``m = n − f``), in
    increasing score order, ties by lowest index. Requires ``n ≥ 2f + 3`` and ``1 ≤ m ≤ n``."""
    n = _check_d2(d2, "multi_krum")
    _require("multi_krum", n, f, n >= 2 * f + 3, "n >= 2f + 3")
    m = n - f if m is None else m
    if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= n:
        raise ValueError(f"multi_krum: m must be an integer in [1, n={n}], got m={m!r}")
    scores = _krum_scores_k(d2, n - f - 2)
    return torch.sort(scores, stable=True).indices[:m]


def bulyan_select(d2: Tensor, f: int) -> Tensor:
    """Bulyan's selection phase (El Mhamdi et al., 2018): ``θ = n − 2f`` indices chosen one at a
    time by Krum on the not-yet-selected set, returned in selection order.

    With ``r`` updates remaining, Krum sums the squared distances to the
    ``max(r − f − 2, 1)`` nearest other remaining updates (the paper keeps f fixed while the set
    shrinks, so the last two rounds, r = 2f + 2 and 2f + 1, would otherwise have fewer than one
    neighbour); the last remaining update, when r = 1, is taken as is. Ties by lowest index.
    Requires ``n ≥ 4f + 3``.
    """
    n = _check_d2(d2, "bulyan")
    _require("bulyan", n, f, n >= 4 * f + 3, "n >= 4f + 3")
    theta = n - 2 * f
    # The rounds' bookkeeping in numpy (each torch call costs microseconds, θ rounds of them
    # add up to a fraction of a pass over the updates); the scores are summed by torch exactly
    # as in _krum_scores_k (a contiguous slice of the same sorted values), so the choices are
    # those of krum_select on each sub-matrix.
    full = d2.detach().cpu().numpy()
    remaining = np.arange(n)
    chosen = []
    for _ in range(theta):  # θ ≤ n rounds, each O(r² log r) on the (r, r) sub-matrix
        r = remaining.size
        if r == 1:
            pick = 0
        else:
            others = full[np.ix_(remaining, remaining)]
            np.fill_diagonal(others, np.inf)
            k = max(r - f - 2, 1)
            nearest = np.ascontiguousarray(np.sort(others, axis=1)[:, :k])
            pick = int(torch.argmin(torch.from_numpy(nearest).sum(dim=1)))  # first minimum
        chosen.append(int(remaining[pick]))
        remaining = np.delete(remaining, pick)
    return torch.tensor(chosen, device=d2.device)
