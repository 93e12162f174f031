"""fedsafe's ServerApp and ClientApp (fedsafe.flower) against fedsafe's own engine, in process: the
ClientApp is called as a SuperNode calls it (tests/flower/fakegrid.py), so these run in seconds.
Flower's own simulation runtime and a real deployment are tested in test_simulation.py and
test_deployment.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsafe.config import ConfigError, validate
from fedsafe.core.streams import numpy_stream
from fedsafe.engine.run import run_experiment
from fedsafe.flower import FlowerError, client_app, run_over_flower
from fedsafe.flower.nodes import Nodes
from fedsafe.flower.records import SECAGG, TRAIN
from fedsafe.flower.server import flower_federation
from fedsafe.protocols.secagg.session import run_round

from .fakegrid import FakeGrid

BASE = {"rounds": 2, "clients": {"num_clients": 5}, "execution": "serial", "seed": 3, "eval_every": 1}
DP = {"enabled": True, "noise_multiplier": 0.5, "clip": 1.0}
CASES = {
    "plain": {},
    "fedavg": {"clients": {"algorithm": "fedavg", "local_steps": 2}},
    "robust_alie": {"robust": {"rule": "trimmed_mean", "pre": ["nnm"]}, "attack": {"name": "alie", "f": 1}},
    "label_flip": {"robust": {"rule": "median"}, "attack": {"name": "label_flip", "f": 1}},
    "backdoor": {"robust": {"rule": "krum"}, "attack": {"name": "pattern_backdoor", "f": 1}},
    "dp_local": {"dp": {**DP, "placement": "local"}},
    "dp_central_adaptive": {"dp": {**DP, "placement": "central", "adaptive": True, "count_stddev": 1.0}},
    "dp_audit": {"dp": {**DP, "placement": "central"}, "audit": {"canaries": 4}, "clients": {"algorithm": "fedavg"}},
    "zeroth_order": {"clients": {"gradient": "zeroth_order"}, "zo": {"k": 4}},
    # DP-SGD on the nodes (their own per-step noise), each replying client's steps accounted by the server
    "dp_example": {"dp": {**DP, "placement": "local", "unit": "example"}, "clients": {"algorithm": "fedavg", "local_steps": 2}},
    "dp_example_secagg": {"protocol": "secagg", "dp": {**DP, "placement": "local", "unit": "example"}},
    "secagg_distributed_dp": {"protocol": "secagg", "dp": {**DP, "placement": "distributed"}},
    # the encoding ranges follow the adaptive clip norm and the noise: the nodes get them in SETUP
    "secagg_distributed_dp_adaptive": {
        "protocol": "secagg", "dp": {**DP, "placement": "distributed", "adaptive": True, "count_stddev": 1.0},
    },
    "secagg_emulated_dropouts": {"protocol": "secagg", "clients": {"algorithm": "fedavg"}, "secagg": {"dropout": 0.2}},
}
COMPARED = ("train_loss", "test_loss", "test_accuracy", "epsilon", "clip", "attack_success_rate", "skipped",
            "secagg_survivors", "byzantine", "participants", "secagg_clipped_clients", "secagg_clipped_coordinates",
            "secagg_clip_probability", "dp_noise_shares")


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _merge(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_flower_run_equals_fedsafe_engine(case: str, tmp_path: Path) -> None:
    """Same config and seed: the run over Flower's nodes and fedsafe's engine give the same model,
    bit for bit, and the same metrics (DP noise drawn on the nodes from the experiment's seed)."""
    cfg = validate(_merge({**BASE, "secure_randomness": False}, CASES[case]))  # the server's noise seeded too
    grid = FakeGrid(client_app(noise_seed="experiment"), 5)
    run_over_flower(cfg, grid, tmp_path / "flower", timeout=5, wait=5)
    run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    a, b = torch.load(tmp_path / "flower" / "model.pt"), torch.load(tmp_path / "engine" / "model.pt")
    assert a.keys() == b.keys()
    if case == "zeroth_order":
        # A node evaluates its one client's K perturbed losses alone, the engine all clients' in one
        # batched forward pass: losses equal up to float32 summation order (2e-7), which the
        # finite differences divide by σ: parameters within 2e-5 after two rounds.
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-4)
        return
    assert all(torch.equal(a[k], b[k]) for k in a)
    for ra, rb in zip(_rows(tmp_path / "flower"), _rows(tmp_path / "engine"), strict=True):
        assert {k: ra.get(k) for k in COMPARED} == {k: rb.get(k) for k in COMPARED}
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["execution"] == "flower"


