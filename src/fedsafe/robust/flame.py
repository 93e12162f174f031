"""FLAME (Nguyen, Rieger, Chen, Yalame, Möllering, Fereidooni, Marchal, Miettinen, Mirhoseini,
Zeitouni, Koushanfar, Sadeghi, Schneider, USENIX Security 2022, "FLAME: Taming backdoors in
federated learning"): cluster, clip, add noise."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.rows import check_matrix, median_value, require
from fedsafe.robust.rowwise import centered_weighted_sum, gram_float64, row_sq_norms, use_gram_kernel


def admitted(updates: Tensor) -> np.ndarray:
    """FLAME's clustering: indices (ascending) of the updates in the largest cluster HDBSCAN
    finds on their pairwise cosine distances ``1 − cos(x_i, x_j)``, with
    ``min_cluster_size = ⌊n/2⌋ + 1``, ``min_samples = 1`` and ``allow_single_cluster`` (the
    honest majority may form the only cluster). Ties between equally large clusters go to the
    lowest label; when HDBSCAN labels every update noise, all are admitted (the clipping and
    noise steps still apply). ValueError if the ``hdbscan`` package is missing."""
    try:
        import hdbscan
    except ImportError:
        raise ValueError("flame: needs the hdbscan package: pip install 'fedsafe[robust]'") from None
    n = updates.shape[0]
    if n < 2:
        return np.arange(n)
    if use_gram_kernel(updates, torch.float64):
        g = gram_float64(updates, torch.float64).numpy()
    else:
        x = updates.detach().to("cpu", torch.float64)
        g = (x @ x.T).numpy()
    norms = np.sqrt(np.clip(np.diag(g), 0, None))
    denom = np.outer(norms, norms)
    cos = np.divide(g, denom, out=np.zeros_like(g), where=denom > 0)
    dist = np.clip(1.0 - cos, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    labels = hdbscan.HDBSCAN(
        min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed", allow_single_cluster=True
    ).fit_predict(dist)
    clusters = [c for c in np.unique(labels) if c >= 0]
    if not clusters:
        return np.arange(n)
    biggest = max(clusters, key=lambda c: (int((labels == c).sum()), -c))
    return np.flatnonzero(labels == biggest)


@AGGREGATORS.register("flame")
def flame(updates: Tensor, *, f: int, generator: torch.Generator | None = None, noise: float = 0.001) -> Tensor:
    """FLAME: HDBSCAN on cosine distances keeps the majority cluster, its updates are clipped
    to the median update norm S, averaged, and Gaussian noise of std ``noise · S`` is added.

    (1) :func:`admitted`: the largest HDBSCAN cluster of the cosine distances; (2) ``S`` is the
    median of the L2 norms of *all* n updates (even n: the mean of the two middle ones) and each
    admitted update is scaled by ``min(1, S/‖x_i‖)``; (3) the mean of the clipped admitted
    updates plus ``N(0, (noise·S)² I)`` drawn from the pipeline's seeded ``generator`` (the
    round's stream ``"robust.rule"``). ``noise`` is FLAME's λ: 0.001 is the paper's value for
    image classification (0.01 for its NLP tasks); 0 disables the noise.

    The paper clusters the clients' *models* (global model plus update) and measures their
    distance to the global model; fedsafe's rules see updates, so the cosines are between
    updates, and ‖x_i‖ is that distance. Cosines between whole models are dominated by the
    global model they share (all near 1), which is why reimplementations cluster updates too.
    Requires ``n > 2f`` (the honest majority is the cluster) and the ``hdbscan`` package.
    Cost: one Gram matrix (as Krum), the norms, and one weighted sum."""
    n = check_matrix(updates, "flame")
    require("flame", n, f, 2 * f < n, "n > 2f")
    if not noise >= 0:
        raise ValueError(f"flame: noise must be >= 0, got {noise}")
    keep = admitted(updates)
    norms = row_sq_norms(updates).sqrt().to(torch.float64)
    bound = float(median_value(norms))
    weights = torch.zeros(n, dtype=torch.float64)
    idx = torch.from_numpy(keep)
    scale = torch.where(norms[idx] > bound, bound / torch.where(norms[idx] > 0, norms[idx], 1.0), torch.ones_like(norms[idx]))
    weights[idx] = scale / len(keep)
    out = centered_weighted_sum(updates, weights, None)
    if noise > 0 and bound > 0:
        if generator is None:
            raise ValueError("flame: needs a seeded generator for its noise (the pipeline supplies one)")
        z = torch.randn(updates.shape[1], generator=generator, dtype=torch.float64)
        out = (out.to(torch.float64) + noise * bound * z).to(updates.dtype)
    return out
