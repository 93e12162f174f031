"""CRFL ([crfl]) over Flower. Under FedsafeStrategy the round's model stage runs on the
strategy's step (clip to ρ_t, then the seeded noise, none after the last round), checked against
the clients' own models recomputed here and a naive clip; certification, which needs the model
and test data the strategy does not hold, is refused at set-up naming crfl.certify. fedsafe's own
ServerApp runs the engine: the same model and certificate as the engine's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedsafe.config import ConfigError
from fedsafe.core.streams import torch_stream

from .fakegrid import FakeGrid

RUN_CONFIG = {"local-epochs": 1, "lr": 0.2}


def _naive(params: torch.Tensor, rho: float, sigma: float, seed: int, t: int, noise: bool) -> torch.Tensor:
    values = params.tolist()
    total = math.sqrt(sum(v * v for v in values))
    if total > rho:
        values = [v * rho / (total + 1e-6) for v in values]
    out = torch.tensor(values, dtype=params.dtype)
    if not noise:
        return out
    z = torch.randn(len(values), generator=torch_stream(seed, "robust.crfl", t), dtype=torch.float64)
    return (out.to(torch.float64) + sigma * z).to(params.dtype)


def test_the_strategy_clips_and_perturbs_the_global_model(digits) -> None:
    from flwr.app import ArrayRecord

    from fedsafe.flower import FedsafeStrategy
    from fedsafe.flower.records import flatten_arrays

    client, task, _ = digits
    exp = {"clients": {"num_clients": 4}, "seed": 5, "secure_randomness": False,
           "crfl": {"enabled": True, "certify": False, "rho": 100.0, "rho_start": 0.5, "rho_growth": 0.25,
                    "sigma_train": 0.05}}
    strategy = FedsafeStrategy(exp)
    grid = FakeGrid(client.app, 4, run_config=RUN_CONFIG)
    initial = ArrayRecord(task.make_model().state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=2)
    final = flatten_arrays(result.arrays)[0]
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    by_round = {r: [m for m in trains if m.metadata.group_id == str(r)] for r in (1, 2)}

    def mean_model(msgs):
        return torch.stack([flatten_arrays(client.train_fn(m, grid.nodes[m.metadata.dst_node_id]).content["arrays"])[0]
                            for m in msgs]).mean(0)

    # round 1: the mean of the clients' models, clipped to ρ_1 = 0.75 and perturbed: what round 2 sent
    sent2 = flatten_arrays(by_round[2][0].content["arrays"])[0]
    torch.testing.assert_close(sent2, _naive(mean_model(by_round[1]), 0.75, 0.05, 5, 1, noise=True), rtol=0, atol=1e-6)
    # round 2, the last: clipped to ρ_2 = 1.0 only
    torch.testing.assert_close(final, _naive(mean_model(by_round[2]), 1.0, 0.05, 5, 2, noise=False), rtol=0, atol=1e-6)
    assert [r["crfl_rho"] for r in strategy.rows] == [0.75, 1.0]
    assert all(r["crfl_norm"] > r["crfl_rho"] for r in strategy.rows)  # the bound bit each round


def test_certifying_under_the_strategy_is_refused_naming_the_key() -> None:
    from fedsafe.flower import FedsafeStrategy

    with pytest.raises(ConfigError, match=r"crfl.certify: FedsafeStrategy holds neither the model nor test data"):
        FedsafeStrategy({"clients": {"num_clients": 4}, "crfl": {"enabled": True, "attackers": 1, "poison_fraction": 0.1}})


def test_the_server_app_runs_the_engine_so_it_certifies_as_the_engine(tmp_path: Path) -> None:
    """fedsafe's own ServerApp over Flower nodes (in process, tests/flower/fakegrid.py) and the
    engine: the same model bit for bit, the same CRFL rows and certificate."""
    import json

    from fedsafe.config import validate
    from fedsafe.engine.run import run_experiment
    from fedsafe.flower import client_app, run_over_flower

    cfg = validate({"rounds": 2, "clients": {"num_clients": 5, "algorithm": "fedavg", "local_steps": 2},
                    "execution": "serial", "seed": 3, "eval_every": 1, "secure_randomness": False,
                    "attack": {"name": "pattern_backdoor", "f": 1},
                    "crfl": {"enabled": True, "rho_start": 1.0, "rho_growth": 0.5, "samples": 8, "batch_models": 3}})
    run_over_flower(cfg, FakeGrid(client_app(noise_seed="experiment"), 5), tmp_path / "flower", timeout=5, wait=5)
    run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    a, b = torch.load(tmp_path / "flower" / "model.pt"), torch.load(tmp_path / "engine" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("flower", "engine"))
    keys = [k for k in sb if k.startswith("crfl_")]
    assert "crfl_certified_accuracy@0.001" in keys and {k: sa[k] for k in keys} == {k: sb[k] for k in keys}
    assert (tmp_path / "flower" / "crfl_certificate.csv").read_text() == (tmp_path / "engine" / "crfl_certificate.csv").read_text()
