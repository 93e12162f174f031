"""One or two passes over the rows of an (n, d) update matrix, in numba: squared norms (or
squared distances to one vector), the Gram matrix, rows scaled by per-row factors (clipping)
and a weighted mean of the rows around a vector (centered clipping).

Why kernels: torch builds these from whole-matrix intermediates. ``x - v`` or ``x * c`` each
write a new (n, d) matrix, and on this project's machines a fresh torch allocation of that size
costs more than reading the matrix several times: its pages are faulted in 4 KiB at a time
(torch does not ask for transparent huge pages; numpy, which allocates every output here, does
for blocks of 4 MiB and more). MKL's ``X Xᵀ`` for n = 50 rows runs at a fraction of the CPU's
peak on these AMD cores and computes both halves of the symmetric product. Here:

* :func:`row_sq_norms` — ``Σ_j (x_ij − c_j)²`` per row in one read, the differences and the
  sum in float64 (exact differences, no (n, d) intermediate);
* :func:`gram_float64` — the upper triangle of ``(X − 1cᵀ)(X − 1cᵀ)ᵀ`` in 4 × 4 tiles of rows
  that stay in registers, over column blocks of at most ``_GRAM_BLOCK`` columns (converted and
  centred in one pass into a per-thread buffer that stays in L2), each block's dot products
  rounded in the accumulation dtype and the blocks summed in float64;
* :func:`sq_distances_float64` — the same tiles and blocks, but each tile sums the squared
  *differences* ``(x_ik − x_jk)²`` of its row pairs: every distance is a sum of non-negative
  terms computed from its two rows alone, so its rounding error is relative to itself (no
  cancellation, no centre, nothing another row can influence). A subtraction and a fused
  multiply-add per pair and column instead of one multiply-add: the subtractions go to the
  floating-point adders, which the Gram's FMAs leave idle: it measured within ±6% of the
  centred Gram (n = 50, d = 10⁶ float32, one or two threads);
* :func:`scale_rows` / :func:`clip_rows` — ``x_i · s_i`` into a new matrix, one read and one
  write (clipping computes each row's norm and scales the row while it is still in cache);
* :func:`centered_weighted_sum` — ``v + Σ_i w_i (x_i − v)`` in one read of the rows it
  weighs, summed in float64.

The columns (for :func:`clip_rows`, the rows) are split into chunks, several per thread, that
``torch.get_num_threads()`` threads take in turn (:func:`fedsafe.robust.selection.run_chunks`);
a per-chunk partial (norms, Gram, distances) is summed afterwards in float64 in chunk order, so
results are deterministic for a given thread count, and rows equal bit for bit get equal norms,
Gram entries and distances.
Without numba, for other dtypes or devices, for tensors that require grad and for tiny inputs
the same quantities come from torch (:func:`_use_kernel`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.selection import kernel_eligible, njit, run_chunks, split_range

# Below this many elements (n·d) torch is as fast and needs no numba call.
_MIN_KERNEL_SIZE = 1 << 16
# Columns per thread below which fewer threads are used.
_MIN_COLUMNS_PER_THREAD = 16384
# Rows of the Gram kernel above which torch's GEMM is used (register tiles pay off for few rows).
_MAX_GRAM_ROWS = 512
# One Gram block (n rows, padded to a multiple of 4, of B columns) is about this many bytes,
# B between 64 and _GRAM_BLOCK: it stays in L2, and each tile's horizontal sums are amortised.
_GRAM_BLOCK_BYTES = 128 * 1024
_GRAM_BLOCK = 512
# Columns of one float64 accumulator block of centred_weighted_sum (stays in L1).
_SUM_BLOCK = 1024


def _use_kernel(updates: Tensor) -> bool:
    return kernel_eligible(updates, _MIN_KERNEL_SIZE)


def _as_numpy(t: Tensor) -> np.ndarray:
    """C-contiguous numpy view of the input (a copy only when it is not contiguous)."""
    return t.detach().resolve_neg().resolve_conj().contiguous().numpy()


if njit is not None:
    # fastmath "reassoc" lets LLVM vectorise the reductions (partial sums per SIMD lane, then
    # a fixed tree): the order is fixed at compile time, the same for every row; "contract"
    # allows fused multiply-adds. No other fast-math assumption (inputs are finite anyway).
    _REDUCE = {"reassoc", "contract"}

    @njit(cache=True, nogil=True, fastmath=_REDUCE)
    def _sq_dist_columns(x, center, centered, c0, c1, out):  # pragma: no cover - compiled
        """out[r] = Σ_{c0 ≤ j < c1} (x[r, j] − centre[j])² (centre ignored unless centred)."""
        for r in range(x.shape[0]):
            row = x[r, c0:c1]
            s = 0.0
            if centered:
                cen = center[c0:c1]
                for j in range(row.shape[0]):
                    t = np.float64(row[j]) - np.float64(cen[j])
                    s += t * t
            else:
                for j in range(row.shape[0]):
                    t = np.float64(row[j])
                    s += t * t
            out[r] = s

    @njit(cache=True, nogil=True, fastmath=_REDUCE)
    def _gram_tile(buf, i0, j0, zero, out):  # pragma: no cover - compiled
        """out[i0:i0+4, j0:j0+4] += the 16 dot products of buf rows i0.. and j0.. (one block)."""
        a0 = buf[i0]
        a1 = buf[i0 + 1]
        a2 = buf[i0 + 2]
        a3 = buf[i0 + 3]
        b0 = buf[j0]
        b1 = buf[j0 + 1]
        b2 = buf[j0 + 2]
        b3 = buf[j0 + 3]
        s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
        s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
        for k in range(a0.shape[0]):
            x0 = a0[k]
            x1 = a1[k]
            x2 = a2[k]
            x3 = a3[k]
            y0 = b0[k]
            y1 = b1[k]
            y2 = b2[k]
            y3 = b3[k]
            s00 += x0 * y0
            s01 += x0 * y1
            s02 += x0 * y2
            s03 += x0 * y3
            s10 += x1 * y0
            s11 += x1 * y1
            s12 += x1 * y2
            s13 += x1 * y3
            s20 += x2 * y0
            s21 += x2 * y1
            s22 += x2 * y2
            s23 += x2 * y3
            s30 += x3 * y0
            s31 += x3 * y1
            s32 += x3 * y2
            s33 += x3 * y3
        o0 = out[i0]
        o1 = out[i0 + 1]
        o2 = out[i0 + 2]
        o3 = out[i0 + 3]
        o0[j0] += s00
        o0[j0 + 1] += s01
        o0[j0 + 2] += s02
        o0[j0 + 3] += s03
        o1[j0] += s10
        o1[j0 + 1] += s11
        o1[j0 + 2] += s12
        o1[j0 + 3] += s13
        o2[j0] += s20
        o2[j0 + 1] += s21
        o2[j0 + 2] += s22
        o2[j0 + 3] += s23
        o3[j0] += s30
        o3[j0 + 1] += s31
        o3[j0 + 2] += s32
        o3[j0 + 3] += s33

    @njit(cache=True, nogil=True, fastmath=_REDUCE)
    def _gram_columns(x, center, centered, buf, zero, c0, c1, out):  # pragma: no cover
        """out (upper triangle by 4 x 4 tiles, float64) += Gram matrix of the rows of
        x[:, c0:c1] minus centre, in blocks of buf's width converted to buf's dtype (zero: a 0
        of that dtype); buf has the rows padded to a multiple of 4, the padding rows zero."""
        n = x.shape[0]
        groups = buf.shape[0] // 4
        block = buf.shape[1]
        for j0 in range(c0, c1, block):
            width = min(block, c1 - j0)
            for r in range(n):
                src = x[r, j0 : j0 + width]
                dst = buf[r]
                if centered:
                    cen = center[j0 : j0 + width]
                    for k in range(width):
                        dst[k] = src[k] - cen[k]
                else:
                    for k in range(width):
                        dst[k] = src[k]
                for k in range(width, block):  # a short last block: zeros add nothing
                    dst[k] = zero
            for gi in range(groups):
                for gj in range(gi, groups):
                    _gram_tile(buf, 4 * gi, 4 * gj, zero, out)

    @njit(cache=True, nogil=True, fastmath=_REDUCE)
    def _dist_tile(buf, i0, j0, zero, out):  # pragma: no cover - compiled
        """out[i0:i0+4, j0:j0+4] += the 16 sums of squared differences of buf rows i0.. and
        j0.. (one block), each difference and sum in buf's dtype."""
        a0 = buf[i0]
        a1 = buf[i0 + 1]
        a2 = buf[i0 + 2]
        a3 = buf[i0 + 3]
        b0 = buf[j0]
        b1 = buf[j0 + 1]
        b2 = buf[j0 + 2]
        b3 = buf[j0 + 3]
        s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
        s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
        for k in range(a0.shape[0]):
            x0 = a0[k]
            x1 = a1[k]
            x2 = a2[k]
            x3 = a3[k]
            y0 = b0[k]
            y1 = b1[k]
            y2 = b2[k]
            y3 = b3[k]
            t = x0 - y0
            s00 += t * t
            t = x0 - y1
            s01 += t * t
            t = x0 - y2
            s02 += t * t
            t = x0 - y3
            s03 += t * t
            t = x1 - y0
            s10 += t * t
            t = x1 - y1
            s11 += t * t
            t = x1 - y2
            s12 += t * t
            t = x1 - y3
            s13 += t * t
            t = x2 - y0
            s20 += t * t
            t = x2 - y1
            s21 += t * t
            t = x2 - y2
            s22 += t * t
            t = x2 - y3
            s23 += t * t
            t = x3 - y0
            s30 += t * t
            t = x3 - y1
            s31 += t * t
            t = x3 - y2
            s32 += t * t
            t = x3 - y3
            s33 += t * t
        o0 = out[i0]
        o1 = out[i0 + 1]
        o2 = out[i0 + 2]
        o3 = out[i0 + 3]
        o0[j0] += s00
        o0[j0 + 1] += s01
        o0[j0 + 2] += s02
        o0[j0 + 3] += s03
        o1[j0] += s10
        o1[j0 + 1] += s11
        o1[j0 + 2] += s12
        o1[j0 + 3] += s13
        o2[j0] += s20
        o2[j0 + 1] += s21
        o2[j0 + 2] += s22
        o2[j0 + 3] += s23
        o3[j0] += s30
        o3[j0 + 1] += s31
        o3[j0 + 2] += s32
        o3[j0 + 3] += s33

    @njit(cache=True, nogil=True, fastmath=_REDUCE)
    def _dist_columns(x, buf, zero, c0, c1, out):  # pragma: no cover - compiled
        """out (upper triangle by 4 x 4 tiles, float64) += Σ_k (x_ik − x_jk)² over the columns
        c0..c1-1 of x, in blocks of buf's width converted to buf's dtype (zero: a 0 of that
        dtype); buf has the rows padded to a multiple of 4 (the padding rows zero, their entries never read)."""
        n = x.shape[0]
        groups = buf.shape[0] // 4
        block = buf.shape[1]
        for j0 in range(c0, c1, block):
            width = min(block, c1 - j0)
            for r in range(n):
                src = x[r, j0 : j0 + width]
                dst = buf[r]
                for k in range(width):
                    dst[k] = src[k]
                for k in range(width, block):  # a short last block: equal zeros add nothing
                    dst[k] = zero
            for gi in range(groups):
                for gj in range(gi, groups):
                    _dist_tile(buf, 4 * gi, 4 * gj, zero, out)

    @njit(cache=True, nogil=True)
    def _scale_columns(x, factors, c0, c1, out):  # pragma: no cover - compiled
        """out[r, c0:c1] = x[r, c0:c1] · factors[r] (product in float64, rounded once)."""
        for r in range(x.shape[0]):
            src = x[r, c0:c1]
            dst = out[r, c0:c1]
            s = factors[r]
            if s == 1.0:
                for j in range(src.shape[0]):
                    dst[j] = src[j]
            else:
                for j in range(src.shape[0]):
                    dst[j] = np.float64(src[j]) * s

    @njit(cache=True, nogil=True, fastmath=_REDUCE)
    def _clip_rows(x, tau, r0, r1, out, norms):  # pragma: no cover - compiled
        """Rows r0..r1-1: norms[r] = ‖x_r‖ (float64), out[r] = x_r · min(1, τ/‖x_r‖)."""
        for r in range(r0, r1):
            src = x[r]
            s = 0.0
            for j in range(src.shape[0]):
                t = np.float64(src[j])
                s += t * t
            norm = np.sqrt(s)
            norms[r] = norm
            dst = out[r]
            if norm > tau:
                factor = tau / norm
                for j in range(src.shape[0]):
                    dst[j] = np.float64(src[j]) * factor
            else:
                for j in range(src.shape[0]):
                    dst[j] = src[j]

    @njit(cache=True, nogil=True)
    def _rescale_rows(out, factors, r0, r1):  # pragma: no cover - compiled
        """Rows r0..r1-1 with factor ≠ 1: out[r] = out[r] · factors[r] in place (float64
        product, rounded once)."""
        for r in range(r0, r1):
            s = factors[r]
            if s == 1.0:
                continue
            row = out[r]
            for j in range(row.shape[0]):
                row[j] = np.float64(row[j]) * s

    @njit(cache=True, nogil=True)
    def _centered_sum_columns(x, w, v, centered, block, c0, c1, out):  # pragma: no cover
        """out[c0:c1] = v + Σ_r w[r] (x[r] − v) (v = 0 unless centred) over columns
        c0..c1-1, summed in float64; rows of weight 0 are not read."""
        acc = np.empty(block, dtype=np.float64)
        for j0 in range(c0, c1, block):
            width = min(block, c1 - j0)
            for k in range(width):
                acc[k] = 0.0
            for r in range(x.shape[0]):
                wr = w[r]
                if wr == 0.0:
                    continue
                src = x[r, j0 : j0 + width]
                if centered:
                    vv = v[j0 : j0 + width]
                    for k in range(width):
                        acc[k] += wr * (np.float64(src[k]) - np.float64(vv[k]))
                else:
                    for k in range(width):
                        acc[k] += wr * np.float64(src[k])
            dst = out[j0 : j0 + width]
            if centered:
                vv = v[j0 : j0 + width]
                for k in range(width):
                    dst[k] = np.float64(vv[k]) + acc[k]
            else:
                for k in range(width):
                    dst[k] = acc[k]


