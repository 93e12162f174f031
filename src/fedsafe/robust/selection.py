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
n x L, each up to ~32 KiB (L a multiple of 64 lanes where possible, see ``sub_block_lanes``)
so the whole network runs on it in or near L1; the slab (~256 KiB) sits in L2.

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
the columns into chunks (several per thread, :func:`split_range`) and runs them on
``torch.get_num_threads()`` plain Python threads, each taking the next chunk when it is done
with one (:func:`run_chunks`). That
avoids numba's threading layers (its OpenMP layer aborts a process that forks after using it;
its workqueue layer aborts on concurrent calls), so the functions stay safe to call from several
threads and in processes that later fork.

Compilation: lazy on first use (float32 and float64 specialisations of two kernels) and cached
on disk (``cache=True``), so only the first process after an install pays a few seconds.
"""

from __future__ import annotations

import functools
import itertools
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
# One sub-block (n x L values) is kept near this size so the network runs in or near L1 ...
_SUB_BLOCK_BYTES = 32 * 1024
# ... and one slab (S sub-blocks) near this size so it stays in L2.
_SLAB_BYTES = 256 * 1024
# Below this many columns per thread, fewer threads are used.
_MIN_COLUMNS_PER_THREAD = 4096
# Column chunks per thread, handed out dynamically (run_chunks).
_CHUNKS_PER_THREAD = 8


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


def mean_around_median(sorted_vals: Tensor, k: int) -> Tensor:
    """Per coordinate, the mean of the k sorted values closest to the column's median, equal
    distances preferring the values below the median (stable order by (distance, rank)).
    The reference for :func:`coordinate_mean_around_median`: medians and distances in the input
    dtype, the k values summed in float64, divided, then cast back.

    Distances to the median decrease then increase along a sorted column, so the k closest
    values form a window ``[s, s + k)``. Its radius ``r*`` (the k-th smallest distance) is the
    smallest over windows of the farther end's distance. The window must contain every value
    closer than ``r*`` (ranks ``[a, b)``) and only values within ``r*`` (ranks from ``p`` on);
    the lowest such start is ``s = max(p, b − k)``."""
    n = sorted_vals.shape[0]
    h = n // 2
    med = sorted_vals[h] if n % 2 else (sorted_vals[h - 1] + sorted_vals[h]) / 2
    dist = (sorted_vals - med).abs()
    spare = n - k
    radius = torch.maximum(dist[: spare + 1], dist[k - 1 :]).min(dim=0).values
    within = dist <= radius
    closer = dist < radius
    first_within = within.to(torch.uint8).argmax(dim=0)  # argmax returns the first maximum
    end_closer = closer.to(torch.uint8).argmax(dim=0) + closer.sum(dim=0)  # 0 if none closer
    start = torch.maximum(first_within, end_closer - k)
    rank = torch.arange(n, device=sorted_vals.device)[:, None]
    inside = (rank >= start) & (rank < start + k)
    total = torch.where(inside, sorted_vals, 0).sum(dim=0, dtype=torch.float64)
    return (total / k).to(sorted_vals.dtype)


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


def _around_median_network(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What the mean of the k values closest to the median reads. When ``k > n/2`` every
    candidate window ``[s, s+k)`` (``s ≤ n − k``) holds the ranks ``n−k..k−1``, so only their set
    matters; the median position(s) and the ranks below ``n−k`` and from ``k`` on, compared in
    pairs ``(j, j + k)``, must be exact. Otherwise the kernel may have to count over every
    position (rounding ties): a full sort."""
    h = n // 2
    medians = (h,) if n % 2 else (h - 1, h)
    if 2 * k <= n:
        return _network(n, 0, n, tuple(range(n)))
    exact = tuple(range(n - k)) + tuple(range(k, n)) + medians
    return _network(n, n - k, k, exact)


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


    @njit(cache=True, nogil=True, inline="always")
    def _load_slab_rows(x, rows, j0, width, slab):  # pragma: no cover - compiled
        """slab[q, r, :] = x[rows[r], j0 + q*L : j0 + (q+1)*L] for the sub-blocks covering width."""
        lanes = slab.shape[2]
        nsub = (width + lanes - 1) // lanes
        for r in range(rows.shape[0]):
            src = x[rows[r], j0 : j0 + width]
            for q in range(nsub):
                seg = src[q * lanes : q * lanes + lanes]
                dst = slab[q, r]
                for k in range(seg.shape[0]):
                    dst[k] = seg[k]
        return nsub

    @njit(cache=True, nogil=True)
    def _around_median_columns(x, rows, ci, cj, k, sub_blocks, lanes, c0, c1, out):  # pragma: no cover
        """out[c0:c1] = per column, the mean of the k values of x[rows, c] closest to their
        median, as :func:`mean_around_median` on the sorted column, lane by lane."""
        m = rows.shape[0]
        h = m // 2
        odd = m % 2 == 1
        spare = m - k
        # windows [s, s + k) that hold the median position (odd m) or one of the two (even m)
        s_lo = max(0, (h if odd else h - 1) - k + 1)
        s_hi = min(spare, h)
        slab = np.zeros((sub_blocks, m, lanes), dtype=x.dtype)
        med = np.empty(lanes, dtype=x.dtype)
        radius = np.empty(lanes, dtype=x.dtype)
        # rank counts, kept in the data's dtype so that the loops below vectorise in one width
        beyond = np.empty(lanes, dtype=x.dtype)  # below the median, farther than the radius
        outside = np.empty(lanes, dtype=x.dtype)  # below the median, not closer than it
        closer = np.empty(lanes, dtype=x.dtype)  # closer than the radius
        start = np.empty(lanes, dtype=x.dtype)
        consts = np.empty(2, dtype=x.dtype)  # 1 and k as scalars of the dtype
        consts[0] = 1
        consts[1] = k
        one = consts[0]
        kf = consts[1]
        nil = one - one
        acc = np.empty(lanes, dtype=np.float64)
        width_max = sub_blocks * lanes
        for j0 in range(c0, c1, width_max):
            width = min(width_max, c1 - j0)
            nsub = _load_slab_rows(x, rows, j0, width, slab)
            for q in range(nsub):
                block = slab[q]
                _apply_network(block, ci, cj)
                upper = block[h]
                if odd:
                    for i in range(lanes):
                        med[i] = upper[i]
                else:
                    lower = block[h - 1]
                    for i in range(lanes):
                        med[i] = (lower[i] + upper[i]) / 2  # rounded to the dtype on the store
                dst = out[j0 + q * lanes : min(j0 + q * lanes + lanes, c1)]
                # The window [s*, s* + k) starts in [s_lo, s_hi] (the windows that reach the
                # median position(s); only rounding ties can move the reference's further
                # left, see below). Every such window holds ranks s_hi..s_lo+k-1, and moving
                # it from s to s + 1 trades rank s (at or below the median) for rank s + k (at
                # or above it): worth it iff the latter is strictly closer, which holds for s
                # below some s* and not from it on. So of ranks j and j + k (s_lo ≤ j < s_hi)
                # the window holds the closer one, j on a tie.
                for i in range(lanes):
                    acc[i] = 0.0
                for r in range(s_hi, s_lo + k):
                    row = block[r]
                    for i in range(lanes):
                        acc[i] += row[i]
                for j in range(s_lo, s_hi):
                    low = block[j]
                    up = block[j + k]
                    for i in range(lanes):
                        closer_up = abs(up[i] - med[i]) < abs(low[i] - med[i])
                        acc[i] += up[i] if closer_up else low[i]
                tied = False
                if s_lo > 0:
                    # mean_around_median starts at s_lo exactly unless the window stayed at
                    # s_lo and rank s_lo - 1 is within its radius (a tie in rounded distances,
                    # e.g. around a median far from the values): then count as it does.
                    low = block[s_lo]
                    up = block[s_lo + k]
                    end = block[s_lo + k - 1]
                    before = block[s_lo - 1]
                    for i in range(lanes):
                        a = abs(low[i] - med[i])
                        b = abs(end[i] - med[i])
                        stayed = abs(up[i] - med[i]) >= a
                        tied = tied | (stayed & (abs(before[i] - med[i]) <= (a if a > b else b)))
                if not tied:
                    for i in range(dst.shape[0]):
                        dst[i] = acc[i] / k
                    continue
                # r* over the windows that reach the median position(s): moving any other
                # window towards them never increases its farther end's distance
                first = block[s_lo]
                last = block[s_lo + k - 1]
                for i in range(lanes):
                    a = abs(first[i] - med[i])
                    b = abs(last[i] - med[i])
                    radius[i] = a if a > b else b
                for s in range(s_lo + 1, s_hi + 1):
                    first = block[s]
                    last = block[s + k - 1]
                    for i in range(lanes):
                        a = abs(first[i] - med[i])
                        b = abs(last[i] - med[i])
                        far = a if a > b else b
                        radius[i] = far if far < radius[i] else radius[i]
                for i in range(lanes):
                    beyond[i] = 0
                    outside[i] = 0
                    closer[i] = 0
                for r in range(m):
                    row = block[r]
                    for i in range(lanes):
                        # branch-free selects (counts are exact in floating point)
                        dr = abs(row[i] - med[i])
                        below = row[i] < med[i]
                        beyond[i] += one if (below & (dr > radius[i])) else nil
                        outside[i] += one if (below & (dr >= radius[i])) else nil
                        closer[i] += one if dr < radius[i] else nil
                for i in range(lanes):
                    # mean_around_median: first_within = beyond, end_closer = outside + closer
                    end_closer = outside[i] + closer[i] if closer[i] > nil else nil
                    start[i] = max(beyond[i], end_closer - kf)
                    acc[i] = 0.0
                rank = nil
                for r in range(m):
                    row = block[r]
                    below_window = rank - kf
                    for i in range(lanes):
                        # rank in [start, start + k)
                        acc[i] += row[i] if (start[i] <= rank) & (start[i] > below_window) else 0.0
                    rank += one
                for i in range(dst.shape[0]):
                    dst[i] = acc[i] / k


