"""The multi-party round: exact sums under dropouts at every stage, aborts, and what the server holds."""

import numpy as np
import pytest

from fedsafe.protocols.secagg import (
    InMemoryTransport,
    SecAggConfig,
    SecAggError,
    crypto,
    fixedpoint,
    run_round,
    seeded_randomness,
)
from fedsafe.protocols.secagg.shamir import combine
from fedsafe.protocols.secagg.wire import SERVER, MsgType, decode

D = 257


def reference_encode(x, clip, q):
    """Independent fixed point: Python floats and ints, coordinate by coordinate."""
    levels = 2**q - 1
    return [int(round((min(max(float(v), -clip), clip) + clip) * (levels / (2 * clip)))) for v in x]


def reference_sum(inputs, ids, clip, q, bits):
    total = [0] * D
    for c in ids:
        for i, v in enumerate(reference_encode(inputs[c], clip, q)):
            total[i] += v
    assert max(total) < 2**bits  # no wrap-around is needed to get the exact sum
    return np.array(total, dtype=np.uint64)


def make_inputs(n, seed=0, scale=0.4, ids=None):
    rng = np.random.default_rng(seed)
    ids = ids if ids is not None else [2 * i + 1 for i in range(n)]
    return {c: rng.normal(scale=scale, size=D) for c in ids}


class RecordingTransport(InMemoryTransport):
    """Keeps a copy of every payload delivered to the server (what it *received*)."""

    def __init__(self):
        super().__init__()
        self.to_server = []

    def send(self, sender, recipient, payload):
        if recipient == SERVER:
            self.to_server.append((sender, bytes(payload)))
        super().send(sender, recipient, payload)


DROP_PATTERNS = {
    "none": {},
    "advertise": {1: "advertise", 7: "advertise"},
    "share": {3: "share", 11: "share"},
    "mask": {5: "mask", 13: "mask"},
    "unmask": {1: "unmask", 9: "unmask"},
    "every_stage": {1: "advertise", 5: "share", 9: "mask", 13: "unmask"},
}


@pytest.mark.parametrize("pattern", list(DROP_PATTERNS))
@pytest.mark.parametrize("graph,k,bits", [("complete", None, 32), ("k_regular", 8, 32), ("k_regular", 8, 62), ("complete", None, 20)])
def test_exact_sum_of_survivors_with_dropouts(pattern, graph, k, bits):
    drop = DROP_PATTERNS[pattern]
    inputs = make_inputs(16)
    cfg = SecAggConfig(graph=graph, k=k, bits=bits, clip=1.0)
    out = run_round(inputs, cfg, drop_at=drop, graph_rng=np.random.default_rng(4))
    expected_survivors = sorted(c for c in inputs if drop.get(c) not in ("advertise", "share", "mask"))
    assert list(out.survivors) == expected_survivors
    ref = reference_sum(inputs, expected_survivors, 1.0, out.quant_bits, bits)
    assert out.total.dtype == (np.uint32 if bits <= 32 else np.uint64)
    assert np.array_equal(out.total.astype(np.uint64), ref)
    clipped_mean = np.mean([np.clip(inputs[c], -1, 1) for c in expected_survivors], axis=0)
    assert np.abs(out.mean() - clipped_mean).max() <= cfg.quantization_error_bound(16) * 1.000001
    assert out.rejected == []
    assert out.neighbors == (15 if graph == "complete" else 8)


@pytest.mark.parametrize(
    "stage,what",
    [("advertise", "advertised keys"), ("share", "shared keys"), ("mask", "sent masked inputs"),
     ("unmask", "answered the unmask request")],
)
def test_round_aborts_below_threshold_at_every_stage(stage, what):
    inputs = make_inputs(6)
    cfg = SecAggConfig()  # t = floor(6/2) + 1 = 4
    drop = {c: stage for c in list(inputs)[:3]}
    with pytest.raises(SecAggError, match=f"only 3 clients {what}, threshold t = 4") as e:
        run_round(inputs, cfg, drop_at=drop)
    assert e.value.sender is None


def test_just_at_threshold_completes():
    inputs = make_inputs(6)
    out = run_round(inputs, SecAggConfig(), drop_at={c: "mask" for c in list(inputs)[:2]})
    assert len(out.survivors) == 4 == out.threshold


def test_secagg_plus_aborts_naming_the_client_whose_secret_cannot_be_rebuilt():
    # k = 4: share groups of 5, t = 3; drop both ring neighbours on one side and one on the other
    ids = list(range(12))
    inputs = make_inputs(12, ids=ids)
    cfg = SecAggConfig(graph="k_regular", k=4)
    keep = {}
    with pytest.raises(SecAggError):  # learn the graph first
        run_round(inputs, cfg, drop_at={c: "advertise" for c in ids[:7]}, graph_rng=np.random.default_rng(0), keep=keep)
    g = keep["server"].graph
    victim = 0
    drop = {v: "unmask" for v in g[victim][:3]}  # 3 of its 4 neighbours never answer: 2 shares < 3
    with pytest.raises(SecAggError, match=f"self-mask seed of client {victim}, threshold t = 3"):
        run_round(inputs, cfg, drop_at=drop, graph_rng=np.random.default_rng(0))


