"""The numba row kernels (``robust/rowwise.py``: squared norms and distances to a vector, the
tiled Gram matrix, scaled and clipped copies, the centred weighted sum) and NNM's mixing kernel
(``robust/mixing.py``) against float64 references, and the rules built on them against the
naive loops of ``naive.py`` with the kernels forced on small inputs.

Every kernel case runs on two paths: ``kernel`` (thresholds lowered so that tiny matrices take
it, 3 threads splitting the columns, Gram blocks of 64 columns, sum blocks of 16) and ``torch``
(the fallback). Data: Gaussian rows with an offset, integer rows with duplicates and a zero row
(exact arithmetic: ties must come out exactly), rows with far outliers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.robust import distances, krum, mixing, rowwise, selection
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.preaggregators import PREAGGREGATORS

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive


def _force_kernels(monkeypatch) -> None:
    if rowwise.njit is None:
        pytest.skip("numba not installed")
    monkeypatch.setattr(rowwise, "_MIN_KERNEL_SIZE", 0)
    monkeypatch.setattr(rowwise, "_MIN_COLUMNS_PER_THREAD", 1)
    monkeypatch.setattr(rowwise, "_GRAM_BLOCK_BYTES", 1)  # 64-column blocks: several per thread
    monkeypatch.setattr(rowwise, "_SUM_BLOCK", 16)
    monkeypatch.setattr(selection, "_MIN_KERNEL_SIZE", 0)
    monkeypatch.setattr(selection, "_MIN_COLUMNS_PER_THREAD", 1)
    monkeypatch.setattr(selection, "_SUB_BLOCK_BYTES", 1)  # 16-lane sub-blocks, small slabs
    monkeypatch.setattr(selection, "_SLAB_BYTES", 4096)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)  # more ranges than cores


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    if request.param == "kernel":
        _force_kernels(monkeypatch)
    else:
        monkeypatch.setattr(rowwise, "_MIN_KERNEL_SIZE", 1 << 62)
        monkeypatch.setattr(selection, "_MIN_KERNEL_SIZE", 1 << 62)
    return request.param


def _rows(kind: str, n: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        x = 3 + torch.randn(n, d, generator=g, dtype=torch.float64)
    elif kind == "ties":  # integers: exact sums; duplicated rows and a zero row
        x = torch.randint(-2, 3, (n, d), generator=g).to(torch.float64)
        if n >= 4:
            x[n - 1] = x[1]
            x[2] = 0
    elif kind == "outliers":
        x = torch.randn(n, d, generator=g, dtype=torch.float64)
        x[:: max(1, n // 3)] *= 1e4
    else:
        raise AssertionError(kind)
    return x.to(dtype)


KINDS = ["gaussian", "ties", "outliers"]
DTYPES = [torch.float32, torch.float64]
# d straddles the 64-column blocks and the per-thread ranges; n straddles the 4-row tiles
SHAPES = [(1, 5), (2, 200), (3, 129), (5, 301), (8, 64), (9, 1000), (13, 257)]


# ----------------------------------------------------------------------------- row_sq_norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,d", SHAPES)
def test_row_sq_norms(path, n, d, kind, dtype):
    x = _rows(kind, n, d, dtype)
    before = x.clone()
    x64 = x.double()
    got = rowwise.row_sq_norms(x)
    assert got.dtype == torch.float64 and got.shape == (n,)
    np.testing.assert_allclose(got.numpy(), (x64 * x64).sum(dim=1).numpy(), rtol=1e-13)
    c = x[n // 2]
    got_c = rowwise.row_sq_norms(x, c)
    want_c = ((x64 - c.double()) ** 2).sum(dim=1).numpy()
    np.testing.assert_allclose(got_c.numpy(), want_c, rtol=1e-13, atol=1e-13 * float(want_c.max()))
    assert got_c[n // 2] == 0  # the centre row itself, exactly
    if kind == "ties":  # exact, and duplicated rows equal
        assert np.array_equal(got_c.numpy(), want_c)
        if n >= 4:
            assert got[1] == got[n - 1] and got[2] == 0
    assert torch.equal(x, before)


def test_row_sq_norms_non_contiguous_and_bad_center(path):
    base = _rows("gaussian", 301, 14, torch.float32)
    x = base.T[:, ::2]  # (14, 151) with strides (1, 28)
    assert not x.is_contiguous()
    want = (x.double() ** 2).sum(dim=1)
    torch.testing.assert_close(rowwise.row_sq_norms(x), want, rtol=1e-13, atol=0)
    with pytest.raises(ValueError, match="center must have shape"):
        rowwise.row_sq_norms(x, torch.zeros(3))


# ----------------------------------------------------------------------------- Gram, distances


def _gram_ref(x: torch.Tensor, dtype: torch.dtype, center: torch.Tensor | None) -> torch.Tensor:
    c = torch.zeros_like(x[0], dtype=torch.float64) if center is None else center.to(dtype).double()
    y = (x.double() - c).to(dtype).double()  # x − c in the wider dtype, rounded to dtype once
    return y @ y.T


@pytest.mark.parametrize("acc", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,d", SHAPES)
def test_gram_kernel(monkeypatch, n, d, kind, dtype, acc):
    _force_kernels(monkeypatch)
    x = _rows(kind, n, d, dtype)
    before = x.clone()
    for center in (None, x[n - 1]):
        assert rowwise.use_gram_kernel(x, acc)
        got = rowwise.gram_float64(x, acc, center)
        want = _gram_ref(x, acc, center)
        assert got.dtype == torch.float64 and torch.equal(got, got.T)
        # each 64-column block summed in the accumulation dtype, blocks in float64
        u = 2.0**-24 if acc == torch.float32 else 2.0**-53
        sq = torch.diagonal(want)
        bound = 2 * 64 * u * torch.sqrt(sq[:, None] * sq[None, :]) + 1e-300
        assert ((got - want).abs() <= bound).all()
        if kind == "ties":
            assert torch.equal(got, want)  # integers: exact
    assert torch.equal(x, before)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,f", [(11, 2), (12, 2), (15, 3), (9, 1)])
def test_distances_and_selections_through_the_kernel(monkeypatch, n, f, kind):
    _force_kernels(monkeypatch)
    x = _rows(kind, n, 300, torch.float32, seed=n)
    x64 = x.double().numpy()
    exact = naive.sq_distances(x64)
    d2 = distances.pairwise_sq_distances(x)
    assert d2.dtype == torch.float32 and torch.equal(d2, d2.T)
    assert torch.all(torch.diagonal(d2) == 0)
    np.testing.assert_allclose(d2.double().numpy(), exact, rtol=1e-5, atol=1e-5 * exact.max())
    d2_64 = distances.pairwise_sq_distances(x, dtype=torch.float64)
    np.testing.assert_allclose(d2_64.numpy(), exact, rtol=1e-12, atol=1e-12 * exact.max())
    if kind == "ties":  # exact distances: duplicates exactly 0 apart, index choices agree
        assert torch.equal(d2_64, torch.from_numpy(exact))
        assert d2[1, n - 1] == 0
        assert krum.krum_select(d2, f) == naive.krum_index(x64, f)
        assert krum.multi_krum_select(d2, f).tolist() == naive.multi_krum_indices(x64, f)
        if n >= 4 * f + 3:
            assert krum.bulyan_select(d2, f).tolist() == naive.bulyan_indices(x64, f)


def test_offset_rows_are_centered_and_exact(monkeypatch):
    _force_kernels(monkeypatch)
    g = torch.Generator().manual_seed(4)
    x = (1000 + 0.01 * torch.randn(10, 700, generator=g, dtype=torch.float64)).to(torch.float32)
    x[6] = x[3]
    assert distances.distance_center(x) is not None
    exact = naive.sq_distances(x.double().numpy())
    got = distances.pairwise_sq_distances(x).double().numpy()
    off = ~np.eye(10, dtype=bool)
    off[3, 6] = off[6, 3] = False
    assert (np.abs(got - exact)[off] <= 1e-5 * exact[off]).all()
    assert got[3, 6] == 0


def test_large_n_uses_torch(monkeypatch):
    monkeypatch.setattr(rowwise, "_MIN_KERNEL_SIZE", 0)
    x = torch.randn(rowwise._MAX_GRAM_ROWS + 1, 8)
    assert not rowwise.use_gram_kernel(x, torch.float32)
    assert rowwise.use_gram_kernel(x[:-1], torch.float32)
    assert not rowwise.use_gram_kernel(x.half(), torch.float16)


# ----------------------------------------------------------------------------- scaled copies


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,d", SHAPES)
def test_scale_and_clip_rows(path, n, d, kind, dtype):
    x = _rows(kind, n, d, dtype)
    before = x.clone()
    factors = torch.linspace(0.25, 1.0, n, dtype=torch.float64)
    factors[-1] = 1.0  # copied exactly
    got = rowwise.scale_rows(x, factors)
    assert got.dtype == dtype and got.data_ptr() != x.data_ptr()
    want = x.double() * factors[:, None]
    torch.testing.assert_close(got, want.to(dtype), rtol=0, atol=0)  # rounded once
    assert torch.equal(got[n - 1], x[n - 1])
    norms = torch.linalg.vector_norm(x.double(), dim=1)
    tau = float(norms.median()) if n > 1 else float(norms[0]) / 2
    clipped = rowwise.clip_rows(x, tau)
    assert clipped.dtype == dtype and clipped.data_ptr() != x.data_ptr()
    rtol = 1e-6 if dtype == torch.float32 else 1e-13
    np.testing.assert_allclose(clipped.double().numpy(), naive.clipping(x.double().numpy(), tau),
                               rtol=rtol, atol=rtol * float(x.abs().max()))
    kept = norms <= tau * (1 - 1e-12)  # clearly below τ whatever the summation order
    assert torch.equal(clipped[kept], x[kept])  # unclipped rows (and zero rows) copied exactly
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", SHAPES)
def test_centered_weighted_sum(path, n, d, dtype):
    x = _rows("outliers", n, d, dtype)
    v = _rows("gaussian", 1, d, dtype, seed=9)[0]
    before = x.clone()
    w = torch.linspace(-0.5, 1.0, n, dtype=torch.float64)
    w[0] = 0.0  # a skipped row
    got = rowwise.centered_weighted_sum(x, w, v)
    want = v.double() + w @ (x.double() - v.double())
    assert got.dtype == dtype and got.shape == (d,)
    scale = float((w.abs() @ (x.double() - v.double()).abs()).max()) + float(v.abs().max())
    rtol = 2.0**-23 if dtype == torch.float32 else 1e-14
    assert float((got.double() - want).abs().max()) <= rtol * scale
    plain = rowwise.centered_weighted_sum(x, w, None)  # Σ w_i x_i
    scale = float((w.abs() @ x.double().abs()).max())
    assert float((plain.double() - w @ x.double()).abs().max()) <= rtol * scale
    assert torch.equal(x, before)


# ----------------------------------------------------------------------------- NNM mixing


def _mixing(n: int, f: int, excluded_by_all: list[int], seed: int) -> torch.Tensor:
    """An NNM-like matrix: every row keeps itself and excludes ``excluded_by_all`` (unless it is
    one of them) plus random others, f in all."""
    g = torch.Generator().manual_seed(seed)
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        out = [j for j in excluded_by_all if j != i][:f]
        others = [int(j) for j in torch.randperm(n, generator=g) if int(j) != i and int(j) not in out]
        out += others[: f - len(out)]
        keep = [j for j in range(n) if j not in out]
        w[i, keep] = 1.0 / (n - f)
    return w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("common", [[], [1, 4], [0, 1, 2, 3]])
@pytest.mark.parametrize("n,f,d", [(9, 2, 300), (12, 4, 1000), (23, 5, 77)])
def test_mix_kernel_equals_exact_mixing(monkeypatch, n, f, d, common, dtype):
    # rows sharing most of their excluded set (from T) and rows far from it (from S)
    _force_kernels(monkeypatch)
    monkeypatch.setattr(mixing, "_MIN_KERNEL_SIZE", 0)
    x = _rows("outliers", n, d, dtype, seed=n + f)
    w = _mixing(n, f, common[:f], seed=d)
    before = x.clone()
    got = mixing.mix(x, w.to(dtype))
    exact_w = (w > 0).double() / (n - f)
    want = exact_w @ x.double()
    assert got.dtype == dtype
    # T (and S) summed in float64; a row's correction, at most 2f rows, in the input dtype
    # (error <= γ_2f · 2f · max|x|), then scaled by 1/(n − f) and rounded once
    u = 2.0**-24 if dtype == torch.float32 else 2.0**-53
    top = float(x.abs().max())
    bound = u * want.abs() + ((2 * f) ** 2 * u / (n - f) + (n + 2 * f) * n * 2.0**-53) * top
    assert ((got.double() - want).abs() <= bound).all()
    assert torch.equal(x, before)


# ----------------------------------------------------------------------------- rules


RULES = [
    ("monna", {}, naive.monna),
    ("monna", {"reference": 2}, lambda x, f: naive.monna(x, f, reference=2)),
    ("centered_clipping", {}, naive.centered_clipping),
    ("centered_clipping", {"tau": 2.0, "iters": 3}, lambda x, f: naive.centered_clipping(x, f, tau=2.0, iters=3)),
    ("meamed", {}, naive.meamed),
    ("bulyan", {}, naive.bulyan),
    ("krum", {}, naive.krum),
    ("multi_krum", {}, naive.multi_krum),
    ("geometric_median", {}, naive.geometric_median),
]
PRES = [
    ("nnm", {}, naive.nnm),
    ("clipping", {"c": 2.0}, lambda x, f: naive.clipping(x, 2.0)),
    ("arc", {}, naive.arc),
]


def _rule_data(kind: str, n: int, f: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n + f)
    d = 150
    if kind == "gaussian":
        x = 1 + torch.randn(n, d, generator=g, dtype=torch.float64)
    elif kind == "ties":
        x = torch.randint(-2, 3, (n, d), generator=g).to(torch.float64)
        x[3] = x[1]
        x[n - 1] = x[1]
        x[4] = 0
    else:
        x = 1 + torch.randn(n, d, generator=g, dtype=torch.float64)
        for i in range(f):
            x[1 + 2 * i] = 1e6 * torch.randn(d, generator=g, dtype=torch.float64)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["gaussian", "ties", "outliers"])
@pytest.mark.parametrize("n,f", [(11, 2), (12, 2), (5, 0), (15, 3)])
@pytest.mark.parametrize("entry", RULES + PRES, ids=lambda e: e[0] + "".join(f"-{k}={v}" for k, v in e[1].items()))
def test_rules_through_kernels_match_naive(monkeypatch, entry, n, f, kind, dtype):
    _force_kernels(monkeypatch)
    monkeypatch.setattr(mixing, "_MIN_KERNEL_SIZE", 0)
    name, params, ref = entry
    registry = PREAGGREGATORS if (name, params, ref) in PRES else AGGREGATORS
    x = _rule_data(kind, n, f, dtype)
    try:
        rule = registry.get(name, params)
        before = x.clone()
        out = rule(x, f=f)
    except ValueError:  # (n, f) outside the rule's requirement: refused on both paths
        pytest.skip(f"{name} refuses n={n}, f={f}")
    assert torch.equal(x, before), "input modified"
    want = ref(x.double().numpy(), f)
    assert out.dtype == dtype and tuple(out.shape) == want.shape
    rtol = 1e-5 if dtype == torch.float32 or name == "geometric_median" else 1e-9
    np.testing.assert_allclose(out.double().numpy(), want, rtol=rtol, atol=rtol * (1 + np.abs(want).max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,d", SHAPES)
def test_clip_rows_by_rank(path, n, d, kind, dtype):
    # ARC's clipping: every row to the (rank+1)-th largest norm, others copied exactly
    x = _rows(kind, n, d, dtype)
    before = x.clone()
    norms = torch.linalg.vector_norm(x.double(), dim=1)
    for rank in sorted({0, n // 2, n - 1}):
        got = rowwise.clip_rows_by_rank(x, rank)
        assert got.dtype == dtype and got.data_ptr() != x.data_ptr()
        tau = float(torch.sort(norms, descending=True).values[rank])
        want = naive.clipping(x.double().numpy(), tau)  # τ = 0 (a zero row): every row to 0
        rtol = 1e-6 if dtype == torch.float32 else 1e-13
        np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=rtol * float(x.abs().max()))
        kept = norms <= tau * (1 - 1e-12)
        assert torch.equal(got[kept], x[kept])
        assert (torch.linalg.vector_norm(got.double(), dim=1) <= tau * (1 + 1e-6) + 1e-300).all()
    with pytest.raises(ValueError, match="rank must be"):
        rowwise.clip_rows_by_rank(x, n)
    assert torch.equal(x, before)