class _Forgetful(dict):
    """A process that keeps no party between messages, as a deployed SuperNode's."""

    def __setitem__(self, key, value) -> None:
        return None


def test_secure_aggregation_replayed_parties_give_the_same_model(tmp_path: Path, monkeypatch) -> None:
    """With a fresh process per message the node rebuilds its party from its secret and replays
    the earlier stages: the model is still the engine's, bit for bit."""
    import fedsafe.flower.party as party

    monkeypatch.setattr(party, "_PARTIES", _Forgetful())
    cfg = validate(_merge({**BASE, "secure_randomness": False}, CASES["secagg_distributed_dp"]))
    run_over_flower(cfg, FakeGrid(client_app(noise_seed="experiment"), 5), tmp_path / "flower", timeout=5, wait=5)
    run_experiment(cfg, tmp_path / "engine", overwrite=True, quiet=True)
    a, b = torch.load(tmp_path / "flower" / "model.pt"), torch.load(tmp_path / "engine" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_secure_aggregation_never_sends_an_update_to_the_server(tmp_path: Path) -> None:
    cfg = validate(_merge(BASE, CASES["secagg_distributed_dp"]))
    grid = FakeGrid(client_app(), 5)
    run_over_flower(cfg, grid, tmp_path, timeout=5, wait=5)
    trains = [r for r in grid.replies if r.metadata.message_type == TRAIN]
    assert len(trains) == 10
    for r in trains:
        assert len(r.content["update"]) == 0  # no update, no momentum: only the loss
    rows = _rows(tmp_path)
    assert all(r["secagg_survivors"] == 5 and "clipped_fraction" not in r for r in rows)


def test_local_dp_noise_is_secret_to_the_server_by_default(tmp_path: Path) -> None:
    """With the default noise seed a node's noise is fresh from the OS: two runs differ, and
    neither equals the run whose noise the server could recompute."""
    cfg = validate(_merge(BASE, CASES["dp_local"]))
    models = []
    for name, app in (("a", client_app()), ("b", client_app()), ("seeded", client_app(noise_seed="experiment"))):
        run_over_flower(cfg, FakeGrid(app, 5), tmp_path / name, timeout=5, wait=5)
        models.append(torch.load(tmp_path / name / "model.pt"))
    flat = [torch.cat([v.reshape(-1) for v in m.values()]) for m in models]
    assert not torch.equal(flat[0], flat[1]) and not torch.equal(flat[0], flat[2])


@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "unmask"])
def test_secure_aggregation_survives_a_node_killed_mid_round(stage: str) -> None:
    """A node that stops answering at a stage is offline from then on; the server still gets the
    exact sum that the in-process protocol computes with that client dropping at that stage."""
    cfg = validate(_merge(BASE, {"protocol": "secagg", "clients": {"algorithm": "fedavg"}, "rounds": 1}))
    grid = FakeGrid(client_app(), 5)
    victim, index = 2, cfg.secagg.stages.index(stage)
    inputs: dict[int, np.ndarray] = {}

    def when(msg) -> bool:
        if msg.metadata.message_type != SECAGG:
            return False
        if not inputs:  # the updates the nodes hold, read before the first stage (the test's view only)
            for ctx in grid.nodes.values():
                cid = ctx.node_config["partition-id"]
                inputs[cid] = ctx.state["fedsafe.update"]["update"].numpy().astype(np.float64)
        return msg.content["fedsafe"]["stage"] == index

    grid.kill(victim, when)
    fed = flower_federation(cfg, Nodes(grid, 5, timeout=5, wait=5))
    row = fed.run_round()
    assert "skipped" not in row
    assert row[f"secagg_dropped_{stage}"] == 1.0
    out = fed.protocol.last_outcome
    ref = run_round(inputs, cfg.secagg, round_=1, drop_at={victim: stage},
                    graph_rng=numpy_stream(cfg.seed, "secagg.graph", 1))
    assert out.survivors == ref.survivors == tuple(c for c in range(5) if c != victim or index == 3)
    np.testing.assert_array_equal(out.total, ref.total)
    # the next round runs with the four nodes left
    row = fed.run_round()
    assert row["dropouts"] == 1 and row["secagg_survivors"] == 4.0


