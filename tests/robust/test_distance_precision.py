"""Float32 distances on rows that share a large offset (model weights rather than gradients).

``‖x‖² + ‖y‖² − 2⟨x, y⟩`` expanded in float32 around an offset of 1000 loses every digit of
distances of size 1e-2: the selections then follow rounding noise. The distance-based rules must
pick what exact arithmetic picks; the reference is the naive float64 loop of ``naive.py``
(differences first, so the float32 inputs' distances are exact to float64 rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.robust import distances, krum
from fedsafe.robust.aggregators import AGGREGATORS, mean_around_median
from fedsafe.robust.mixing import mix
from fedsafe.robust.preaggregators import PREAGGREGATORS
from fedsafe.robust.rows import average_rows

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive

N, F, DIM, OFFSET, TRIALS = 15, 3, 100, 1000.0, 30


def _offset_rows(seed: int) -> tuple[torch.Tensor, set[int]]:
    """float32 rows ``1000 + 0.01·N(0, 1)`` (honest) and F rows ``1000 + 0.03·N(0, 1)``
    (Byzantine) at random positions. A Byzantine row's n − f − 2 nearest others lie at squared
    distance ≈ 1e-3·DIM, an honest row's at ≈ 2e-4·DIM, so exact Krum never picks one."""
    g = torch.Generator().manual_seed(seed)
    x = OFFSET + 0.01 * torch.randn(N, DIM, generator=g, dtype=torch.float64)
    byz = torch.randperm(N, generator=g)[:F]
    x[byz] = OFFSET + 0.03 * torch.randn(F, DIM, generator=g, dtype=torch.float64)
    return x.to(torch.float32), {int(i) for i in byz}


def test_offset_krum_picks_what_exact_krum_picks():
    for seed in range(TRIALS):
        x, byz = _offset_rows(seed)
        want = naive.krum_index(x.double().numpy(), F)
        assert want not in byz  # the data are what the docstring says
        d2 = distances.pairwise_sq_distances(x)
        assert krum.krum_select(d2, F) == want, f"trial {seed}"
        assert torch.equal(AGGREGATORS.get("krum")(x, f=F), x[want])


def test_offset_selections_match_exact():
    for seed in range(TRIALS):
        x, _ = _offset_rows(seed)
        x64 = x.double().numpy()
        d2 = distances.pairwise_sq_distances(x)
        assert krum.multi_krum_select(d2, F).tolist() == naive.multi_krum_indices(x64, F), seed
        assert krum.multi_krum_select(d2, F, 4).tolist() == naive.multi_krum_indices(x64, F, 4), seed
        assert krum.bulyan_select(d2, F).tolist() == naive.bulyan_indices(x64, F), seed
        w = distances.nnm_mixing(d2, F)
        got = [set(torch.nonzero(row).flatten().tolist()) for row in w]
        assert got == [set(nb) for nb in naive.nnm_neighbors(x64, F)], seed


def test_offset_rules_match_naive_outputs():
    # the registered rules on the exact selections: the same float32 arithmetic after selecting
    x, _ = _offset_rows(0)
    x64 = x.double().numpy()
    keep = torch.tensor(naive.multi_krum_indices(x64, F))
    assert torch.equal(AGGREGATORS.get("multi_krum")(x, f=F), average_rows(x, keep))
    chosen = torch.sort(x[naive.bulyan_indices(x64, F)], dim=0).values
    assert torch.equal(AGGREGATORS.get("bulyan")(x, f=F), mean_around_median(chosen, N - 4 * F))
    w = torch.zeros(N, N)
    for i, nearest in enumerate(naive.nnm_neighbors(x64, F)):
        w[i, nearest] = 1.0 / (N - F)
    assert torch.equal(PREAGGREGATORS.get("nnm")(x, f=F), mix(x, w))


