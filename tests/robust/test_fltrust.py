"""FLTrust: the rule against a naive twin of Cao et al.'s Algorithm 1, and the engine's root
dataset (drawn once, its own batches and momentum, checkpointed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.core.errors import ConfigError
from fedsafe.robust.aggregators import AGGREGATORS


def _naive(x: np.ndarray, g0: np.ndarray) -> np.ndarray:
    scores, scaled = [], []
    n0 = np.linalg.norm(g0)
    for g in x:
        ng = np.linalg.norm(g)
        cos = 0.0 if ng == 0 or n0 == 0 else float(g @ g0) / (ng * n0)
        scores.append(max(0.0, cos))
        scaled.append(g * (n0 / ng) if ng > 0 else g)
    total = sum(scores)
    if total == 0:
        return np.zeros(x.shape[1])
    return sum(s * v for s, v in zip(scores, scaled)) / total


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fltrust_against_naive(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 30, generator=g, dtype=torch.float64)
    x[3] = 0  # a zero update: score 0
    x[4] = -5 * x[5]  # points away from most: likely score 0
    g0 = torch.randn(30, generator=g, dtype=torch.float64) + x.mean(0)
    got = AGGREGATORS.get("fltrust")(x.to(dtype), f=3, server_update=g0.to(dtype))
    torch.testing.assert_close(got.double(), torch.from_numpy(_naive(x.numpy(), g0.numpy())),
                               rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)
    assert got.dtype == dtype


def test_fltrust_degenerate_cases_and_errors():
    x = torch.ones(4, 3)
    rule = AGGREGATORS.get("fltrust")
    assert torch.equal(rule(x, f=1, server_update=-torch.ones(3)), torch.zeros(3))  # all scores 0
    assert torch.equal(rule(x, f=1, server_update=torch.zeros(3)), torch.zeros(3))
    torch.testing.assert_close(rule(x, f=1, server_update=2 * torch.ones(3)), 2 * torch.ones(3))  # ‖g0‖ scale
    with pytest.raises(ValueError, match="needs the server's update"):
        rule(x, f=1)
    with pytest.raises(ValueError, match=r"server_update must have shape \(3,\)"):
        rule(x, f=1, server_update=torch.ones(4))
    with pytest.raises(ValueError, match="root_size"):
        AGGREGATORS.get("fltrust", {"root_size": 0})(x, f=1, server_update=torch.ones(3))


RAW = {
    "rounds": 4, "seed": 2, "eval_every": 2, "checkpoint_every": 2,
    "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
    "model": {"name": "mlp", "hidden": 16}, "clients": {"num_clients": 10},
    "robust": {"rule": "fltrust", "params": {"root_size": 50}}, "attack": {"name": "sign_flip", "f": 2},
}


def test_the_engine_supplies_the_server_update_from_its_root_dataset():
    from fedsafe import Experiment
    from fedsafe.engine.clients import ClientWork

    exp = Experiment(RAW)
    fed = exp.federation()
    root = fed.root
    assert root.work.data.x_train.shape[0] == 50 and root.work.data.num_clients == 1
    rows = {tuple(r.flatten().tolist()) for r in fed.data.x_train}
    assert all(tuple(r.flatten().tolist()) in rows for r in root.work.data.x_train)  # drawn from the training set
    seen = []
    rule = fed.pipeline.rule
    fed.pipeline.rule = lambda u, *, f, server_update: seen.append(server_update.clone()) or rule(u, f=f, server_update=server_update)
    params = fed.state.params.clone()
    fed.run_round()
    # the server's update is dsgd on the root data at the round's model: the naive recomputation
    twin = ClientWork(fed.cfg.clients, fed.backend, root.work.data, root.work.seed)
    want = twin.run(1, params, np.zeros(1, dtype=np.int64), torch.zeros(1, params.numel())).updates[0]
    torch.testing.assert_close(seen[0], want)
    assert root.momentum is not None and torch.equal(root.momentum[0], want)


def test_fltrust_resumes_exactly_and_checks_root_size(tmp_path, interrupted_then_resumed):
    from fedsafe import Experiment

    whole = Experiment(RAW).run(tmp_path / "whole")
    resumed = interrupted_then_resumed(lambda: Experiment(RAW), tmp_path / "cut")
    assert torch.equal(resumed.federation.state.params, whole.federation.state.params)
    with pytest.raises(ConfigError, match=r"root_size must be an integer in \[1, "):
        Experiment(RAW, robust={"params": {"root_size": 10**6}}).run()


def test_fltrust_stops_model_replacement_where_the_mean_does_not():
    from fedsafe import Experiment

    raw = {**RAW, "rounds": 30, "eval_every": 10, "checkpoint_every": 0, "clients": {"num_clients": 20},
           "attack": {"name": "model_replacement", "f": 4}}
    mean = Experiment({**raw, "robust": {"rule": "mean"}}).run().summary
    trust = Experiment(raw).run().summary
    assert mean["final_attack_success_rate"] > 0.9
    assert trust["final_attack_success_rate"] < 0.1 and trust["final_accuracy"] > 0.7
