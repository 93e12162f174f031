"""The round written once (issue #27, items 1 and 2): ``fedsafe.engine.round`` runs the stages for
the engine and the Flower strategy from a plan resolved once; subsystems implement only the
plugin interfaces they need; rules, client algorithms and plugins own their state."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsafe.core.plugins import (
    ClientTransform,
    HostView,
    ModelState,
    Observer,
    Plugin,
    RoundPlugin,
    ServerTransform,
    implementing,
)
from fedsafe.core.protocol import PlainProtocol, ProtocolError
from fedsafe.core.types import RoundContext
from fedsafe.engine.round import aggregate_and_step, end_round, plugin_summary, release_empty, resolve_plan
from fedsafe.robust.pipeline import RobustPipeline

SRC = Path(__file__).resolve().parents[2] / "src" / "fedsafe"

TINY = {
    "rounds": 2, "seed": 3, "eval_every": 1,
    "data": {"name": "digits", "max_train": 300}, "model": {"name": "logreg"}, "clients": {"num_clients": 6},
}


class Log(ServerTransform, Observer):
    """A server transform and observer that records what it is handed."""

    name = "log"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def extra_messages(self, ctx, dim):
        self.calls.append("extra_messages")
        return []

    def transform_messages(self, messages, ctx):
        self.calls.append("transform_messages")
        return messages

    def transform_aggregate(self, vector, ctx, agg):
        self.calls.append("transform_aggregate")
        return vector

    def on_round_end(self, fed, row):
        self.calls.append("on_round_end")
        return {"log_round": fed.state.round}

    def summary(self, fed):
        return {"log_rounds": len([c for c in self.calls if c == "on_round_end"])}


class Double(ClientTransform):
    """A client transform alone: doubles each row; counts what remote clients reported."""

    name = "double"

    def __init__(self) -> None:
        self.seen: list[list[dict[str, float]]] = []

    def transform_honest(self, updates, ctx, ids):
        return 2 * updates

    def observe_honest(self, ctx, ids, reports):
        self.seen.append(list(reports))


def _plan(plugins, **kw):
    pipeline = RobustPipeline("mean", {}, [], 0, 0)
    return resolve_plan(PlainProtocol(), pipeline, plugins, lambda v, t: -v, **kw)


def test_each_stage_runs_over_the_plugins_that_implement_it():
    log, double = Log(), Double()
    plan = _plan([double, log])
    assert plan.transform_honest == (double,) and plan.observe_honest == (double,)
    assert plan.extra_messages == plan.transform_aggregate == plan.on_round_end == (log,)
    assert plan.stages == ("transform_honest", "extra_messages", "transform_messages", "aggregate",
                           "transform_aggregate", "decode", "step", "on_round_end")
    assert implementing([double, log, object()], "summary") == (log,)
    # the old all-in-one interface is the three parts together
    assert issubclass(Plugin, ClientTransform) and issubclass(Plugin, ServerTransform) and issubclass(Plugin, Observer)
    assert not issubclass(Log, ClientTransform) and issubclass(Log, RoundPlugin)


def test_the_round_transforms_aggregates_decodes_and_steps_in_order():
    log, double = Log(), Double()
    plan = _plan([double, log])
    ctx = RoundContext(1, 0, (0, 1), 0)
    steps: list[torch.Tensor] = []
    row: dict = {}
    skip = aggregate_and_step(plan, ctx, np.array([0, 1]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), row, steps.append)
    assert skip is None
    torch.testing.assert_close(steps[0], -torch.tensor([4.0, 6.0]))  # the mean of the doubled rows, decoded
    assert log.calls == ["extra_messages", "transform_messages", "transform_aggregate"]
    assert "aggregate_seconds" in row and row["excluded_nonfinite"] == 0
    host = HostView(cfg=None, state=ModelState(1, steps[0]), out_dir=None, rows=[])
    end_round(plan, host, row)
    assert row["log_round"] == 1 and plugin_summary(plan, host) == {"log_rounds": 1}


def test_remote_clients_are_observed_not_transformed_and_cost_can_stay_out_of_the_row():
    double = Double()
    plan = _plan([double], clients_remote=True, record_cost=False)
    steps: list[torch.Tensor] = []
    row: dict = {}
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    aggregate_and_step(plan, RoundContext(1, 0, (0, 1), 0), np.array([0, 1]), x, row, steps.append,
                       reports=[{"a": 1.0}, {}])
    torch.testing.assert_close(steps[0], -x.mean(0))  # the clients transformed their own rows
    assert double.seen == [[{"a": 1.0}, {}]] and "aggregate_seconds" not in row


def test_a_skipped_round_says_why_and_does_not_step():
    steps: list[torch.Tensor] = []
    plan = _plan([])
    nan = torch.full((2, 2), float("nan"))
    assert aggregate_and_step(plan, RoundContext(1, 0, (0, 1), 0), np.array([0, 1]), nan, {}, steps.append) == \
        "round 1: every update was non-finite"
    inf = dataclasses.replace(plan, decode=lambda v, t: v * float("inf"))
    assert aggregate_and_step(inf, RoundContext(1, 0, (0,), 0), np.array([0]), torch.ones(1, 2), {}, steps.append) == \
        "non-finite aggregate"
    strict = _plan([], skip_on=())
    with pytest.raises(ProtocolError):
        aggregate_and_step(strict, RoundContext(1, 0, (0, 1), 0), np.array([0, 1]), nan, {}, steps.append)
    assert steps == []
    assert release_empty(plan, RoundContext(1, 0, (), 0), 2, steps.append) is False


def test_the_engine_runs_plugins_of_any_part():
    from fedsafe import Experiment

    log = Log()
    result = Experiment(TINY, plugins=[log]).run()
    assert [r["log_round"] for r in result.rows] == [1, 2]
    assert log.calls.count("on_round_end") == 2 and log.calls.count("transform_aggregate") == 2
    fed = result.federation
    assert fed.plan.plugins[-1] is log and fed.plan.protocol is fed.protocol and fed.plan.pipeline is fed.pipeline


def test_the_engine_and_the_strategy_share_the_round_module():
    federation = (SRC / "engine" / "federation.py").read_text()
    strategy = (SRC / "flower" / "strategy.py").read_text()
    for src in (federation, strategy):
        assert "from fedsafe.engine.round import" in src and "aggregate_and_step(" in src
        assert ".transform_aggregate(" not in src and ".protocol.aggregate(" not in src
    assert "SimpleNamespace" not in strategy


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_client_work_knows_no_subsystem_and_the_engine_no_rule():
    clients = SRC / "engine" / "clients.py"
    assert not any(m.startswith("fedsafe.zo") or m.startswith("fedsafe.privacy") for m in _imports(clients))
    assert "self.inherent" not in clients.read_text()
    federation = (SRC / "engine" / "federation.py").read_text()
    assert "RootUpdate" not in federation and "server_update =" not in federation.split("class Federation")[1]


def test_fltrust_root_update_belongs_to_the_pipeline():
    from fedsafe import Experiment

    raw = {**TINY, "robust": {"rule": "fltrust", "params": {"root_size": 20}}}
    fed = Experiment(raw).federation()
    assert fed.root is fed.pipeline.root and fed.root.work.data.x_train.shape[0] == 20
    fed.run_round()
    assert fed.pipeline.server_update is not None
    assert set(fed.pipeline.state_dict()) == {"_root"}
    mean = RobustPipeline("mean", {}, [], 0, 0)
    mean.attach_server_data(None, 0, None)  # a rule that takes no server_update: nothing to attach
    assert mean.root is None and mean.state_dict() == {}


def test_one_switch_per_subsystem_its_sections_enabled():
    from fedsafe.config import validate
    from fedsafe.core.plugins import section_enabled

    cfg = validate(TINY)
    assert section_enabled(cfg, "dp") is False and section_enabled(cfg, "audit") is False
    assert section_enabled(cfg, "inherent") is False  # an absent optional section is off
    assert section_enabled(cfg, "aggregate_norm") is None  # no such section: the plugin decides
    on = validate({**TINY, "dp": {"enabled": True, "noise_multiplier": 1.0},
                   "audit": {"canaries": 4}, "clients": {"num_clients": 6, "algorithm": "fedavg"}})
    assert section_enabled(on, "dp") is True and section_enabled(on, "audit") is True
