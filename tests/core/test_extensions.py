"""The extension points: a protocol, a round plugin and a client algorithm registered from
outside fedsafe run in the engine unchanged; lazy registrations cost no import."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from fedsafe.config import apply_overrides, validate
from fedsafe.core.clients import CLIENT_ALGORITHMS, ClientAlgorithm, LocalResult
from fedsafe.core.errors import ConfigError
from fedsafe.core.plugins import ROUND_PLUGINS, Plugin
from fedsafe.core.protocol import PROTOCOLS, PlainProtocol
from fedsafe.core.registry import Registry, RegistryError
from fedsafe.engine.federation import Federation


def small(**over):
    raw = {
        "seed": 1, "rounds": 3, "eval_every": 3,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": 6, "batch_size": 16},
        "server": {"lr": 0.5},
    }
    return validate(apply_overrides(raw, over))


@contextmanager
def registered(registry, name, impl, **kw):
    registry.register(name, **kw)(impl)
    try:
        yield
    finally:
        registry.unregister(name)


class CountingPlain(PlainProtocol):
    """plain aggregation that counts its rounds and reports a metric"""

    name = "counting_plain"

    def __init__(self):
        self.rounds = 0

    def aggregate(self, messages, pipeline, ctx):
        self.rounds += 1
        agg = super().aggregate(messages, pipeline, ctx)
        agg.metrics["counted"] = float(self.rounds)
        return agg


def test_a_registered_protocol_runs_and_equals_plain_when_it_aggregates_alike():
    with registered(PROTOCOLS, "counting_plain", lambda cfg: CountingPlain()):
        fed = Federation(small(protocol="counting_plain"))
        fed.run()
        assert fed.protocol.rounds == 3 and [r["counted"] for r in fed.rows] == [1.0, 2.0, 3.0]
    plain = Federation(small())
    plain.run()
    torch.testing.assert_close(fed.state.params, plain.state.params, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown protocol 'counting_plain'; valid: he, plain, secagg, tee"):
        small(protocol="counting_plain")


class RoundCounter(Plugin):
    name = "round_counter"

    def __init__(self, dim):
        self.dim, self.seen = dim, []

    def transform_aggregate(self, vector, ctx, agg):
        self.seen.append(ctx.round)
        return vector

    def on_round_end(self, fed, row):
        return {"counter_rounds": len(self.seen)}


def test_a_registered_round_plugin_is_made_from_the_setup_and_sees_every_round():
    made = []

    def factory(setup):
        made.append(setup)
        return RoundCounter(setup.initial.numel())

    with registered(ROUND_PLUGINS, "round_counter", factory):
        fed = Federation(small())
        fed.run()
    plug = [p for p in fed.plugins if isinstance(p, RoundCounter)]
    assert len(plug) == 1 and plug[0].seen == [1, 2, 3] and plug[0].dim == 64 * 10 + 10
    assert fed.rows[-1]["counter_rounds"] == 3
    assert made[0].client_sizes and sum(made[0].client_sizes) == len(fed.data.y_train)
    assert all(not isinstance(p, RoundCounter) for p in Federation(small()).plugins)  # unregistered


def test_a_plugin_factory_value_error_is_a_config_error_naming_the_plugin():
    def factory(setup):
        raise ValueError("needs [counter] settings")

    with registered(ROUND_PLUGINS, "counter", factory), pytest.raises(ConfigError, match="counter: needs"):
        Federation(small())


class SignSGD(ClientAlgorithm):
    """one minibatch gradient; sends its sign"""

    def run(self, work, round_, params, ids, momentum, label_transform):
        x, y = work.batch(round_, 0, ids, label_transform)
        g, losses = work.backend.gradients(params, x, y)
        return LocalResult(torch.sign(g), losses, None)


def test_a_registered_client_algorithm_runs_through_every_backend():
    with registered(CLIENT_ALGORITHMS, "signsgd", SignSGD):
        rows = []
        for execution in ("serial", "vectorized"):
            fed = Federation(small(execution=execution, **{"clients.algorithm": "signsgd"}))
            fed.run()
            rows.append(fed.state.params)
            assert set(torch.unique(fed.work.run(1, fed.state.params, np.array([0, 1])).updates).tolist()) <= {-1.0, 0.0, 1.0}
        torch.testing.assert_close(rows[0], rows[1])
    with pytest.raises(ValueError, match="unknown client algorithm 'signsgd'; valid: dsgd, fedavg, inherent"):
        small(**{"clients.algorithm": "signsgd"})


def test_lazy_registrations_are_listed_without_importing_their_modules():
    code = (
        "import sys; from fedsafe.core.protocol import PROTOCOLS; from fedsafe.core.plugins import ROUND_PLUGINS; "
        "from fedsafe.core.clients import CLIENT_ALGORITHMS; "
        "print(PROTOCOLS.names(), ROUND_PLUGINS.ordered(), len(CLIENT_ALGORITHMS.names()), "
        "[m for m in ('fedsafe.protocols.secagg.protocol', 'fedsafe.protocols.tee.protocol', 'fedsafe.privacy.dp.plugin', "
        "'fedsafe.zo.algorithms', 'fedsafe.engine') if m in sys.modules])"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "['he', 'plain', 'secagg', 'tee'] ['dp', 'inherent', 'audit', 'crfl'] 5 []"


def test_registry_tags_lazy_entries_and_unregister():
    reg = Registry("widget")

    @reg.register("a", tags=("round",), shape="circle")
    def a(*, size: int = 1):
        """a round widget"""

    reg.register_lazy("b", "fedsafe.core.types:vector_problem", "lazily loaded")
    assert reg.names() == ["a", "b"] and reg.tagged("round") == ["a"]
    assert reg.entry("a").meta == {"shape": "circle"} and list(reg.entry("a").params) == ["size"]
    assert reg.summary("b") == "lazily loaded"
    from fedsafe.core.types import vector_problem

    assert reg.entry("b").impl is vector_problem
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("a")(a)
    with pytest.raises(RegistryError, match="'module:attribute'"):
        reg.register_lazy("c", "no_colon")
    reg.unregister("a")
    assert reg.names() == ["b"]
    with pytest.raises(RegistryError, match="unknown widget 'a'; valid: b"):
        reg.entry("a")


def test_the_tee_reads_its_rules_from_the_registry_tags():
    from fedsafe.protocols.tee.rules import tee_rules
    from fedsafe.robust.aggregators import AGGREGATORS

    assert tee_rules() == {"bulyan": (), "cosine_filter": (), "krum": (), "multi_krum": ("m",), "norm_filter": ("factor",)}
    assert set(tee_rules()) == set(AGGREGATORS.tagged("distance_split"))
