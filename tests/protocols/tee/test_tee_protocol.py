"""TEEProtocol end to end (in-process parties): selections and aggregates equal plaintext."""

import math
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from fedsafe.core.protocol import ProtocolError
from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.tee import COST_KEYS, TEEConfig, TEEProtocol
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.distances import pairwise_sq_distances
from fedsafe.robust.filters import (
    cosine_filter,
    cosine_filter_select,
    norm_filter,
    norm_filter_select,
)
from fedsafe.robust.krum import multi_krum_select
from fedsafe.robust.pipeline import RobustPipeline


def fake_pipeline(rule, f, **params):
    return SimpleNamespace(rule_name=rule, pre=[], f=f, rule_params=params, previous=None)


def attacked(n=15, f=3, d=300, seed=0):
    """Honest updates around a common direction + f identical ALIE-style updates."""
    gen = torch.Generator().manual_seed(seed)
    honest = 0.5 + 0.1 * torch.randn(n - f, d, generator=gen)
    alie = honest.mean(0) + 1.5 * honest.std(0, unbiased=False)
    return torch.cat([honest, alie.expand(f, d)])


def run(g, pipe, *, rounds=(1,), **cfg):
    cfg = {"clip": 40.0, "processes": False, **cfg}  # above every norm here: nothing clipped
    with TEEProtocol(TEEConfig(**cfg)) as proto:
        out = []
        for r in rounds:
            msgs = [Message(100 + i, g[i]) for i in range(g.shape[0])]
            out.append(proto.aggregate(msgs, pipe, RoundContext(r, 0, tuple(m.client_id for m in msgs), pipe.f)))
    return out if len(out) > 1 else out[0]


def test_multi_krum_selection_and_aggregate_equal_plaintext():
    g = attacked()
    pipe = RobustPipeline("multi_krum", {}, [], 3, 0)
    agg = run(g, pipe, noise_ratio=1e8)
    want = multi_krum_select(pairwise_sq_distances(g, dtype=torch.float64), 3)
    assert sorted(agg.seen["selected_clients"]) == sorted(100 + int(i) for i in want)
    assert torch.equal(agg.vector, AGGREGATORS.get("multi_krum")(g, f=3))
    assert agg.metrics["selected"] == 12
    assert pipe.previous is agg.vector


@pytest.mark.parametrize("rule,params", [("krum", {}), ("bulyan", {}), ("multi_krum", {"m": 5})])
def test_distance_rules_equal_plaintext(rule, params):
    g = attacked(seed=1)
    pipe = RobustPipeline(rule, params, [], 3, 0)
    agg = run(g, pipe)
    assert torch.equal(agg.vector, AGGREGATORS.get(rule, params)(g, f=3))


def test_gram_filters_equal_plaintext_and_their_formulas():
    g = attacked(seed=2)
    g[0] *= 10  # one oversized update
    g[1] = -g[1]  # one flipped update
    for rule, plain, params in [("norm_filter", norm_filter, {"factor": 1.5}), ("cosine_filter", cosine_filter, {})]:
        agg = run(g, fake_pipeline(rule, 3, **params), clip=200.0)
        assert agg.metrics["clipped"] == 0
        assert torch.equal(agg.vector, plain(g, f=3, **params))
    # the formulas on a hand example: norms 1, 1, 1, 10 (median 1) and one reversed direction
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [10.0, 0.0], [-1.0, -0.1]])
    gx = x.double() @ x.double().T
    assert norm_filter_select(gx, 1, 2.0).tolist() == [0, 1, 2, 4]
    assert cosine_filter_select(gx, 1).tolist() == [0, 1, 2, 3]


def test_check_refuses_coordinatewise_rules_and_preaggregators_with_reasons():
    proto = TEEProtocol(TEEConfig(processes=False))
    for rule in ("median", "trimmed_mean", "meamed", "mean"):
        with pytest.raises(ProtocolError, match="coordinates"):
            proto.check(RobustPipeline(rule, {}, [], 1, 0))
    with pytest.raises(ProtocolError, match="robust.pre"):
        proto.check(RobustPipeline("multi_krum", {}, [("nnm", {})], 1, 0))
    with pytest.raises(ProtocolError, match="valid: factor"):
        proto.check(fake_pipeline("norm_filter", 1, factr=2.0))
    for rule in ("krum", "multi_krum", "bulyan"):
        proto.check(RobustPipeline(rule, {}, [], 1, 0))
    for rule in ("norm_filter", "cosine_filter"):
        proto.check(fake_pipeline(rule, 1))
    assert proto.session is None  # checking starts nothing


