"""Per-example gradients (vmap of grad) against a Python loop of ordinary autograd, one example
at a time, and the clipping rule of Assumption 1."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsafe.privacy.inherent import clip_rows, per_example_grads


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def _data(n: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _loop(model: nn.Module, x, y, loss=F.cross_entropy, clip=None) -> torch.Tensor:
    """Reference: one backward pass per example; clip by an explicit rescale when too long."""
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        loss(model(x[i : i + 1]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])
        if clip is not None and float(g.norm()) > clip:
            g = g / float(g.norm()) * clip
        rows.append(g)
    return torch.stack(rows)


def test_flat_params_match_loop():
    model = _model()
    x, y = _data()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    got = per_example_grads(model, flat, x, y)
    assert got.shape == (9, 5 * 7 + 7 + 7 * 3 + 3)
    torch.testing.assert_close(got, _loop(model, x, y), rtol=1e-10, atol=1e-12)


def test_params_other_than_the_models_own_and_dict_form():
    model = _model()
    x, y = _data()
    g = torch.Generator().manual_seed(5)
    params = {n: p.detach() + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters()}
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in ref_model.named_parameters():
            p.copy_(params[n])
    ref = _loop(ref_model, x, y)
    torch.testing.assert_close(per_example_grads(model, params, x, y), ref, rtol=1e-10, atol=1e-12)
    flat = torch.cat([params[n].reshape(-1) for n, _ in model.named_parameters()])
    torch.testing.assert_close(per_example_grads(model, flat, x, y), ref, rtol=1e-10, atol=1e-12)


def test_clipping_matches_loop_and_bounds_norms():
    model = _model()
    x, y = _data()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    raw = _loop(model, x, y)
    clip = float(raw.norm(dim=1).median())  # about half the rows get clipped
    got = per_example_grads(model, flat, x, y, clip=clip)
    torch.testing.assert_close(got, _loop(model, x, y, clip=clip), rtol=1e-10, atol=1e-12)
    assert float(got.norm(dim=1).max()) <= clip * (1 + 1e-12)
    unclipped = per_example_grads(model, flat, x, y)
    inside = unclipped.norm(dim=1) <= clip
    assert 0 < int(inside.sum()) < x.shape[0]
    assert torch.equal(got[inside], unclipped[inside])  # rows inside the ball are untouched, bit for bit


def test_buffers_are_used_and_custom_loss():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 1)).double()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    model.eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    y = torch.randn(6, 1, generator=g, dtype=torch.float64)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    got = per_example_grads(model, flat, x, y, loss_fn=F.mse_loss)
    torch.testing.assert_close(got, _loop(model, x, y, loss=F.mse_loss), rtol=1e-10, atol=1e-12)


def test_clip_rows_rule_and_errors():
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    out = clip_rows(g, 1.0)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(g[0], torch.tensor([3.0, 4.0], dtype=torch.float64))  # input untouched
    with pytest.raises(ValueError, match="clip"):
        clip_rows(g, 0.0)
    model = _model()
    x, y = _data()
    with pytest.raises(ValueError, match="flat vector of length"):
        per_example_grads(model, torch.zeros(3, dtype=torch.float64), x, y)
    with pytest.raises(ValueError, match="missing"):
        per_example_grads(model, {"0.weight": torch.zeros(7, 5)}, x, y)
