"""Nearest-neighbour mixing applied without a dense matrix product.

NNM replaces every update by the mean of its n − f nearest neighbours: ``Y = W X`` with W
row-stochastic (1/(n−f) on n − f entries per row). As a dense GEMM that is 2·n²·d flops, and
torch's GEMM for a 50×50 by 50×10⁶ product costs 6–8 reads of the matrix here. Sums of rows need
far less, because the sets the rows keep overlap: with ``E_i`` the f updates row i does *not*
keep, the updates excluded by more than half of the rows form a set ``C`` (the set nearest to
all the ``E_i`` in symmetric difference; with outliers, typically the outliers), and with
``T = Σ_{j ∉ C} x_j``

    y_i = (T + Σ_{j ∈ C \\ E_i} x_j − Σ_{j ∈ E_i \\ C} x_j) / (n − f),

|E_i Δ C| row operations per row (0 when row i excludes exactly C), or, for a row whose set is
far from C, ``y_i = (S − Σ_{j ∈ E_i} x_j) / (n − f)`` with ``S = T + Σ_{j ∈ C} x_j`` (f
operations), whichever is fewer. The numba kernel below computes this over column blocks that
stay in cache (T, and S when a row uses it, once per block, then each row), threads split the
columns (see :func:`fedsafe.robust.selection.run_columns`). T and S are summed in float64; a
row's correction (the q ≤ 2f rows it adds or subtracts) in the input dtype, so that float32
rows are added 16 to a SIMD register without conversions; then ``(T + correction) / (n − f)``
in float64, rounded once. Error: the rounding of the result, plus at most
``q²·u·max|x| / (n − f)`` for the correction (u the input dtype's unit roundoff; for float32
below the error of a float32 GEMM, about ``n·u·max|x|``), plus about ``(n + 2f)·n·2⁻⁵³·max|x|``
for the float64 sums.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.selection import kernel_eligible, njit, run_columns

# Below this many elements (n·d) the dense product is as fast.
_MIN_KERNEL_SIZE = 1 << 16

if njit is not None:

    @njit(cache=True, nogil=True, inline="always")
    def _add_rows(acc, x, rows, signs, j0, width):  # pragma: no cover - compiled
        """acc[:width] += Σ_o signs[o] · x[rows[o], j0:j0+width], four rows per pass over acc."""
        o = 0
        count = rows.shape[0]
        while o + 4 <= count:
            r0 = x[rows[o], j0 : j0 + width]
            r1 = x[rows[o + 1], j0 : j0 + width]
            r2 = x[rows[o + 2], j0 : j0 + width]
            r3 = x[rows[o + 3], j0 : j0 + width]
            s0 = signs[o]
            s1 = signs[o + 1]
            s2 = signs[o + 2]
            s3 = signs[o + 3]
            for k in range(width):
                acc[k] += (s0 * r0[k] + s1 * r1[k]) + (s2 * r2[k] + s3 * r3[k])
            o += 4
        while o < count:
            r0 = x[rows[o], j0 : j0 + width]
            s0 = signs[o]
            for k in range(width):
                acc[k] += s0 * r0[k]
            o += 1

    @njit(cache=True, nogil=True)
    def _mix_columns(x, base_rows, base_signs, c_rows, c_signs, use_s, ops, signs, nops, scale,
                     sub_blocks, lanes, c0, c1, out):  # pragma: no cover - compiled
        """out[i, c0:c1] = (B_i + Σ_o signs[i, o] x[ops[i, o]]) · scale (o < nops[i]),
        B_i = S if use_s[i] else T, T = Σ x[base_rows], S = T + Σ x[c_rows] in float64, the
        correction Σ_o in x's dtype, over column blocks."""
        n = out.shape[0]
        width_max = sub_blocks * lanes
        t_sum = np.empty(width_max, dtype=np.float64)
        s_sum = np.empty(width_max, dtype=np.float64)
        acc = np.empty(width_max, dtype=x.dtype)  # the corrections, in the input dtype
        need_s = False
        for i in range(n):
            need_s = need_s or use_s[i]
        for j0 in range(c0, c1, width_max):
            width = min(width_max, c1 - j0)
            for k in range(width):
                t_sum[k] = 0.0
            _add_rows(t_sum, x, base_rows, base_signs, j0, width)
            if need_s:
                for k in range(width):
                    s_sum[k] = t_sum[k]
                _add_rows(s_sum, x, c_rows, c_signs, j0, width)
            for i in range(n):
                base = s_sum if use_s[i] else t_sum
                dst = out[i, j0 : j0 + width]
                if nops[i] > 0:
                    for k in range(width):
                        acc[k] = 0
                    _add_rows(acc, x, ops[i, : nops[i]], signs[i, : nops[i]], j0, width)
                    for k in range(width):
                        dst[k] = (base[k] + acc[k]) * scale
                else:
                    for k in range(width):
                        dst[k] = base[k] * scale


