"""``protocol = "he"``: config validation, refusals, the SABLE round against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedsafe.core.protocol import ProtocolError
from fedsafe.core.streams import numpy_stream
from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.he import HEConfig, HEProtocol, HEProtocolError, Quantizer
from fedsafe.robust.pipeline import RobustPipeline


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _pipe(rule="trimmed_mean", f=1, pre=()):
    return RobustPipeline(rule, {}, list(pre), f, 0)


def _ctx(n, round_=3, seed=11, byz=0):
    return RoundContext(round_, seed, tuple(range(100, 100 + n)), byz)


def _messages(n, d, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * scale
    x[0, :5] = 100.0  # far outside the clamp: a Byzantine-looking value
    x[1, 5:10] = x[2, 5:10]  # ties
    return [Message(100 + i, x[i].clone()) for i in range(n)], x


def _quantized(x, delta, clamp):
    return Quantizer(delta, clamp).quantize(x.double().numpy())


def test_config_is_strict_and_ranged():
    assert HEConfig().delta == 4 and HEConfig().backend == "bfv"
    with pytest.raises(ValidationError):
        HEConfig(delta=1)
    with pytest.raises(ValidationError):
        HEConfig(delta=9)
    with pytest.raises(ValidationError):
        HEConfig(clamp=0)
    with pytest.raises(ValidationError):
        HEConfig(backend="ckks")
    with pytest.raises(ValidationError):
        HEConfig(workers=0)
    with pytest.raises(ValidationError, match="extra"):
        HEConfig(bitz=4)  # (he.bits is a key now: it replaced he.delta, issue #27 item 4)
    with pytest.raises(ValidationError, match="exceeds he.delta"):
        HEConfig(delta=3, digits=4)
    assert HEProtocol({"delta": 3, "clamp": 0.01}).config.clamp == 0.01


@pytest.mark.parametrize("rule", ["mean", "krum", "geometric_median", "centered_clipping"])
def test_check_refuses_other_rules_with_reason(rule):
    with pytest.raises(ProtocolError, match="only coordinate-wise rules.*encrypted"):
        HEProtocol(backend="emulator").check(RobustPipeline(rule, {}, [], 1, 0))


def test_check_refuses_preaggregators():
    pipe = RobustPipeline("trimmed_mean", {}, [("nnm", {})], 1, 0)
    with pytest.raises(ProtocolError, match="pre-aggregators \\(nnm\\)"):
        HEProtocol(backend="emulator").check(pipe)
    HEProtocol(backend="emulator").check(_pipe("median"))


@pytest.mark.parametrize("n,f,delta", [(5, 1, 4), (6, 2, 3), (7, 0, 2), (9, 3, 5)])
def test_emulated_round_is_the_trimmed_mean_of_quantized_messages(n, f, delta):
    clamp = 0.5
    msgs, x = _messages(n, 300, seed=n)
    proto = HEProtocol(backend="emulator", delta=delta, clamp=clamp)
    agg = proto.aggregate(msgs, _pipe(f=f), _ctx(n))
    q = np.sort(_quantized(x, delta, clamp), axis=0)
    want = q[f : n - f].sum(axis=0) / (n - 2 * f) / Quantizer(delta, clamp).scale
    assert agg.vector.dtype == torch.float32 and agg.vector.shape == (300,)
    assert np.array_equal(agg.vector.numpy(), want.astype(np.float32))
    for key in ("he_encrypt_seconds", "he_hts_seconds", "he_decrypt_seconds", "bytes_up", "bytes_down"):
        assert key in agg.cost
    assert agg.metrics["he_selected"] == n - 2 * f


@pytest.mark.parametrize("n", [4, 5])
def test_emulated_median_matches_numpy_median_of_quantized(n):
    msgs, x = _messages(n, 200, seed=7)
    agg = HEProtocol(backend="emulator", delta=4, clamp=1.0).aggregate(msgs, _pipe("median", f=1), _ctx(n))
    q = _quantized(x, 4, 1.0)
    want = np.median(q, axis=0) / Quantizer(4, 1.0).scale
    assert np.array_equal(agg.vector.numpy(), want.astype(np.float32))


def test_subsample_draws_2f_plus_1_from_the_seeded_stream_and_takes_their_median():
    n, f = 9, 2
    msgs, x = _messages(n, 100, seed=3)
    proto = HEProtocol(backend="emulator", delta=4, clamp=1.0, subsample=True)
    ctx = _ctx(n, round_=5, seed=42)
    agg = proto.aggregate(msgs, _pipe(f=f), ctx)
    chosen = sorted(numpy_stream(42, "he.subsample", 5).choice(n, size=2 * f + 1, replace=False).tolist())
    assert agg.seen["server"]["subsample"] == chosen
    assert proto.subsample(n, f, ctx) == chosen
    assert proto.subsample(n, f, _ctx(n, round_=6, seed=42)) != chosen or n < 2 * f + 2
    q = _quantized(x, 4, 1.0)[chosen]
    assert np.array_equal(agg.vector.numpy(), (np.median(q, axis=0) / Quantizer(4, 1.0).scale).astype(np.float32))
    assert agg.metrics["he_inputs"] == 2 * f + 1 and agg.metrics["he_selected"] == 1
    # nothing to gain when n = 2f+1 already: all inputs are used
    assert HEProtocol(backend="emulator", subsample=True).subsample(5, 2, ctx) == [0, 1, 2, 3, 4]


def test_round_refuses_too_few_inputs_for_f():
    msgs, _ = _messages(4, 10)
    with pytest.raises(ProtocolError, match="more than 2f=4"):
        HEProtocol(backend="emulator").aggregate(msgs, _pipe(f=2), _ctx(4))


def test_round_refuses_impossible_parameters_with_reason():
    msgs, _ = _messages(15, 10)
    proto = HEProtocol(backend="emulator", delta=4, poly_modulus_degree=8192)
    with pytest.raises(ProtocolError, match="no 128-bit-secure BFV parameters"):
        proto.aggregate(msgs, _pipe(f=3), _ctx(15))


# ----------------------------------------------------------------------------- BFV rounds


def test_bfv_round_equals_emulated_round_bit_for_bit():
    pytest.importorskip("tenseal")
    n, f = 3, 1
    msgs, x = _messages(n, 50, seed=1)
    cfg = {"delta": 2, "clamp": 0.4}
    emu = HEProtocol(backend="emulator", **cfg).aggregate(msgs, _pipe(f=f), _ctx(n))
    proto = HEProtocol(backend="bfv", **cfg)
    try:
        agg = proto.aggregate(msgs, _pipe(f=f), _ctx(n))
    finally:
        proto.close()
    assert torch.equal(agg.vector, emu.vector)
    server_saw = agg.seen["server"]
    assert "no secret key" in server_saw["keys"] and server_saw["subsample"] is None
    assert agg.cost["bytes_up"] == float(sum(server_saw["bytes_per_node"])) > 0
    assert agg.cost["bytes_down"] > 0 and agg.cost["he_setup_bytes"] > 0
    assert agg.cost["he_hts_seconds"] > 0 and agg.metrics["he_model_budget_bits"] >= 12


def test_bfv_round_rejects_a_malformed_upload_naming_the_client(monkeypatch):
    pytest.importorskip("tenseal")
    import dataclasses

    n = 3
    msgs, _ = _messages(n, 20, seed=2)
    proto = HEProtocol(backend="bfv", delta=2, clamp=1.0)
    real = proto._encrypt

    def tamper(node, client_id, row):
        up = real(node, client_id, row)
        if client_id == 101:
            return dataclasses.replace(up, ciphertexts=((b"\x00" * 64,),))
        return up

    monkeypatch.setattr(proto, "_encrypt", tamper)
    try:
        with pytest.raises(HEProtocolError, match="client 101") as info:
            proto.aggregate(msgs, _pipe(f=1), _ctx(n))
    finally:
        proto.close()
    assert info.value.client_id == 101


def test_preflight_plans_before_the_run():
    proto = HEProtocol(backend="emulator", delta=4)
    plan = proto.preflight(15, _pipe(f=3))
    assert plan.spec.n == 15 and plan.spec.selected == 9
    assert HEProtocol(backend="emulator", subsample=True).preflight(15, _pipe(f=3)).spec.n == 7
    with pytest.raises(ProtocolError, match="more than 2f"):
        proto.preflight(6, _pipe(f=3))
    with pytest.raises(ProtocolError, match="no 128-bit-secure"):
        HEProtocol(backend="emulator", poly_modulus_degree=8192).preflight(15, _pipe(f=3))
