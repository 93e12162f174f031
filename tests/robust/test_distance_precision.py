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
        assert got == [set(nb) for nb in naive.nnm_neighbours(x64, F)], seed


def test_offset_rules_match_naive_outputs():
    # the registered rules on the exact selections: the same float32 arithmetic after selecting
    x, _ = _offset_rows(0)
    x64 = x.double().numpy()
    keep = torch.tensor(naive.multi_krum_indices(x64, F))
    assert torch.equal(AGGREGATORS.get("multi_krum")(x, f=F), average_rows(x, keep))
    chosen = torch.sort(x[naive.bulyan_indices(x64, F)], dim=0).values
    assert torch.equal(AGGREGATORS.get("bulyan")(x, f=F), mean_around_median(chosen, N - 4 * F))
    w = torch.zeros(N, N)
    for i, nearest in enumerate(naive.nnm_neighbours(x64, F)):
        w[i, nearest] = 1.0 / (N - F)
    assert torch.equal(PREAGGREGATORS.get("nnm")(x, f=F), mix(x, w))


def _bound(x: torch.Tensor, centre: int | None, m: int) -> np.ndarray:
    """The docstring's bound ``(2γ_m + 8u)(‖x_i − c‖² + ‖x_j − c‖²)`` for float32 (u = 2⁻²⁴)."""
    u = 2.0**-24
    gamma = m * u / (1 - m * u)
    x64 = x.double()
    c = torch.zeros_like(x64[0]) if centre is None else x64[centre]
    sq = ((x64 - c) ** 2).sum(dim=1).numpy()
    return (2 * gamma + 8 * u) * (sq[:, None] + sq[None, :])


@pytest.mark.parametrize("offset", [0.0, 1.0, 1e3, 1e5])
def test_error_bound_holds_and_scales_with_spread_not_offset(offset):
    g = torch.Generator().manual_seed(7)
    x = offset + torch.randn(12, DIM, generator=g, dtype=torch.float64)
    x[5] = x[2] + 1e-3 * torch.randn(DIM, generator=g, dtype=torch.float64)  # a close pair
    x[9] = 50 * torch.randn(DIM, generator=g, dtype=torch.float64) + offset  # a far row
    x = x.to(torch.float32)
    exact = naive.sq_distances(x.double().numpy())
    centre = distances.distance_centre(x)
    if offset >= 1e3:
        # the common offset dominates: centred on a row of the bulk, not the far row 9
        assert centre is not None and centre != 9
    got = distances.pairwise_sq_distances(x).double().numpy()
    err = np.abs(got - exact)
    bound = _bound(x, centre, DIM)
    assert (err <= bound).all(), float((err / bound).max())
    if offset >= 1e3:  # centring made the bound on the bulk relative to its spread, not ‖x‖²
        bulk = np.ix_([i for i in range(12) if i != 9], [i for i in range(12) if i != 9])
        assert bound[bulk].max() < 1e-3 * _bound(x, None, DIM)[bulk].min()


def test_gradient_like_rows_are_not_centred():
    # rows around 0 (or a common direction small against their spread): the probe finds no
    # centre closer to the typical row than the origin, so no centring pass is spent
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 5000, generator=g)
    assert distances.distance_centre(x) is None
    x[:4] *= 100  # far rows do not change that
    assert distances.distance_centre(x) is None
    y = 10 + torch.randn(20, 5000, generator=g)
    y[:4] = 10 + 100 * torch.randn(4, 5000, generator=g)  # Byzantine rows far from the bulk
    r = distances.distance_centre(y)
    assert r is not None and r >= 4


def test_wide_rows_use_blocks_and_stay_exact(monkeypatch):
    # several column blocks (the float64 sum across them) and a probe of column runs
    monkeypatch.setattr(distances, "_BLOCK_BYTES", 7 * 4 * 1024)  # 1024 columns per block
    g = torch.Generator().manual_seed(2)
    n, d = 7, 5000
    assert distances.block_columns(n, 4, d) == 1024 and distances.probe_columns(n, d) is not None
    x = (OFFSET + 0.01 * torch.randn(n, d, generator=g, dtype=torch.float64)).to(torch.float32)
    xd = x.double()
    exact = ((xd[:, None, :] - xd[None, :, :]) ** 2).sum(dim=-1).numpy()  # differences first
    centre = distances.distance_centre(x)
    assert centre is not None
    got = distances.pairwise_sq_distances(x).double().numpy()
    assert (np.abs(got - exact) <= _bound(x, centre, 1024)).all()
    off = ~np.eye(n, dtype=bool)
    assert (np.abs(got - exact)[off] <= 1e-4 * exact[off]).all()
    got64 = distances.pairwise_sq_distances(x, dtype=torch.float64).numpy()
    np.testing.assert_allclose(got64, exact, rtol=1e-12, atol=0)