def test_too_many_nodes_killed_skips_the_round(tmp_path: Path) -> None:
    cfg = validate(_merge(BASE, {"protocol": "secagg", "clients": {"algorithm": "fedavg"}, "rounds": 1}))
    grid = FakeGrid(client_app(), 5)
    for c in (0, 1, 2):
        grid.kill(c, lambda m: m.metadata.message_type == SECAGG and m.content["fedsafe"]["stage"] == 2)
    fed = flower_federation(cfg, Nodes(grid, 5, timeout=5, wait=5))
    before = fed.state.params.clone()
    row = fed.run_round()
    assert "threshold" in row["skipped"] or "survivors" in row["skipped"]
    assert torch.equal(fed.state.params, before)


def test_a_node_that_dies_before_training_is_a_dropout(tmp_path: Path) -> None:
    cfg = validate(_merge(BASE, {"robust": {"rule": "median"}, "rounds": 2}))
    grid = FakeGrid(client_app(), 5)
    grid.kill(4, lambda m: m.metadata.message_type == TRAIN and m.content["fedsafe"]["round"] == 2)
    run_over_flower(cfg, grid, tmp_path, timeout=5, wait=5)
    rows = _rows(tmp_path)
    assert rows[0]["dropouts"] == 0 and rows[1]["dropouts"] == 1 and "skipped" not in rows[1]


def test_a_restarted_supernode_takes_its_client_back(tmp_path: Path) -> None:
    """Client 2's node dies in round 2; a new SuperNode (new node id, same partition-id) comes
    up: from round 3 on client 2 trains again on it."""
    cfg = validate(_merge(BASE, {"rounds": 3}))
    grid = FakeGrid(client_app(), 5)

    def dies(msg) -> bool:
        if msg.metadata.message_type == TRAIN and msg.content["fedsafe"]["round"] == 2:
            grid.add_node(2, 5)  # the replacement connects while the old node is still listed
            return True
        return False

    grid.kill(2, dies)
    run_over_flower(cfg, grid, tmp_path, timeout=5, wait=5)
    assert [r["dropouts"] for r in _rows(tmp_path)] == [0, 1, 0]


class _Crash(Exception):
    pass


def test_a_crashed_server_resumes_to_the_same_model(tmp_path: Path) -> None:
    """The ServerApp dies in round 3 (after round 2's checkpoint); run again with resume, over
    fresh nodes, it ends with the model of an uninterrupted run."""
    cfg = validate(_merge(BASE, {"rounds": 4, "checkpoint_every": 1, "robust": {"rule": "median"}}))
    run_over_flower(cfg, FakeGrid(client_app(), 5), tmp_path / "whole", timeout=5, wait=5)

    grid = FakeGrid(client_app(), 5)

    def crash(msg) -> bool:
        if msg.metadata.message_type == TRAIN and msg.content["fedsafe"]["round"] == 3:
            raise _Crash
        return False

    grid.kill(0, crash)
    with pytest.raises(_Crash):
        run_over_flower(cfg, grid, tmp_path / "resumed", timeout=5, wait=5)
    run_over_flower(cfg, FakeGrid(client_app(), 5), tmp_path / "resumed", timeout=5, wait=5, resume=True)
    a, b = torch.load(tmp_path / "whole" / "model.pt"), torch.load(tmp_path / "resumed" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["round"] for r in _rows(tmp_path / "resumed")] == [1, 2, 3, 4]


