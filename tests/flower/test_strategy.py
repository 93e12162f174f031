"""FedsafeStrategy (your own Flower ClientApp, fedsafe's server) and dp_mod, on the example
project examples/flower_strategy, driven in process (tests/flower/fakegrid.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsafe.config import ConfigError, validate
from fedsafe.engine.run import run_experiment

from .fakegrid import FakeGrid

RUN_CONFIG = {"local-epochs": 1, "lr": 0.2}


def _start(strategy, app, rounds: int = 2, n: int = 4):
    from flwr.app import ArrayRecord

    from fedsafe.flower.records import flatten_arrays

    grid = FakeGrid(app, n, run_config=RUN_CONFIG)
    initial = ArrayRecord(sys.modules["digits_app.task"].make_model().state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    return grid, flatten_arrays(initial)[0], flatten_arrays(result.arrays)[0]


def _wrapped(app_fn):
    """A ClientApp whose train replies go through ``app_fn(reply, partition) -> reply``."""
    from flwr.clientapp import ClientApp

    client = sys.modules["digits_app.client_app"]
    out = ClientApp()

    @out.train()
    def train(msg, context):
        return app_fn(client.train_fn(msg, context), context.node_config["partition-id"])

    return out


def test_mean_is_unweighted_fedavg(digits) -> None:
    """rule mean, no DP, server lr 1: the new model is the plain mean of the clients' models
    (computed here by calling each client's train function directly)."""
    from fedsafe.flower import FedsafeStrategy
    from fedsafe.flower.records import flatten_arrays

    client, task, _ = digits
    strategy = FedsafeStrategy({"clients": {"num_clients": 4}})
    grid, initial, final = _start(strategy, client.app, rounds=1)
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    models = [flatten_arrays(client.train_fn(m, grid.nodes[m.metadata.dst_node_id]).content["arrays"])[0] for m in trains]
    torch.testing.assert_close(final, torch.stack(models).mean(0), rtol=0, atol=1e-6)
    row = strategy.rows[0]
    assert row["participants"] == 4 and row["dropouts"] == 0 and "train_loss" in row


def test_a_robust_rule_resists_a_client_that_scales_its_model(digits) -> None:
    from fedsafe.flower import FedsafeStrategy
    from fedsafe.flower.records import flatten_arrays, unflatten_arrays

    def attack(reply, partition):
        if partition == 0:
            arrays = reply.content["arrays"]
            reply.content["arrays"] = unflatten_arrays(flatten_arrays(arrays)[0] * 1000, arrays)
        return reply

    norms = {}
    for rule in ("mean", "median"):
        strategy = FedsafeStrategy({"clients": {"num_clients": 4}, "robust": {"rule": rule, "f": 1}})
        _, initial, final = _start(strategy, _wrapped(attack), rounds=1)
        norms[rule] = float((final - initial).norm())
    assert norms["mean"] > 100 * norms["median"]
    assert norms["median"] < 10


def test_central_dp_accounts_as_fedsafe_engine(digits, tmp_path: Path) -> None:
    from fedsafe.flower import FedsafeStrategy

    client, _, _ = digits
    exp = {"clients": {"num_clients": 4}, "rounds": 3,
           "dp": {"enabled": True, "placement": "central", "noise_multiplier": 1.2, "clip": 1.0}}
    strategy = FedsafeStrategy(exp, out_dir=tmp_path / "strategy")
    _start(strategy, client.app, rounds=3)
    engine = next(iter(run_experiment(validate(exp), tmp_path / "engine", overwrite=True, quiet=True).values()))
    rows = [json.loads(x) for x in (tmp_path / "engine" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("epsilon") for r in strategy.rows] == [r.get("epsilon") for r in rows]
    assert strategy.rows[-1]["epsilon"] > 0
    summary = json.loads((tmp_path / "strategy" / "summary.json").read_text())
    assert summary["epsilon"] == engine["epsilon"]
    assert summary["dp_placement"] == "central" and summary["rounds"] == 3


@pytest.mark.parametrize("placement", ["central", "distributed"])
def test_adaptive_clipping_moves_the_clip_norm(digits, placement: str) -> None:
    """Adaptive clipping (Andrew et al.): the clip norm follows the noised fraction of unclipped
    updates; under distributed placement each client's dp_mod sends its noised clipping bit."""
    from fedsafe.flower import FedsafeStrategy

    client, _, _ = digits
    exp = {"clients": {"num_clients": 4}, "robust": {"rule": "mean"},
           "dp": {"enabled": True, "placement": placement, "noise_multiplier": 0.8, "clip": 0.05, "adaptive": True,
                  "count_stddev": 1.0, "accountant": "rdp"}}
    strategy = FedsafeStrategy(exp)
    _, _, final = _start(strategy, client.app, rounds=3)
    rows = strategy.rows
    assert all("skipped" not in r and r["excluded_unprotected"] == 0 for r in rows)
    assert rows[-1]["clip"] > 0.05  # the updates are far longer than 0.05: the norm grows
    assert all("noised_unclipped_fraction" in r for r in rows) and bool(torch.isfinite(final).all())


def test_audit_canaries_are_inserted_and_measured(digits, tmp_path: Path) -> None:
    """With [audit], canary updates join every round's aggregate and the summary carries the
    one-shot ε estimate next to the analytical ε (Andrew et al. 2023)."""
    from fedsafe.flower import FedsafeStrategy

    client, _, _ = digits
    exp = {"clients": {"num_clients": 4}, "audit": {"canaries": 8, "unobserved": 8},
           "dp": {"enabled": True, "placement": "central", "noise_multiplier": 1.0, "clip": 1.0}}
    strategy = FedsafeStrategy(exp, out_dir=tmp_path)
    _start(strategy, client.app, rounds=3)
    assert all(r["canaries"] > 0 for r in strategy.rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eps_est_final"] is not None and summary["eps_analytical"] > 0
    assert (tmp_path / "audit_cosines.npz").is_file()


def test_local_dp_needs_the_clients_dp_mod(digits) -> None:
    """A reply without dp_mod's mark is refused: no update reaches the aggregate unnoised."""
    from fedsafe.flower import FedsafeStrategy

    client, _, _ = digits
    exp = {"clients": {"num_clients": 4}, "robust": {"rule": "median"},
           "dp": {"enabled": True, "placement": "local", "noise_multiplier": 0.5, "clip": 1.0, "accountant": "rdp"}}
    plain = _wrapped(lambda reply, p: reply)  # the same training, without the mod
    strategy = FedsafeStrategy(exp)
    _, initial, final = _start(strategy, plain, rounds=1)
    assert strategy.rows[0]["excluded_unprotected"] == 4 and strategy.rows[0]["skipped"] == "no usable reply"
    assert torch.equal(final, initial)

    strategy = FedsafeStrategy(exp)
    grid, initial, final = _start(strategy, client.app, rounds=1)  # mods=[dp_mod]
    row = strategy.rows[0]
    assert row["excluded_unprotected"] == 0 and "skipped" not in row and row["epsilon"] > 0
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert all(r.content["metrics"]["fedsafe.dp"] == 1.0 and r.content["metrics"]["fedsafe.clip"] == 1.0 for r in replies)


def test_dp_mod_noise_is_fresh_and_clipped(digits) -> None:
    """Two identical train messages through dp_mod give different noise; without noise
    (z = 0) the update is the trained delta clipped to C."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    from fedsafe.flower.records import flatten_arrays

    client, task, _ = digits
    grid = FakeGrid(client.app, 1, num_partitions=4, run_config=RUN_CONFIG)
    arrays = ArrayRecord(task.make_model().state_dict())
    flat = flatten_arrays(arrays)[0]

    def send(z: float):
        cfg = validate({"clients": {"num_clients": 4}, "robust": {"rule": "median"},
                        "dp": {"enabled": True, "placement": "local", "noise_multiplier": z, "clip": 0.5, "accountant": "rdp"}})
        conf = ConfigRecord({"fedsafe.config": cfg.to_toml(), "fedsafe.round": 1, "fedsafe.client": 0, "fedsafe.dp.clip": 0.5})
        msg = Message(RecordDict({"arrays": arrays, "config": conf}), dst_node_id=grid.node_of(0), message_type="train")
        return flatten_arrays(grid.send_and_receive([msg])[0].content["arrays"])[0] - flat

    a, b = send(0.3), send(0.3)
    assert not torch.equal(a, b)
    clean = send(0.0)
    assert abs(float(clean.norm()) - 0.5) < 1e-4  # trained far beyond C: clipped to it
    assert float(a.norm()) > 2 * 0.5  # the noise (zC per coordinate over ~2.4k coordinates) dominates


def test_malformed_replies_are_left_out(digits) -> None:
    from flwr.app import Array, ArrayRecord

    from fedsafe.flower import FedsafeStrategy

    def bad(reply, partition):
        if partition == 1:
            reply.content["arrays"] = ArrayRecord({"x": Array(np.zeros(3, dtype=np.float32))})
        if partition == 2:
            arrays = reply.content["arrays"]
            first = next(iter(arrays))
            arrays[first] = Array(np.full(arrays[first].numpy().shape, np.nan, dtype=np.float32))
        return reply

    strategy = FedsafeStrategy({"clients": {"num_clients": 4}})
    _, initial, final = _start(strategy, _wrapped(bad), rounds=1)
    row = strategy.rows[0]
    assert row["excluded_malformed"] == 1 and row["excluded_nonfinite"] == 1 and "skipped" not in row
    assert bool(torch.isfinite(final).all())
    assert strategy.errors[0][:2] == (1, 1) and "do not match the global model" in strategy.errors[0][2]


@pytest.mark.parametrize(("exp", "match"), [
    ({"attack": {"name": "alie", "f": 1}}, "the attackers are real clients"),
    ({"protocol": "secagg"}, "needs fedsafe's own ClientApp"),
    ({"clients": {"gradient": "zeroth_order"}}, "zeroth-order clients need"),
    ({"variants": {"a": {}}}, "a strategy runs one experiment"),
    ({"clients": {"algorithm": "dsgd"}}, "whose deltas are FedAvg's messages"),
    ({"dp": {"enabled": True, "unit": "example", "placement": "local"}}, "DP-SGD runs inside each client's training"),
    ({"crfl": {"enabled": True, "attackers": 1, "poison_fraction": 0.5}}, "crfl.certify: FedsafeStrategy holds neither"),
])
def test_what_the_strategy_cannot_run_is_refused(exp: dict, match: str) -> None:
    from fedsafe.flower import FedsafeStrategy

    with pytest.raises(ConfigError, match=match):
        FedsafeStrategy(exp)


def test_rules_that_need_the_engine_are_refused_at_the_first_round(digits) -> None:
    from fedsafe.flower import FedsafeStrategy

    client, _, _ = digits
    strategy = FedsafeStrategy({"clients": {"num_clients": 4}, "robust": {"rule": "fltrust"}})
    with pytest.raises(ConfigError, match="needs fedsafe's own ServerApp"):
        _start(strategy, client.app, rounds=1)


def test_the_example_project_learns_under_each_experiment(digits, tmp_path: Path) -> None:
    """examples/flower_strategy's three experiments, 10 clients, 6 rounds."""
    from flwr.app import ArrayRecord

    from fedsafe.flower import FedsafeStrategy

    client, task, server = digits
    for name, exp in server.EXPERIMENTS.items():
        grid = FakeGrid(client.app, 10, run_config=RUN_CONFIG)
        strategy = FedsafeStrategy(exp, out_dir=tmp_path / name, fraction_evaluate=0.5)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(task.make_model().state_dict()), num_rounds=6)
        acc = result.evaluate_metrics_clientapp[6]["eval_acc"]
        assert acc > (0.5 if name != "private" else 0.1), (name, acc)
        assert (tmp_path / name / "summary.json").is_file()
