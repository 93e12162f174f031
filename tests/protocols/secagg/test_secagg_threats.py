"""Attacks by a malicious server or client, written as the attacker would run them.

Each attack is a party subclass that deviates from the protocol; the tests check that honest
clients refuse (naming the field) and that the attacker ends without any individual input.
"""

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pydantic import ValidationError

from fedsafe.protocols.secagg import (
    SecAggConfig,
    SecAggError,
    crypto,
    fixedpoint,
    run_round,
)
from fedsafe.protocols.secagg.client import ClientParty
from fedsafe.protocols.secagg.server import ServerParty
from fedsafe.protocols.secagg.shamir import combine
from fedsafe.protocols.secagg.wire import Advertise, MsgType, UnmaskRequest

D = 64


def make_inputs(ids, seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.uniform(-0.9, 0.9, D) for c in ids}


def reference_encode(x, clip, q):
    """Independent fixed point: Python floats and ints, coordinate by coordinate."""
    levels = 2**q - 1
    return np.array([int(round((min(max(float(v), -clip), clip) + clip) * (levels / (2 * clip)))) for v in x])


def reference_sum(inputs, ids, clip, q):
    return sum(reference_encode(inputs[c], clip, q) for c in ids)


# --- 1. a threshold of at most half a share group ----------------------------------------------