# --- refusals ------------------------------------------------------------------------------------


def test_missing_nodes_are_named(tmp_path: Path) -> None:
    grid = FakeGrid(client_app(), 3, partitions=[0, 1, 3], num_partitions=5)
    with pytest.raises(FlowerError, match=r"no SuperNode holds fedsafe clients \[2, 4\]"):
        run_over_flower(validate(BASE), grid, tmp_path, timeout=1, wait=0.5)


def test_two_nodes_holding_one_client_are_refused(tmp_path: Path) -> None:
    grid = FakeGrid(client_app(), 5, partitions=[0, 1, 2, 3, 3])
    with pytest.raises(FlowerError, match="both hold fedsafe client 3"):
        run_over_flower(validate(BASE), grid, tmp_path, timeout=1, wait=0.5)


def test_num_partitions_must_match_the_experiment(tmp_path: Path) -> None:
    grid = FakeGrid(client_app(), 5, num_partitions=7)
    with pytest.raises(FlowerError, match="num-partitions 7, but clients.num_clients = 5"):
        run_over_flower(validate(BASE), grid, tmp_path, timeout=1, wait=0.5)


@pytest.mark.parametrize(("extra", "match"), [
    ({"protocol": "he"}, "protocol = 'he': over Flower"),
    ({"protocol": "secagg", "secagg": {"adversary": "active"}}, "needs a PKI"),
    ({"protocol": "secagg", "attack": {"name": "alie", "f": 1}}, "attack 'alie'"),
    ({"variants": {"big": {"clients": {"num_clients": 6}}}}, "variants.big: every variant must keep clients.num_clients"),
])
def test_what_flower_cannot_run_is_refused_before_contacting_nodes(extra: dict, match: str, tmp_path: Path) -> None:
    grid = FakeGrid(client_app(), 5)
    with pytest.raises(ConfigError, match=match):
        run_over_flower(validate(_merge(BASE, extra)), grid, tmp_path, timeout=1, wait=0.5)
    assert grid.sent == []


def test_a_train_message_for_another_client_is_an_error_reply() -> None:
    grid = FakeGrid(client_app(), 2, partitions=[0, 1])
    cfg = validate(_merge(BASE, {"clients": {"num_clients": 2}}))
    nodes = Nodes(grid, 2, timeout=1, wait=1)
    nodes.node_of[0], nodes.node_of[1] = nodes.node_of[1], nodes.node_of[0]  # a server that mixes them up
    fed = flower_federation(cfg, nodes)
    row = fed.run_round()
    assert row["skipped"] == "every honest client dropped out"
    assert any("addressed to client 1, but this node holds client 0" in reason for _, reason in nodes.errors)


def test_a_secagg_stage_out_of_order_is_refused_by_the_node() -> None:
    from flwr.app import ConfigRecord, Message, RecordDict

    grid = FakeGrid(client_app(), 1)
    msg = Message(RecordDict({"fedsafe": ConfigRecord({"round": 1, "client": 0, "stage": 0, "payloads": [b"x"]})}),
                  dst_node_id=grid.node_of(0), message_type=SECAGG)
    reply = grid.send_and_receive([msg])[0]
    assert reply.has_error() and "holds no update for round 1" in reply.error.reason


def test_an_unknown_noise_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="noise_seed must be one of"):
        client_app(noise_seed="zero")


def test_messages_are_addressed_per_round(tmp_path: Path) -> None:
    cfg = validate(_merge(BASE, {"rounds": 1}))
    grid = FakeGrid(client_app(), 5)
    run_over_flower(cfg, grid, tmp_path, timeout=5, wait=5)
    trains = [m for m in grid.sent if m.metadata.message_type == TRAIN]
    assert {m.metadata.group_id for m in trains} == {"1"}
    assert sorted(int(m.content["fedsafe"]["client"]) for m in trains) == list(range(5))
