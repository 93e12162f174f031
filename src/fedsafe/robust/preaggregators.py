"""Pre-aggregators: pure functions ``pre(updates[n, d], *, f, **params) -> [n', d]`` applied in
sequence before the rule (e.g. NNM then trimmed mean). Randomised ones receive the round's
seeded ``generator`` (reserved keyword).

Inputs are never modified; outputs keep the updates' dtype. Each pre-aggregator states what it
requires of n and f and refuses the rest with a ValueError naming itself, n, f and the
requirement. Pre-aggregators that do not use f (bucketing, clipping) pass it on unchanged: with
f Byzantine inputs at most f of their outputs are contaminated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsafe.core.registry import Registry
from fedsafe.robust.distances import nnm_mixing, pairwise_sq_distances
from fedsafe.robust.mixing import kernel_applies, mix
from fedsafe.robust.rows import check_matrix as _check_matrix
from fedsafe.robust.rows import require as _require
from fedsafe.robust.rowwise import clip_rows, clip_rows_by_rank, empty_faulting

PREAGGREGATORS: Registry = Registry("pre-aggregator", reserved=("f", "generator"))




@PREAGGREGATORS.register("nnm")
def nnm(updates: Tensor, *, f: int) -> Tensor:
    """Nearest-neighbour mixing (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan 2023,
    "Fixing by mixing"): ``y_i = (1/(n−f)) Σ_{j ∈ N_i} x_j`` with ``N_i`` the ``n − f`` nearest
    neighbours of ``x_i``, itself included (then by squared distance, ties by lowest index).

    Computed as ``W X`` with the row-stochastic mixing matrix ``W`` of
    ``distances.nnm_mixing``, the neighbours coming from one Gram-matrix distance computation,
    by the kernel of ``robust.mixing``; the output's pages are faulted in on a background
    thread while the distances are computed (``rowwise.empty_faulting``).
    Output ``(n, d)``. Requires ``n > 2f``."""
    n = _check_matrix(updates, "nnm")
    _require("nnm", n, f, 2 * f < n, "n > 2f")
    if not kernel_applies(updates):
        return mix(updates, nnm_mixing(pairwise_sq_distances(updates), f))
    out, ready = empty_faulting(tuple(updates.shape), torch.empty(0, dtype=updates.dtype).numpy().dtype)
    try:
        w = nnm_mixing(pairwise_sq_distances(updates), f)
    finally:
        ready()  # nothing may write to out before the page-touching thread is done
    return mix(updates, w, out=out)


@PREAGGREGATORS.register("bucketing")
def bucketing(updates: Tensor, *, f: int, generator: torch.Generator | None = None, s: int = 2) -> Tensor:
    """Bucketing (Karimireddy, He, Jaggi 2022): permute the updates with
    ``π = torch.randperm(n, generator=generator)``, split ``x_π(0), x_π(1), …`` into consecutive
    buckets of ``s`` (the last holds the remaining ``n mod s`` if non-zero) and return each
    bucket's mean: ``⌈n/s⌉`` rows.

    f is not used (at most f buckets hold a Byzantine update; the next rule gets the same f).
    Needs the round's ``generator`` and an integer ``s ≥ 1``; any n, f ≥ 0."""
    n = _check_matrix(updates, "bucketing")
    _require("bucketing", n, f, True, "f >= 0")
    if not isinstance(s, int) or isinstance(s, bool) or s < 1:
        raise ValueError(f"bucketing: s must be an integer >= 1, got {s!r}")
    if generator is None:
        raise ValueError("bucketing: needs the round's seeded generator (reserved keyword 'generator')")
    perm = torch.randperm(n, generator=generator)
    # bucket means as one (⌈n/s⌉, n) averaging matrix times the updates: no shuffled copy
    bucket = torch.empty(n, dtype=torch.long)
    bucket[perm] = torch.arange(n) // s
    rows = -(-n // s)
    w = torch.zeros(rows, n, dtype=updates.dtype)
    w[bucket, torch.arange(n)] = 1.0
    w /= w.sum(dim=1, keepdim=True)
    return w.to(updates.device) @ updates


@PREAGGREGATORS.register("clipping")
def clipping(updates: Tensor, *, f: int, c: float) -> Tensor:
    """Static L2 clipping: ``x_i · min(1, c / ‖x_i‖)`` (a zero update stays zero).
    Needs ``c > 0``; any n, f ≥ 0 (f is not used).

    Norms in float64; each row is scaled right after its norm, while it is still in cache
    (``rowwise.clip_rows``): one read of the matrix from memory and one write."""
    n = _check_matrix(updates, "clipping")
    _require("clipping", n, f, True, "f >= 0")
    if not c > 0:
        raise ValueError(f"clipping: c must be > 0, got {c}")
    return clip_rows(updates, float(c))


@PREAGGREGATORS.register("arc")
def arc(updates: Tensor, *, f: int) -> Tensor:
    """Adaptive robust clipping (Allouah, Guerraoui, Gupta, Pinot, Rizk 2024, "Boosting robustness
    by clipping gradients in distributed learning"): with ``k = ⌊2 (f/n) (n − f)⌋``
    (computed exactly as ``2f(n−f) div n``), the ``k`` largest-norm updates are clipped to the
    ``(k+1)``-th largest norm ``τ``. Since every other update has norm ≤ τ this is
    ``x_i · min(1, τ / ‖x_i‖)`` for all i (so norm ties need no rule); k = 0 changes nothing.
    Requires ``n > 2f``.

    Norms in float64 (``rowwise.clip_rows_by_rank``): one pass copies each row while taking
    its norm, then only the k clipped rows are scaled in the copy (products rounded once; the
    others are exact copies)."""
    n = _check_matrix(updates, "arc")
    _require("arc", n, f, 2 * f < n, "n > 2f")
    k = (2 * f * (n - f)) // n
    return clip_rows_by_rank(updates, k)
