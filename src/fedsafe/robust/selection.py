"""Coordinate-wise order statistics over clients: median and trimmed mean of an (n, d) matrix.

Conventions (docs/architecture.md): the median of an even count is the mean of the two middle values,
computed as ``(a + b) / 2`` in the input dtype; the trimmed mean drops ``f`` values from each end
of every coordinate (needs n > 2f). Both return a new tensor of the input dtype and never modify
their input. **Inputs must be finite** (the engine drops non-finite updates before aggregating;
with NaNs the kernel's min/max and ``torch.sort`` order them differently).

Why a kernel: ``torch.sort`` / ``torch.median`` along dim 0 of a row-major (n, d) matrix sort
every coordinate on its own through stride-d memory, ~40-50x the time of one read of the matrix
(``updates.mean(0)``) at n=50, d=1e6. Here a numba kernel runs one *sorting network* over many
coordinates at once. A network is a fixed list of compare-exchange pairs (i, j); applied to a
block that holds, for L adjacent coordinates, the n client values as n rows of L lanes, each
step is ``row_i, row_j = min(row_i, row_j), max(row_i, row_j)`` over the L lanes: branch-free,
SIMD-vectorised, and exact (values are only moved, never combined).

Memory: the kernel copies a W-column slab of the input (n rows, each a long contiguous run, so
the hardware prefetcher streams it) into a per-thread scratch laid out as W/L sub-blocks of
n x L, each ~16 KiB so the whole network runs on it inside L1; the slab (~256 KiB) sits in L2.

The network is Batcher's odd-even merge sort for n (padded to a power of two; comparators that
touch the padding are dropped, as if it held +inf), pruned backwards to what the result needs:
for the median only the middle position(s) must hold their exact order statistic; for the
trimmed mean only the *set* of values in ranks f..n-f-1, so compare-exchanges between two
positions of the same band whose exact values nothing later reads are dropped. The trimmed sum
is accumulated in float64 and divided once, then cast (at least as exact as the reference).

Falls back to the ``torch.sort`` reference (same semantics, ``_torch_median`` /
``_torch_trimmed_mean``) when numba is not installed, for tiny inputs (n * d below
``_MIN_KERNEL_SIZE``: both take microseconds), for n > ``_MAX_NETWORK_N`` (the network grows as
n log^2 n; not measured beyond), for dtypes other than float32/float64, for non-CPU tensors
and for tensors that require grad. A non-contiguous input is made contiguous first (one copy).

Threads: the kernels are serial ``nogil`` numba functions over a column range; the call splits
the columns into ``torch.get_num_threads()`` ranges and runs them on plain Python threads. That
avoids numba's threading layers (its OpenMP layer aborts a process that forks after using it;
its workqueue layer aborts on concurrent calls), so the functions stay safe to call from several
threads and in processes that later fork.

Compilation: lazy on first use (float32 and float64 specialisations of two kernels) and cached
on disk (``cache=True``), so only the first process after an install pays a few seconds.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.rows import check_matrix

try:  # optional at runtime: without numba everything uses the torch.sort reference
    from numba import njit
except ImportError:  # pragma: no cover - exercised only where numba is absent
    njit = None

# Below this many elements both paths take ~10 us; the torch one needs no numba call.
_MIN_KERNEL_SIZE = 1024
# Batcher's network needs ~n log^2(n) / 4 compare-exchanges: at n = 2048 (50k of them) the
# kernel was still ~7x faster than torch.sort along dim 0; beyond, unmeasured, use the sort.
_MAX_NETWORK_N = 2048
# One sub-block (n x L values) is kept near this size so the network runs in L1 ...
_SUB_BLOCK_BYTES = 16 * 1024
# ... and one slab (S sub-blocks) near this size so it stays in L2.
_SLAB_BYTES = 256 * 1024
# Below this many columns per thread, fewer threads are used.
_MIN_COLUMNS_PER_THREAD = 4096


def _torch_median(updates: Tensor) -> Tensor:
    """Reference: sort each coordinate; even n averages the two middle values."""
    n = updates.shape[0]
    s = torch.sort(updates, dim=0).values
    if n % 2:
        return s[n // 2].clone()
    return (s[n // 2 - 1] + s[n // 2]) / 2


def _torch_trimmed_mean(updates: Tensor, f: int) -> Tensor:
    """Reference: sort each coordinate, average ranks f .. n-f-1 (summed in float64 like the
    kernel, so both paths agree to rounding of the result)."""
    n = updates.shape[0]
    s = torch.sort(updates, dim=0).values
    return (s[f : n - f].sum(dim=0, dtype=torch.float64) / (n - 2 * f)).to(updates.dtype)


# ----------------------------------------------------------------------------- networks


def _batcher_pairs(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort on n wires, as compare-exchange pairs (i < j).

    Built for the next power of two; pairs with j >= n are dropped, which is the same as
    padding with +inf (a +inf on the high wire of a compare-exchange never moves)."""
    size = 1
    while size < n:
        size *= 2
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    a, b = i + j, i + j + k
                    if a // (2 * p) == b // (2 * p) and b < n:
                        pairs.append((a, b))
            k //= 2
        p *= 2
    return pairs