def _reachable_arrays_and_bytes(obj, seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        yield bytes(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _reachable_arrays_and_bytes(k, seen)
            yield from _reachable_arrays_and_bytes(v, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from _reachable_arrays_and_bytes(v, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from _reachable_arrays_and_bytes(vars(obj), seen)


@pytest.mark.parametrize("graph,k", [("complete", None), ("k_regular", 4)])
def test_server_never_holds_an_individual_unmasked_update(graph, k):
    n = 10
    inputs = make_inputs(n)
    cfg = SecAggConfig(graph=graph, k=k)
    net = RecordingTransport()
    keep = {}
    drop = {1: "mask", 5: "unmask"}
    out = run_round(inputs, cfg, drop_at=drop, transport=net, keep=keep, graph_rng=np.random.default_rng(2))
    server = keep["server"]
    q, bits = out.quant_bits, cfg.bits
    encoded = {c: np.array(reference_encode(inputs[c], 1.0, q), dtype=np.uint32) for c in inputs}
    raw = {c: e.tobytes() for c, e in encoded.items()}
    probes = {c: raw[c][:64] for c in raw}  # 16 consecutive coordinates

    # 1. everything the server object holds after the round
    for item in _reachable_arrays_and_bytes(server):
        if isinstance(item, np.ndarray):
            if item.size == D:
                for c, e in encoded.items():
                    assert np.mean(item.astype(np.uint64) == e) < 0.05, f"server holds client {c}'s update"
        else:
            assert not any(p in item for p in probes.values())
    # it never got both kinds of share for one client
    assert not set(server._seed_points) & set(server._key_points)
    assert set(server._key_points) <= {1}  # only the client that dropped after sharing

    # 2. everything it received: no plaintext; masked inputs only from U3
    log_types = [e["type"] for e in server.log]
    assert log_types.count("MASKED") == n - 1 and "undecodable" not in log_types
    assert all(set(e) <= {"sender", "bytes", "type", "accepted"} for e in server.log)
    received_masked = {}
    for sender, payload in net.to_server:
        assert not any(p in payload for p in probes.values())
        h, body = decode(payload, sender)
        if h.type == MsgType.MASKED:
            received_masked[sender] = body.values.astype(np.uint64)

    # 3. with all it learned (self-mask seeds of survivors, mask key of the dropped client), the
    #    best single-client unmasking still differs from the client's update: the pairwise masks
    #    with other survivors remain.
    expand = crypto.MaskExpander(D + fixedpoint.CLIP_STATS, np.dtype("<u4"))  # + the clipping statistics
    for u, y in received_masked.items():
        seed = combine(server._seed_points[u], server.threshold)
        guess = (y - expand(seed).astype(np.uint64)) % 2**bits
        assert np.mean(guess[:D] == encoded[u]) < 0.05
    # ...while the sum is exact
    ref = reference_sum(inputs, out.survivors, 1.0, q, bits)
    assert np.array_equal(out.total.astype(np.uint64), ref)


def test_seeded_keys_reproduce_the_wire_bytes_os_keys_do_not_but_the_sum_is_the_same():
    inputs = make_inputs(6)
    cfg = SecAggConfig()
    runs = []
    for randomness in (seeded_randomness(7, 1), seeded_randomness(7, 1), None):
        net = RecordingTransport()
        out = run_round(inputs, cfg, transport=net, randomness=randomness)
        runs.append((out, [p for _, p in net.to_server]))
    assert runs[0][1] == runs[1][1]
    assert runs[0][1] != runs[2][1]
    assert np.array_equal(runs[0][0].total, runs[2][0].total)


def test_bytes_are_counted_per_client_and_direction():
    inputs = make_inputs(5)
    net = InMemoryTransport()
    out = run_round(inputs, SecAggConfig(), transport=net)
    assert sum(out.bytes_up.values()) + net.bytes_sent[SERVER] == sum(net.bytes_received.values())
    assert sum(out.bytes_down.values()) == net.bytes_sent[SERVER]
    # the masked input dominates the upload: D words of 4 bytes plus headers
    assert all(4 * D < b < 4 * D + 2000 for b in out.bytes_up.values())


def test_duplicated_replayed_and_garbage_messages_are_rejected_and_the_sum_stays_exact():
    inputs = make_inputs(6)
    cfg = SecAggConfig()
    old = RecordingTransport()
    run_round(inputs, cfg, round_=1, transport=old)
    first_sender, first_payload = old.to_server[0]

    class Meddler(InMemoryTransport):
        def send(self, sender, recipient, payload):
            super().send(sender, recipient, payload)
            if recipient == SERVER:
                super().send(sender, recipient, payload)  # duplicate
                if sender == first_sender:
                    super().send(sender, recipient, first_payload)  # replay from round 1
                    super().send(sender, recipient, b"\x00garbage")  # too short
                    super().send(sender, recipient, bytes(40))  # no magic

    out = run_round(inputs, cfg, round_=2, transport=Meddler())
    ref = reference_sum(inputs, sorted(inputs), 1.0, out.quant_bits, 32)
    assert np.array_equal(out.total.astype(np.uint64), ref)
    text = "\n".join(out.rejected)
    assert text.count("duplicate") == 4 * 6
    assert f"from client {first_sender}, field 'round'" in text and "replayed" in text
    assert f"from client {first_sender}, field 'magic'" in text
    assert f"from client {first_sender}, field 'header': truncated" in text


def test_a_client_refuses_an_unmask_request_listing_a_client_as_survivor_and_dropped():
    from fedsafe.protocols.secagg.wire import Header, UnmaskRequest, encode

    inputs = make_inputs(4)
    keep = {}
    run_round(inputs, SecAggConfig(), keep=keep)
    client = keep["clients"][1]
    client.stage = "unmask"
    client._accepted.discard((SERVER, MsgType.UNMASK_REQUEST))
    msg = encode(Header(MsgType.UNMASK_REQUEST, client.session, 1, SERVER, 1), UnmaskRequest((1, 3), (3,)))
    with pytest.raises(SecAggError, match="client 3 listed as both survivor and dropped"):
        client.receive(SERVER, msg)
