"""Pre-aggregators against the naive loop implementations in ``naive.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.core.registry import RegistryError
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.preaggregators import PREAGGREGATORS

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive

D = 30


def _data(kind: str, n: int, f: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        x = 1 + torch.randn(n, D, generator=g, dtype=torch.float64)
    elif kind == "ties":
        x = torch.randint(-2, 3, (n, D), generator=g).to(torch.float64)
        x[2] = x[0]
        x[n - 1] = x[0]
        x[4] = 0  # a zero update: clipping must leave it alone
    elif kind == "outliers":
        x = 1 + torch.randn(n, D, generator=g, dtype=torch.float64)
        for i in range(f):
            x[1 + 2 * i] = 1e6 * torch.randn(D, generator=g, dtype=torch.float64)
    else:
        raise AssertionError(kind)
    return x.to(dtype)


def _call(name, params, x, f, seed=0):
    kw = {"generator": torch.Generator().manual_seed(seed)} if name == "bucketing" else {}
    return PREAGGREGATORS.get(name, params)(x, f=f, **kw)


def _perm(n):  # the permutation bucketing draws from _call's generator
    return naive.bucketing_perm(torch.Generator().manual_seed(0), n)


PRES = [
    ("nnm", {}, naive.nnm),
    ("bucketing", {}, lambda x, f: naive.bucketing(x, _perm(len(x)))),
    ("bucketing", {"s": 3}, lambda x, f: naive.bucketing(x, _perm(len(x)), s=3)),
    ("clipping", {"c": 2.0}, lambda x, f: naive.clipping(x, 2.0)),
    ("arc", {}, naive.arc),
]
PRE_IDS = [name + "".join(f"-{k}={v}" for k, v in p.items()) for name, p, _ in PRES]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["gaussian", "ties", "outliers"])
@pytest.mark.parametrize("n,f", [(11, 2), (12, 3), (5, 0)])
@pytest.mark.parametrize("name,params,ref", PRES, ids=PRE_IDS)
def test_pre_matches_naive(name, params, ref, n, f, kind, dtype):
    x = _data(kind, n, f, dtype)
    before = x.clone()
    out = _call(name, params, x, f)
    assert torch.equal(x, before), "input modified"
    expected = ref(x.double().numpy(), f)
    assert out.dtype == dtype and out.shape == expected.shape
    rtol = 1e-5 if dtype == torch.float32 else 1e-9
    atol = rtol * (1 + np.abs(expected).max())
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name,params", [("nnm", {}), ("clipping", {"c": 2.0}), ("arc", {})])
def test_permutation_equivariance(name, params):
    x = _data("gaussian", 12, 3, torch.float64, seed=1)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(4))
    permuted_first = _call(name, params, x[perm], 3)
    np.testing.assert_allclose(permuted_first.numpy(), _call(name, params, x, 3)[perm].numpy(), rtol=1e-12)


def test_bucketing_is_not_permutation_invariant_but_preserves_the_mean():
    # Which rows share a bucket depends on their positions, so a permuted input gives other
    # bucket means for the same generator; only the distribution over generators is invariant.
    # What holds for every draw: with s | n the bucket means average to the mean, and each
    # output row is the mean of s distinct input rows.
    x = _data("gaussian", 12, 0, torch.float64, seed=2)
    out = _call("bucketing", {"s": 3}, x, 0, seed=9)
    assert out.shape == (4, D)
    np.testing.assert_allclose(out.mean(dim=0).numpy(), x.mean(dim=0).numpy(), rtol=1e-12)
    assert torch.equal(_call("bucketing", {"s": 1}, x, 0, seed=9).sort(dim=0).values, x.sort(dim=0).values)
    assert torch.equal(_call("bucketing", {"s": 3}, x, 0, seed=9), out)  # same generator, same output


def test_far_outliers():
    n, f = 15, 3
    x = 1 + torch.randn(n, D, generator=torch.Generator().manual_seed(3))
    x[[2, 7, 11]] = 1e6
    honest = x[[i for i in range(n) if i not in (2, 7, 11)]]
    lo, hi = honest.min(dim=0).values, honest.max(dim=0).values
    # NNM then trimmed mean stays in the honest box
    out = AGGREGATORS.get("trimmed_mean")(_call("nnm", {}, x, f), f=f)
    assert torch.all(out >= lo - 1e-5) and torch.all(out <= hi + 1e-5)
    # ARC clips at least f rows (k = floor(2 f (n - f) / n) = 4 >= f), so no norm exceeds the honest max
    clipped = _call("arc", {}, x, f)
    honest_max = torch.linalg.vector_norm(honest, dim=1).max()
    assert torch.linalg.vector_norm(clipped, dim=1).max() <= honest_max * (1 + 1e-6)
    assert torch.linalg.vector_norm(_call("clipping", {"c": 2.0}, x, f), dim=1).max() <= 2.0 * (1 + 1e-6)


@pytest.mark.parametrize("name,n,f,req", [("nnm", 4, 2, "n > 2f"), ("arc", 6, 3, "n > 2f")])
def test_requirements_refused(name, n, f, req):
    with pytest.raises(ValueError) as err:
        _call(name, {}, torch.randn(n, 3), f)
    msg = str(err.value)
    assert msg.startswith(name) and req in msg and f"n={n}" in msg and f"f={f}" in msg


def test_bad_parameters_refused():
    x = torch.randn(6, 3)
    with pytest.raises(ValueError, match="generator"):
        PREAGGREGATORS.get("bucketing")(x, f=1)
    with pytest.raises(ValueError, match="s must be"):
        _call("bucketing", {"s": 0}, x, 1)
    with pytest.raises(ValueError, match="c must be > 0"):
        _call("clipping", {"c": 0.0}, x, 1)
    with pytest.raises(RegistryError, match="needs parameter"):
        PREAGGREGATORS.get("clipping")
    with pytest.raises(RegistryError, match="valid: s"):
        PREAGGREGATORS.get("bucketing", {"generator": None})


def test_nnm_complement_kernel_equals_dense_mixing():
    # Big enough for the numba kernel; the kernel's float64 block sums vs the float32 GEMM.
    from fedsafe.robust.distances import nnm_mixing, pairwise_sq_distances
    from fedsafe.robust.mixing import mix

    g = torch.Generator().manual_seed(3)
    x = torch.randn(23, 7001, generator=g)
    x[:4] *= 1e3  # outliers far from everyone
    w = nnm_mixing(pairwise_sq_distances(x), 5)
    ref = (w.double() @ x.double()).float()
    torch.testing.assert_close(mix(x, w), ref, rtol=1e-6, atol=1e-4)
    # float64: the complement S − Σ_excluded cancels, so the error scales with n·max|x|, not |y|.
    bound = 1e-14 * x.shape[0] * float(x.abs().max())
    exact_w = (w > 0).double() / (w > 0).sum(dim=1, keepdim=True)  # 1/(n−f) not rounded to float32
    torch.testing.assert_close(mix(x.double(), w.double()), exact_w @ x.double(), rtol=0, atol=bound)
