"""Wire format: round trips, fuzzed decoders and parties, and the stateful checks."""

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsafe.protocols.secagg import InMemoryTransport, SecAggConfig, SecAggError
from fedsafe.protocols.secagg.client import ClientParty
from fedsafe.protocols.secagg.crypto import SeededRandomness
from fedsafe.protocols.secagg.pki import Enrolment
from fedsafe.protocols.secagg.server import ServerParty
from fedsafe.protocols.secagg.shamir import PRIME
from fedsafe.protocols.secagg.wire import (
    HEADER_BYTES,
    SEALED_BYTES,
    SERVER,
    Advertise,
    ConsistencyCheck,
    ConsistencySignature,
    Forward,
    Header,
    Keys,
    Limits,
    Masked,
    MsgType,
    Setup,
    ShareKind,
    SharePlaintext,
    Shares,
    Signatures,
    SignedAdvertise,
    SignedKeys,
    Unmask,
    UnmaskRequest,
    decode,
    decode_share_plaintext,
    encode,
    encode_share_plaintext,
)

IDS = [0, 1, 2]
D = 8
SESSION = bytes(range(16))
# FEDSAFE_FUZZ_EXAMPLES=5000 for a deep run; the default keeps the suite fast
FUZZ = settings(
    max_examples=int(os.environ.get("FEDSAFE_FUZZ_EXAMPLES", "150")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def pk(i):
    return bytes([i]) * 32


SAMPLES = {
    MsgType.SETUP: (Header(MsgType.SETUP, SESSION, 1, SERVER, 0), Setup(D, 32, 28, 2, ((D - 1, -1.0, 1.0), (1, -0.5, 1.5)), (1, 2))),
    MsgType.ADVERTISE: (Header(MsgType.ADVERTISE, SESSION, 1, 0, SERVER), Advertise(pk(1), pk(2))),
    MsgType.KEYS: (Header(MsgType.KEYS, SESSION, 1, SERVER, 0), Keys(((1, pk(3), pk(4)), (2, pk(5), pk(6))))),
    MsgType.SHARES: (Header(MsgType.SHARES, SESSION, 1, 0, SERVER), Shares(((1, b"a" * SEALED_BYTES), (2, b"b" * SEALED_BYTES)))),
    MsgType.FORWARD: (Header(MsgType.FORWARD, SESSION, 1, SERVER, 0), Forward(((1, b"c" * SEALED_BYTES),))),
    MsgType.MASKED: (Header(MsgType.MASKED, SESSION, 1, 0, SERVER), Masked(np.arange(D, dtype="<u4") * 12345)),
    MsgType.UNMASK_REQUEST: (Header(MsgType.UNMASK_REQUEST, SESSION, 1, SERVER, 0), UnmaskRequest((0, 2), (1,))),
    MsgType.UNMASK: (Header(MsgType.UNMASK, SESSION, 1, 0, SERVER),
                     Unmask(((0, ShareKind.SELF_MASK_SEED, 5), (1, ShareKind.MASK_KEY, PRIME - 1)))),
    MsgType.SIGNED_ADVERTISE: (Header(MsgType.SIGNED_ADVERTISE, SESSION, 1, 0, SERVER),
                               SignedAdvertise(pk(1), pk(2), b"s" * 64)),
    MsgType.SIGNED_KEYS: (Header(MsgType.SIGNED_KEYS, SESSION, 1, SERVER, 0),
                          SignedKeys(((1, pk(3), pk(4), b"a" * 64), (2, pk(5), pk(6), b"b" * 64)))),
    MsgType.CONSISTENCY_CHECK: (Header(MsgType.CONSISTENCY_CHECK, SESSION, 1, SERVER, 0), ConsistencyCheck((0, 1, 2))),
    MsgType.CONSISTENCY_SIGNATURE: (Header(MsgType.CONSISTENCY_SIGNATURE, SESSION, 1, 0, SERVER),
                                    ConsistencySignature(b"c" * 64)),
    MsgType.SIGNATURES: (Header(MsgType.SIGNATURES, SESSION, 1, SERVER, 0), Signatures(((0, b"d" * 64), (2, b"e" * 64)))),
}


@pytest.mark.parametrize("mtype", list(MsgType))
def test_round_trip(mtype):
    h, body = SAMPLES[mtype]
    payload = encode(h, body)
    h2, body2 = decode(payload, h.sender, Limits(dim=D, bits=32))
    assert h2 == h
    if mtype == MsgType.MASKED:
        assert np.array_equal(body2.values, body.values)
    else:
        assert body2 == body


def test_share_plaintext_round_trip_and_checks():
    p = SharePlaintext(4, 9, 123, PRIME - 1)
    raw = encode_share_plaintext(p)
    assert decode_share_plaintext(raw, sender=4, holder=9) == p
    with pytest.raises(SecAggError, match="field 'owner'"):
        decode_share_plaintext(raw, sender=5, holder=9)
    with pytest.raises(SecAggError, match="field 'holder'"):
        decode_share_plaintext(raw, sender=4, holder=8)


@pytest.mark.parametrize(
    "mtype,mutate,field",
    [
        (MsgType.ADVERTISE, lambda b: b[:-1], "s_pk"),
        (MsgType.ADVERTISE, lambda b: b + b"\x00", "length"),
        (MsgType.ADVERTISE, lambda b: b[:HEADER_BYTES] + pk(1) + pk(1), "s_pk"),
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES] + struct.pack("!I", 0) + b[HEADER_BYTES + 4 :], "dim"),
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 4] + b"\x08" + b[HEADER_BYTES + 5 :], "bits"),
        # ranges: runs u16 at +8, then (length u32 | lo f64 | hi f64) per run from +10
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 14] + struct.pack("!d", float("nan")) + b[HEADER_BYTES + 22 :],
         "ranges[0]"),
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 14] + struct.pack("!d", 2.0) + b[HEADER_BYTES + 22 :], "ranges[0]"),
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 14] + struct.pack("!dd", -1e308, 1e308) + b[HEADER_BYTES + 30 :],
         "ranges[0]"),  # a width that overflows
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 10] + struct.pack("!I", D - 2) + b[HEADER_BYTES + 14 :], "ranges"),
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 10] + struct.pack("!I", 0) + b[HEADER_BYTES + 14 :],
         "ranges[0].length"),
        (MsgType.SETUP, lambda b: b[:HEADER_BYTES + 8] + struct.pack("!H", 0) + b[HEADER_BYTES + 10 :], "ranges.count"),
        (MsgType.SETUP, lambda b: b[:-4] + struct.pack("!I", 0), "neighbours"),  # lists the recipient
        (MsgType.SETUP, lambda b: b[:-4] + struct.pack("!I", 1), "neighbours"),  # repeated id
        (MsgType.KEYS, lambda b: b[:HEADER_BYTES] + struct.pack("!H", 3) + b[HEADER_BYTES + 2 :], "entries[2].id"),
        (MsgType.MASKED, lambda b: b[:HEADER_BYTES] + struct.pack("!I", D + 1) + b[HEADER_BYTES + 4 :], "dim"),
        (MsgType.MASKED, lambda b: b[:HEADER_BYTES + 4] + b"\x08" + b[HEADER_BYTES + 5 :], "width"),
        (MsgType.UNMASK_REQUEST, lambda b: b[:-4] + struct.pack("!I", 2), "dropped"),
        (MsgType.UNMASK, lambda b: b[:HEADER_BYTES + 6] + b"\x07" + b[HEADER_BYTES + 7 :], "entries[0].kind"),
        (MsgType.UNMASK, lambda b: b[:-33] + PRIME.to_bytes(33, "big"), "entries[1].share"),
        (MsgType.UNMASK, lambda b: b[:2] + b"\x01" + b[3:], "version"),  # version 1: one clip in SETUP
        (MsgType.UNMASK, lambda b: b[:3] + b"\x63" + b[4:], "type"),
        (MsgType.UNMASK, lambda b: b[:3] + bytes([MsgType.KEYS]) + b[4:], "sender"),  # downlink type from a client
        (MsgType.SIGNED_ADVERTISE, lambda b: b[:-1], "signature"),
        (MsgType.SIGNED_ADVERTISE, lambda b: b + b"\x00", "length"),
        (MsgType.SIGNED_ADVERTISE, lambda b: b[:HEADER_BYTES] + pk(1) + pk(1) + b[-64:], "s_pk"),
        (MsgType.SIGNED_KEYS, lambda b: b[:HEADER_BYTES] + struct.pack("!H", 3) + b[HEADER_BYTES + 2 :], "entries[2].id"),
        (MsgType.SIGNED_KEYS, lambda b: b[:-1], "entries[1].signature"),
        (MsgType.SIGNED_KEYS, lambda b: b[:HEADER_BYTES + 38] + pk(3) + b[HEADER_BYTES + 70 :], "entries[0].s_pk"),
        (MsgType.SIGNED_KEYS, lambda b: b[:HEADER_BYTES + 2] + struct.pack("!I", SERVER) + b[HEADER_BYTES + 6 :],
         "entries[0].id"),
        (MsgType.CONSISTENCY_CHECK, lambda b: b[:-4] + struct.pack("!I", 1), "survivors"),  # repeated id
        (MsgType.CONSISTENCY_CHECK, lambda b: b[:HEADER_BYTES] + struct.pack("!H", 0), "survivors.count"),
        (MsgType.CONSISTENCY_CHECK, lambda b: b[:3] + bytes([MsgType.CONSISTENCY_SIGNATURE]) + b[4:], "recipient"),
        (MsgType.CONSISTENCY_SIGNATURE, lambda b: b[:-1], "signature"),
        (MsgType.CONSISTENCY_SIGNATURE, lambda b: b + b"\x00", "length"),
        (MsgType.SIGNATURES, lambda b: b[:HEADER_BYTES + 2] + struct.pack("!I", 3) + b[HEADER_BYTES + 6 :], "entries.id"),
        (MsgType.SIGNATURES, lambda b: b[:-1], "entries[1].signature"),
    ],
)
def test_malformed_fields_are_named(mtype, mutate, field):
    h, body = SAMPLES[mtype]
    bad = mutate(encode(h, body))
    with pytest.raises(SecAggError, match=rf"field '{__import__('re').escape(field)}'") as e:
        decode(bad, h.sender, Limits(dim=D, bits=32))
    assert e.value.field == field
    assert e.value.sender == ("server" if h.sender == SERVER else h.sender)


