"""MDA, SMEA, CAF and ClippedClustering (fedsafe.robust.defences) against their naive twins in
``naive.py`` (numpy float64, d × d covariances, explicit loops over subsets and clusters), plus
their requirements, parameters, tie rules, robustness and the exhaustive-search limit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.core.errors import RequirementError
from fedsafe.core.registry import RegistryError
from fedsafe.robust import defences
from fedsafe.robust.aggregators import AGGREGATORS

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive

NEW = ["mda", "smea", "caf", "clipped_clustering"]


def _data(kind: str, n: int, f: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        x = 1 + torch.randn(n, d, generator=g, dtype=torch.float64)
    elif kind == "ties":  # integer entries (exact distances) + duplicated rows + exact zeros
        x = torch.randint(-2, 3, (n, d), generator=g).to(torch.float64)
        x[3 % n] = x[1 % n]
        x[n - 1] = x[1 % n]
        x[4 % n, : d // 2] = 0
    elif kind == "outliers":  # f rows of 1e6 scale, in various directions
        x = 1 + torch.randn(n, d, generator=g, dtype=torch.float64)
        for i in range(f):
            x[(1 + 2 * i) % n] = 1e6 * torch.randn(d, generator=g, dtype=torch.float64)
    elif kind == "offset":  # model weights: a large shared offset, a small spread
        x = 1e3 + 1e-2 * torch.randn(n, d, generator=g, dtype=torch.float64)
    else:
        raise AssertionError(kind)
    return x.to(dtype)


RULES = [
    ("mda", {}, naive.mda),
    ("smea", {}, naive.smea),
    ("caf", {}, naive.caf),
    ("clipped_clustering", {}, naive.clipped_clustering),
    ("clipped_clustering", {"linkage": "single"}, lambda x, f: naive.clipped_clustering(x, f, "single")),
    ("clipped_clustering", {"linkage": "complete"}, lambda x, f: naive.clipped_clustering(x, f, "complete")),
]
RULE_IDS = [name + "".join(f"-{k}={v}" for k, v in p.items()) for name, p, _ in RULES]


def _close(out: torch.Tensor, ref: np.ndarray, dtype: torch.dtype) -> None:
    rtol = 1e-5 if dtype == torch.float32 else 1e-9
    scale = 1.0 + float(np.abs(ref).max())
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["gaussian", "ties", "outliers", "offset"])
@pytest.mark.parametrize("n,f,d", [(11, 2, 40), (12, 2, 40), (5, 0, 40), (9, 4, 6), (8, 3, 3)])
@pytest.mark.parametrize("name,params,ref", RULES, ids=RULE_IDS)
def test_rule_matches_naive(name, params, ref, n, f, d, kind, dtype):
    x = _data(kind, n, f, d, dtype)
    before = x.clone()
    out = AGGREGATORS.get(name, params)(x, f=f)
    assert torch.equal(x, before), "input modified"
    assert out.dtype == dtype and out.shape == (d,)
    _close(out, ref(x.double().numpy(), f), dtype)


@pytest.mark.parametrize("name", NEW)
def test_single_update_and_f_zero(name):
    x = _data("gaussian", 1, 0, 5, torch.float64)
    torch.testing.assert_close(AGGREGATORS.get(name)(x, f=0), x[0])
    y = _data("gaussian", 6, 0, 5, torch.float64)
    if name != "clipped_clustering":  # f = 0: every subset / candidate is the full set: the mean
        torch.testing.assert_close(AGGREGATORS.get(name)(y, f=0), y.mean(0))


@pytest.mark.parametrize("name", ["mda", "smea"])
def test_subset_ties_go_to_the_lowest_indices(name):
    # 1-D points 0, 1, 2, 3 and f = 1: {0, 1, 2} and {1, 2, 3} tie in diameter (2) and in
    # variance (2/3); the first in combinations order, {0, 1, 2}, wins.
    x = torch.arange(4, dtype=torch.float64)[:, None]
    assert AGGREGATORS.get(name)(x, f=1).item() == pytest.approx(1.0, rel=1e-15)
    assert AGGREGATORS.get(name)(x.flip(0), f=1).item() == pytest.approx(2.0, rel=1e-15)  # rows 0-2: 3, 2, 1


def test_clipped_clustering_equal_clusters_keep_the_lowest_index():
    # two directions, two updates each: the cluster of update 0 is kept, whichever it is
    a, b = [1.0, 0.0], [0.0, 1.0]
    x = torch.tensor([b, a, a, b], dtype=torch.float64)
    torch.testing.assert_close(AGGREGATORS.get("clipped_clustering")(x, f=1), torch.tensor(b, dtype=torch.float64))
    torch.testing.assert_close(AGGREGATORS.get("clipped_clustering")(x.flip(0), f=1), torch.tensor(b, dtype=torch.float64))
    y = torch.tensor([a, b, b, a], dtype=torch.float64)
    torch.testing.assert_close(AGGREGATORS.get("clipped_clustering")(y, f=1), torch.tensor(a, dtype=torch.float64))


def test_clipped_clustering_clips_to_the_current_median_norm():
    # one direction, norms 1, 2, 3, 4, 10, and one opposite update of norm 5: the median of
    # the six norms is (3 + 4) / 2 = 3.5, so the kept cluster's norms become 1, 2, 3, 3.5, 3.5.
    u = torch.tensor([0.6, 0.8], dtype=torch.float64)
    x = torch.stack([s * u for s in (1.0, 2.0, 3.0, 4.0, 10.0)] + [-5.0 * u])
    out = AGGREGATORS.get("clipped_clustering")(x, f=1)
    torch.testing.assert_close(out, (1 + 2 + 3 + 3.5 + 3.5) / 5 * u)


def test_clipped_clustering_zero_update_has_cosine_zero():
    # a zero update is at cosine distance 1 from everything (no NaN): here the last to merge,
    # so it alone forms the smaller cluster
    x = torch.tensor([[0.0, 0.0], [1.0, 0.1], [1.0, -0.1], [1.0, 0.0], [0.2, 1.0], [0.3, 1.0]], dtype=torch.float64)
    out = AGGREGATORS.get("clipped_clustering")(x, f=2)
    np.testing.assert_allclose(out.numpy(), naive.clipped_clustering(x.numpy(), 2), rtol=1e-12)
    norms = torch.linalg.vector_norm(x, dim=1)
    m = norms.sort().values[2:4].mean()
    want = (x[1:] * torch.clamp(m / norms[1:], max=1)[:, None]).mean(0)
    torch.testing.assert_close(out, want)


def test_caf_stops_when_the_weighted_updates_coincide():
    # 5 equal honest updates and 2 outliers: once the outliers weigh nothing, λ = 0 and the
    # loop stops at the honest vector itself (ByzFL's power step would divide 0 by 0 there).
    h = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    x = torch.stack([h] * 5 + [h + torch.tensor([50.0, 0, 0]), h + torch.tensor([0, 0, -80.0])])
    out = AGGREGATORS.get("caf")(x, f=2)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, h, rtol=0, atol=1e-12)
    same = torch.stack([h] * 4)
    torch.testing.assert_close(AGGREGATORS.get("caf")(same, f=1), h, rtol=0, atol=0)


def test_caf_tau_max_is_over_updates_still_weighted():
    # 1-D, a far outlier: after it is zeroed it still has the largest projection. With τ_max
    # over the weighted updates the second step zeroes the farthest honest update and the
    # loop ends (Σc ≤ n − 2f) after 2 steps; the naive twin does the same.
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [100.0]], dtype=torch.float64)
    out = AGGREGATORS.get("caf")(x, f=1)
    np.testing.assert_allclose(out.numpy(), naive.caf(x.numpy(), 1), rtol=1e-12)
    assert 0.0 <= out.item() <= 4.0


@pytest.mark.parametrize("name", NEW)
def test_permutation_invariance(name):
    n, f = 10, 2
    x = _data("gaussian", n, f, 30, torch.float64, seed=2)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5))
    out = AGGREGATORS.get(name)(x, f=f)
    np.testing.assert_allclose(AGGREGATORS.get(name)(x[perm], f=f).numpy(), out.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NEW)
def test_far_outliers_do_not_move_the_rules(name):
    n, f, d = 15, 3, 30
    g = torch.Generator().manual_seed(3)
    x = 1 + torch.randn(n, d, generator=g)
    byz = [2, 7, 11]
    x[byz] = 1e6 * torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)  # colluding
    honest = x[[i for i in range(n) if i not in byz]]
    center = honest.mean(dim=0)
    radius = torch.linalg.vector_norm(honest - center, dim=1).max()
    out = AGGREGATORS.get(name)(x, f=f)
    assert torch.linalg.vector_norm(out - center) <= radius
    if name != "clipped_clustering":  # means of honest subsets / weights: inside the honest box
        lo, hi = honest.min(dim=0).values, honest.max(dim=0).values
        assert torch.all(out >= lo - 1e-5) and torch.all(out <= hi + 1e-5)
    assert torch.linalg.vector_norm(AGGREGATORS.get("mean")(x, f=f) - center) > 1e5


@pytest.mark.parametrize("name", NEW)
def test_scattered_outliers_do_not_move_the_rules(name):
    # f Byzantine updates far away, each in its own direction (not colluding)
    x = _data("outliers", 12, 2, 30, torch.float64, seed=4)
    byz = [1, 3]
    honest = x[[i for i in range(12) if i not in byz]]
    center = honest.mean(dim=0)
    radius = torch.linalg.vector_norm(honest - center, dim=1).max()
    out = AGGREGATORS.get(name)(x, f=2)
    assert torch.linalg.vector_norm(out - center) <= radius


def test_clipped_clustering_drops_sign_flipped_updates():
    # same norms as honest updates, opposite directions: only the cosines tell them apart
    n, d = 15, 200
    g = torch.Generator().manual_seed(4)
    x = (1 + torch.randn(d, generator=g, dtype=torch.float64)) + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    byz = [2, 7, 11]
    x[byz] = -x[byz]
    honest = [i for i in range(n) if i not in byz]
    norms = torch.linalg.vector_norm(x, dim=1)
    clipped = x * torch.clamp(norms.median() / norms, max=1)[:, None]  # odd n: the middle norm
    out = AGGREGATORS.get("clipped_clustering")(x, f=3)
    np.testing.assert_allclose(out.numpy(), clipped[honest].mean(dim=0).numpy(), rtol=1e-12)
    assert torch.dot(AGGREGATORS.get("mean")(x, f=3), out) < torch.dot(out, out)


BAD = [(name, 4, 2) for name in NEW] + [(name, 6, 3) for name in NEW]


@pytest.mark.parametrize("name,n,f", BAD, ids=[f"{b[0]}-{b[1]}-{b[2]}" for b in BAD])
def test_requirements_refused(name, n, f):
    with pytest.raises(RequirementError) as err:
        AGGREGATORS.get(name)(torch.randn(n, 5), f=f)
    msg = str(err.value)
    assert msg.startswith(name) and "n > 2f" in msg and f"n={n}" in msg and f"f={f}" in msg


@pytest.mark.parametrize("name", NEW)
def test_bad_inputs_refused(name):
    with pytest.raises(ValueError, match="f must be an integer"):
        AGGREGATORS.get(name)(torch.randn(9, 3), f=-1)
    with pytest.raises(ValueError, match="2-D"):
        AGGREGATORS.get(name)(torch.randn(9), f=1)
    with pytest.raises(ValueError, match="no updates"):
        AGGREGATORS.get(name)(torch.randn(0, 3), f=0)
    with pytest.raises(ValueError, match="floating point"):
        AGGREGATORS.get(name)(torch.ones(5, 3, dtype=torch.long), f=1)


@pytest.mark.parametrize("name", ["mda", "smea"])
@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "10"])
def test_bad_max_subsets_refused(name, bad):
    with pytest.raises(ValueError, match=f"{name}: max_subsets must be an integer >= 1"):
        AGGREGATORS.get(name, {"max_subsets": bad})(torch.randn(9, 3), f=1)


@pytest.mark.parametrize("bad", ["ward", "centroid", "", None])
def test_bad_linkage_refused(bad):
    with pytest.raises(ValueError, match="clipped_clustering: linkage must be one of average, single, complete"):
        AGGREGATORS.get("clipped_clustering", {"linkage": bad})(torch.randn(9, 3), f=1)


@pytest.mark.parametrize("name", ["mda", "smea"])
def test_refuses_above_the_subset_limit(name):
    # C(50, 10) = 10 272 278 170 subsets: refused at once, before any work on the updates
    count = math.comb(50, 10)
    assert count > defences.MAX_SUBSETS == 100_000
    with pytest.raises(ValueError) as err:
        AGGREGATORS.get(name)(torch.randn(50, 4), f=10)
    msg = str(err.value)
    assert msg.startswith(f"{name}:") and "C(50, 10)" in msg and str(count) in msg and "max_subsets = 100000" in msg
    # the limit is a parameter: C(12, 2) = 66 subsets
    x = torch.randn(12, 4)
    with pytest.raises(ValueError, match=r"C\(12, 2\) = 66 subsets .* exceeds max_subsets = 65"):
        AGGREGATORS.get(name, {"max_subsets": 65})(x, f=2)
    torch.testing.assert_close(AGGREGATORS.get(name, {"max_subsets": 66})(x, f=2), AGGREGATORS.get(name)(x, f=2))


def test_registry_entries():
    assert set(NEW) <= set(AGGREGATORS.names())
    for name in NEW:
        assert "\n" not in AGGREGATORS.summary(name)  # one line in `fedsafe list rules`
    with pytest.raises(RegistryError, match="valid: max_subsets"):
        AGGREGATORS.get("mda", {"m": 3})
    with pytest.raises(RegistryError, match="valid: max_subsets"):
        AGGREGATORS.get("smea", {"tau": 3})
    with pytest.raises(RegistryError, match="valid: none"):
        AGGREGATORS.get("caf", {"max_subsets": 3})
    with pytest.raises(RegistryError, match="valid: linkage"):
        AGGREGATORS.get("clipped_clustering", {"tau": 1.0})


@pytest.mark.parametrize("name", NEW)
def test_float32_many_columns_agree_with_float64(name):
    # d larger than one block of the Gram kernel, rows sharing an offset: the float32 run
    # selects / weights as the float64 run does
    g = torch.Generator().manual_seed(7)
    x = 5 + 0.1 * torch.randn(10, 5000, generator=g)
    out = AGGREGATORS.get(name)(x, f=2)
    assert out.dtype == torch.float32 and out.shape == (5000,)
    _close(out, AGGREGATORS.get(name)(x.double(), f=2).numpy(), torch.float32)