def _bound(x: torch.Tensor, center: torch.Tensor | None, m: int) -> np.ndarray:
    """The torch path's bound ``(2γ_m + 8u)(‖x_i − c‖² + ‖x_j − c‖²)`` for float32 (u = 2⁻²⁴)."""
    u = 2.0**-24
    gamma = m * u / (1 - m * u)
    x64 = x.double()
    c = torch.zeros_like(x64[0]) if center is None else center.double()
    sq = ((x64 - c) ** 2).sum(dim=1).numpy()
    return (2 * gamma + 8 * u) * (sq[:, None] + sq[None, :])


@pytest.mark.parametrize("offset", [0.0, 1.0, 1e3, 1e5])
def test_error_bound_holds_and_scales_with_spread_not_offset(offset):
    # small rows: the torch path, centred on the coordinate-wise median
    g = torch.Generator().manual_seed(7)
    x = offset + torch.randn(12, DIM, generator=g, dtype=torch.float64)
    x[5] = x[2] + 1e-3 * torch.randn(DIM, generator=g, dtype=torch.float64)  # a close pair
    x[9] = 50 * torch.randn(DIM, generator=g, dtype=torch.float64) + offset  # a far row
    x = x.to(torch.float32)
    exact = naive.sq_distances(x.double().numpy())
    center = distances.distance_center(x)
    want = torch.tensor(naive.median(x, 0), dtype=torch.float64).to(torch.float32)
    assert torch.equal(center, want)  # the coordinate-wise median, not any one row
    got = distances.pairwise_sq_distances(x).double().numpy()
    err = np.abs(got - exact)
    bound = _bound(x, center, DIM) + 2.0**-24 * exact  # + the cast of the result
    assert (err <= bound).all(), float((err / bound).max())
    if offset >= 1e3:  # centring made the bound on the bulk relative to its spread, not ‖x‖²
        bulk = np.ix_([i for i in range(12) if i != 9], [i for i in range(12) if i != 9])
        assert bound[bulk].max() < 1e-3 * _bound(x, None, DIM)[bulk].min()


@pytest.mark.parametrize("n", [9, 10, 11, 12])
def test_center_lies_within_the_honest_range(n):
    # fewer than n/2 Byzantine rows, all above every honest value in every coordinate (or all
    # below, or split): every coordinate of the centre stays between the honest extremes
    g = torch.Generator().manual_seed(n)
    f = (n - 1) // 2
    for layout in ("above", "below", "split"):
        x = 1000 + 0.01 * torch.randn(n, 300, generator=g, dtype=torch.float64)
        byz = torch.randperm(n, generator=g)[:f]
        honest = torch.tensor([i for i in range(n) if i not in set(byz.tolist())])
        sign = {"above": 1.0, "below": -1.0, "split": torch.where(torch.arange(f) % 2 == 0, 1.0, -1.0)[:, None]}[layout]
        x[byz] = 1000 + sign * 1e6 * (1 + torch.rand(f, 300, generator=g, dtype=torch.float64))
        x = x.to(torch.float32)
        c = distances.distance_center(x)
        assert (c >= x[honest].min(dim=0).values).all() and (c <= x[honest].max(dim=0).values).all(), layout
    assert distances.distance_center(x[:1]) is None and distances.distance_center(x[:, :0]) is None