def kernel_eligible(updates: Tensor, min_size: int) -> bool:
    """Whether a numba kernel of this package can take ``updates``: numba is there, a float32
    or float64 CPU matrix that does not require grad, with at least ``min_size`` entries
    (below that torch is as fast). Otherwise the callers use their torch fallback."""
    n, d = updates.shape
    return (
        njit is not None
        and updates.dtype in (torch.float32, torch.float64)
        and updates.device.type == "cpu"
        and not updates.requires_grad
        and n * d >= min_size
    )


def _use_kernel(updates: Tensor) -> bool:
    return kernel_eligible(updates, _MIN_KERNEL_SIZE) and 2 <= updates.shape[0] <= _MAX_NETWORK_N


def run_chunks(work, chunks: int, threads: int) -> None:
    """``work(c)`` for every ``c < chunks``, handed out in order to ``threads`` threads as each
    becomes free: the calling thread and plain Python threads (the kernels are ``nogil``).
    Dynamic, so that a thread slowed down (another process, or torch's OpenMP worker still
    spinning after the caller's last parallel op) takes fewer chunks instead of holding up the
    rest. The first exception is re-raised here, after every thread has finished."""
    if threads <= 1 or chunks <= 1:
        for c in range(chunks):
            work(c)
        return
    counter = itertools.count()  # next() is atomic under the GIL
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not errors:
                c = next(counter)
                if c >= chunks:
                    return
                work(c)
        except BaseException as e:  # re-raised in the caller, never a silently half-filled out
            errors.append(e)

    workers = [threading.Thread(target=loop) for _ in range(1, min(threads, chunks))]
    for w in workers:
        w.start()
    loop()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