def test_more_participants_than_dimensions_is_refused():
    g = torch.randn(6, 4)
    with pytest.raises(ProtocolError, match="orthogonal"):
        run(g, RobustPipeline("multi_krum", {}, [], 1, 0))


def test_costs_metrics_and_what_was_seen():
    n, d, rho = 9, 400, 1e4
    g = attacked(n=n, f=2, d=d, seed=3)
    a1, a2, a3 = run(g, RobustPipeline("multi_krum", {}, [], 2, 0), rounds=(1, 2, 3), noise_ratio=rho,
                     precompute_rounds=2)
    assert set(COST_KEYS) <= set(a2.cost)
    assert all(v >= 0 for v in a2.cost.values())
    # the offline phase runs when the pool is empty: before rounds 1 and 3, 2 blocks each time
    assert [a.cost["noise_precompute_seconds"] > 0 for a in (a1, a2, a3)] == [True, False, True]
    assert all(a.metrics["noise_online"] == 0 for a in (a1, a2, a3))
    assert a2.cost["bytes_to_accelerator_1"] > n * d * 8 and a2.cost["bytes_up"] > n * d * 4
    bits = sum(0.5 * math.log2(1 + 1 / rho) for _ in range(d))  # Σ_k ½ log2(1 + Var/σ²), Var/σ² = 1/ρ
    assert a2.metrics["mi_bound_bits"] == pytest.approx(bits, rel=1e-12)
    assert a2.metrics["mi_bound_bits_total"] == pytest.approx(2 * bits, rel=1e-12)
    c = 2 * rho * 40.0**2  # C = 2ρ clip²
    for i in (1, 2):
        seen = a2.seen[f"accelerator_{i}"]
        assert seen["matches_enclave"] and seen["shape"] == (n, d)
        dev = torch.linalg.vector_norm(seen["Y"] - g.double(), dim=1)  # ‖Y − g‖ = ‖R‖ = √(C/2)
        torch.testing.assert_close(dev, torch.full((n,), math.sqrt(c / 2), dtype=torch.float64), rtol=1e-9, atol=0)


def test_nonfinite_excluded_and_oversized_clipped_inside_the_enclave():
    g = attacked(n=12, f=2, d=200, seed=4)
    g[3, 7] = math.nan
    g[5] *= 1e4
    clip = 50.0
    agg = run(g, RobustPipeline("multi_krum", {}, [], 2, 0), clip=clip)
    assert agg.metrics["excluded_nonfinite"] == 1 and agg.metrics["clipped"] == 1
    kept = torch.cat([g[:3], g[4:]])
    kept[4] = (kept[4].double() * (clip / torch.linalg.vector_norm(kept[4].double()))).float()
    assert torch.equal(agg.vector, AGGREGATORS.get("multi_krum")(kept, f=2))


def test_target_bits_sets_the_noise():
    g = attacked(n=8, f=1, d=1000, seed=5)
    agg = run(g, RobustPipeline("krum", {}, [], 1, 0), target_bits=0.25)
    assert agg.metrics["mi_bound_bits"] == pytest.approx(0.25, rel=1e-9)


def test_config_validation():
    with pytest.raises(ValidationError, match="not both"):
        TEEConfig(noise_ratio=1e4, target_bits=1.0)
    with pytest.raises(ValidationError):
        TEEConfig(clip=0)
    with pytest.raises(ValidationError):
        TEEConfig(noise_ratio=float("inf"))
    with pytest.raises(ValidationError):
        TEEConfig(arithmetic="float32")
    with pytest.raises(ValidationError):
        TEEConfig(unknown=1)
    assert TEEConfig().resolved_noise_ratio(100) == 1e6


def test_plaintext_filters_are_registrable_rules():
    from fedsafe.core.registry import Registry

    reg = Registry("aggregation rule", reserved=("f", "previous"))
    reg.register("norm_filter")(norm_filter)
    reg.register("cosine_filter")(cosine_filter)
    assert set(reg.entry("norm_filter").params) == {"factor"} and not reg.entry("cosine_filter").params
    g = attacked(seed=6)
    assert torch.equal(reg.get("norm_filter", {"factor": 3.0})(g, f=3), norm_filter(g, f=3, factor=3.0))