def test_masked_words_outside_the_modulus_are_rejected():
    h, _ = SAMPLES[MsgType.MASKED]
    payload = encode(h, Masked(np.array([1, 2**20], dtype="<u4")))
    assert decode(payload, 0, Limits(bits=21))
    with pytest.raises(SecAggError, match=r"field 'values'.*outside Z_2\^20"):
        decode(payload, 0, Limits(bits=20))


def test_sender_must_match_the_channel():
    h, body = SAMPLES[MsgType.ADVERTISE]
    with pytest.raises(SecAggError, match="from client 5, field 'sender': header names sender 0"):
        decode(encode(h, body), 5)


# --- fuzzing: decoders ------------------------------------------------------------------------


def _only_secagg_errors(payload, sender, limits=Limits(dim=D, bits=32)):
    try:
        decode(payload, sender, limits)
    except SecAggError as e:
        assert e.sender in ("server", sender) and e.field
    # any other exception propagates and fails the test


@FUZZ
@given(payload=st.binary(max_size=400), sender=st.sampled_from([SERVER, 0, 1, 2**32 - 2]))
def test_fuzz_arbitrary_bytes(payload, sender):
    _only_secagg_errors(payload, sender)


@FUZZ
@given(mtype=st.sampled_from(list(MsgType)), body=st.binary(max_size=300))
def test_fuzz_arbitrary_body_behind_a_valid_header(mtype, body):
    h, _ = SAMPLES[mtype]
    head = encode(*SAMPLES[mtype])[:HEADER_BYTES]
    _only_secagg_errors(head + body, h.sender)
    _only_secagg_errors(head + body, h.sender, Limits())