def _sum_parts(parts: np.ndarray) -> np.ndarray:
    """Σ over the chunks' partials (axis 0), added in chunk order: the same result whichever
    thread ran which chunk."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def row_sq_norms(updates: Tensor, center: Tensor | None = None) -> Tensor:
    """``Σ_j (x_ij − c_j)²`` for every row i (``c = centre`` or 0), float64, on the updates'
    device: differences and sums in float64 (for float32 rows each difference is exact), in one
    pass and no (n, d) intermediate. Rows equal bit for bit get equal values."""
    n, d = updates.shape
    if center is not None and center.shape != (d,):
        raise ValueError(f"row_sq_norms: center must have shape ({d},), got {tuple(center.shape)}")
    if not _use_kernel(updates):
        diff = updates.to(torch.float64)
        if center is not None:
            diff = diff - center.to(device=updates.device, dtype=torch.float64)
        return (diff * diff).sum(dim=1)
    x = _as_numpy(updates)
    c = x[0] if center is None else _as_numpy(center.to(updates.dtype))
    bounds, threads = split_range(d, 64, _MIN_COLUMNS_PER_THREAD)
    parts = np.zeros((len(bounds) - 1, n), dtype=np.float64)
    run_chunks(
        lambda t: _sq_dist_columns(x, c, center is not None, bounds[t], bounds[t + 1], parts[t]),
        len(bounds) - 1,
        threads,
    )
    return torch.from_numpy(_sum_parts(parts))


def gram_block(n: int, itemsize: int) -> int:
    """Columns per block of the Gram kernel: about ``_GRAM_BLOCK_BYTES`` per block of the n rows
    (padded to a multiple of 4), a multiple of 16 between 64 and ``_GRAM_BLOCK``."""
    rows = -(-n // 4) * 4
    return max(64, min(_GRAM_BLOCK, _GRAM_BLOCK_BYTES // (rows * itemsize) // 16 * 16))


def use_gram_kernel(updates: Tensor, dtype: torch.dtype) -> bool:
    """Whether :func:`gram_float64` and :func:`sq_distances_float64` can run their tile kernels
    (else torch: a GEMM)."""
    return _use_kernel(updates) and dtype in (torch.float32, torch.float64) and updates.shape[0] <= _MAX_GRAM_ROWS


def gram_float64(updates: Tensor, dtype: torch.dtype, center: Tensor | None = None) -> Tensor:
    """``G = (X − 1cᵀ)(X − 1cᵀ)ᵀ`` (``c = centre`` or 0) as a float64 (n, n) tensor, each
    block's dot products accumulated in ``dtype`` over at most :func:`gram_block` columns
    (the centred values rounded to ``dtype``: ``x − c`` computed in the wider of the two) and
    the blocks summed in float64. Symmetric by construction (the upper triangle is mirrored).
    Needs :func:`use_gram_kernel`."""
    n, d = updates.shape
    x = _as_numpy(updates)
    acc = np.float32 if dtype == torch.float32 else np.float64
    c = np.zeros(1, dtype=acc) if center is None else _as_numpy(center.to(dtype))
    block = gram_block(n, np.dtype(acc).itemsize)
    bounds, threads = split_range(d, block, _MIN_COLUMNS_PER_THREAD)
    chunks = len(bounds) - 1
    rows = -(-n // 4) * 4
    parts = np.zeros((chunks, rows, rows), dtype=np.float64)
    bufs = np.zeros((chunks, rows, block), dtype=acc)  # the padding rows stay zero
    run_chunks(
        lambda t: _gram_columns(x, c, center is not None, bufs[t], acc(0), bounds[t], bounds[t + 1], parts[t]),
        chunks,
        threads,
    )
    upper = np.triu(_sum_parts(parts)[:n, :n])
    return torch.from_numpy(upper + np.triu(upper, 1).T)


def sq_distances_float64(updates: Tensor, dtype: torch.dtype) -> Tensor:
    """``D_ij = Σ_k (x_ik − x_jk)²`` as a float64 (n, n) tensor: each difference and each
    block's sum of squares in ``dtype`` (float64 when the updates are float64: rounding them to
    float32 first would cancel), over blocks of at most :func:`gram_block` columns, the blocks
    summed in float64. Exactly symmetric (the upper triangle is mirrored) with an exactly zero
    diagonal; rows equal bit for bit are exactly 0 apart and get equal entries. ``D_ij`` is
    computed from rows i and j alone, as a sum of non-negative terms: with ``u`` the unit
    roundoff of the accumulation dtype and m the block's columns, it is within ``γ_{m+2}·D_ij``
    of the exact value before the float64 sum over blocks (relative ``⌈d/m⌉·2⁻⁵³`` more).
    Needs :func:`use_gram_kernel`."""
    n, d = updates.shape
    x = _as_numpy(updates)
    acc = np.float64 if torch.float64 in (dtype, updates.dtype) else np.float32
    block = gram_block(n, np.dtype(acc).itemsize)
    bounds, threads = split_range(d, block, _MIN_COLUMNS_PER_THREAD)
    chunks = len(bounds) - 1
    rows = -(-n // 4) * 4
    parts = np.zeros((chunks, rows, rows), dtype=np.float64)
    bufs = np.zeros((chunks, rows, block), dtype=acc)  # the padding rows stay zero
    run_chunks(
        lambda t: _dist_columns(x, bufs[t], acc(0), bounds[t], bounds[t + 1], parts[t]),
        chunks,
        threads,
    )
    upper = np.triu(_sum_parts(parts)[:n, :n], 1)
    return torch.from_numpy(upper + upper.T)


if njit is not None:

    @njit(cache=True, nogil=True)
    def _touch_pages(flat, step):  # pragma: no cover - compiled
        """Write 0 to every step-th element (one per page): the pages get faulted in."""
        for i in range(0, flat.shape[0], step):
            flat[i] = 0


def empty_faulting(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, Callable[[], None]]:
    """``(array, wait)``: a new C-contiguous array whose pages a background thread faults in
    (writing a 0 to each 4 KiB page) while the caller computes something else; ``wait()``
    joins that thread and must be called before anything is written to the array.

    A fresh (n, d) output costs the kernel's zeroing of its pages on first touch, about one
    to two reads of the matrix on this project's machines, and that does not get faster with
    more threads; NNM overlaps it with its distance computation."""
    out = np.empty(shape, dtype=dtype)
    if njit is None or out.nbytes < (1 << 22):
        return out, lambda: None
    flat = out.reshape(-1)
    worker = threading.Thread(target=_touch_pages, args=(flat, max(1, 4096 // out.itemsize)))
    worker.start()
    return out, worker.join


def _new_like(x: np.ndarray) -> np.ndarray:
    # numpy asks the kernel for transparent huge pages on large blocks: faulting in a fresh
    # (n, d) output then costs a fraction of what torch's 4 KiB pages cost
    return np.empty(x.shape, dtype=x.dtype)


def scale_rows(updates: Tensor, factors: Tensor) -> Tensor:
    """A new matrix ``x_i · s_i`` (``s = factors``, one per row, applied in float64 and rounded
    once to the updates' dtype; rows with ``s_i = 1`` are copied exactly). One read, one write."""
    n, d = updates.shape
    if not _use_kernel(updates):
        wide = torch.float64 if updates.dtype in (torch.float32, torch.float64) else updates.dtype
        s = factors.to(device=updates.device, dtype=wide)[:, None]
        return (updates.to(wide) * s).to(updates.dtype)
    x = _as_numpy(updates)
    s = factors.detach().to("cpu", torch.float64).numpy()
    out = _new_like(x)
    bounds, threads = split_range(d, 64, _MIN_COLUMNS_PER_THREAD)
    run_chunks(lambda t: _scale_columns(x, s, bounds[t], bounds[t + 1], out), len(bounds) - 1, threads)
    return torch.from_numpy(out)


def clip_rows(updates: Tensor, tau: float) -> Tensor:
    """A new matrix ``x_i · min(1, τ/‖x_i‖)`` (zero rows stay zero), norms in float64. Each
    row's norm is taken and the row scaled while it is still in cache: threads split the rows."""
    n, d = updates.shape
    if not _use_kernel(updates):
        norms = row_sq_norms(updates).sqrt()
        return scale_rows(updates, torch.where(norms > tau, tau / norms, torch.ones_like(norms)))
    x = _as_numpy(updates)
    out = _new_like(x)
    norms = np.empty(n, dtype=np.float64)
    threads = max(1, min(torch.get_num_threads(), n * d // _MIN_COLUMNS_PER_THREAD))
    run_chunks(lambda r: _clip_rows(x, float(tau), r, r + 1, out, norms), n, threads)
    return torch.from_numpy(out)


def clip_rows_by_rank(updates: Tensor, rank: int) -> Tensor:
    """A new matrix ``x_i · min(1, τ/‖x_i‖)`` with ``τ`` the ``(rank+1)``-th largest row norm
    (ARC's clipping; norms in float64, products rounded once; rows not clipped are exact
    copies). τ needs every norm first, so: one pass copies each row while taking its norm (the
    row read once from memory, as in :func:`clip_rows`), then only the rows above τ are scaled
    in place in the copy."""
    n, d = updates.shape
    if not 0 <= rank < n:
        raise ValueError(f"clip_rows_by_rank: rank must be in [0, {n}), got {rank}")
    if not _use_kernel(updates):
        norms = row_sq_norms(updates).sqrt()
        tau = torch.sort(norms, descending=True).values[rank]
        return scale_rows(updates, torch.where(norms > tau, tau / norms, torch.ones_like(norms)))
    x = _as_numpy(updates)
    out = _new_like(x)
    norms = np.empty(n, dtype=np.float64)
    threads = max(1, min(torch.get_num_threads(), n * d // _MIN_COLUMNS_PER_THREAD))
    run_chunks(lambda r: _clip_rows(x, np.inf, r, r + 1, out, norms), n, threads)
    tau = float(np.sort(norms)[::-1][rank])
    factors = np.where(norms > tau, tau / np.where(norms > 0, norms, 1.0), 1.0)
    clipped = np.flatnonzero(factors != 1.0)
    run_chunks(lambda c: _rescale_rows(out, factors, clipped[c], clipped[c] + 1), clipped.size, threads)
    return torch.from_numpy(out)


def centered_weighted_sum(updates: Tensor, weights: Tensor, v: Tensor | None) -> Tensor:
    """``v + Σ_i w_i (x_i − v)`` (``Σ_i w_i x_i`` when ``v`` is None) in the updates' dtype
    (``v`` of that dtype, length d): one read of the rows with non-zero weight, differences and
    sum in float64, rounded once."""
    n, d = updates.shape
    if not _use_kernel(updates):
        w = weights.to(device=updates.device, dtype=torch.float64)
        if v is None:
            return (w @ updates.to(torch.float64)).to(updates.dtype)
        v64 = v.to(torch.float64)
        return (v64 + w @ (updates.to(torch.float64) - v64)).to(updates.dtype)
    x = _as_numpy(updates)
    w = weights.detach().to("cpu", torch.float64).numpy()
    vv = x[0] if v is None else _as_numpy(v.to(updates.dtype))
    out = np.empty(d, dtype=x.dtype)
    bounds, threads = split_range(d, _SUM_BLOCK, _MIN_COLUMNS_PER_THREAD)
    run_chunks(
        lambda t: _centered_sum_columns(x, w, vv, v is not None, _SUM_BLOCK, bounds[t], bounds[t + 1], out),
        len(bounds) - 1,
        threads,
    )
    return torch.from_numpy(out)
