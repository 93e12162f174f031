"""BAFFLE's clip of zeroth-order gradient estimates to an infinity-norm, against torch."""

from __future__ import annotations

import math

import pytest
import torch

from fedsafe.zo import clip_inf


@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0])
def test_clip_inf_matches_clip_grad_norm(scale):
    g = torch.Generator().manual_seed(1)
    vec = torch.randn(300, generator=g, dtype=torch.float64) * scale
    p = torch.nn.Parameter(torch.zeros(300, dtype=torch.float64))
    p.grad = vec.clone()
    torch.nn.utils.clip_grad_norm_([p], max_norm=0.3, norm_type=math.inf)
    out = clip_inf(vec, 0.3)
    torch.testing.assert_close(out, p.grad, rtol=1e-12, atol=1e-15)
    assert out.abs().max() <= 0.3 + 1e-12
    if vec.abs().max() > 0.3:  # rescaled, not clamped: direction kept
        torch.testing.assert_close(out / out.norm(), vec / vec.norm())
    rows = clip_inf(torch.stack([vec, vec / 1e4]), 0.3)
    torch.testing.assert_close(rows[0], out)
    torch.testing.assert_close(rows[1], vec / 1e4)