@functools.lru_cache(maxsize=512)
def _network(n: int, lo: int, hi: int, exact: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Compare-exchange pairs that leave the values of ranks lo..hi-1 (as a set) in positions
    lo..hi-1 and the exact order statistic in every position listed in ``exact``.

    Walks Batcher's network backwards: a position becomes "exact" once a later kept comparator
    reads it; a comparator between two non-exact positions of the same band (< lo, lo..hi-1,
    >= hi) only permutes values inside that band, so it is dropped."""

    def band(p: int) -> int:
        return 0 if p < lo else (1 if p < hi else 2)

    is_exact = [p in exact for p in range(n)]
    kept: list[tuple[int, int]] = []
    for a, b in reversed(_batcher_pairs(n)):
        if not is_exact[a] and not is_exact[b] and band(a) == band(b):
            continue
        kept.append((a, b))
        is_exact[a] = is_exact[b] = True
    kept.reverse()
    first = np.array([a for a, _ in kept], dtype=np.int64)
    second = np.array([b for _, b in kept], dtype=np.int64)
    return first, second


def _median_network(n: int) -> tuple[np.ndarray, np.ndarray]:
    m = n // 2
    if n % 2:
        return _network(n, m, m + 1, (m,))
    return _network(n, m - 1, m + 1, (m - 1, m))


def _trimmed_network(n: int, f: int) -> tuple[np.ndarray, np.ndarray]:
    return _network(n, f, n - f, ())


# ----------------------------------------------------------------------------- kernels
# Loops index from 0 over a view's own length: numba then knows indices are non-negative and
# LLVM vectorises them (an offset like range(k0, k1) keeps wraparound checks and stays scalar).

if njit is not None:

    @njit(cache=True, nogil=True, inline="always")
    def _load_slab(x, j0, width, slab):  # pragma: no cover - compiled
        """slab[q, r, :] = x[r, j0 + q*L : j0 + (q+1)*L] for the sub-blocks covering width."""
        n = x.shape[0]
        lanes = slab.shape[2]
        nsub = (width + lanes - 1) // lanes
        for r in range(n):
            src = x[r, j0 : j0 + width]
            for q in range(nsub):
                seg = src[q * lanes : q * lanes + lanes]
                dst = slab[q, r]
                for k in range(seg.shape[0]):
                    dst[k] = seg[k]
        return nsub

    @njit(cache=True, nogil=True, inline="always")
    def _apply_network(block, ci, cj):  # pragma: no cover - compiled
        """Compare-exchange rows ci[c] and cj[c] of an (n, L) block, lane by lane."""
        for c in range(ci.shape[0]):
            ra = block[ci[c]]
            rb = block[cj[c]]
            for k in range(ra.shape[0]):
                a = ra[k]
                b = rb[k]
                # `a < b ? a : b` is exactly the x86 min/max select, so it becomes vminps/vmaxps
                ra[k] = a if a < b else b
                rb[k] = b if a < b else a

    @njit(cache=True, nogil=True)
    def _median_columns(x, ci, cj, sub_blocks, lanes, c0, c1, out):  # pragma: no cover
        """out[c0:c1] = coordinate median of x[:, c0:c1]; c0 is a multiple of the slab width."""
        n = x.shape[0]
        m = n // 2
        odd = n % 2 == 1
        slab = np.zeros((sub_blocks, n, lanes), dtype=x.dtype)
        width_max = sub_blocks * lanes
        for j0 in range(c0, c1, width_max):
            width = min(width_max, c1 - j0)
            nsub = _load_slab(x, j0, width, slab)
            for q in range(nsub):
                block = slab[q]
                _apply_network(block, ci, cj)
                dst = out[j0 + q * lanes : min(j0 + q * lanes + lanes, c1)]
                upper = block[m]
                if odd:
                    for k in range(dst.shape[0]):
                        dst[k] = upper[k]
                else:
                    lower = block[m - 1]
                    for k in range(dst.shape[0]):
                        # the sum stays in the input dtype, as in the reference (a + b) / 2
                        dst[k] = (lower[k] + upper[k]) / 2

    @njit(cache=True, nogil=True)
    def _trimmed_columns(x, ci, cj, lo, hi, sub_blocks, lanes, c0, c1, out):  # pragma: no cover
        """out[c0:c1] = mean of ranks lo..hi-1 of x[:, c0:c1], summed in float64."""
        n = x.shape[0]
        count = float(hi - lo)
        slab = np.zeros((sub_blocks, n, lanes), dtype=x.dtype)
        acc = np.empty(lanes, dtype=np.float64)
        width_max = sub_blocks * lanes
        for j0 in range(c0, c1, width_max):
            width = min(width_max, c1 - j0)
            nsub = _load_slab(x, j0, width, slab)
            for q in range(nsub):
                block = slab[q]
                _apply_network(block, ci, cj)
                for k in range(lanes):
                    acc[k] = 0.0
                for r in range(lo, hi):
                    row = block[r]
                    for k in range(lanes):
                        acc[k] += row[k]
                dst = out[j0 + q * lanes : min(j0 + q * lanes + lanes, c1)]
                for k in range(dst.shape[0]):
                    dst[k] = acc[k] / count


def _use_kernel(updates: Tensor) -> bool:
    n, d = updates.shape
    return (
        njit is not None
        and updates.dtype in (torch.float32, torch.float64)
        and updates.device.type == "cpu"
        and not updates.requires_grad
        and 2 <= n <= _MAX_NETWORK_N
        and n * d >= _MIN_KERNEL_SIZE
    )


def run_columns(kernel, x: np.ndarray, args: tuple, out: np.ndarray) -> None:
    """Run ``kernel(x, *args, sub_blocks, lanes, c0, c1, out)`` over column ranges, one per
    thread (``torch.get_num_threads()``), the calling thread taking the first."""
    n, d = x.shape
    lanes = max(16, min(512, _SUB_BLOCK_BYTES // (n * x.itemsize) // 16 * 16))
    sub_blocks = max(1, _SLAB_BYTES // (n * lanes * x.itemsize))
    slab = sub_blocks * lanes
    nslabs = -(-d // slab)
    threads = max(1, min(torch.get_num_threads(), d // _MIN_COLUMNS_PER_THREAD, nslabs))
    # ranges start on slab boundaries so that every thread has whole sub-blocks but the last
    bounds = [min(d, (t * nslabs // threads) * slab) for t in range(threads + 1)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            kernel(x, *args, sub_blocks, lanes, bounds[t], bounds[t + 1], out)
        except BaseException as e:  # re-raised in the caller, never a silently half-filled out
            errors.append(e)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(1, threads)]
    for w in workers:
        w.start()
    work(0)
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


def _as_numpy(updates: Tensor) -> np.ndarray:
    """C-contiguous numpy view of the input (a copy only when it is not contiguous)."""
    return updates.detach().resolve_neg().contiguous().numpy()



def coordinate_median(updates: Tensor) -> Tensor:
    """Coordinate-wise median over dim 0: for each coordinate j the middle order statistic
    x_(m+1),j (n = 2m + 1), or (x_(m),j + x_(m+1),j) / 2 in the input dtype (n = 2m).
    Inputs must be finite."""
    n = check_matrix(updates, "coordinate_median", floating=False)
    if n == 1:
        return updates[0].clone()
    if not _use_kernel(updates):
        return _torch_median(updates)
    x = _as_numpy(updates)
    out = np.empty(x.shape[1], dtype=x.dtype)
    run_columns(_median_columns, x, _median_network(n), out)
    return torch.from_numpy(out)


def coordinate_trimmed_mean(updates: Tensor, f: int) -> Tensor:
    """Mean of the values ranked f .. n-f-1 in every coordinate (needs n > 2f):
    (1 / (n - 2f)) Σ_{r=f+1}^{n-f} x_(r),j. Summed in float64, returned in the input dtype.
    Inputs must be finite."""
    n = check_matrix(updates, "coordinate_trimmed_mean", floating=False)
    if not 0 <= 2 * f < n:
        raise ValueError(f"trimmed mean needs n > 2f, got n={n}, f={f}")
    if not _use_kernel(updates):
        return _torch_trimmed_mean(updates, f)
    x = _as_numpy(updates)
    out = np.empty(x.shape[1], dtype=x.dtype)
    run_columns(_trimmed_columns, x, (*_trimmed_network(n, f), f, n - f), out)
    return torch.from_numpy(out)
