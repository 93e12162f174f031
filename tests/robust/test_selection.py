"""Coordinate-wise median / trimmed mean against independent numpy references.

Every case runs twice: through the numba sorting-network kernel (thresholds lowered so that even
tiny matrices take it, and several threads split the columns) and through the torch.sort
fallback. The median must match ``np.median`` bit for bit (both compute (a + b) / 2 in the input
dtype); the trimmed mean must match a float64 sorted-slice mean to float tolerance.
"""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np
import pytest
import torch

from fedsafe.robust import selection
from fedsafe.robust.selection import coordinate_median, coordinate_trimmed_mean

# kernel: default block sizes; kernel-tiny: 16-lane sub-blocks in slabs of a few of them, so
# small matrices still span many sub-blocks, slabs and threads
PATHS = ["kernel", "kernel-tiny", "torch"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param.startswith("kernel"):
        if selection.njit is None:
            pytest.skip("numba not installed")
        monkeypatch.setattr(selection, "_MIN_KERNEL_SIZE", 0)
        monkeypatch.setattr(selection, "_MIN_COLUMNS_PER_THREAD", 1)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # more ranges than cores
        if request.param == "kernel-tiny":
            monkeypatch.setattr(selection, "_SUB_BLOCK_BYTES", 1)
            monkeypatch.setattr(selection, "_SLAB_BYTES", 4096)
    else:
        monkeypatch.setattr(selection, "_MIN_KERNEL_SIZE", 1 << 62)
    return request.param


def ref_median(x: np.ndarray) -> np.ndarray:
    return np.median(x, axis=0)


def ref_trimmed(x: np.ndarray, f: int) -> np.ndarray:
    n = x.shape[0]
    return np.sort(x.astype(np.float64), axis=0)[f : n - f].mean(axis=0)


def assert_trimmed_close(got: torch.Tensor, x: np.ndarray, f: int) -> None:
    want = ref_trimmed(x, f)
    # float64 sums in a different order: relative error ~ n * 1e-16 of the largest kept value
    kept_scale = np.abs(np.sort(x.astype(np.float64), axis=0)[f : x.shape[0] - f]).max()
    np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=1e-6, atol=1e-12 * kept_scale)


def make(rng: np.random.Generator, n: int, d: int, kind: str, dtype=np.float32) -> np.ndarray:
    if kind == "normal":
        x = rng.standard_normal((n, d))
    elif kind == "ties":  # few distinct values: many equal middle elements
        x = rng.integers(-2, 3, size=(n, d)).astype(np.float64)
    elif kind == "outliers":  # a few clients send huge values of either sign
        x = rng.standard_normal((n, d))
        bad = rng.random((n, d)) < 0.2
        x[bad] = rng.choice([-1.0, 1.0], size=bad.sum()) * rng.uniform(1e29, 1e30, size=bad.sum())
    else:
        raise ValueError(kind)
    return x.astype(dtype)


# d values straddle the kernel's sub-block (lanes) and slab widths, none a multiple of them
DS = [1, 37, 3001]


@pytest.mark.parametrize("n", [*range(1, 10), 50])
@pytest.mark.parametrize("kind", ["normal", "ties", "outliers"])
def test_median_matches_numpy(path, n, kind):
    rng = np.random.default_rng(1000 * n + len(kind))
    for d in DS:
        x = make(rng, n, d, kind)
        t = torch.from_numpy(x.copy())
        got = coordinate_median(t)
        assert got.dtype == torch.float32 and got.shape == (d,)
        np.testing.assert_array_equal(got.numpy(), ref_median(x))
        assert torch.equal(t, torch.from_numpy(x)), "input modified"