def split_range(count: int, unit: int, min_per_thread: int) -> tuple[list[int], int]:
    """``(bounds, threads)``: chunk bounds ``b_0 = 0 < b_1 < … < b_C = count``, every bound but
    the last a multiple of ``unit``, and the number of threads to run them on
    (``torch.get_num_threads()``, fewer when a thread would get fewer than ``min_per_thread``
    items). One chunk per thread would make every call wait for its slowest thread; with
    several threads there are ``_CHUNKS_PER_THREAD`` chunks per thread (:func:`run_chunks`)."""
    units = -(-count // unit)
    threads = max(1, min(torch.get_num_threads(), count // max(1, min_per_thread), units))
    chunks = 1 if threads == 1 else min(units, threads * _CHUNKS_PER_THREAD)
    return [min(count, (c * units // chunks) * unit) for c in range(chunks + 1)], threads


def sub_block_lanes(n: int, itemsize: int) -> int:
    """Lanes (columns) of one sub-block: about ``_SUB_BLOCK_BYTES / (n · itemsize)``, rounded
    down to a multiple of 64 (to 16 below that; at least 16, at most 512). LLVM runs the lane
    loops 64 float32 values per iteration: a width of 80 would leave a 16-lane remainder loop
    after every compare-exchange, 30% slower for n = 50 than a width of 128."""
    raw = _SUB_BLOCK_BYTES // (n * itemsize)
    lanes = raw // 64 * 64 if raw >= 64 else raw // 16 * 16
    return max(16, min(512, lanes))


def run_columns(kernel, x: np.ndarray, args: tuple, out: np.ndarray, rows: int | None = None) -> None:
    """Run ``kernel(x, *args, sub_blocks, lanes, c0, c1, out)`` over column ranges, one per
    thread (``torch.get_num_threads()``), the calling thread taking the first. Sub-blocks hold
    ``rows`` rows (default: all of ``x``'s)."""
    n, d = x.shape
    n = n if rows is None else rows
    lanes = sub_block_lanes(n, x.itemsize)
    sub_blocks = max(1, _SLAB_BYTES // (n * lanes * x.itemsize))
    # chunks start on slab boundaries so that every chunk has whole sub-blocks but the last
    bounds, threads = split_range(d, sub_blocks * lanes, _MIN_COLUMNS_PER_THREAD)
    run_chunks(lambda c: kernel(x, *args, sub_blocks, lanes, bounds[c], bounds[c + 1], out), len(bounds) - 1, threads)


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


def coordinate_mean_around_median(updates: Tensor, k: int, rows: Tensor | None = None) -> Tensor:
    """Per coordinate, the mean of the ``k`` values closest to the coordinate's median (even
    count: ``(a + b) / 2`` in the input dtype), equal distances preferring values below the
    median, over the rows ``rows`` of ``updates`` (an index tensor; all rows when None, in
    any order: the result does not depend on it). Median and distances in the input dtype, the
    k values summed in float64 (in an order that may differ from the fallback's where that
    sum rounds), then divided and cast: :func:`mean_around_median` on the sorted column,
    which the fallback runs. Needs ``1 ≤ k ≤ m`` (m rows). Inputs must be finite.

    The kernel sorts the column blocks with the network of :func:`_around_median_network`
    and picks the window lane by lane, without copying the selected rows."""
    check_matrix(updates, "coordinate_mean_around_median", floating=False)
    idx = (
        torch.arange(updates.shape[0]) if rows is None else rows.detach().to("cpu", torch.int64).flatten()
    )
    m = idx.numel()
    if not 1 <= k <= m:
        raise ValueError(f"mean around the median needs 1 <= k <= m, got m={m}, k={k}")
    if m == 1:
        return updates[int(idx[0])].clone()
    sub_size = m * updates.shape[1]
    if not (_use_kernel(updates) and 2 <= m <= _MAX_NETWORK_N and sub_size >= _MIN_KERNEL_SIZE):
        chosen = updates if rows is None else updates.index_select(0, idx.to(updates.device))
        return mean_around_median(torch.sort(chosen, dim=0).values, k)
    x = _as_numpy(updates)
    out = np.empty(x.shape[1], dtype=x.dtype)
    args = (idx.numpy(), *_around_median_network(m, k), k)
    run_columns(_around_median_columns, x, args, out, rows=m)
    return torch.from_numpy(out)