class SplitRequestServer(ServerParty):
    """Announces ``announce`` as the threshold, keeps the victim's masked input, and asks half of
    the victim's share holders for its self-mask seed (the victim 'survived') and the other half
    for its mask key (the victim 'dropped'). With t <= g/2 each half alone reaches t."""

    victim = 0
    announce = 2

    def start(self):
        self.kept = {}
        self.threshold = self.announce
        super().start()

    def _on_masked(self, u, b):
        if u == self.victim:
            self.kept[u] = b.values.copy()
        super()._on_masked(u, b)

    def _close_mask(self):
        u3 = set(self.u3)
        self.sets["U3"] = tuple(sorted(u3))
        self._require(len(u3), "sent masked inputs")
        dropped = set(self._sealed) - u3
        v = self.victim
        holders = [v] + sorted(u for u in u3 if u != v and v in self._forwarded[u])
        key_side = set(holders[(len(holders) + 1) // 2 :])
        for u in sorted(u3):
            fw = self._forwarded[u]
            surv, drop = {u} | (fw & u3), fw & dropped
            if u in key_side:
                surv, drop = surv - {v}, drop | {v}
            self._requested[u] = (frozenset(surv), frozenset(drop))
            self._send(u, MsgType.UNMASK_REQUEST, UnmaskRequest(tuple(sorted(surv)), tuple(sorted(drop))))


def recover(server, victim):
    """The victim's quantized input, if the server holds both of its secrets: its masked input
    minus the self mask and every pairwise mask (recomputed from the victim's mask key)."""
    t = server.threshold
    seed = combine(server._seed_points[victim], t)
    sk = X25519PrivateKey.from_private_bytes(combine(server._key_points[victim], t))
    expand = crypto.MaskExpander(server.width, server.dtype)  # the update's words, then the clipping statistics
    x = server.kept[victim].copy()
    np.subtract(x, expand(seed), out=x)
    for v in sorted(server._forwarded[victim]):
        s = crypto.agree(sk, server.pks[v][1], session=server.session, purpose="mask", a=victim, b=v)
        (np.subtract if victim < v else np.add)(x, expand(s), out=x)
    return fixedpoint.reduce(x, server.bits)[: server.dim]


@pytest.mark.parametrize(
    "raw,n",
    [({"threshold": 2}, 10), ({"threshold": 5}, 10), ({"threshold": 0.34}, 10), ({"threshold": 0.49}, 3),
     ({"threshold": 2, "graph": "k_regular", "k": 4}, 20)],
)
def test_config_refuses_a_threshold_of_at_most_half_the_share_group(raw, n):
    with pytest.raises((ValidationError, SecAggError), match=r"secagg\.threshold") as e:
        SecAggConfig.model_validate(raw).check_capacity(n)
    assert "half" in str(e.value)


def test_clients_refuse_a_threshold_lowered_by_the_server_and_the_split_attack_learns_nothing():
    ids = list(range(8))
    inputs = make_inputs(ids)
    keep = {}
    with pytest.raises(SecAggError, match="only 0 clients advertised keys"):
        run_round(inputs, SecAggConfig(), keep=keep, server_factory=SplitRequestServer)
    for c in keep["clients"].values():
        assert c.abort_reason is not None and c.abort_reason.field == "threshold"
        assert "threshold 2" in str(c.abort_reason) and "[5, 8]" in str(c.abort_reason)
    server = keep["server"]
    assert server.kept == {} and server._seed_points == {} and server._key_points == {}


def test_the_split_attack_recovers_an_input_from_clients_that_accept_a_low_threshold(monkeypatch):
    """Control: the attack above is real. Clients that skip the threshold check (as before the
    fix) give the server both secrets of the victim, and its exact quantized input."""
    from fedsafe.protocols.secagg import client as client_module

    monkeypatch.setattr(client_module, "min_threshold", lambda g: 2)
    ids = list(range(8))
    inputs = make_inputs(ids)
    keep = {}
    out = run_round(inputs, SecAggConfig(), keep=keep, server_factory=SplitRequestServer)
    x = recover(keep["server"], 0)
    assert np.array_equal(x.astype(np.int64), reference_encode(inputs[0], 1.0, out.quant_bits))
    decoded = fixedpoint.decode_mean(x, 1, 1.0, out.quant_bits)
    assert np.abs(decoded - inputs[0]).max() < 1e-8


def test_a_client_never_reveals_both_secrets_of_one_peer():
    """Once a client answered an unmask request, a second one (here: asking for the mask key of a
    client the first one listed as a survivor) is refused and nothing more is sent."""
    from fedsafe.protocols.secagg.wire import SERVER, Header, encode

    inputs = make_inputs(range(4))
    keep = {}
    run_round(inputs, SecAggConfig(), keep=keep)
    net, client = keep["transport"], keep["clients"][1]
    assert client.stage == "done"
    net.receive(SERVER)
    again = encode(Header(MsgType.UNMASK_REQUEST, client.session, 1, SERVER, 1), UnmaskRequest((1, 2), (3,)))
    with pytest.raises(SecAggError, match="duplicate UNMASK_REQUEST"):
        client.receive(SERVER, again)
    assert net.receive(SERVER) == []


# --- 2. small-order X25519 keys -----------------------------------------------------------------

P25519 = 2**255 - 19
# The u-coordinates of the points of order 1, 2, 4 and 8 on Curve25519 and the non-canonical
# encodings of 0 and 1 (u + p < 2^255): the list libsodium and others refuse.
SMALL_ORDER_U = [
    0, 1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
    P25519 - 1, P25519, P25519 + 1,
]


def small_order_keys():
    return [u.to_bytes(32, "little") for u in SMALL_ORDER_U]


def _ladder(k, u):
    """RFC 7748's Montgomery ladder, in Python integers: the u-coordinate of k * (u, .)."""
    p, a24 = P25519, 121665
    x1, x2, z2, x3, z3, swap = u % p, 1, 0, u % p, 1, 0
    for t in reversed(range(255)):
        bit = (k >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b, c, d = x2 + z2, x2 - z2, x3 + z3, x3 - z3
        aa, bb, da, cb = a * a, b * b, d * a, c * b
        e = aa - bb
        x3, z3 = (da + cb) ** 2 % p, x1 * (da - cb) ** 2 % p
        x2, z2 = aa * bb % p, e * (aa + a24 * e) % p
    if swap:
        x2, z2 = x3, z3
    return x2 * pow(z2, p - 2, p) % p


def test_the_listed_keys_have_small_order_by_an_independent_ladder():
    for key in small_order_keys():
        u = int.from_bytes(key, "little") & ((1 << 255) - 1)
        assert _ladder(8, u) == 0  # 8 P is the identity (u = 0 in this encoding)
    assert _ladder(8, 9) != 0  # the base point has large order


def test_is_small_order_matches_the_list_and_the_ladder():
    rng = np.random.default_rng(5)
    for key in small_order_keys():
        assert crypto.is_small_order(key)
        assert crypto.is_small_order(key[:31] + bytes([key[31] | 0x80]))  # the top bit is ignored
    for _ in range(200):
        key = rng.bytes(32)
        u = int.from_bytes(key, "little") & ((1 << 255) - 1)
        assert crypto.is_small_order(key) == (_ladder(8, u) == 0) is False
    assert not crypto.is_small_order((9).to_bytes(32, "little"))


@pytest.mark.parametrize("point", range(len(SMALL_ORDER_U)))
@pytest.mark.parametrize("field", ["c_pk", "s_pk"])
def test_a_client_advertising_a_small_order_key_is_dropped_and_the_round_completes(point, field):
    bad, key = 2, small_order_keys()[point]

    class BadKeyClient(ClientParty):
        def _send(self, mtype, body):
            if mtype == MsgType.ADVERTISE:
                body = Advertise(key, body.s_pk) if field == "c_pk" else Advertise(body.c_pk, key)
            super()._send(mtype, body)

    def factory(c, vector, net, **kw):
        return (BadKeyClient if c == bad else ClientParty)(c, vector, net, **kw)

    ids = list(range(6))
    inputs = make_inputs(ids)
    keep = {}
    out = run_round(inputs, SecAggConfig(), keep=keep, client_factory=factory)
    honest = [c for c in ids if c != bad]
    assert list(out.survivors) == honest and bad not in keep["server"].sets["U1"]
    assert np.array_equal(out.total.astype(np.int64), reference_sum(inputs, honest, 1.0, out.quant_bits))
    err = keep["server"].rejected[0]
    assert err.sender == bad and err.field == field and "small-order" in str(err)


def test_a_client_leaves_out_a_neighbor_whose_relayed_key_has_small_order():
    """Defence in depth: a server that relays a small-order key anyway (to client 0, in place of
    client 2's) does not make client 0 abort; it leaves client 2 out of its share group, says
    why, and the round completes for everyone else."""
    from fedsafe.protocols.secagg.wire import Keys

    class RelaysBadKey(ServerParty):
        def _close_advertise(self):
            super()._close_advertise()
            self.transport.receive(0)  # replace the KEYS to client 0
            entries = tuple((v, small_order_keys()[0] if v == 2 else c, s) for v, c, s in
                            ((v, *self.pks[v]) for v in sorted(self._keys_sent[0])))
            self._keys_sent[0] = self._keys_sent[0] - {2}
            self._send(0, MsgType.KEYS, Keys(entries))

    ids = list(range(6))
    inputs = make_inputs(ids)
    keep = {}
    out = run_round(inputs, SecAggConfig(), keep=keep, server_factory=RelaysBadKey)
    client = keep["clients"][0]
    assert client.abort_reason is None
    err = client.rejected[0]
    assert err.sender == "server" and err.field == "entries[1].c_pk" and "small order" in str(err)
    assert 2 not in client._keys and 0 in keep["server"].sets["U2"]
    # client 0 then refuses client 2's share and drops out; the others complete, exactly
    assert list(out.survivors) == ids[1:]
    assert np.array_equal(out.total.astype(np.int64), reference_sum(inputs, ids[1:], 1.0, out.quant_bits))
