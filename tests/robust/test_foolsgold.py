"""FoolsGold: the weights against a naive twin of Fung et al.'s Algorithm 1, the histories the
pipeline keeps (and the engine checkpoints), and sybils losing their weight."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.core.errors import ConfigError
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.foolsgold import foolsgold_weights
from fedsafe.robust.pipeline import RobustPipeline


def _naive_weights(h: np.ndarray, kappa: float = 1.0) -> np.ndarray:
    # the official code takes cosine_similarity(H) - I: each row keeps a 0 on its diagonal, so
    # a client's largest cosine is floored at 0 (an update that opposes everyone is not a sybil)
    n = h.shape[0]
    cs = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            ni, nj = np.linalg.norm(h[i]), np.linalg.norm(h[j])
            cs[i, j] = 0.0 if i == j or ni == 0 or nj == 0 else float(h[i] @ h[j]) / (ni * nj)
    v = cs.max(axis=1)
    for i in range(n):
        for j in range(n):
            if i != j and v[j] > v[i]:
                cs[i, j] *= v[i] / v[j]
    alpha = np.clip(1 - cs.max(axis=1), 0, 1)
    alpha[alpha < 1e-12] = 0.0  # identical directions, up to rounding
    if alpha.max() == 0:
        return np.zeros(n)
    alpha = alpha / alpha.max()
    alpha[alpha == 1] = 0.99
    out = np.zeros(n)
    for i in range(n):
        out[i] = 0.0 if alpha[i] == 0 else min(1.0, max(0.0, kappa * (math.log(alpha[i] / (1 - alpha[i])) + 0.5)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kappa", [1.0, 0.5])
def test_weights_against_naive(seed, kappa):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(9, 20, generator=g, dtype=torch.float64)
    h[6] = h[7] = h[8] = torch.randn(20, generator=g, dtype=torch.float64)  # three sybils
    h[2] = 0  # a client with no history
    got = foolsgold_weights(h, kappa)
    np.testing.assert_allclose(got.numpy(), _naive_weights(h.numpy(), kappa), rtol=1e-12, atol=1e-12)
    assert got[6:].tolist() == [0.0, 0.0, 0.0]


def test_conforms_to_the_official_code_when_a_client_opposes_everyone():
    # Two clients close together, a third pointing the other way: its largest cosine to the
    # others is negative. The official FoolsGold code (DistributedML/FoolsGold,
    # deep-fg/fg/foolsgold.py) floors it at 0 through the zero diagonal: the third client keeps
    # full weight, the two similar ones are pardoned to nothing.
    h = torch.tensor([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.05]], dtype=torch.float64)
    assert foolsgold_weights(h).tolist() == [0.0, 0.0, 1.0]
    np.testing.assert_array_equal(_naive_weights(h.numpy()), [0.0, 0.0, 1.0])
    # every client opposing every other (three directions 120 degrees apart): all honest
    t = torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3], dtype=torch.float64)
    assert foolsgold_weights(torch.stack([t.cos(), t.sin()], 1)).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weights_against_naive_with_opposing_histories(seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(20, generator=g, dtype=torch.float64)
    h = base + 0.8 * torch.randn(7, 20, generator=g, dtype=torch.float64)  # six honest, similar-ish
    h[6] = -h[:6].sum(0)  # one client against all the others: every cosine of its row negative
    assert (torch.nn.functional.cosine_similarity(h[6:], h[:6]) < 0).all()
    got = foolsgold_weights(h)
    np.testing.assert_allclose(got.numpy(), _naive_weights(h.numpy()), rtol=1e-12, atol=1e-12)


def test_rule_uses_the_histories_and_refuses_without_ids():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 10, generator=g, dtype=torch.float64)
    hist = {0: torch.randn(10, generator=g, dtype=torch.float64), 4: torch.randn(10, generator=g, dtype=torch.float64)}
    ids = (0, 1, 2, 3, 4, 9)
    rule = AGGREGATORS.get("foolsgold")
    before = x.clone()
    out = rule(x, f=1, client_ids=ids, history=hist)
    assert torch.equal(x, before)  # the histories are added to a copy
    h = x.clone()
    h[0] += hist[0]
    h[4] += hist[4]
    alpha = torch.from_numpy(_naive_weights(h.numpy()))
    torch.testing.assert_close(out, (alpha / alpha.sum()) @ x)
    with pytest.raises(ValueError, match="needs the client id of every row"):
        rule(x, f=1)
    sybils = torch.ones(4, 10, dtype=torch.float64)
    assert torch.equal(rule(sybils, f=1, client_ids=(0, 1, 2, 3), history={}), torch.zeros(10, dtype=torch.float64))


def test_pipeline_keeps_each_clients_history():
    p = RobustPipeline("foolsgold", {}, [], 1, 0)
    a, b = torch.randn(3, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    p(a, 1, [4, 7, 9])
    p.apply(b, 2, [7, 1])  # a what-if aggregation changes nothing
    p(b, 2, [7, 1])
    assert sorted(p.history) == [1, 4, 7, 9]
    torch.testing.assert_close(p.history[7], a[1] + b[0])
    torch.testing.assert_close(p.history[1], b[1])
    with pytest.raises(ValueError, match="cannot run after pre-aggregators"):
        RobustPipeline("foolsgold", {}, [("nnm", {})], 1, 0)


RAW = {"rounds": 4, "seed": 1, "eval_every": 2, "checkpoint_every": 2,
       "data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 16},
       "clients": {"num_clients": 10, "sampling": "fixed", "sample_size": 6},
       "robust": {"rule": "foolsgold"}, "attack": {"name": "sign_flip", "f": 2}}


def test_engine_resumes_foolsgold_exactly_and_refuses_pre_aggregators(tmp_path, interrupted_then_resumed):
    from fedsafe import Experiment

    whole = Experiment(RAW).run(tmp_path / "whole")
    resumed = interrupted_then_resumed(lambda: Experiment(RAW), tmp_path / "cut")
    assert torch.equal(resumed.federation.state.params, whole.federation.state.params)
    assert sorted(resumed.federation.pipeline.history) == sorted(whole.federation.pipeline.history)
    with pytest.raises(ConfigError, match="cannot run after pre-aggregators"):
        Experiment(RAW, robust={"pre": ["nnm"]}).run()


def test_foolsgold_zeroes_sybil_backdoors():
    from fedsafe import Experiment

    raw = {"rounds": 30, "seed": 0, "eval_every": 10, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20},
           "robust": {"rule": "foolsgold"}, "attack": {"name": "model_replacement", "f": 4}}
    s = Experiment(raw).run().summary
    assert s["final_attack_success_rate"] < 0.1 and s["final_accuracy"] > 0.85