def test_wide_rows_use_blocks_and_stay_exact(monkeypatch):
    # several column blocks of the torch path (the float64 sum across them)
    monkeypatch.setattr(distances, "_BLOCK_BYTES", 7 * 4 * 1024)  # 1024 columns per block
    g = torch.Generator().manual_seed(2)
    n, d = 7, 5000
    assert distances.block_columns(n, 4, d) == 1024
    x = (OFFSET + 0.01 * torch.randn(n, d, generator=g, dtype=torch.float64)).to(torch.float32)
    xd = x.double()
    exact = ((xd[:, None, :] - xd[None, :, :]) ** 2).sum(dim=-1).numpy()  # differences first
    center = distances.distance_center(x)
    got = distances.pairwise_sq_distances(x).double().numpy()
    assert (np.abs(got - exact) <= _bound(x, center, 1024) + 2.0**-24 * exact).all()
    off = ~np.eye(n, dtype=bool)
    assert (np.abs(got - exact)[off] <= 1e-4 * exact[off]).all()
    got64 = distances.pairwise_sq_distances(x, dtype=torch.float64).numpy()
    np.testing.assert_allclose(got64, exact, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- adversarial rows
# Issue #25, item 2: the distances must not depend on the Byzantine rows beyond their own
# entries. Before the fix a centre row was picked on a fixed, public subset of "probe" columns
# (runs of 32 adjacent columns, ⌊16384/n⌋ values, evenly spaced), and a Byzantine row equal to
# the honest mean on those columns and shifted by 1000 elsewhere became the centre: the honest
# distances then carried errors of the size of ‖x_h − x_b‖² ≈ 1e9, and Krum, Multi-Krum, Bulyan
# and NNM followed rounding noise. The attacks below are built against that public probe (kept
# here as the attacker knew it) and against any rule that lets one row, or a few columns, decide.

ADV_N, ADV_F, ADV_D, ADV_DRAWS = 25, 5, 2000, 20


def _public_probe(n: int, d: int) -> np.ndarray:
    """The probe columns of the old ``distances.probe_columns`` (the attacker's target)."""
    runs = max(1, 16384 // n // 32)
    starts = np.arange(runs) * (d - 32) // max(1, runs - 1)
    return (starts[:, None] + np.arange(32)).reshape(-1)


def _exact(x: torch.Tensor) -> np.ndarray:
    """Exact reference distances, as ``naive.sq_distances`` (differences first, float64), vectorised."""
    x64 = x.double().numpy()
    return ((x64[:, None, :] - x64[None, :, :]) ** 2).sum(axis=-1)


def _attack(kind: str, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """float32 rows: honest ``1000 + 0.01·N(0, 1)``, ADV_F Byzantine rows at random positions."""
    g = np.random.default_rng(seed)
    n, f, d = ADV_N, ADV_F, ADV_D
    x = 1000 + 0.01 * g.standard_normal((n, d))
    byz = g.permutation(n)[:f]
    honest = np.setdiff1d(np.arange(n), byz)
    mu = x[honest].mean(axis=0)
    probe = _public_probe(n, d)
    rest = np.setdiff1d(np.arange(d), probe)
    if kind == "probe":  # the reported attack: the honest mean on the probe, +1000 elsewhere
        x[byz] = mu
        x[np.ix_(byz, rest)] += 1000.0
    elif kind == "probe_spread":  # the same, Byzantine rows apart from each other elsewhere
        x[byz] = mu
        x[np.ix_(byz, rest)] += 1000.0 * (1 + g.random((f, rest.size)))
    elif kind == "probe_nearest":  # one row nearest to everyone on the probe, the others far
        x[byz] = mu + 5.0
        x[byz[0], probe] = mu[probe]
        x[np.ix_(byz[:1], rest)] += 1000.0
    elif kind == "one_column":  # the honest mean everywhere but one column, shifted by 1e6
        x[byz] = mu
        x[byz, g.integers(d)] += 1e6
    elif kind == "flat_probe":  # every row equal on the probe: the probe cannot tell them apart
        x[:, probe] = 1000.0
        x[byz] = 1000.0
        x[np.ix_(byz, rest)] += 1000.0
    elif kind == "huge":  # far beyond the honest values' magnitude in every column
        x[byz] = 1e15 * (1 + g.random((f, d)))
    else:
        raise ValueError(kind)
    return torch.from_numpy(x).to(torch.float32), np.sort(byz)


def _nnm_from(d2: np.ndarray, f: int) -> list[set[int]]:
    """``naive.nnm_neighbors`` on given distances: i, then its n − f − 1 nearest (then index)."""
    n = d2.shape[0]
    return [
        {i, *sorted((j for j in range(n) if j != i), key=lambda j: (d2[i, j], j))[: n - f - 1]}
        for i in range(n)
    ]


@pytest.fixture(params=["kernel", "torch"])
def dist_path(request, monkeypatch):
    """``kernel``: the numba kernel (what n = 50, d = 1e6 float32 takes), forced on these small
    rows and split over 3 column ranges; ``torch``: the fallback."""
    from fedsafe.robust import rowwise, selection

    if request.param == "kernel":
        if rowwise.njit is None:
            pytest.skip("numba not installed")
        monkeypatch.setattr(rowwise, "_MIN_KERNEL_SIZE", 0)
        monkeypatch.setattr(rowwise, "_MIN_COLUMNS_PER_THREAD", 1)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    else:
        monkeypatch.setattr(rowwise, "_MIN_KERNEL_SIZE", 1 << 62)
        monkeypatch.setattr(selection, "_MIN_KERNEL_SIZE", 1 << 62)
    return request.param


def _adversary_free_bound(x: torch.Tensor, exact: np.ndarray, path: str) -> np.ndarray:
    """The bounds of ``pairwise_sq_distances``'s docstring for float32 rows (u = 2⁻²⁴), plus the
    float64 sum over blocks and the final cast to float32:

    * kernel: ``(γ_{m+2} + ⌈d/m⌉·2⁻⁵³ + u)·D_ij``, m the kernel's block (each entry from the two
      rows alone);
    * torch: ``(2γ_m + 8u + ⌈d/m⌉·2⁻⁵³)·(‖x_i − c‖² + ‖x_j − c‖²) + u·D_ij``, c the
      coordinate-wise median of all rows, m the block's columns."""
    from fedsafe.robust import rowwise

    n, d = x.shape
    u = 2.0**-24

    def gamma(k: int) -> float:
        return k * u / (1 - k * u)

    if path == "kernel":
        m = rowwise.gram_block(n, 4)
        blocks = -(-d // m) + 24  # chunk boundaries (3 threads, 8 chunks each) may split blocks
        return (gamma(m + 2) + blocks * 2.0**-53 + u) * exact
    m = distances.block_columns(n, 4, d)
    c = torch.from_numpy(np.array([naive._med(list(col)) for col in x.double().numpy().T]))
    c = c.to(torch.float32).double()  # the median in float32, as the rows
    sq = ((x.double() - c) ** 2).sum(dim=1).numpy()
    return (2 * gamma(m) + 8 * u + -(-d // m) * 2.0**-53) * (sq[:, None] + sq[None, :]) + u * exact


ATTACKS = ["probe", "probe_spread", "probe_nearest", "one_column", "flat_probe", "huge"]


@pytest.mark.parametrize("kind", ATTACKS)
def test_byzantine_rows_cannot_change_the_selections(dist_path, kind, monkeypatch):
    n, f = ADV_N, ADV_F
    mismatches = []
    for seed in range(ADV_DRAWS):
        x, byz = _attack(kind, seed)
        exact = _exact(x)
        monkeypatch.setattr(naive, "sq_distances", lambda _x, e=exact: e)  # the naive rules, on it
        x64 = x.double().numpy()
        d2 = distances.pairwise_sq_distances(x)
        got = (
            krum.krum_select(d2, f),
            krum.multi_krum_select(d2, f).tolist(),
            krum.bulyan_select(d2, f).tolist(),
            [set(torch.nonzero(row).flatten().tolist()) for row in distances.nnm_mixing(d2, f)],
        )
        want = (
            naive.krum_index(x64, f),
            naive.multi_krum_indices(x64, f),
            naive.bulyan_indices(x64, f),
            _nnm_from(exact, f),
        )
        assert want[0] not in byz and not set(want[1]) & set(byz.tolist())  # exact rules are fine
        mismatches += [(seed, rule) for rule, a, b in zip(("krum", "multi_krum", "bulyan"), got, want) if a != b]
        # NNM: every honest row's neighbours exactly. A Byzantine row far away has honest
        # neighbours whose distances to it (≈ 1.4e9) can differ by less than a float32 ulp of
        # the result (128): no float32 D can order those, so only such near-ties may differ.
        bound = _adversary_free_bound(x, exact, dist_path)
        for i, (a, b) in enumerate(zip(got[3], want[3])):
            if a == b:
                continue
            cutoff = max(exact[i, j] for j in b)
            tie = all(abs(exact[i, j] - cutoff) <= 2 * bound[i, j] + 2 * np.spacing(np.float32(cutoff)) for j in a ^ b)
            if i not in byz or not tie:
                mismatches.append((seed, "nnm", i))
    assert mismatches == [], mismatches


@pytest.mark.parametrize("kind", ATTACKS)
def test_honest_distances_stay_within_the_bound_whatever_the_byzantine_rows(dist_path, kind):
    for seed in range(0, ADV_DRAWS, 4):
        x, byz = _attack(kind, seed)
        honest = np.setdiff1d(np.arange(ADV_N), byz)
        hh = np.ix_(honest, honest)
        exact = _exact(x)
        got = distances.pairwise_sq_distances(x).double().numpy()
        err = np.abs(got - exact)
        bound = _adversary_free_bound(x, exact, dist_path)
        assert (err <= bound).all(), float((err / bound).max())
        # on honest pairs the bound depends on the honest rows alone: tiny against their distances
        off = ~np.eye(honest.size, dtype=bool)
        assert (bound[hh][off] <= 1e-3 * exact[hh][off]).all(), (seed, float((bound[hh][off] / exact[hh][off]).max()))
        # the attacked matrix agrees with the honest rows' own on honest pairs
        alone = distances.pairwise_sq_distances(x[torch.from_numpy(honest)]).double().numpy()
        np.testing.assert_allclose(got[hh], alone, rtol=2 * (bound[hh] / np.maximum(exact[hh], 1e-300)).max(), atol=0)


def test_kernel_error_is_relative_to_each_distance(dist_path):
    # a pair 1e-3 apart at an offset of 1e5 among rows 1 apart and one row 1e6 away: the kernel's
    # entries are within γ_{m+2} of their own value (nothing the Gram expansion can promise)
    g = torch.Generator().manual_seed(11)
    x = 1e5 + torch.randn(9, 3000, generator=g, dtype=torch.float64)
    x[4] = x[1] + 1e-3 * torch.randn(3000, generator=g, dtype=torch.float64)
    x[7] += 1e6
    x = x.to(torch.float32)
    exact = _exact(x)
    got = distances.pairwise_sq_distances(x).double().numpy()
    assert got[1, 4] > 0 and (got == got.T).all() and (np.diag(got) == 0).all()
    bound = _adversary_free_bound(x, exact, dist_path)
    assert (np.abs(got - exact) <= bound).all()
    if dist_path == "kernel":
        assert abs(got[1, 4] - exact[1, 4]) <= 3.1e-5 * exact[1, 4]
        got64 = distances.pairwise_sq_distances(x, dtype=torch.float64).numpy()
        np.testing.assert_allclose(got64, exact, rtol=1e-12, atol=0)


def test_kernel_float64_rows_are_not_rounded_before_they_are_subtracted(monkeypatch):
    # float64 rows 1e-9 apart at an offset of 1e3 (float32 would round them together): asked
    # for a float32 result, the kernel still subtracts in float64 and rounds only the result
    from fedsafe.robust import rowwise

    if rowwise.njit is None:
        pytest.skip("numba not installed")
    monkeypatch.setattr(rowwise, "_MIN_KERNEL_SIZE", 0)
    g = torch.Generator().manual_seed(5)
    x = 1e3 + 1e-9 * torch.randn(6, 700, generator=g, dtype=torch.float64)
    assert rowwise.use_gram_kernel(x, torch.float32)
    exact = _exact(x)
    got = distances.pairwise_sq_distances(x, dtype=torch.float32)
    assert got.dtype == torch.float32
    off = ~np.eye(6, dtype=bool)
    np.testing.assert_allclose(got.double().numpy()[off], exact[off], rtol=2.0**-23)
