"""The protocols see the robust pipeline only through its public interface (issue #27 item 2):
``pipeline.spec`` (what it would aggregate) and ``pipeline.record(vector)`` (the aggregate a
protocol computed in its place), and each states the rules it performs itself
(``performs()``), which its check accepts and nothing else."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from fedsafe.core.protocol import PlainProtocol, ProtocolError
from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.he import HEProtocol
from fedsafe.protocols.secagg import SecAggConfig, SecAggProtocol
from fedsafe.protocols.tee import TEEConfig, TEEProtocol
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.pipeline import PipelineSpec, RobustPipeline


class SpecOnly:
    """A pipeline stand-in with nothing but the public interface: no rule_name, f, pre,
    rule_params or previous to read or write."""

    __slots__ = ("spec", "recorded")

    def __init__(self, rule: str, f: int = 1, params=None, pre=()) -> None:
        self.spec = PipelineSpec(rule=rule, params=dict(params or {}), f=f, pre=tuple(pre))
        self.recorded: list[torch.Tensor] = []

    def record(self, aggregate: torch.Tensor) -> None:
        self.recorded.append(aggregate)


def _round(n, d=16, seed=0, scale=0.1):
    g = torch.Generator().manual_seed(seed)
    x = 0.5 + scale * torch.randn(n, d, generator=g)
    msgs = [Message(100 + i, x[i].clone()) for i in range(n)]
    return msgs, x, RoundContext(1, 0, tuple(m.client_id for m in msgs), 0)


def test_pipeline_spec_describes_what_it_aggregates_read_only():
    pipe = RobustPipeline("multi_krum", {"m": 3}, [("nnm", {}), ("bucketing", {"s": 2})], 2, 0)
    spec = pipe.spec
    assert spec == PipelineSpec(rule="multi_krum", params={"m": 3}, f=2, pre=("nnm", "bucketing"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.rule = "mean"
    with pytest.raises(TypeError):
        spec.params["m"] = 4  # a read-only view
    assert pipe.spec.params["m"] == 3


def test_record_remembers_what_calling_the_pipeline_remembers():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    y = torch.randn(6, 5, generator=torch.Generator().manual_seed(2))
    called = RobustPipeline("centered_clipping", {}, [], 1, 0)
    out = called(x, 1)
    recorded = RobustPipeline("centered_clipping", {}, [], 1, 0)
    recorded.record(out)
    assert recorded.previous is out  # what the engine checkpoints
    assert torch.equal(recorded.apply(y, 2), called.apply(y, 2))


def test_secagg_aggregates_through_the_interface_only():
    msgs, x, ctx = _round(4)
    pipe = SpecOnly("mean", f=0)
    proto = SecAggProtocol(SecAggConfig(), key_seed=0)
    agg = proto.aggregate(msgs, pipe, ctx)
    assert pipe.recorded == [agg.vector]
    assert (agg.vector.double() - x.double().mean(0)).abs().max() <= proto.quantization_error_bound(4) + 1e-6


def test_he_aggregates_through_the_interface_only():
    msgs, x, ctx = _round(5)
    pipe = SpecOnly("trimmed_mean", f=1)
    agg = HEProtocol(backend="emulator").aggregate(msgs, pipe, ctx)
    assert len(pipe.recorded) == 1 and pipe.recorded[0] is agg.vector
    assert agg.vector.shape == (16,) and bool(torch.isfinite(agg.vector).all())


def test_tee_aggregates_through_the_interface_only():
    msgs, x, ctx = _round(5)
    pipe = SpecOnly("krum", f=1)
    with TEEProtocol(TEEConfig(clip=40.0, processes=False)) as proto:
        agg = proto.aggregate(msgs, pipe, ctx)
    assert len(pipe.recorded) == 1 and pipe.recorded[0] is agg.vector
    assert torch.equal(agg.vector, AGGREGATORS.get("krum")(x, f=1))


def _protocols():
    return [SecAggProtocol(), HEProtocol(backend="emulator"), TEEProtocol(TEEConfig(processes=False))]


@pytest.mark.parametrize("proto", _protocols(), ids=lambda p: p.name)
def test_declared_rules_are_what_the_check_accepts(proto):
    performs = set(proto.performs())
    assert performs  # each performs some rule itself
    for rule in AGGREGATORS.names():
        accepted = True
        try:
            proto.check(SpecOnly(rule))
        except ProtocolError:
            accepted = False
        assert accepted == (rule in performs), rule
    for rule in performs:  # none of them runs pre-aggregators, which need the individual updates
        with pytest.raises(ProtocolError):
            proto.check(SpecOnly(rule, pre=("nnm",)))


def test_declared_rules():
    assert SecAggProtocol().performs() == ("mean",)
    assert HEProtocol(backend="emulator").performs() == ("trimmed_mean", "median")
    assert set(TEEProtocol().performs()) == {"krum", "multi_krum", "bulyan", "norm_filter", "cosine_filter"}
    assert PlainProtocol().performs() is None  # runs the pipeline itself: every rule


def test_no_protocol_reads_or_writes_pipeline_attributes():
    root = Path(__file__).resolve().parents[2] / "src" / "fedsafe" / "protocols"
    internals = re.compile(r"pipeline\.(rule_name|rule_params|pre|f|previous|rule|history)\b")
    found = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for p in sorted(root.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if internals.search(line)
    ]
    assert found == []
