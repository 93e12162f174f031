"""The engine-facing protocol: refusal of rules, the aggregate, its cost and metrics, dropouts."""

import math

import pytest
import torch

from fedsafe.core.protocol import PlainProtocol, ProtocolError
from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.secagg import STAGES, SecAggConfig, SecAggError, SecAggProtocol
from fedsafe.robust.pipeline import RobustPipeline


def mean_pipe():
    return RobustPipeline("mean", {}, [], 0, 0)


def messages(n, d=300, seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return [Message(10 + i, torch.randn(d, generator=g) * scale) for i in range(n)]


def ctx(n, round_=1, seed=0):
    return RoundContext(round_, seed, tuple(range(10, 10 + n)), 0)


@pytest.mark.parametrize(
    "rule,pre,needle",
    [("krum", [], "rule 'krum'"), ("median", [], "rule 'median'"), ("mean", [("nnm", {})], "pre-aggregators 'nnm'")],
)
def test_check_refuses_rules_that_need_individual_updates(rule, pre, needle):
    pipe = RobustPipeline(rule, {}, pre, 1, 0)
    with pytest.raises(ProtocolError, match=needle) as e:
        SecAggProtocol().check(pipe)
    assert "reveals only the sum" in str(e.value)


def test_check_accepts_the_plain_mean():
    assert SecAggProtocol().check(mean_pipe()) is None
    assert SecAggProtocol.name == "secagg" and SecAggProtocol.reveals_messages is False


def test_aggregate_is_the_plain_mean_up_to_quantization_with_cost_metrics_and_seen():
    n, d = 7, 300
    msgs = messages(n, d)
    pipe = mean_pipe()
    proto = SecAggProtocol(SecAggConfig(clip=0.5))
    agg = proto.aggregate(msgs, pipe, ctx(n))
    plain = PlainProtocol().aggregate(msgs, mean_pipe(), ctx(n)).vector
    assert agg.vector.dtype == torch.float32 and agg.vector.shape == (d,)
    bound = proto.quantization_error_bound(n)
    assert (agg.vector.double() - plain.double()).abs().max() <= bound + 1e-7  # + float32 rounding
    assert torch.equal(pipe.previous, agg.vector)
    assert agg.metrics["secagg_survivors"] == n and agg.metrics["secagg_dropouts"] == 0
    assert agg.metrics["secagg_quant_error_bound"] == pytest.approx(bound)
    for s in STAGES:
        assert agg.cost[f"secagg_{s}_seconds"] >= 0
    up = agg.seen["transport"]["bytes_up"]
    assert agg.cost["bytes_up"] == sum(up.values()) and set(up) == {m.client_id for m in msgs}
    assert agg.cost["bytes_up_per_client_max"] >= 4 * d
    assert agg.cost["bytes_down"] == agg.cost["secagg_bytes_down"] > 0
    # what the server received: message types, senders and sizes only
    log = agg.seen["server"]
    assert [e["type"] for e in log].count("MASKED") == n
    assert all(isinstance(e["bytes"], int) and set(e) <= {"type", "sender", "bytes", "accepted"} for e in log)


def test_clipping_is_applied_before_the_sum():
    msgs = [Message(0, torch.full((4,), 5.0)), Message(1, torch.full((4,), -1.0)), Message(2, torch.zeros(4))]
    agg = SecAggProtocol(SecAggConfig(clip=2.0)).aggregate(msgs, mean_pipe(), ctx(3))
    assert torch.allclose(agg.vector, torch.full((4,), 1.0 / 3), atol=1e-6)  # (2 - 1 + 0) / 3


def test_simulated_dropouts_come_from_the_seeded_stream_and_the_mean_is_over_survivors():
    n = 12
    msgs = messages(n)
    cfg = SecAggConfig(dropout=0.1, clip=1.0)
    a = SecAggProtocol(cfg).aggregate(msgs, mean_pipe(), ctx(n, round_=3, seed=0))
    b = SecAggProtocol(cfg).aggregate(msgs, mean_pipe(), ctx(n, round_=3, seed=0))
    assert torch.equal(a.vector, b.vector) and a.metrics == b.metrics
    # this stream drops one client at each of advertise and share, two at unmask (still summed)
    assert [a.metrics[f"secagg_dropped_{s}"] for s in STAGES] == [1, 1, 0, 2]
    assert a.metrics["secagg_dropouts"] == 2 and a.metrics["secagg_survivors"] == 10 == a.count
    proto = SecAggProtocol(cfg)
    proto.aggregate(msgs, mean_pipe(), ctx(n, round_=3, seed=0))
    surv = set(proto.last_outcome.survivors)
    ref = torch.stack([m.vector for m in msgs if m.client_id in surv]).mean(0)
    assert (a.vector - ref).abs().max() <= proto.quantization_error_bound(n) + 1e-7


def test_dropouts_below_threshold_raise_protocol_error():
    n = 6
    with pytest.raises(ProtocolError, match="round aborted: only"):
        SecAggProtocol(SecAggConfig(dropout=0.6, dropout_stages=("mask",))).aggregate(messages(n), mean_pipe(), ctx(n))


def test_non_finite_update_is_withheld_by_its_client():
    msgs = messages(5)
    msgs[2] = Message(msgs[2].client_id, torch.full((300,), math.nan))
    agg = SecAggProtocol().aggregate(msgs, mean_pipe(), ctx(5))
    ref = torch.stack([m.vector for i, m in enumerate(msgs) if i != 2]).mean(0)
    assert (agg.vector - ref).abs().max() < 1e-6
    assert agg.metrics["excluded_nonfinite"] == 1 and agg.metrics["secagg_survivors"] == 4


def test_seeded_keys_and_k_regular_graph():
    n = 20
    msgs = messages(n)
    cfg = SecAggConfig(graph="k_regular", k=6)
    a = SecAggProtocol(cfg, key_seed=1).aggregate(msgs, mean_pipe(), ctx(n))
    b = SecAggProtocol(cfg).aggregate(msgs, mean_pipe(), ctx(n))
    assert torch.equal(a.vector, b.vector)  # masks cancel exactly whatever the keys
    assert a.metrics["secagg_neighbors"] == 6 and a.metrics["secagg_threshold"] == 4
    # SecAgg+ uploads O(k) shares, not O(n)
    full = SecAggProtocol(SecAggConfig()).aggregate(msgs, mean_pipe(), ctx(n))
    assert a.cost["bytes_up"] < full.cost["bytes_up"]


def test_client_transform_hook_runs_on_the_client_side():
    msgs = messages(4)
    seen = []

    def add_one(m, c):
        seen.append(m.client_id)
        return m.vector + 0.01

    agg = SecAggProtocol(client_transform=add_one).aggregate(msgs, mean_pipe(), ctx(4))
    ref = torch.stack([m.vector for m in msgs]).mean(0) + 0.01
    assert (agg.vector - ref).abs().max() < 1e-6 and sorted(seen) == [10, 11, 12, 13]


def test_bad_rounds_raise_secagg_errors():
    with pytest.raises(SecAggError, match="no messages"):
        SecAggProtocol().aggregate([], mean_pipe(), ctx(0))
    with pytest.raises(SecAggError, match="repeat"):
        SecAggProtocol().aggregate([Message(1, torch.zeros(3)), Message(1, torch.zeros(3))], mean_pipe(), ctx(2))
    with pytest.raises(SecAggError, match="at least 2 participants"):
        SecAggProtocol().aggregate([Message(1, torch.zeros(3))], mean_pipe(), ctx(1))


def test_secagg_training_on_digits_matches_plain_up_to_quantization():
    from fedsafe.config import validate
    from fedsafe.engine.federation import Federation

    raw = {
        "seed": 3, "rounds": 12, "eval_every": 6,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "mlp", "hidden": 16},
        "clients": {"num_clients": 8, "batch_size": 16},
        "server": {"lr": 0.3, "momentum": 0.5},
    }
    plain = Federation(validate(raw))
    plain.run()
    sec = Federation(validate(raw))
    sec.protocol = SecAggProtocol(SecAggConfig(clip=1.0))  # the lead wires this through config
    sec.protocol.check(sec.pipeline)
    sec.run()
    assert (sec.state.params - plain.state.params).abs().max() < 1e-4
    assert abs(sec.rows[-1]["test_accuracy"] - plain.rows[-1]["test_accuracy"]) <= 0.01
    row = sec.rows[-1]
    assert row["secagg_survivors"] == 8 and row["secagg_mask_seconds"] > 0 and row["secagg_bytes_up"] > 0