def _plan(excluded: np.ndarray, dtype=np.float64) -> tuple:
    """Kernel arguments for the boolean (n, n) matrix ``excluded`` (row i excludes update j);
    ``dtype``: the input's (the corrections' signs are of it)."""
    n = excluded.shape[0]
    f = int(excluded[0].sum())
    common = excluded.sum(axis=0) * 2 > n  # C: excluded by more than half of the rows
    add = common & ~excluded  # per row: C \ E_i, added to T
    sub = excluded & ~common  # per row: E_i \ C, subtracted
    use_s = add.sum(axis=1) + sub.sum(axis=1) > f  # cheaper from S: subtract E_i
    add[use_s] = False
    sub[use_s] = excluded[use_s]
    nops = (add.sum(axis=1) + sub.sum(axis=1)).astype(np.int64)
    ops = np.zeros((n, max(1, int(nops.max()))), dtype=np.int64)
    signs = np.zeros(ops.shape, dtype=dtype)
    for i in range(n):
        plus, minus = np.flatnonzero(add[i]), np.flatnonzero(sub[i])
        ops[i, : plus.size + minus.size] = np.concatenate([plus, minus])
        signs[i, : plus.size] = 1.0
        signs[i, plus.size : plus.size + minus.size] = -1.0
    base_rows = np.flatnonzero(~common).astype(np.int64)
    c_rows = np.flatnonzero(common).astype(np.int64)
    return (base_rows, np.ones(base_rows.size), c_rows, np.ones(c_rows.size), use_s, ops, signs, nops)


def kernel_applies(updates: Tensor) -> bool:
    """Whether :func:`mix` can use the kernel for these updates (given an NNM matrix)."""
    return kernel_eligible(updates, _MIN_KERNEL_SIZE)


def mix(updates: Tensor, weights: Tensor, out: np.ndarray | None = None) -> Tensor:
    """``weights @ updates`` for an NNM mixing matrix (rows with n − f equal weights 1/(n−f)).

    Uses the kernel when numba is available and the input is a float CPU matrix
    (:func:`kernel_applies`); otherwise (and for tiny inputs) the dense product. ``out``: an
    uninitialised C-contiguous array of the updates' shape and dtype for the kernel to fill
    (for instance one whose pages are already faulted in); default, a new one.
    """
    n, d = updates.shape
    keep = weights > 0
    kept = keep.sum(dim=1)
    if not (kernel_applies(updates) and bool((kept == kept[0]).all()) and kept[0] < n):
        return weights.to(updates.dtype) @ updates
    x = updates.detach().resolve_neg().contiguous().numpy()
    plan = _plan((~keep).cpu().numpy(), x.dtype)
    if out is None or out.shape != x.shape or out.dtype != x.dtype or not out.flags.c_contiguous:
        out = np.empty_like(x)  # numpy: huge pages for a large output (see robust/rowwise.py)
    run_columns(_mix_columns, x, (*plan, 1.0 / float(kept[0])), out)
    return torch.from_numpy(out)