@st.composite
def mutated(draw, valid: bytes):
    b = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "extend", "insert", "delete", "splice"]))
        pos = draw(st.integers(0, max(len(b) - 1, 0)))
        if op == "flip" and b:
            b[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and b:
            b[pos] = draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFE, 0xFF]))
        elif op == "truncate":
            del b[pos:]
        elif op == "extend":
            b += draw(st.binary(min_size=1, max_size=40))
        elif op == "insert":
            b[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del b[pos : pos + draw(st.integers(1, 8))]
        elif op == "splice" and len(b) >= 4:
            b[pos : pos + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"]))
    return bytes(b)


@FUZZ
@given(data=st.data(), mtype=st.sampled_from(list(MsgType)))
def test_fuzz_mutated_valid_messages(data, mtype):
    h, body = SAMPLES[mtype]
    _only_secagg_errors(data.draw(mutated(encode(h, body))), h.sender)


@FUZZ
@given(data=st.data())
def test_fuzz_share_plaintext(data):
    raw = data.draw(st.one_of(st.binary(max_size=120), mutated(encode_share_plaintext(SharePlaintext(4, 9, 1, 2)))))
    try:
        decode_share_plaintext(raw, sender=4, holder=9)
    except SecAggError as e:
        assert e.sender == 4 and e.field


# --- fuzzing: parties mid-round ---------------------------------------------------------------


ENROLMENT = Enrolment(lambda cid: SeededRandomness(1, f"enrol/{cid}"))
ENROLMENT.enrol(IDS)
MODES = {"semi_honest": SecAggConfig(), "active": SecAggConfig(adversary="active")}
STAGE_CASES = [(mode, i) for mode, cfg in MODES.items() for i in range(len(cfg.stages))]


def parties_at(stage: int, mode: str = "semi_honest"):
    """Server and clients of a 3-client round after ``stage`` stages (deterministic keys)."""
    cfg = MODES[mode]
    active = mode == "active"
    net = InMemoryTransport()
    server = ServerParty(IDS, cfg, D, net, round_=1, rand=SeededRandomness(1, "server"),
                         directory=ENROLMENT.directory if active else None)
    clients = {
        c: ClientParty(c, np.full(D, 0.1 * c), net, round_=1, rand=SeededRandomness(1, f"c{c}"),
                       identity=ENROLMENT.identity(c) if active else None)
        for c in IDS
    }
    server.start()
    for _ in cfg.stages[:stage]:
        for c in IDS:
            clients[c].step()
            server.step()
        server.close_stage()
    return server, clients, net


def valid_traffic(stage: int, mode: str = "semi_honest"):
    server, clients, net = parties_at(stage, mode)
    down = net.receive(0)  # what client 0 is sent for this stage
    for c in IDS:
        if c == 0:
            for s, p in down:
                clients[0].receive(s, p)
        else:
            clients[c].step()
    up = net.receive(SERVER)
    return down, up


TRAFFIC = {case: valid_traffic(case[1], case[0]) for case in STAGE_CASES}


@FUZZ
@given(data=st.data(), case=st.sampled_from(STAGE_CASES))
def test_fuzz_server_receiving_mutated_client_messages(data, case):
    server, _, _ = parties_at(case[1], case[0])
    _, up = TRAFFIC[case]
    sender, payload = data.draw(st.sampled_from(up))
    bad = data.draw(st.one_of(mutated(payload), st.binary(max_size=200)))
    try:
        server.receive(sender, bad)
    except SecAggError as e:
        assert e.sender == sender and e.field
    # the other clients' valid messages are still accepted afterwards
    for s, p in up:
        if s != sender:
            server.receive(s, p)


@FUZZ
@given(data=st.data(), case=st.sampled_from(STAGE_CASES))
def test_fuzz_client_receiving_mutated_server_messages(data, case):
    _, clients, net = parties_at(case[1], case[0])
    net.receive(0)
    down, _ = TRAFFIC[case]
    (_, payload), = down
    bad = data.draw(st.one_of(mutated(payload), st.binary(max_size=200)))
    try:
        clients[0].receive(SERVER, bad)
    except SecAggError as e:
        # the server, a round-level abort (None), or the authenticated author of a sealed share
        assert e.sender in ("server", None, *IDS)


# --- stateful checks --------------------------------------------------------------------------


def test_out_of_order_duplicate_replay_and_misaddressed_messages_name_sender_and_field():
    server, clients, net = parties_at(1)  # server expects SHARES
    _, up = TRAFFIC["semi_honest", 1]
    s0, shares0 = up[0]
    server.receive(s0, shares0)
    with pytest.raises(SecAggError, match=f"from client {s0}, field 'type': duplicate SHARES"):
        server.receive(s0, shares0)
    _, up_mask = TRAFFIC["semi_honest", 2]
    s1, masked1 = up_mask[1]
    with pytest.raises(SecAggError, match=f"from client {s1}, field 'type': out of order: MASKED in stage 'share'"):
        server.receive(s1, masked1)
    _, up_adv = TRAFFIC["semi_honest", 0]
    s2, adv2 = up_adv[2]
    with pytest.raises(SecAggError, match=f"from client {s2}, field 'type': duplicate ADVERTISE"):
        server.receive(s2, adv2)
    # a message of another round (replay), and one of the same round but another session
    old_h, old_body = SAMPLES[MsgType.SHARES]
    with pytest.raises(SecAggError, match="field 'round'.*replayed"):
        server.receive(0, encode(Header(MsgType.SHARES, server.session, 7, 0, SERVER), old_body))
    with pytest.raises(SecAggError, match="field 'session'.*another session"):
        server.receive(0, encode(Header(MsgType.SHARES, bytes(16), 1, 0, SERVER), old_body))
    # the client side: a server message addressed to someone else
    h, body = SAMPLES[MsgType.KEYS]
    with pytest.raises(SecAggError, match="from server, field 'recipient'"):
        clients[1].receive(SERVER, encode(Header(MsgType.KEYS, clients[1].session, 1, SERVER, 2), body))
    assert all(isinstance(e, SecAggError) for e in server.rejected)


def test_server_refuses_shares_for_the_wrong_neighbors_and_key_reuse():
    server, _, _ = parties_at(0)
    _, up = TRAFFIC["semi_honest", 0]
    (s0, a0), (s1, a1), _ = up
    server.receive(s0, a0)
    _, body = decode(a0, s0)
    reuse = encode(Header(MsgType.ADVERTISE, server.session, 1, s1, SERVER), Advertise(body.c_pk, pk(9)))
    with pytest.raises(SecAggError, match=f"from client {s1}, field 'c_pk': reuses a public key of client {s0}"):
        server.receive(s1, reuse)
    stranger = encode(Header(MsgType.ADVERTISE, server.session, 1, 77, SERVER), Advertise(pk(7), pk(8)))
    with pytest.raises(SecAggError, match="from client 77, field 'sender': not a participant"):
        server.receive(77, stranger)
    server2, _, _ = parties_at(1)
    bad = encode(Header(MsgType.SHARES, server2.session, 1, 0, SERVER), Shares(((1, b"x" * SEALED_BYTES),)))
    with pytest.raises(SecAggError, match=r"from client 0, field 'entries.id': .*missing \[2\]"):
        server2.receive(0, bad)
