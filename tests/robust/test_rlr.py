"""Robust learning rate (Ozdayi et al., AAAI 2021) against a naive twin, its convention
differences from the reference code (each in a test named for it), and its effect: the
coordinates only a minority pushes are reversed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.core.errors import RequirementError
from fedsafe.robust import rlr as rlr_module
from fedsafe.robust.aggregators import AGGREGATORS

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive


def _data(seed: int, n: int, d: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, d), generator=g).to(dtype)  # integers: exact zeros and tied votes
    return x + 0.25 * torch.randn(n, d, generator=g, dtype=dtype) * (torch.rand(n, d, generator=g) < 0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threshold", [None, 0, 1, 3, 6, 9])
def test_rlr_against_naive(seed, threshold):
    x = _data(seed, 9, 60)
    params = {} if threshold is None else {"threshold": threshold}
    got = AGGREGATORS.get("rlr", params)(x, f=2)
    np.testing.assert_allclose(got.numpy(), naive.rlr(x, 2, threshold), rtol=1e-12, atol=1e-15)


def test_rlr_against_naive_across_column_blocks_and_float32(monkeypatch):
    monkeypatch.setattr(rlr_module, "_BLOCK", 7)  # many blocks, a ragged last one
    x = _data(3, 11, 100, torch.float32)
    got = AGGREGATORS.get("rlr", {"threshold": 4})(x, f=1)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), naive.rlr(x, 1, 4), rtol=1e-6, atol=1e-6)
    sums = rlr_module.sign_sums(x)
    assert sums.tolist() == torch.sign(x).sum(0).to(torch.int32).tolist()


def test_unweighted_mean_where_the_reference_weighs_by_data_size():
    # the reference's agg_avg is Σ n_i x_i / Σ n_i; fedsafe's rows are already the clients'
    # messages (weighting, if any, is the client algorithm's), so the rule's mean is unweighted
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, -6.0]], dtype=torch.float64)
    sizes = torch.tensor([10.0, 1.0, 1.0], dtype=torch.float64)
    got = AGGREGATORS.get("rlr", {"threshold": 1})(x, f=0)
    torch.testing.assert_close(got, x.mean(0))
    weighted = (sizes[:, None] * x).sum(0) / sizes.sum()
    assert not torch.allclose(got, weighted)


def test_threshold_zero_is_the_mean_as_the_references_off_switch():
    x = _data(4, 7, 30)
    torch.testing.assert_close(AGGREGATORS.get("rlr", {"threshold": 0})(x, f=3), x.mean(0), rtol=0, atol=0)


def test_sign_of_zero_votes_for_neither_side():
    # torch.sign(0) = 0 in the reference: two +, one −, two zeros → |sum| = 1
    x = torch.tensor([[1.0], [2.0], [-1.0], [0.0], [0.0]], dtype=torch.float64)
    assert rlr_module.sign_sums(x).tolist() == [1]
    assert float(AGGREGATORS.get("rlr", {"threshold": 1})(x, f=0)) == pytest.approx(0.4)
    assert float(AGGREGATORS.get("rlr", {"threshold": 2})(x, f=0)) == pytest.approx(-0.4)


def test_learning_rate_magnitude_is_the_servers_and_only_its_sign_the_rules():
    # reference: w ← w + lr_vector ⊙ mean, lr_vector_j = ±server_lr; fedsafe: the rule returns
    # ±mean_j and the server step multiplies by server.lr, the same model
    x = _data(5, 8, 40)
    eta, theta = 0.3, 3
    w = torch.randn(40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sums = torch.sign(x).sum(0).abs()
    lr_vector = torch.where(sums >= theta, torch.tensor(eta, dtype=torch.float64), torch.tensor(-eta, dtype=torch.float64))
    reference = w + lr_vector * x.mean(0)
    ours = w + eta * AGGREGATORS.get("rlr", {"threshold": theta})(x, f=1)
    torch.testing.assert_close(ours, reference)


def test_rlr_reverses_what_only_a_minority_pushes():
    # 10 clients: on coordinates 0..49 the 8 honest clients agree (positive); on 50..99 the
    # honest ones cancel in pairs and the 2 attackers push hard in one direction (a backdoor's
    # coordinates). The mean moves every coordinate up; RLR reverses the attackers' ones.
    g = torch.Generator().manual_seed(0)
    honest = torch.cat([1 + 0.1 * torch.rand(8, 50, generator=g), torch.tensor([[0.5], [-0.5]]).repeat(4, 50)], dim=1)
    evil = torch.cat([torch.ones(2, 50), 10 * torch.ones(2, 50)], dim=1)
    x = torch.cat([honest, evil]).to(torch.float64)
    out = AGGREGATORS.get("rlr")(x, f=2)  # θ = 3: the attackers' 2 votes are not enough
    assert (out[:50] > 0).all() and torch.equal(out[:50], x.mean(0)[:50])
    assert (out[50:] < 0).all() and torch.equal(out[50:], -x.mean(0)[50:])
    assert (x.mean(0)[50:] > 0).all()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_threshold_errors_name_the_field_and_range(bad):
    with pytest.raises(ValueError, match=r"rlr: threshold must be an integer in \[0, n\]"):
        AGGREGATORS.get("rlr", {"threshold": bad})(torch.ones(4, 2), f=1)


def test_threshold_above_n_is_a_requirement():
    with pytest.raises(RequirementError, match=r"rlr requires threshold <= n \(threshold = 5\), got n=4, f=1"):
        AGGREGATORS.get("rlr", {"threshold": 5})(torch.ones(4, 2), f=1)
    with pytest.raises(RequirementError, match=r"the default f \+ 1\), got n=3, f=3"):
        AGGREGATORS.get("rlr")(torch.ones(3, 2), f=3)
    out = AGGREGATORS.get("rlr", {"threshold": 4})(torch.ones(4, 2), f=1)  # unanimous: kept
    torch.testing.assert_close(out, torch.ones(2))


def test_rlr_through_the_engine():
    from fedsafe import Experiment

    raw = {"rounds": 3, "seed": 0, "eval_every": 3, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 16}, "clients": {"num_clients": 10},
           "attack": {"name": "sign_flip", "f": 2}}
    a = Experiment(raw, robust={"rule": "rlr"}).run()
    b = Experiment(raw, robust={"rule": "rlr"}).run()
    assert a.summary["final_accuracy"] == b.summary["final_accuracy"] and a.summary["final_accuracy"] > 0.1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kernel", [True, False])
def test_kernel_and_torch_paths_against_naive(monkeypatch, dtype, kernel):
    # the numba kernel (one read, float64 sums, int32 votes) and the torch fallback, with
    # several kernel blocks and a ragged last one
    monkeypatch.setattr(rlr_module, "_MIN_KERNEL_SIZE", 0 if kernel else 1 << 62)
    monkeypatch.setattr(rlr_module, "_KERNEL_BLOCK", 16)
    x = _data(6, 9, 203, dtype)
    got = AGGREGATORS.get("rlr", {"threshold": 3})(x, f=1)
    assert got.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    np.testing.assert_allclose(got.numpy(), naive.rlr(x, 1, 3), rtol=tol, atol=tol)
