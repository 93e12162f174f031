"""Robust aggregation rules and the distance functions behind them, against the naive loop
implementations in ``naive.py`` (numpy float64, one client / pair / coordinate at a time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.core.registry import RegistryError
from fedsafe.robust import distances, krum
from fedsafe.robust.aggregators import AGGREGATORS

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive

D = 40


def _data(kind: str, n: int, f: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        x = 1 + torch.randn(n, D, generator=g, dtype=torch.float64)
    elif kind == "ties":  # integer entries (exact distances, equal scores) + duplicated rows
        x = torch.randint(-2, 3, (n, D), generator=g).to(torch.float64)
        x[3] = x[1]
        x[n - 1] = x[1]
        x[4, : D // 2] = 0  # some exact zeros, for the sign statistics
    elif kind == "outliers":  # f rows of 1e6 scale, not at index 0 (MoNNA's reference)
        x = 1 + torch.randn(n, D, generator=g, dtype=torch.float64)
        for i in range(f):
            x[1 + 2 * i] = 1e6 * torch.randn(D, generator=g, dtype=torch.float64)
    else:
        raise AssertionError(kind)
    return x.to(dtype)


# name, params, naive reference (x: float64 numpy, f) -> float64 numpy
def _dnc_ref(params):
    def ref(x, f):
        num_iters, sub_dim = params.get("num_iters", 1), params.get("sub_dim", 10000)
        seed = params.get("seed", 0)
        coords = [naive.dnc_coords(seed, x.shape[1], sub_dim, t) for t in range(num_iters)]
        return naive.dnc(x, f, coords, filter_frac=params.get("filter_frac", 1.0))
    return ref


def _signguard_ref(params):
    def ref(x, f):
        coords = naive.signguard_coords(params.get("seed", 0), x.shape[1], params.get("coord_frac", 0.1))
        return naive.signguard(x, f, coords, lower=params.get("lower", 0.1), upper=params.get("upper", 3.0))
    return ref


RULES = [
    ("mean", {}, naive.mean),
    ("median", {}, naive.median),
    ("trimmed_mean", {}, naive.trimmed_mean),
    ("krum", {}, naive.krum),
    ("multi_krum", {}, naive.multi_krum),
    ("multi_krum", {"m": 2}, lambda x, f: naive.multi_krum(x, f, m=2)),
    ("bulyan", {}, naive.bulyan),
    ("geometric_median", {}, naive.geometric_median),
    ("centered_clipping", {}, naive.centered_clipping),
    ("centered_clipping", {"tau": 2.0, "iters": 3},
     lambda x, f: naive.centered_clipping(x, f, tau=2.0, iters=3)),
    ("meamed", {}, naive.meamed),
    ("monna", {}, naive.monna),
    ("monna", {"reference": 2}, lambda x, f: naive.monna(x, f, reference=2)),
    ("dnc", {}, _dnc_ref({})),
    ("dnc", {"sub_dim": 16, "num_iters": 2, "seed": 3}, _dnc_ref({"sub_dim": 16, "num_iters": 2, "seed": 3})),
    ("dnc", {"filter_frac": 0.5}, _dnc_ref({"filter_frac": 0.5})),
    ("signguard", {}, _signguard_ref({})),
    ("signguard", {"coord_frac": 0.5, "seed": 7}, _signguard_ref({"coord_frac": 0.5, "seed": 7})),
]
RULE_IDS = [name + "".join(f"-{k}={v}" for k, v in p.items()) for name, p, _ in RULES]
ROBUST = sorted({name for name, _, _ in RULES} - {"mean"})


def _close(out: torch.Tensor, ref: np.ndarray, dtype: torch.dtype, loose: bool = False) -> None:
    rtol = 1e-5 if dtype == torch.float32 or loose else 1e-9
    scale = 1.0 + float(np.abs(ref).max())
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["gaussian", "ties", "outliers"])
@pytest.mark.parametrize("n,f", [(11, 2), (12, 2), (5, 0)])
@pytest.mark.parametrize("name,params,ref", RULES, ids=RULE_IDS)
def test_rule_matches_naive(name, params, ref, n, f, kind, dtype):
    x = _data(kind, n, f, dtype)
    before = x.clone()
    out = AGGREGATORS.get(name, params)(x, f=f)
    assert torch.equal(x, before), "input modified"
    assert out.dtype == dtype and out.shape == (D,)
    _close(out, ref(x.double().numpy(), f), dtype, loose=name == "geometric_median")


def test_centered_clipping_uses_previous():
    x = _data("gaussian", 9, 2, torch.float64)
    prev = torch.full((D,), 0.5, dtype=torch.float64)
    kept = prev.clone()
    out = AGGREGATORS.get("centered_clipping", {"tau": 1.5, "iters": 2})(x, f=2, previous=prev)
    assert torch.equal(prev, kept)
    _close(out, naive.centered_clipping(x.numpy(), 2, previous=prev.numpy(), tau=1.5, iters=2), torch.float64)
    with pytest.raises(ValueError, match="previous must have shape"):
        AGGREGATORS.get("centered_clipping")(x, f=2, previous=torch.zeros(D + 1))


def test_krum_ties_go_to_lowest_index():
    # 1-D points 0..4, f = 1: scores sum the n - f - 2 = 2 nearest: 5, 2, 2, 2, 5.
    x = torch.arange(5, dtype=torch.float32)[:, None]
    d2 = distances.pairwise_sq_distances(x)
    assert krum.krum_scores(d2, 1).tolist() == [5, 2, 2, 2, 5]
    assert krum.krum_select(d2, 1) == 1
    assert krum.multi_krum_select(d2, 1, 2).tolist() == [1, 2]
    assert AGGREGATORS.get("krum")(x.flip(0), f=1).item() == 3  # reversed: index 1 holds 3


def test_closest_to_median_ties_prefer_lower_values():
    # column 0, 2, 4: median 2, n - f = 2 closest: {2, 0} or {2, 4} at equal distance -> {0, 2}.
    x = torch.tensor([[0.0], [2.0], [4.0]])
    assert AGGREGATORS.get("meamed")(x, f=1).item() == 1.0


@pytest.mark.parametrize("kind", ["gaussian", "ties"])
@pytest.mark.parametrize("n,f", [(11, 2), (12, 2), (15, 3)])
def test_distance_selections_match_naive(kind, n, f):
    x = _data(kind, n, f, torch.float32, seed=1)
    x64 = x.double().numpy()
    d2 = distances.pairwise_sq_distances(x, dtype=torch.float64)
    np.testing.assert_allclose(d2.numpy(), naive.sq_distances(x64), rtol=1e-12, atol=1e-9)
    assert torch.equal(d2, d2.T) and (d2 >= 0).all() and torch.all(torch.diagonal(d2) == 0)
    d2_32 = distances.pairwise_sq_distances(x)
    assert d2_32.dtype == torch.float32 and torch.all(torch.diagonal(d2_32) == 0)
    np.testing.assert_allclose(d2_32.double().numpy(), d2.numpy(), rtol=1e-5, atol=1e-3)
    if kind == "ties":  # exact ties: the index choices themselves must agree
        assert krum.krum_select(d2, f) == naive.krum_index(x64, f)
        assert krum.multi_krum_select(d2, f).tolist() == naive.multi_krum_indices(x64, f)
        if n >= 4 * f + 3:
            assert krum.bulyan_select(d2, f).tolist() == naive.bulyan_indices(x64, f)
    mix = distances.nnm_mixing(d2, f)
    np.testing.assert_allclose(mix.sum(dim=1).numpy(), 1.0)


@pytest.mark.parametrize("name,params,ref", [r for r in RULES if r[0] != "mean"], ids=RULE_IDS[1:])
def test_permutation_invariance(name, params, ref):
    # Bulyan at f = 2 would reach Krum with one neighbour (r = 5 remaining): then the two
    # mutual nearest neighbours always tie and the lower index wins, so use f = 3 (r >= 7).
    n, f = (15, 3) if name == "bulyan" else (12, 2)
    x = _data("gaussian", n, f, torch.float64, seed=2)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    params_p = dict(params)
    if name == "monna":  # the reference is a client, so it moves with the permutation
        params_p["reference"] = int((perm == params.get("reference", 0)).nonzero())
    out = AGGREGATORS.get(name, params)(x, f=f)
    out_p = AGGREGATORS.get(name, params_p)(x[perm], f=f)
    np.testing.assert_allclose(out_p.numpy(), out.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ROBUST)
def test_far_outliers_do_not_move_robust_rules(name):
    n, f = 15, 3
    g = torch.Generator().manual_seed(3)
    x = 1 + torch.randn(n, 30, generator=g)
    honest_idx = [i for i in range(n) if i not in (2, 7, 11)]
    byz = 1e6 * torch.nn.functional.normalize(torch.randn(30, generator=g), dim=0)
    x[[2, 7, 11]] = byz  # all Byzantine clients send the same vector
    honest = x[honest_idx]
    center = honest.mean(dim=0)
    radius = torch.linalg.vector_norm(honest - center, dim=1).max()
    if name == "centered_clipping":  # robust from a good start: the previous aggregate
        out = AGGREGATORS.get(name, {"tau": 1.0, "iters": 5})(x, f=f, previous=honest[0])
    else:
        out = AGGREGATORS.get(name)(x, f=f)
    assert torch.linalg.vector_norm(out - center) <= radius
    if name not in ("geometric_median", "centered_clipping", "signguard"):  # these may shrink/shift
        lo, hi = honest.min(dim=0).values, honest.max(dim=0).values
        assert torch.all(out >= lo - 1e-5) and torch.all(out <= hi + 1e-5)
    assert torch.linalg.vector_norm(AGGREGATORS.get("mean")(x, f=f) - center) > 1e5


def test_signguard_sign_clustering_removes_sign_flipped_updates():
    # Same norms as the honest updates, so only the sign statistics can tell them apart.
    n, f, d = 15, 3, 200
    g = torch.Generator().manual_seed(4)
    base = 1 + torch.randn(d, generator=g, dtype=torch.float64)
    x = base + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    byz = [2, 7, 11]
    x[byz] = -x[byz]
    honest = [i for i in range(n) if i not in byz]
    out = AGGREGATORS.get("signguard", {"coord_frac": 0.5})(x, f=f)
    norms = torch.linalg.vector_norm(x, dim=1)
    clipped = x * torch.clamp(norms.median() / norms, max=1)[:, None]  # odd n: plain median
    np.testing.assert_allclose(out.numpy(), clipped[honest].mean(dim=0).numpy(), rtol=1e-12)


BAD = [  # (name, params, n, f, requirement in the message)
    ("median", {}, 4, 2, "n > 2f"),
    ("trimmed_mean", {}, 4, 2, "n > 2f"),
    ("krum", {}, 6, 2, "n >= 2f + 3"),
    ("multi_krum", {}, 6, 2, "n >= 2f + 3"),
    ("bulyan", {}, 10, 2, "n >= 4f + 3"),
    ("geometric_median", {}, 4, 2, "n > 2f"),
    ("centered_clipping", {}, 4, 2, "n > 2f"),
    ("meamed", {}, 4, 2, "n > 2f"),
    ("monna", {}, 4, 2, "n > 2f"),
    ("dnc", {}, 4, 2, "n > 2f"),
    ("dnc", {"num_iters": 3}, 7, 3, "n > num_iters"),
    ("signguard", {}, 4, 2, "n > 2f"),
]


@pytest.mark.parametrize("name,params,n,f,req", BAD, ids=[f"{b[0]}-{b[2]}-{b[3]}" for b in BAD])
def test_requirements_refused(name, params, n, f, req):
    x = torch.randn(n, 5)
    with pytest.raises(ValueError) as err:
        AGGREGATORS.get(name, params)(x, f=f)
    msg = str(err.value)
    assert msg.startswith(name) and req in msg and f"n={n}" in msg and f"f={f}" in msg


@pytest.mark.parametrize("name", ROBUST)
def test_bad_inputs_refused(name):
    with pytest.raises(ValueError, match="f must be an integer"):
        AGGREGATORS.get(name)(torch.randn(9, 3), f=-1)
    with pytest.raises(ValueError, match="2-D"):
        AGGREGATORS.get(name)(torch.randn(9), f=1)


def test_bad_parameters_refused():
    x = torch.randn(9, 4)
    with pytest.raises(ValueError, match="m must be"):
        AGGREGATORS.get("multi_krum", {"m": 10})(x, f=1)
    with pytest.raises(ValueError, match="reference must be"):
        AGGREGATORS.get("monna", {"reference": 9})(x, f=1)
    with pytest.raises(ValueError, match="tau must be"):
        AGGREGATORS.get("centered_clipping", {"tau": 0.0})(x, f=1)
    with pytest.raises(ValueError, match="lower <= 1 <= upper"):
        AGGREGATORS.get("signguard", {"upper": 0.5})(x, f=1)


def test_registry_lookup_and_unknown_parameters():
    assert set(ROBUST) | {"mean"} <= set(AGGREGATORS.names())
    rule = AGGREGATORS.get("multi_krum", {"m": 3})
    assert rule(torch.randn(9, 4), f=1).shape == (4,)
    with pytest.raises(RegistryError, match="valid: filter_frac, num_iters, seed, sub_dim"):
        AGGREGATORS.get("dnc", {"subdim": 10})
    with pytest.raises(RegistryError, match="valid: none"):
        AGGREGATORS.get("krum", {"m": 3})
    with pytest.raises(RegistryError, match="valid: iters, tau"):  # previous is reserved
        AGGREGATORS.get("centered_clipping", {"previous": None})
    with pytest.raises(RegistryError, match="unknown aggregation rule 'krumm'"):
        AGGREGATORS.get("krumm")


def test_centered_clipping_default_radius_is_the_median_distance():
    # tau = None: the median distance to the centre, whatever the scale of the updates. With
    # ByzFL's fixed 100 on updates of norm ~1 nothing is clipped and the rule is the mean.
    g = torch.Generator().manual_seed(3)
    for scale in (1e-3, 1.0, 1e3):
        honest = scale * (1 + 0.1 * torch.randn(9, 40, generator=g, dtype=torch.float64))
        x = torch.cat([honest, -20 * scale * torch.ones(2, 40, dtype=torch.float64)])
        out = AGGREGATORS.get("centered_clipping")(x, f=2)
        dist = torch.linalg.vector_norm(x, dim=1)
        radius = dist.median()  # 11 rows: the middle one
        want = (x * torch.clamp(radius / dist, max=1)[:, None]).mean(0)
        torch.testing.assert_close(out, want)
        err_cc = torch.linalg.vector_norm(out - honest.mean(0))
        err_mean = torch.linalg.vector_norm(x.mean(0) - honest.mean(0))
        assert err_cc < 0.25 * err_mean
    fixed = AGGREGATORS.get("centered_clipping", {"tau": 100.0})(x / 1e4, f=2)  # every distance < 13
    torch.testing.assert_close(fixed, (x / 1e4).mean(0))  # the old default: no clipping at this scale


def test_geometric_median_converges_despite_far_outliers():
    # The objective's relative change (RFA's stopping rule) is dominated by outliers at 1e6:
    # it stopped 0.45 away from the geometric median. Steps are now measured against the
    # median distance: a long plain Weiszfeld run is the reference.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(15, 20, generator=g, dtype=torch.float64)
    x[:4] = 1e6
    got = AGGREGATORS.get("geometric_median")(x, f=4)
    z = x.mean(0)
    for _ in range(20000):
        w = 1 / torch.linalg.vector_norm(x - z, dim=1).clamp_min(1e-12)
        z = (w[:, None] * x).sum(0) / w.sum()
    assert float(torch.linalg.vector_norm(got - z)) < 1e-4
