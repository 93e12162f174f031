"""Pairwise squared distances and the selections that need nothing but them.

Distance-based rules (Krum, Multi-Krum, Bulyan's selection in :mod:`fedsafe.robust.krum`; NNM's
mixing and the geometric median's Weiszfeld weights below) are split in two:
``pairwise_sq_distances`` turns the ``(n, d)`` updates into an ``(n, n)`` matrix ``D`` with
``D_ij = ‖x_i − x_j‖²``, and the selections work from ``D`` alone. The TEE subsystem decodes ``D`` itself (the untrusted accelerator never sees updates) and
calls the same selection functions, so plaintext and TEE runs select identically.

Precision, whatever the Byzantine rows are. An adversary sending f < n/2 of the rows must
not be able to change the distances between the others, so no entry ``D_ij`` may depend on a
third row's values beyond rounding that is bounded by the honest rows alone
(``pairwise_sq_distances`` states the bounds):

* numba kernel (float CPU rows, n ≤ 512: the engine's case): ``D_ij = Σ_k (x_ik − x_jk)²``
  summed directly (:func:`fedsafe.robust.rowwise.sq_distances_float64`). Each entry comes from
  rows i and j alone as a sum of non-negative terms, so its error is relative to ``D_ij`` itself:
  other rows cannot touch it, and a shared offset (model weights) costs nothing.
* otherwise (torch: other devices or dtypes, more rows, tiny inputs, no numba): the Gram
  expansion ``‖c_i‖² + ‖c_j‖² − 2⟨c_i, c_j⟩`` of the rows centred on the coordinate-wise median
  ``c``, whose error is relative to ``‖x_i − c‖² + ‖x_j − c‖²``. With fewer than n/2 Byzantine
  rows every ``c_k`` lies between the smallest and the largest honest value of coordinate k, so
  for honest rows that is bounded by the honest rows' own spread.

Before issue #25 the centre was one of the rows, picked on a fixed, public subset of columns: a
Byzantine row equal to the honest mean on those columns and shifted elsewhere became the centre,
and the honest distances carried errors of the size of its shift (Krum then disagreed with
exact arithmetic in 19 of 20 draws). A centre chosen from a sample of the columns, or any single
row, can be steered that way; the two rules above cannot.

Ties: every selection orders by value with a *stable* sort, so equal scores or distances are
broken by the lowest index. Exact ties only arise when distances are computed exactly (e.g.
integer-valued updates); duplicated rows tie among themselves but give the same output
whichever copy is picked.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedsafe.robust.rows import median_value
from fedsafe.robust.rows import require as _require
from fedsafe.robust.rowwise import gram_float64, sq_distances_float64, use_gram_kernel
from fedsafe.robust.selection import coordinate_median

# One converted or centred block of columns (n rows x B columns) of the torch path is about this
# many bytes; it bounds the extra memory whatever n and d are. Each block costs two parallel
# regions (the subtraction, the product). Measured for the centred distances of n = 50, d = 10⁶
# float32 on 2 threads, in multiples of one mean(0) in the same process, blocks of 8 / 16 / 32 /
# 64 MiB cost 4.6 / 4.5 / 5.5 / 6.4 on a quiet machine (small blocks stay in cache; uncentred
# 3.7-4) but 13 / 8.7 / 5.7 / 4.7 on an oversubscribed one (load 8 on 2 cores: every parallel
# region then waits milliseconds for its second thread). 16 MiB: the quiet optimum.
_BLOCK_BYTES = 16 << 20


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


def gram(updates: Tensor, *, dtype: torch.dtype | None = None, center: Tensor | None = None) -> Tensor:
    """``G = (X − 1cᵀ)(X − 1cᵀ)ᵀ`` accumulated in ``dtype`` (default: the updates' dtype), with
    ``c = centre`` (a length-d vector) or 0, returned in ``dtype``. See :func:`_gram64`."""
    return _gram64(updates, dtype or updates.dtype, center).to(dtype or updates.dtype)


def _gram64(updates: Tensor, dtype: torch.dtype, center: Tensor | None) -> Tensor:
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
        return gram_float64(updates, dtype, center)
    if center is None and updates.dtype == dtype:
        return updates @ updates.T
    n, d = updates.shape
    cols = block_columns(n, torch.finfo(dtype).bits // 8, d)
    c = None if center is None else center.to(dtype)
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


def distance_center(updates: Tensor) -> Tensor | None:
    """The centre that the torch path of :func:`pairwise_sq_distances` subtracts before its Gram
    product: the coordinate-wise median of all rows (:func:`fedsafe.robust.selection.coordinate_median`;
    the mean of the two middle values for even n), or None for fewer than two rows or no columns.

    No single row and no subset of the columns decides it: with f < n/2 Byzantine rows, every
    coordinate of it lies between the smallest and the largest honest value of that coordinate.
    For odd n, (n+1)/2 > f values are at or below the median and as many at or above it, so an
    honest value lies on each side; for even n the same holds for both middle values, and
    ``(a + b) / 2`` rounded lies between them (rounding is monotone; finite values, no
    overflow). Hence ``‖x_h − c‖² ≤ R_H² = Σ_k (max_h x_hk − min_h x_hk)²`` for every honest
    row h, a quantity of the honest rows alone, whatever the Byzantine rows hold."""
    n, d = updates.shape
    if n < 2 or d == 0:
        return None
    return coordinate_median(updates)


def pairwise_sq_distances(updates: Tensor, *, dtype: torch.dtype | None = None) -> Tensor:
    """``D_ij = ‖x_i − x_j‖²`` as an (n, n) matrix in ``dtype`` (the accumulation and result
    dtype; default: the updates' dtype), exactly symmetric, with an exactly zero diagonal,
    O(n² d) flops and no (n, n, d) intermediate.

    * Float CPU rows with n ≤ 512 (:func:`fedsafe.robust.rowwise.use_gram_kernel`: the engine's
      case): the numba kernel :func:`~fedsafe.robust.rowwise.sq_distances_float64` sums the
      squared differences directly, over column blocks of at most 512 columns (each block's
      differences and sums in ``dtype``, in float64 for float64 updates), the blocks summed in
      float64. Rows equal bit for bit come out exactly 0 apart.
    * Otherwise torch: the Gram expansion ``‖c_i‖² + ‖c_j‖² − 2⟨c_i, c_j⟩`` of ``c_i = x_i − c``,
      ``c`` the coordinate-wise median (:func:`distance_center`; distances do not depend on it),
      the Gram matrix of :func:`gram` (column blocks, each converted and centred in one pass,
      its product in ``dtype``, summed in float64), the expansion done in float64, clamped at 0
      and symmetrised. Duplicated rows may come out a small positive distance apart (GEMM).

    Error bounds. With ``u`` the unit roundoff of the accumulation dtype (2⁻²⁴ for float32,
    2⁻⁵³ for float64), ``m`` the length of one rounded sum (the kernel's block, at most 512
    columns; for torch the block's column count), ``γ_m = m·u / (1 − m·u)`` and ``B`` the number
    of blocks summed in float64:

    * kernel: ``|D̂_ij − D_ij| ≤ (γ_{m+2} + B·2⁻⁵³)·D_ij`` (γ_m for a sum of m products, whatever
      order the vectorised loop adds in; 2u for rounding the difference before squaring it,
      nothing when it is exact, as it is wherever the two values agree to within a factor 2).
      The error of each entry is relative to that entry: for float32 and m = 512 at most
      3.1e-5·D_ij, whatever any row holds, offsets included.
    * torch: ``|D̂_ij − D_ij| ≤ (2γ_m + 8u + B·2⁻⁵³)·(‖x_i − c‖² + ‖x_j − c‖²)`` (2γ_m for the
      three Gram entries, 4u for rounding the centred values). For two honest rows, with fewer
      than n/2 Byzantine rows, ``‖x_h − c‖² ≤ R_H²`` (:func:`distance_center`): the bound is
      set by the honest rows' spread, and Byzantine rows, however far, only inflate the errors
      of their own entries, which are then as large as their distances. What remains is the
      worst case of any Gram expansion: two rows much closer to each other than to ``c`` have
      a relative error of up to the bound over ``D_ij``.

    Casting the result to ``dtype`` rounds it once more (u relative). The bounds are the worst
    rounding can do; typical errors are far smaller, as rounding errors partly cancel. What no
    floating-point computation can promise is the order of two distances closer than these
    bounds: selections follow exact arithmetic except on such near-ties.
    """
    if updates.ndim != 2:
        raise ValueError(
            f"pairwise_sq_distances: updates must be a 2-D (n, d) tensor, got shape {tuple(updates.shape)}"
        )
    acc = dtype or updates.dtype
    if use_gram_kernel(updates, acc):
        return sq_distances_float64(updates, acc).to(acc)
    g = _gram64(updates, acc, distance_center(updates)).to(torch.float64)
    sq = torch.diagonal(g)
    d2 = (sq[:, None] + sq[None, :] - 2 * g).clamp_min(0)
    d2 = (d2 + d2.T) / 2
    d2.fill_diagonal_(0)
    return d2.to(acc)


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