def test_active_protocol_enrols_clients_once_and_aggregates_exactly_like_semi_honest():
    n = 8
    msgs = messages(n)
    proto = SecAggProtocol(SecAggConfig(adversary="active"), key_seed=1)
    a = proto.aggregate(msgs, mean_pipe(), ctx(n, round_=1))
    keys = proto.enrolment.directory.entries()
    assert sorted(keys) == [m.client_id for m in msgs]
    b = proto.aggregate(msgs[:6], mean_pipe(), ctx(6, round_=2))
    assert proto.enrolment.directory.entries() == keys  # long-term keys: same across rounds
    semi = SecAggProtocol(SecAggConfig()).aggregate(msgs, mean_pipe(), ctx(n, round_=1))
    assert torch.equal(a.vector, semi.vector)
    assert b.metrics["secagg_survivors"] == 6
    assert a.cost["secagg_consistency_seconds"] > 0 and a.metrics["secagg_dropped_consistency"] == 0
    # signatures cost bytes: 64 per signed key pair relayed and per signature forwarded
    assert a.cost["bytes_down"] > semi.cost["bytes_down"] + 2 * 64 * n * (n - 1)
    assert "secagg_consistency_seconds" not in semi.cost


def test_active_dropouts_include_the_consistency_stage():
    n = 12
    cfg = SecAggConfig(adversary="active", dropout=0.1)
    agg = SecAggProtocol(cfg).aggregate(messages(n), mean_pipe(), ctx(n, round_=3))
    assert sum(agg.metrics[f"secagg_dropped_{s}"] for s in cfg.stages) >= 1
    assert "secagg_dropped_consistency" in agg.metrics
    with pytest.raises(ValueError, match="only with secagg.adversary = 'active'"):
        SecAggConfig(dropout_stages=("consistency",))
