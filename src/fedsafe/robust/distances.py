"""Pairwise squared distances and the selections that need nothing but them.

Distance-based rules (Krum, Multi-Krum, Bulyan's selection in :mod:`fedsafe.robust.krum`; NNM's
mixing and the geometric median's Weiszfeld weights below) are split in two:
``pairwise_sq_distances`` turns the ``(n, d)`` updates into an ``(n, n)`` matrix ``D`` with
``D_ij = ‖x_i − x_j‖²``, and the selections work from ``D`` alone. The TEE subsystem decodes ``D`` itself (the untrusted accelerator never sees updates) and
calls the same selection functions, so plaintext and TEE runs select identically.

Precision: ``D`` comes from a Gram expansion, whose rounding error is relative to the squared
norms of the rows it multiplies. Rows sharing a large offset (model weights rather than
gradients) are therefore first centred on one of them (``distance_centre``), so that float32
distances are accurate relative to the rows' spread, not to their norms; the bound is stated
in ``pairwise_sq_distances``.

Ties: every selection orders by value with a *stable* sort, so equal scores or distances are
broken by the lowest index. Exact ties only arise when distances are computed exactly (e.g.
integer-valued updates); duplicated rows tie among themselves but give the same output
whichever copy is picked.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.rows import median_value
from fedsafe.robust.rows import require as _require
from fedsafe.robust.rowwise import gram_float64, use_gram_kernel

# One converted or centred block of columns (n rows x B columns) is about this many bytes; it
# bounds the extra memory whatever n and d are. Each block costs two parallel regions (the
# subtraction, the product). Measured for the centred distances of n = 50, d = 10⁶ float32 on
# 2 threads, in multiples of one mean(0) in the same process, blocks of 8 / 16 / 32 / 64 MiB
# cost 4.6 / 4.5 / 5.5 / 6.4 on a quiet machine (small blocks stay in cache; uncentred 3.7-4)
# but 13 / 8.7 / 5.7 / 4.7 on an oversubscribed one (load 8 on 2 cores: every parallel region
# then waits milliseconds for its second thread). 16 MiB: the quiet optimum.
_BLOCK_BYTES = 16 << 20
# The probe that picks the centre holds at most this many values (n rows x its columns) and is
# worked on by numpy on one thread: ~0.4 ms at n = 50, and no waiting for a second thread to be
# scheduled (on a loaded machine each parallel region of torch or BLAS cost milliseconds).
_PROBE_VALUES = 16384
# Its columns come in runs of adjacent ones (a 64-byte cache line holds 16 float32 values: one
# value per line would read a line for each), spread evenly over the d columns.
_PROBE_RUN = 32



def check_d2(d2: Tensor, rule: str) -> int:
    if d2.ndim != 2 or d2.shape[0] != d2.shape[1]:
        raise ValueError(
            f"{rule}: squared distances must be a square (n, n) matrix, got shape {tuple(d2.shape)}"
        )
    if d2.shape[0] == 0:
        raise ValueError(f"{rule}: no updates")
    return d2.shape[0]


def block_columns(n: int, itemsize: int, d: int) -> int:
    """Columns per block of :func:`gram`: about ``_BLOCK_BYTES / (n · itemsize)``, at least
    1024 (fewer, larger products when n is large), at most ``d``."""
    return max(1, min(d, max(1024, _BLOCK_BYTES // max(1, n * itemsize))))


def gram(updates: Tensor, *, dtype: torch.dtype | None = None, centre: Tensor | None = None) -> Tensor:
    """``G = (X − 1cᵀ)(X − 1cᵀ)ᵀ`` accumulated in ``dtype`` (default: the updates' dtype), with
    ``c = centre`` (a length-d vector) or 0, returned in ``dtype``. See :func:`_gram64`."""
    return _gram64(updates, dtype or updates.dtype, centre).to(dtype or updates.dtype)


def _gram64(updates: Tensor, dtype: torch.dtype, centre: Tensor | None) -> Tensor:
    """The Gram matrix of :func:`gram` before its cast to ``dtype`` (float64 where it was
    summed in float64).

    Float CPU rows (n ≤ 512, not too few values): the register-tiled kernel
    :func:`fedsafe.robust.rowwise.gram_float64`: column blocks of at most
    :func:`~fedsafe.robust.rowwise.gram_block` columns converted to ``dtype`` (and centred) in
    one pass into a per-thread buffer, the upper triangle's dot products accumulated in
    ``dtype`` per block and the blocks summed in float64; exactly symmetric, and rows equal bit
    for bit get equal entries. Otherwise torch: without centring or conversion one product
    ``X Xᵀ``; else column blocks of :func:`block_columns` columns, each converted and centred
    in one pass into a reused buffer, its product computed in ``dtype`` and added into a
    float64 total. Either way every dot product is rounded over at most one block's length
    (one product: d) and the extra memory is a block, not a copy of the matrix."""
    if use_gram_kernel(updates, dtype):
        return gram_float64(updates, dtype, centre)
    if centre is None and updates.dtype == dtype:
        return updates @ updates.T
    n, d = updates.shape
    cols = block_columns(n, torch.finfo(dtype).bits // 8, d)
    c = None if centre is None else centre.to(dtype)
    g = torch.zeros(n, n, dtype=torch.float64, device=updates.device)
    buf = torch.empty(n, cols, dtype=dtype, device=updates.device)
    for start in range(0, d, cols):  # a few dozen blocks, not single coordinates
        stop = min(d, start + cols)
        block = buf[:, : stop - start]
        if c is None:
            block.copy_(updates[:, start:stop])
        else:
            torch.sub(updates[:, start:stop], c[start:stop], out=block)
        g += block @ block.T
    return g


def probe_columns(n: int, d: int) -> Tensor | None:
    """Column indices of the probe: ``⌊16384 / n⌋`` columns rounded down to whole runs of 32
    adjacent ones (at least one run) with evenly spaced starts, or None (all columns) when
    ``d`` is not larger."""
    runs = max(1, _PROBE_VALUES // max(1, n) // _PROBE_RUN)
    if d <= runs * _PROBE_RUN:
        return None
    starts = torch.arange(runs) * (d - _PROBE_RUN) // max(1, runs - 1)
    return (starts[:, None] + torch.arange(_PROBE_RUN)).flatten()


def distance_centre(updates: Tensor) -> int | None:
    """The row that :func:`pairwise_sq_distances` subtracts before its Gram product, or None
    for no centring. Decided on the probe columns (:func:`probe_columns`, in float64, distances
    taken after subtracting the probe's mean, so they are accurate whatever the offset):

    * ``r`` = the row whose ``⌊n/2⌋`` nearest other rows are nearest (smallest sum of squared
      distances; first index on ties): with fewer than n/2 Byzantine rows it lies in the bulk
      of the honest rows, never in a far outlier;
    * centre on ``x_r`` iff the median over rows of ``‖x_i − x_r‖²`` is below the median of
      ``‖x_i‖²``, i.e. when a common offset makes the rows nearer to ``x_r`` than to the
      origin (model weights, or gradients with a common part larger than their spread).

    Rows around the origin (gradients dominated by noise) are not centred: there the origin is
    already as good a centre, and the subtraction would cost one more pass over the matrix."""
    n, d = updates.shape
    if n < 2 or d == 0:
        return None
    cols = probe_columns(n, d)
    p = updates if cols is None else updates.index_select(1, cols.to(updates.device))
    p = p.detach().to("cpu", torch.float64).numpy()
    q = p - p.mean(axis=0)
    gq = np.einsum("ik,jk->ij", q, q)  # numpy's own loop: one thread, no BLAS thread pool
    sq = np.diag(gq)
    dq = np.maximum(sq[:, None] + sq[None, :] - 2 * gq, 0.0)
    np.fill_diagonal(dq, np.inf)
    r = int(np.argmin(np.sort(dq, axis=1)[:, : n // 2].sum(axis=1)))
    dq[r, r] = 0.0
    return r if np.median(dq[r]) < np.median((p * p).sum(axis=1)) else None


def pairwise_sq_distances(updates: Tensor, *, dtype: torch.dtype | None = None) -> Tensor:
    """``D_ij = ‖x_i − x_j‖²``, expanded as ``‖c_i‖² + ‖c_j‖² − 2⟨c_i, c_j⟩`` with
    ``c_i = x_i − c`` for a centre ``c`` (distances do not depend on it).

    ``c`` is the row :func:`distance_centre` picks, or 0: rows that share a large offset
    (model weights) are centred first, since the plain expansion would subtract numbers of size
    ‖x‖² ≫ D and keep only rounding noise. The Gram matrix of the centred rows is that of
    :func:`gram` (:func:`_gram64`: for float CPU rows a tiled kernel over column blocks of at
    most 512 columns summed in float64, and not cast back to ``dtype``; otherwise torch: one
    ``X Xᵀ`` when not centred, column blocks summed in float64 when centred), O(n² d) flops
    and no (n, n, d) intermediate; the expansion is done in float64, clamped at 0,
    symmetrised, its diagonal set to exactly 0, and cast to ``dtype`` (the accumulation and
    result dtype; default: the updates' dtype).

    Error bound. With ``u`` the unit roundoff of the accumulation dtype (2⁻²⁴ for float32,
    2⁻⁵³ for float64), ``m`` the length of one rounded dot product (the kernel's block, at most
    512 columns; for torch ``d`` for the single product, the block's column count otherwise)
    and ``γ_m = m·u / (1 − m·u)``,

        |D̂_ij − D_ij| ≤ (2γ_m + 8u) · (‖x_i − c‖² + ‖x_j − c‖²)

    (2γ_m for the three Gram entries, whatever order the kernel or the BLAS sums in; 4u for
    rounding the centred values, nothing when they are exact, as they are wherever x and c
    agree to within a factor 2; 2u for the cast of a Gram computed by a single torch product;
    the float64 sum over ⌈d/m⌉ blocks adds at most ⌈d/m⌉·2⁻⁵³ times the same factor).
    The error is relative to the spread about ``c``, not to ‖x‖: an offset shared by all rows
    costs nothing. What remains is the worst case of any Gram expansion: a pair much closer to
    each other than to ``c`` has a relative error of up to the bound over D_ij. Rows far from
    the bulk make that worse only when they are the centre, which the choice of ``c`` avoids.
    Duplicated rows come out exactly 0 apart from the kernel (equal rows, equal sums); from
    torch's GEMM they may come out a small positive distance apart. The bound is
    the worst rounding can do; typical errors are far smaller, as rounding errors partly cancel.
    """
    if updates.ndim != 2:
        raise ValueError(
            f"pairwise_sq_distances: updates must be a 2-D (n, d) tensor, got shape {tuple(updates.shape)}"
        )
    r = distance_centre(updates)
    g = _gram64(updates, dtype or updates.dtype, None if r is None else updates[r]).to(torch.float64)
    sq = torch.diagonal(g)
    d2 = (sq[:, None] + sq[None, :] - 2 * g).clamp_min(0)
    d2 = (d2 + d2.T) / 2
    d2.fill_diagonal_(0)
    return d2.to(dtype or updates.dtype)


def nnm_mixing(d2: Tensor, f: int) -> Tensor:
    """NNM's row-stochastic mixing matrix (Allouah et al., 2023): ``W_ij = 1/(n − f)`` if ``j``
    is one of the ``n − f`` nearest neighbours of ``i`` (``i`` itself always included, then the
    others by distance, ties by lowest index), else 0. Requires ``n > 2f``."""
    n = check_d2(d2, "nnm")
    _require("nnm", n, f, 2 * f < n, "n > 2f")
    keyed = d2.clone()
    keyed.fill_diagonal_(-1.0)  # self first even if a duplicate of lower index is also at 0
    nearest = torch.sort(keyed, dim=1, stable=True).indices[:, : n - f]
    w = torch.zeros_like(d2)
    w.scatter_(1, nearest, 1.0 / (n - f))
    return w


def weiszfeld_weights(
    d2: Tensor, *, eps: float = 1e-8, tol: float = 1e-6, max_iter: int = 100
) -> Tensor:
    """Convex weights ``α`` (float64, Σα = 1) with ``z = Σ_i α_i x_i`` the smoothed Weiszfeld
    approximation of the geometric median (Pillutla, Kakade, Harchaoui, RFA, 2022).

    Start at the mean (``α = 1/n``); repeat ``w_i = 1 / max(eps, ‖z − x_i‖)``, ``α = w / Σw``
    until the step ``‖z_new − z‖`` is at most ``tol`` times the median distance
    ``median_i ‖z_new − x_i‖``, or ``max_iter`` steps were taken. Every iterate is a convex
    combination of the updates, so the distances follow from ``D`` alone:
    ``‖z − x_i‖² = Σ_j α_j D_ij − ½ Σ_jk α_j α_k D_jk`` (clamped at 0), and the step from the
    change of weights ``δ = α_new − α`` (Σδ = 0): ``‖Δz‖² = −½ δᵀ D δ``.

    RFA stops when the objective ``Σ_i ‖z − x_i‖`` changes by at most ``tol`` relative; far
    outliers dominate that sum, so with a few updates at 10⁶ and the rest of spread 1 it
    stopped 0.45 away from the geometric median (found comparing with ByzFL). The median
    distance is the scale of the bulk, whatever the outliers do: the step is measured
    against it.
    """
    n = check_d2(d2, "geometric_median")
    if not eps > 0 or not tol >= 0 or not (isinstance(max_iter, int) and max_iter >= 1):
        raise ValueError(
            "geometric_median: needs eps > 0, tol >= 0, integer max_iter >= 1; "
            f"got eps={eps}, tol={tol}, max_iter={max_iter}"
        )
    dd = d2.to(torch.float64)

    def dist(a: Tensor) -> Tensor:
        da = dd @ a
        return (da - 0.5 * (a @ da)).clamp_min(0).sqrt()

    alpha = torch.full((n,), 1.0 / n, dtype=torch.float64, device=d2.device)
    for _ in range(max_iter):
        w = 1.0 / dist(alpha).clamp_min(eps)
        new = w / w.sum()
        delta = new - alpha
        step = float((-0.5 * (delta @ (dd @ delta))).clamp_min(0)) ** 0.5
        alpha = new
        if step <= tol * float(median_value(dist(alpha))):
            break
    return alpha
