"""The server optimizer Adam (BAFFLE's) and the EMA of the global model, against torch."""

from __future__ import annotations

import pytest
import torch

from fedsafe.engine.adam import Adam, AdamState
from fedsafe.engine.ema import EMA


@pytest.mark.parametrize("weight_decay", [0.0, 5e-4, 0.1])
def test_adam_matches_torch_optim_adam(weight_decay):
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(50, generator=g, dtype=torch.float64)
    grads = [torch.randn(50, generator=g, dtype=torch.float64) * (i + 1) for i in range(12)]

    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    adam = Adam(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    w, state = w0.clone(), None
    for gr in grads:
        p.grad = gr.clone()
        opt.step()
        w_before, gr_before = w.clone(), gr.clone()
        w, state = adam.step(w, gr, state)
        assert torch.equal(gr, gr_before)  # inputs untouched
        assert not torch.equal(w, w_before)
        torch.testing.assert_close(w, p.detach(), rtol=1e-12, atol=1e-12)
    torch_state = opt.state[p]
    torch.testing.assert_close(state.m, torch_state["exp_avg"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state.v, torch_state["exp_avg_sq"], rtol=1e-12, atol=1e-12)
    assert state.t == int(torch_state["step"]) == 12


def test_adam_first_step_is_lr_times_sign():
    # With bias correction the first step is γ·g/(|g| + ε) ≈ γ·sign(g).
    w, st = Adam(lr=0.1, weight_decay=0).step(torch.zeros(3), torch.tensor([2.0, -0.5, 1e-3]), None)
    torch.testing.assert_close(w, torch.tensor([-0.1, 0.1, -0.1]), rtol=1e-4, atol=1e-6)
    again = AdamState.from_state_dict(st.state_dict())
    assert again.t == 1 and torch.equal(again.m, st.m)


def test_adam_errors():
    with pytest.raises(ValueError, match="betas"):
        Adam(betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="shape"):
        Adam().step(torch.zeros(3), torch.zeros(4), None)


def _torch_ema_reference(params, decay, warmup):
    # torch_ema.ExponentialMovingAverage.update, written out (shadow starts at params[0]).
    shadow, n, out = params[0].clone(), 0, []
    for p in params[1:]:
        d = decay
        if warmup:
            n += 1
            d = min(decay, (1 + n) / (10 + n))
        shadow = shadow - (1 - d) * (shadow - p)
        out.append(shadow.clone())
    return out


@pytest.mark.parametrize("warmup", [True, False])
def test_ema_matches_torch_ema_rule(warmup):
    g = torch.Generator().manual_seed(2)
    seq = [torch.randn(20, generator=g, dtype=torch.float64) for _ in range(300)]
    ema = EMA(0.995, warmup=warmup)
    first = ema.update(seq[0])
    assert torch.equal(first, seq[0])
    got = [ema.update(p) for p in seq[1:]]
    for a, b in zip(got, _torch_ema_reference(seq, 0.995, warmup)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the warm-up reaches the configured decay once (1+n)/(10+n) >= 0.995, n >= 1791
    if warmup:
        assert ema.current_decay() == pytest.approx(301 / 310)
        ema.num_updates = 1790
    assert ema.current_decay() == 0.995


def test_ema_constant_sequence_and_state_dict():
    w = torch.arange(5.0)
    ema = EMA(0.9, warmup=False, params=w)
    for _ in range(3):
        ema.update(w + 1)
    torch.testing.assert_close(ema.value, w + 1 - 0.9**3)
    other = EMA()
    other.load_state_dict(ema.state_dict())
    assert other.decay == 0.9 and other.num_updates == 3 and not other.warmup
    torch.testing.assert_close(other.update(w), ema.update(w))
    with pytest.raises(ValueError, match="decay"):
        EMA(1.0)
    with pytest.raises(ValueError, match="before the first update"):
        EMA().value
