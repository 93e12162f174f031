"""FedSGD mode (clients upload M scalars, the server decodes the aggregate) and FedAvg mode
(local zeroth-order steps, the client uploads its model delta)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import grad

from fedsafe.core.types import RoundContext
from fedsafe.zo import (
    ZODecoder,
    ZOSettings,
    client_messages,
    estimate_gradient,
    upload_bytes,
    zo_local_steps,
    zo_local_steps_many,
)

IN, C = 12, 4
D = IN * C + C


def loss(flat, x, y):
    w = flat[: IN * C].view(C, IN)
    return F.cross_entropy(x @ w.T + flat[IN * C :], y)


def data(n, b, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(n, b, IN, generator=g, dtype=dtype)
    ys = (xs[..., :C].argmax(-1) + (torch.rand(n, b, generator=g) < 0.1).long()) % C
    return xs, ys


@pytest.mark.parametrize("scheme", ["forward", "central"])
def test_fedsgd_round_trip(scheme):
    settings = ZOSettings(k=40, sigma=1e-4, scheme=scheme, chunk=8, decode_chunk=16)
    xs, ys = data(5, 16)
    w = torch.zeros(D, dtype=torch.float64)
    msgs, losses = client_messages(loss, w, xs, ys, settings, seed=7, round=3)
    m = 40 if scheme == "forward" else 20
    assert msgs.shape == (5, m)
    assert msgs[0].numel() * msgs.element_size() // 2 == upload_bytes(40, scheme)  # float64 here; 4 B on the wire
    torch.testing.assert_close(losses, torch.full((5,), float(np.log(C)), dtype=torch.float64))
    ctx = RoundContext(round=3, seed=7, participants=tuple(range(5)), num_byzantine=0)
    decoded = ZODecoder(D, settings)(msgs.mean(0), ctx)
    # decoding the mean of the scalars = averaging the clients' own estimates
    src = settings.source(7, D)
    per_client = torch.stack([estimate_gradient(loss, w, xs[i], ys[i], src, 3, 40, scheme) for i in range(5)])
    torch.testing.assert_close(decoded, per_client.mean(0), rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match=f"shape \\({m},\\)"):
        ZODecoder(D, settings)(msgs.mean(0)[:-1], ctx)


def test_fedsgd_training_decreases_loss():
    # A few server steps with the decoded direction reduce the loss (plain GD, lr 0.5).
    settings = ZOSettings(k=100, chunk=50)
    xs, ys = data(4, 32, seed=1)
    w = torch.zeros(D, dtype=torch.float64)
    full = lambda w: loss(w, xs.reshape(-1, IN), ys.reshape(-1))  # noqa: E731
    start = full(w)
    for r in range(15):
        msgs, _ = client_messages(loss, w, xs, ys, settings, seed=0, round=r)
        ctx = RoundContext(round=r, seed=0, participants=(0, 1, 2, 3), num_byzantine=0)
        w = w - 0.5 * ZODecoder(D, settings)(msgs.mean(0), ctx)
    assert full(w) < 0.8 * start


def test_local_steps_many_equals_single_clients():
    xs, ys = data(3, 8, seed=2)
    steps = np.array([3, 1, 2])
    w0 = 0.01 * torch.ones(D, dtype=torch.float64)

    def batches_many(s, active):
        return xs[active] * (1 + s), ys[active]

    kw = dict(lr=0.2, k=16, sigma=1e-4, seed=5, round=4, chunk=5, weight_decay=1e-3, clip=0.3)
    many = zo_local_steps_many(loss, w0, batches_many, clients=[10, 11, 12], steps=steps, **kw)
    for i, c in enumerate([10, 11, 12]):
        one = zo_local_steps(
            loss, w0, lambda s, i=i: (xs[i] * (1 + s), ys[i]), steps=int(steps[i]), client=c, **kw
        )
        torch.testing.assert_close(many.delta[i], one.delta, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(many.losses[i], one.losses)
    # different clients draw different directions even on identical data
    same = zo_local_steps_many(loss, w0, lambda s, a: (xs[[0, 0]], ys[[0, 0]]), clients=[1, 2], steps=1, **kw)
    assert not torch.allclose(same.delta[0], same.delta[1])


@pytest.mark.parametrize("scheme", ["forward", "central"])
def test_local_step_follows_the_gradient(scheme):
    xs, ys = data(1, 64, seed=3)
    w0 = torch.zeros(D, dtype=torch.float64)
    res = zo_local_steps(
        loss, w0, lambda s: (xs[0], ys[0]), steps=1, lr=1.0, k=400, sigma=1e-4, seed=0, client=0, round=0,
        scheme=scheme, chunk=64,
    )
    g = grad(loss)(w0, xs[0], ys[0])
    m = 400 if scheme == "forward" else 200
    cos = F.cosine_similarity(-res.delta, g, dim=0).item()
    assert cos > 0.8 * np.sqrt(m / (D + m))
    several = zo_local_steps(
        loss, w0, lambda s: (xs[0], ys[0]), steps=5, lr=0.5, k=100, sigma=1e-4, seed=0, client=0, round=0
    )
    assert loss(w0 + several.delta, xs[0], ys[0]) < loss(w0, xs[0], ys[0])


def test_decoded_momentum_steps_and_checks_its_state():
    from fedsafe.engine.server_optimizer import ServerSGD
    from fedsafe.zo import DecodedMomentum

    step = DecodedMomentum(ServerSGD(lr=0.1), momentum=0.5, weight_decay=0.1)
    w, g = torch.ones(3, dtype=torch.float64), torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    w1, buf = step.step(w, g, None)
    m1 = 0.5 * (g + 0.1 * w)  # m_0 = 0
    torch.testing.assert_close(buf["momentum"], m1)
    torch.testing.assert_close(w1, w - 0.1 * m1)
    w2, buf = step.step(w1, g, buf)
    m2 = 0.5 * m1 + 0.5 * (g + 0.1 * w1)
    torch.testing.assert_close(w2, w1 - 0.1 * m2)
    assert step.buffer_problem(buf, 3) is None and step.buffer_problem(None, 3) is None
    assert "state" in step.buffer_problem(torch.zeros(3), 3)
    assert "missing" in step.buffer_problem({"momentum": None, "inner": None}, 3)
    assert "3 entries" in step.buffer_problem({"momentum": torch.zeros(4), "inner": None}, 3)
    assert "present" in DecodedMomentum(ServerSGD(0.1), 0.0, 0.1).buffer_problem(buf, 3)
    with pytest.raises(ValueError, match="clients.momentum"):
        DecodedMomentum(ServerSGD(0.1), momentum=1.0)