@pytest.mark.parametrize("n", [*range(1, 10), 50])
@pytest.mark.parametrize("kind", ["normal", "ties", "outliers"])
def test_trimmed_mean_matches_numpy_for_every_f(path, n, kind):
    rng = np.random.default_rng(2000 * n + len(kind))
    for d in DS:
        x = make(rng, n, d, kind)
        t = torch.from_numpy(x.copy())
        fs = range((n + 1) // 2) if n < 10 else [0, 1, n // 5, (n - 1) // 2]
        for f in fs:
            got = coordinate_trimmed_mean(t, f)
            assert got.dtype == torch.float32 and got.shape == (d,)
            assert_trimmed_close(got, x, f)
        assert torch.equal(t, torch.from_numpy(x)), "input modified"


@pytest.mark.parametrize("n", [4, 7, 50])
def test_float64(path, n):
    rng = np.random.default_rng(n)
    x = make(rng, n, 3001, "outliers", np.float64)
    t = torch.from_numpy(x)
    med = coordinate_median(t)
    assert med.dtype == torch.float64
    np.testing.assert_array_equal(med.numpy(), ref_median(x))
    for f in (0, 1, (n - 1) // 2):
        got = coordinate_trimmed_mean(t, f)
        assert got.dtype == torch.float64
        assert_trimmed_close(got, x, f)


@pytest.mark.parametrize("n", [6, 9])
def test_non_contiguous_input(path, n):
    rng = np.random.default_rng(7)
    base = torch.from_numpy(make(rng, 2 * 3001, n, "ties"))
    t = base.T[:, ::2]  # transposed and strided: (n, 3001) with strides (1, 2n)
    assert not t.is_contiguous()
    x = t.numpy().copy()
    np.testing.assert_array_equal(coordinate_median(t).numpy(), ref_median(x))
    assert_trimmed_close(coordinate_trimmed_mean(t, 2), x, 2)


@pytest.mark.parametrize("n", range(2, 13))
def test_every_zero_one_column(path, n):
    """0-1 principle: a comparator network that is right on all 2^n zero-one inputs is right on
    every input, so this checks the pruned networks for small n exhaustively."""
    x = np.array(list(itertools.product([0.0, 1.0], repeat=n)), dtype=np.float32).T.copy()
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(coordinate_median(t).numpy(), ref_median(x))
    for f in range((n + 1) // 2):
        assert_trimmed_close(coordinate_trimmed_mean(t, f), x, f)


def test_median_equals_torch_reference_exactly():
    # default thresholds: a matrix big enough to take the kernel without patching
    g = torch.Generator().manual_seed(3)
    t = torch.randn(50, 20_011, generator=g)
    t[::7] *= 1e6
    assert torch.equal(coordinate_median(t), selection._torch_median(t))
    torch.testing.assert_close(coordinate_trimmed_mean(t, 10), selection._torch_trimmed_mean(t, 10))


def test_result_is_a_new_tensor(path):
    t = torch.randn(1, 50)
    out = coordinate_median(t)
    out += 1
    assert not torch.equal(out, t[0])
    t = torch.randn(5, 50)
    before = t.clone()
    coordinate_median(t).add_(1)
    coordinate_trimmed_mean(t, 0).add_(1)
    assert torch.equal(t, before)


def test_concurrent_calls_from_threads(path):
    rng = np.random.default_rng(11)
    xs = [make(rng, 9, 2000, "normal") for _ in range(4)]
    results: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        results[i] = coordinate_median(torch.from_numpy(xs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(results[i].numpy(), ref_median(x))


@pytest.mark.parametrize("n,f", [(4, 2), (5, 3), (1, 1), (3, -1)])
def test_trimmed_mean_rejects_too_large_f(n, f):
    with pytest.raises(ValueError, match="n > 2f"):
        coordinate_trimmed_mean(torch.zeros(n, 3), f)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="2-D"):
        coordinate_median(torch.zeros(5))
    with pytest.raises(ValueError, match="no updates"):
        coordinate_trimmed_mean(torch.zeros(0, 3), 0)


def test_other_dtypes_and_grad_fall_back_to_torch():
    t = torch.randn(5, 10_000, dtype=torch.float16)
    assert coordinate_median(t).dtype == torch.float16
    t = torch.randn(5, 10_000, requires_grad=True)
    coordinate_trimmed_mean(t, 1).sum().backward()
    assert t.grad is not None


# ----------------------------------------------------------------------------- mean around median
# coordinate_mean_around_median (MeaMed, Bulyan's second phase): per column, the mean of the k
# values closest to the median, equal distances preferring lower ranks; median and distances in
# the input dtype, the k values summed in float64. The reference below follows that definition
# literally, one column at a time (exact sum): the kernel must pick the same values, so it
# matches up to the rounding of its float64 sum, and bit for bit where that sum is exact
# (integer data).


def ref_around_median(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(the means, rounded once to the dtype; the means of the chosen values' magnitudes)."""
    two = x.dtype.type(2)
    out, mags = [], []
    for col in x.T:
        v = np.sort(col)
        m = len(v)
        h = m // 2
        med = v[h] if m % 2 else (v[h - 1] + v[h]) / two  # numpy scalars: in the dtype
        dist = np.abs(v - med)
        chosen = sorted(range(m), key=lambda p: (dist[p], p))[:k]
        out.append(math.fsum(float(v[p]) for p in chosen) / k)
        mags.append(sum(abs(float(v[p])) for p in chosen) / k)
    return np.array(out).astype(x.dtype), np.array(mags)


def around_median_ks(n: int) -> list[int]:
    return list(range(1, n + 1)) if n <= 9 else sorted({1, 3, n // 2, n // 2 + 1, n - n // 5, n - 1, n})


def check_around_median(got: torch.Tensor, ref: tuple[np.ndarray, np.ndarray], m: int, exact: bool) -> None:
    want, mags = ref
    assert got.dtype == torch.from_numpy(want).dtype
    if exact:
        np.testing.assert_array_equal(got.numpy(), want)
        return
    # a float64 sum of m terms in some order, then one rounding to the dtype
    err = np.abs(got.numpy().astype(np.float64) - want.astype(np.float64))
    bound = m * 2.0**-52 * mags + np.spacing(np.abs(want)).astype(np.float64)
    assert (err <= bound).all(), float((err / bound).max())


@pytest.mark.parametrize("n", [*range(1, 10), 30, 50])
@pytest.mark.parametrize("kind", ["normal", "ties", "outliers"])
def test_mean_around_median_matches_reference(path, n, kind):
    rng = np.random.default_rng(3000 * n + len(kind))
    for d in (1, 37, 301):
        x = make(rng, n, d, kind)
        t = torch.from_numpy(x.copy())
        for k in around_median_ks(n):
            got = selection.coordinate_mean_around_median(t, k)
            assert got.shape == (d,)
            check_around_median(got, ref_around_median(x, k), n, exact=kind == "ties")
        assert torch.equal(t, torch.from_numpy(x)), "input modified"


@pytest.mark.parametrize("n", [4, 7, 30])
def test_mean_around_median_float64(path, n):
    rng = np.random.default_rng(n)
    for kind in ("outliers", "ties"):
        x = make(rng, n, 1001, kind, np.float64)
        for k in around_median_ks(n):
            check_around_median(selection.coordinate_mean_around_median(torch.from_numpy(x), k),
                                ref_around_median(x, k), n, exact=kind == "ties")


@pytest.mark.parametrize("m", [1, 2, 5, 8, 30])
def test_mean_around_median_of_selected_rows(path, m):
    # Bulyan's phase 2: the rows chosen by index, in any order, from a non-contiguous matrix
    rng = np.random.default_rng(m)
    base = torch.from_numpy(make(rng, 2 * 301, 40, "ties"))
    t = base.T[:, ::2]  # (40, 301), not contiguous
    assert not t.is_contiguous()
    rows = torch.from_numpy(rng.permutation(40)[:m])
    sub = t.numpy()[rows.numpy()].copy()
    for k in around_median_ks(m):
        got = selection.coordinate_mean_around_median(t, k, rows=rows)
        check_around_median(got, ref_around_median(sub, k), m, exact=True)


def test_mean_around_median_matches_naive_closest_values(path):
    # naive.py's definition (float64 loop): equal on integer data, where no rounding is involved
    import naive

    rng = np.random.default_rng(5)
    x = make(rng, 12, 300, "ties")
    for k in range(1, 13):
        want = np.array([naive._closest_to_median_mean(list(x[:, j].astype(np.float64)), k) for j in range(300)])
        np.testing.assert_allclose(selection.coordinate_mean_around_median(torch.from_numpy(x), k).numpy(),
                                   want, rtol=1e-7)


def test_closest_ties_prefer_values_below_the_median(path):
    # 0, 2, 4 (median 2): 0 and 4 tie at distance 2, the lower wins: k = 2 -> (0 + 2) / 2
    t = torch.tensor([[0.0] * 40, [2.0] * 40, [4.0] * 40])
    assert torch.equal(selection.coordinate_mean_around_median(t, 2), torch.full((40,), 1.0))
    # even count: 0, 1, 3, 4 (median 2): 1 and 3 tie, then 0 and 4: k = 1 -> 1, k = 3 -> 4 / 3
    t = torch.tensor([[0.0] * 40, [1.0] * 40, [3.0] * 40, [4.0] * 40])
    assert torch.equal(selection.coordinate_mean_around_median(t, 1), torch.full((40,), 1.0))
    assert torch.equal(selection.coordinate_mean_around_median(t, 3), torch.full((40,), 4.0 / 3))


@pytest.mark.parametrize("n", range(2, 13))
def test_around_median_network_on_every_zero_one_column(n):
    """0-1 principle: the pruned network leaves the exact order statistic in every position the
    kernel reads and the right set of values in the band it only sums, for every input."""
    x = np.array(list(itertools.product([0, 1], repeat=n)), dtype=np.int8).T.copy()
    want = np.sort(x, axis=0)
    h = n // 2
    for k in range(1, n + 1):
        ci, cj = selection._around_median_network(n, k)
        y = x.copy()
        for a, b in zip(ci, cj):
            lo, hi = np.minimum(y[a], y[b]), np.maximum(y[a], y[b])
            y[a], y[b] = lo, hi
        if 2 * k > n:
            exact = [*range(n - k), *range(k, n), h] + ([h - 1] if n % 2 == 0 else [])
            band = slice(n - k, k)
            np.testing.assert_array_equal(y[band].sum(axis=0), want[band].sum(axis=0))
        else:
            exact = list(range(n))
        np.testing.assert_array_equal(y[exact], want[exact])


def test_mean_around_median_is_a_new_tensor_and_checks_k(path):
    t = torch.randn(5, 64)
    before = t.clone()
    selection.coordinate_mean_around_median(t, 3).add_(1)
    assert torch.equal(t, before)
    one = torch.randn(1, 64)
    out = selection.coordinate_mean_around_median(one, 1)
    assert torch.equal(out, one[0]) and out.data_ptr() != one.data_ptr()
    for k in (0, 6):
        with pytest.raises(ValueError, match="1 <= k <= m"):
            selection.coordinate_mean_around_median(t, k)
    with pytest.raises(ValueError, match="1 <= k <= m"):
        selection.coordinate_mean_around_median(t, 3, rows=torch.tensor([0, 1]))


def test_mean_around_median_equals_torch_reference_exactly():
    # default thresholds (the kernel) against the torch reference on the sorted matrix
    g = torch.Generator().manual_seed(8)
    t = torch.randn(50, 20_011, generator=g)
    t[::7] *= 1e3
    for k in (40, 25, 10):
        ref = selection.mean_around_median(torch.sort(t, dim=0).values, k)
        assert torch.equal(selection.coordinate_mean_around_median(t, k), ref)
    rows = torch.tensor([3, 17, 4, 40, 22, 9, 31, 0, 11, 49, 28])
    ref = selection.mean_around_median(torch.sort(t[rows], dim=0).values, 3)
    assert torch.equal(selection.coordinate_mean_around_median(t, 3, rows=rows), ref)


def test_run_chunks_runs_every_chunk_once_and_reraises():
    seen: list[int] = []
    lock = threading.Lock()

    def work(c: int) -> None:
        with lock:
            seen.append(c)

    selection.run_chunks(work, 37, 3)
    assert sorted(seen) == list(range(37))

    def fail(c: int) -> None:
        if c == 5:
            raise RuntimeError("chunk 5")

    with pytest.raises(RuntimeError, match="chunk 5"):
        selection.run_chunks(fail, 20, 3)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_split_range_bounds(monkeypatch, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    for count, unit, minimum in [(10, 4, 1), (1000, 64, 1), (1000, 64, 600), (5, 16, 1), (100_000, 1280, 4096)]:
        bounds, used = selection.split_range(count, unit, minimum)
        assert bounds[0] == 0 and bounds[-1] == count
        assert all(a < b for a, b in zip(bounds, bounds[1:]))
        assert all(b % unit == 0 for b in bounds[:-1])
        assert 1 <= used <= threads and (used == 1 or count // used >= minimum)
        assert len(bounds) - 1 == (1 if used == 1 else min(-(-count // unit), used * selection._CHUNKS_PER_THREAD))
