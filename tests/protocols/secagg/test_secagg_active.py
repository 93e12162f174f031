"""The active-adversary variant (Bonawitz et al. 2017, Fig. 4 with signatures and the consistency
check): honest runs match the semi-honest protocol exactly; a malicious server that forges keys,
equivocates about the survivor list or drops signatures is caught and learns no input."""

import re

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedsafe.protocols.secagg import (
    SecAggConfig,
    SecAggError,
    crypto,
    fixedpoint,
    run_round,
)
from fedsafe.protocols.secagg.client import ClientParty, share_aad
from fedsafe.protocols.secagg.crypto import SeededRandomness
from fedsafe.protocols.secagg.pki import (
    Directory,
    Enrolment,
    advertisement_transcript,
    consistency_transcript,
)
from fedsafe.protocols.secagg.server import ServerParty
from fedsafe.protocols.secagg.shamir import combine
from fedsafe.protocols.secagg.wire import (
    SERVER,
    ConsistencyCheck,
    ConsistencySignature,
    Forward,
    Header,
    Keys,
    MsgType,
    SharePlaintext,
    Signatures,
    SignedAdvertise,
    SignedKeys,
    decode_share_plaintext,
    encode,
    encode_share_plaintext,
)

D = 64
ACTIVE = SecAggConfig(adversary="active")


def make_inputs(ids, seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.uniform(-0.9, 0.9, D) for c in ids}


def reference_sum(inputs, ids, clip, q):
    """Independent fixed point: Python floats and ints, coordinate by coordinate."""
    levels = 2**q - 1
    return np.array([sum(int(round((min(max(float(inputs[c][i]), -clip), clip) + clip) * (levels / (2 * clip))))
                         for c in ids) for i in range(D)])


def seeded_enrolment(seed=1):
    return Enrolment(lambda cid: SeededRandomness(seed, f"enrol/{cid}"))


# --- honest runs ----------------------------------------------------------------------------------

DROPS = {
    "none": {},
    "every_stage": {1: "advertise", 3: "share", 5: "mask", 7: "consistency", 9: "unmask"},
    "consistency": {2: "consistency", 4: "consistency"},
}


@pytest.mark.parametrize("drop", list(DROPS))
@pytest.mark.parametrize("graph,k", [("complete", None), ("k_regular", 10)])
def test_honest_active_round_gives_exactly_the_semi_honest_sum(drop, graph, k):
    ids = list(range(12))
    inputs = make_inputs(ids)
    cfg = SecAggConfig(graph=graph, k=k, adversary="active")
    keep = {}
    out = run_round(inputs, cfg, drop_at=DROPS[drop], graph_rng=np.random.default_rng(3), keep=keep)
    # a drop at "consistency" (after masking) plays the part of a drop at "unmask" in the semi-honest run
    semi_drop = {c: ("unmask" if s == "consistency" else s) for c, s in DROPS[drop].items()}
    semi = run_round(inputs, SecAggConfig(graph=graph, k=k), drop_at=semi_drop, graph_rng=np.random.default_rng(3))
    assert out.survivors == semi.survivors
    assert np.array_equal(out.total, semi.total)
    assert np.array_equal(out.total.astype(np.int64), reference_sum(inputs, out.survivors, 1.0, out.quant_bits))
    assert out.rejected == [] and out.aborted_clients == ()
    sets = keep["server"].sets
    assert set(sets["U4"]) == set(sets["U3"]) - {c for c, s in DROPS[drop].items() if s == "consistency"}
    assert list(out.stage_seconds) == ["advertise", "share", "mask", "consistency", "unmask"]


def test_active_round_aborts_when_too_few_sign_the_survivor_list():
    ids = list(range(6))  # t = 4
    with pytest.raises(SecAggError, match="only 3 clients signed the survivor list, threshold t = 4"):
        run_round(make_inputs(ids), ACTIVE, drop_at={c: "consistency" for c in ids[:3]})


def test_the_server_drops_clients_with_bad_or_unenrolled_advertisements_and_bad_consistency_signatures():
    ids = list(range(7))
    enrolment = seeded_enrolment()
    enrolment.enrol(ids)
    impostor_key = crypto.new_signing_key(SeededRandomness(9, "impostor"))

    class Impostor(ClientParty):
        """Client 1 signs its keys with a key that is not its enrolled one; client 2 signs
        garbage in the consistency check."""

        def _send(self, mtype, body):
            if self.id == 1 and mtype == MsgType.SIGNED_ADVERTISE:
                msg = advertisement_transcript(self.session, self.round, 1, body.c_pk, body.s_pk)
                body = SignedAdvertise(body.c_pk, body.s_pk, crypto.sign(impostor_key, msg))
            if self.id == 2 and mtype == MsgType.CONSISTENCY_SIGNATURE:
                body = ConsistencySignature(crypto.sign(self.identity.signing_key, b"something else"))
            super()._send(mtype, body)

    keep = {}
    inputs = make_inputs(ids)
    out = run_round(inputs, ACTIVE, client_factory=Impostor, enrolment=enrolment, keep=keep)
    server = keep["server"]
    assert 1 not in server.sets["U1"] and 2 in server.sets["U3"] and 2 not in server.sets["U4"]
    assert list(out.survivors) == [0, 2, 3, 4, 5, 6]  # 2 masked its input: it is summed
    assert np.array_equal(out.total.astype(np.int64), reference_sum(inputs, out.survivors, 1.0, out.quant_bits))
    fields = {(e.sender, e.field) for e in server.rejected}
    assert {(1, "signature"), (2, "signature")} <= fields


def test_an_unenrolled_participant_cannot_join():
    ids = list(range(5))
    enrolment = seeded_enrolment()
    enrolment.enrol(ids)
    directory = Directory({c: enrolment.directory.lookup(c) for c in ids if c != 4})
    keep = {}
    cfg = SecAggConfig(adversary="active")

    def server_factory(*args, **kw):
        return ServerParty(*args, **{**kw, "directory": directory})

    out = run_round(make_inputs(ids), cfg, enrolment=enrolment, server_factory=server_factory, keep=keep)
    assert 4 not in out.survivors
    assert any(e.sender == 4 and "not enrolled" in str(e) for e in keep["server"].rejected)


# --- a malicious server ---------------------------------------------------------------------------


class EquivocatingServer(ServerParty):
    """Sends the true U3 to ``seed_side`` clients and U3 without the victim to the others, so
    that the first would reveal the victim's self-mask seed and the others its mask key; then
    forwards either every signature (``forward = "all"``) or to each client only those over its
    own list (``"matching"``), or only ``t - 1`` of them (``"too_few"``)."""

    victim = 0
    seed_side = 4
    forward = "all"

    def _close_mask(self):
        u3 = tuple(sorted(set(self.u3)))
        self.sets["U3"] = u3
        without = tuple(v for v in u3 if v != self.victim)
        first = {self.victim} | set([v for v in u3 if v != self.victim][: self.seed_side - 1])
        self.view = {u: (u3 if u in first else without) for u in u3}
        for u in u3:
            self._send(u, MsgType.CONSISTENCY_CHECK, ConsistencyCheck(self.view[u]))

    def _on_consistency_signature(self, u, b):
        self._consistency_sigs[u] = b.signature  # whatever list it signed

    def _close_consistency(self):
        u4 = sorted(self._consistency_sigs)
        for u in u4:
            peers = u4 if self.forward == "all" else [v for v in u4 if self.view[v] == self.view[u]]
            if self.forward == "too_few":
                peers = peers[: self.threshold - 1]
            view, fw = set(self.view[u]), self._forwarded[u]
            self._requested[u] = (frozenset({u} | (fw & view)), frozenset(fw - view))
            self._send(u, MsgType.SIGNATURES, Signatures(tuple((v, self._consistency_sigs[v]) for v in peers)))


@pytest.mark.parametrize(
    "forward,field",
    # "all": each client sees signatures over the other list (invalid), or by a client not in its U3
    [("all", r"entries\[\d+\]\.(signature|id)"), ("matching", "entries.count"), ("too_few", "entries.count")],
)
def test_a_server_sending_different_survivor_lists_is_caught_and_learns_nothing(forward, field):
    ids = list(range(8))  # t = 5: neither half of 4 clients can gather 5 signatures
    server_cls = type("S", (EquivocatingServer,), {"forward": forward})
    keep = {}
    with pytest.raises(SecAggError, match=r"only 0 clients answered the unmask request.*8 clients aborted"):
        run_round(make_inputs(ids), ACTIVE, server_factory=server_cls, keep=keep)
    for c in keep["clients"].values():
        assert c.abort_reason is not None and re.fullmatch(field, c.abort_reason.field), c.abort_reason
    server = keep["server"]
    assert server._seed_points == {} and server._key_points == {}
    assert "UNMASK" not in [e["type"] for e in server.log]


def test_a_server_that_convinces_a_majority_gets_one_consistent_list_only():
    """With 5 of 8 told the true U3, those 5 reach t and reveal seeds; the 3 told otherwise
    abort. The server ends with self-mask seeds and no mask key: the victim stays masked."""
    ids = list(range(8))
    inputs = make_inputs(ids)
    server_cls = type("S", (EquivocatingServer,), {"forward": "matching", "seed_side": 5})
    keep = {}
    out = run_round(inputs, ACTIVE, server_factory=server_cls, keep=keep)
    assert len(out.aborted_clients) == 3 and 0 not in out.aborted_clients
    server = keep["server"]
    assert server._key_points == {} and len(server._seed_points[0]) == 5
    assert np.array_equal(out.total.astype(np.int64), reference_sum(inputs, ids, 1.0, out.quant_bits))


class KeySubstitutingServer(ServerParty):
    """Hands the victim key pairs of its own making in place of its neighbours' (a man in the
    middle), keeps the victim's shares and masked input, and opens them; the victim is forwarded
    shares the server sealed itself, so it goes on to mask with the substituted keys. In the
    active variant the server can only attach the neighbours' real signatures (over their real
    keys)."""

    victim = 0

    def start(self):
        self.fake, self.kept = {}, {}
        super().start()

    def _close_advertise(self):
        super()._close_advertise()
        v0 = self.victim
        self.transport.receive(v0)  # withdraw the honest KEYS to the victim
        entries = []
        for v in sorted(self._keys_sent[v0]):
            c_sk = X25519PrivateKey.generate()
            s_sk = X25519PrivateKey.generate()
            self.fake[v] = (c_sk, s_sk)
            keys = (v, crypto.public_bytes(c_sk), crypto.public_bytes(s_sk))
            entries.append((*keys, self._advert_sigs[v]) if self.active else keys)
        mtype, body = (MsgType.SIGNED_KEYS, SignedKeys) if self.active else (MsgType.KEYS, Keys)
        self._send(v0, mtype, body(tuple(entries)))

    def _on_shares(self, u, b):
        if u == self.victim:
            self.kept["shares"] = dict(b.entries)
            b = type(b)(())  # forward none of them
            self._keys_sent[u] = frozenset()
        super()._on_shares(u, b)

    def _close_share(self):
        super()._close_share()
        v0 = self.victim
        if v0 not in self._sealed:
            return
        self.transport.receive(v0)  # withdraw the honest FORWARD: the victim could not open it
        aad, entries = share_aad(self.session, self.round), []
        for v in sorted(self.fake):
            key = crypto.agree(self.fake[v][0], self.pks[v0][0], session=self.session, purpose="enc", a=v, b=v0)
            entries.append((v, crypto.seal(key, v, v0, encode_share_plaintext(SharePlaintext(v, v0, 1, 1)), aad)))
        self._forwarded[v0] = frozenset(self.fake)
        self._send(v0, MsgType.FORWARD, Forward(tuple(entries)))

    def _on_masked(self, u, b):
        if u == self.victim:
            self.kept["masked"] = b.values.copy()
        super()._on_masked(u, b)

    def recover(self):
        """The victim's quantized input from its shares (opened with the fake keys) and masked input."""
        v0, aad = self.victim, share_aad(self.session, self.round)
        c_pk = self.pks[v0][0]
        mk, sd = [], []
        for v, sealed in self.kept["shares"].items():
            key = crypto.agree(self.fake[v][0], c_pk, session=self.session, purpose="enc", a=v, b=v0)
            p = decode_share_plaintext(crypto.open_sealed(key, v0, v, sealed, aad, field="x"), sender=v0, holder=v)
            mk.append((v + 1, p.mask_key_share))
            sd.append((v + 1, p.seed_share))
        sk = X25519PrivateKey.from_private_bytes(combine(mk, self.threshold))
        expand = crypto.MaskExpander(self.width, self.dtype)  # the update's words, then the clipping statistics
        x = self.kept["masked"].copy()
        np.subtract(x, expand(combine(sd, self.threshold)), out=x)
        for v in sorted(self._forwarded[v0]):
            s = crypto.agree(sk, crypto.public_bytes(self.fake[v][1]), session=self.session, purpose="mask", a=v0, b=v)
            (np.subtract if v0 < v else np.add)(x, expand(s), out=x)
        return fixedpoint.reduce(x, self.bits)[: self.dim]


def test_semi_honest_mode_trusts_the_server_to_relay_keys_a_substituting_server_reads_an_input():
    """The documented limit of ``adversary = "semi_honest"``: nothing authenticates the keys the
    server relays, so a server that deviates can read an input. This is what "active" is for."""
    ids = list(range(6))
    inputs = make_inputs(ids)
    keep = {}
    try:
        run_round(inputs, SecAggConfig(), server_factory=KeySubstitutingServer, keep=keep)
    except SecAggError:
        pass  # the round itself may not complete; the attacker already has what it wanted
    q = SecAggConfig().effective_quant_bits(len(ids))
    x = keep["server"].recover()
    assert np.array_equal(x.astype(np.int64), reference_sum(inputs, [0], 1.0, q))


def test_active_clients_refuse_substituted_keys_and_the_server_learns_nothing_of_them():
    ids = list(range(6))
    inputs = make_inputs(ids)
    keep = {}
    out = run_round(inputs, ACTIVE, server_factory=KeySubstitutingServer, keep=keep)
    victim = keep["clients"][0]
    assert victim.abort_reason.field == "entries[0].signature" and victim.abort_reason.sender == "server"
    assert "do not carry its signature" in str(victim.abort_reason)
    server = keep["server"]
    assert "shares" not in server.kept and "masked" not in server.kept
    assert [e["type"] for e in server.log if e["sender"] == 0] == ["SIGNED_ADVERTISE"]
    assert list(out.survivors) == ids[1:]  # the others complete, without the victim


def test_active_clients_refuse_keys_of_a_client_missing_from_the_pki():
    ids = list(range(5))
    enrolment = seeded_enrolment()
    enrolment.enrol(ids)
    partial = Directory({c: enrolment.directory.lookup(c) for c in ids if c != 3})
    from fedsafe.protocols.secagg.pki import Identity

    def factory(c, vector, net, identity=None, **kw):
        if c == 0:
            identity = Identity(identity.signing_key, partial)
        return ClientParty(c, vector, net, identity=identity, **kw)

    keep = {}
    run_round(make_inputs(ids), ACTIVE, enrolment=enrolment, client_factory=factory, keep=keep)
    reason = keep["clients"][0].abort_reason
    assert reason.field == "entries[2].id" and "not enrolled" in str(reason)


def test_a_client_answers_one_signature_list_only():
    ids = list(range(4))
    keep = {}
    run_round(make_inputs(ids), ACTIVE, keep=keep)
    client, net = keep["clients"][1], keep["transport"]
    net.receive(SERVER)
    sig = crypto.sign(client.identity.signing_key, consistency_transcript(client.session, 1, (0, 1, 2, 3)))
    again = encode(Header(MsgType.SIGNATURES, client.session, 1, SERVER, 1), Signatures(((1, sig),)))
    with pytest.raises(SecAggError, match="duplicate SIGNATURES"):
        client.receive(SERVER, again)
    assert net.receive(SERVER) == []


def test_signatures_bind_session_round_list_and_purpose():
    key = crypto.new_signing_key(SeededRandomness(3, "k"))
    vk = crypto.verification_bytes(key)
    s1, s2 = bytes(16), bytes(15) + b"\x01"
    sig = crypto.sign(key, consistency_transcript(s1, 1, (1, 2, 3)))
    assert crypto.verify(vk, sig, consistency_transcript(s1, 1, (1, 2, 3)))
    for other in [consistency_transcript(s2, 1, (1, 2, 3)), consistency_transcript(s1, 2, (1, 2, 3)),
                  consistency_transcript(s1, 1, (1, 2)), consistency_transcript(s1, 1, (1, 2, 4))]:
        assert not crypto.verify(vk, sig, other)
    pk = bytes(range(32))
    adv = crypto.sign(key, advertisement_transcript(s1, 1, 7, pk, pk[::-1]))
    assert crypto.verify(vk, adv, advertisement_transcript(s1, 1, 7, pk, pk[::-1]))
    assert not crypto.verify(vk, adv, advertisement_transcript(s1, 1, 8, pk, pk[::-1]))
    assert not crypto.verify(vk, adv, advertisement_transcript(s1, 1, 7, pk[::-1], pk))
    assert not crypto.verify(vk, b"\x00" * 64, advertisement_transcript(s1, 1, 7, pk, pk[::-1]))
    assert not crypto.verify(bytes(31), adv, b"")  # a malformed key is simply invalid


def test_directory_binds_an_id_to_one_key():
    d = Directory({1: bytes(32)})
    d.register(1, bytes(32))  # the same key again is fine
    with pytest.raises(ValueError, match="already enrolled"):
        d.register(1, b"\x01" * 32)
    with pytest.raises(ValueError, match="32 bytes"):
        d.register(2, b"\x01" * 31)
    assert 1 in d and 2 not in d and d.lookup(2) is None


def test_active_server_needs_the_directory():
    from fedsafe.protocols.secagg import InMemoryTransport

    with pytest.raises(SecAggError, match="PKI directory"):
        ServerParty([0, 1, 2], ACTIVE, D, InMemoryTransport(), round_=1)


def test_each_client_is_forwarded_the_signatures_of_its_share_group_only():
    """SecAgg+ keeps O(k) per client: the consistency signatures a client gets are those of its
    neighbours and itself (all of U4 for the complete graph)."""
    from fedsafe.protocols.secagg import InMemoryTransport
    from fedsafe.protocols.secagg.wire import decode

    class Recording(InMemoryTransport):
        def __init__(self):
            super().__init__()
            self.down = []

        def send(self, sender, recipient, payload):
            if sender == SERVER:
                self.down.append((recipient, bytes(payload)))
            super().send(sender, recipient, payload)

    ids = list(range(20))
    net, keep = Recording(), {}
    cfg = SecAggConfig(graph="k_regular", k=4, adversary="active")
    run_round(make_inputs(ids), cfg, transport=net, keep=keep, drop_at={3: "consistency"},
              graph_rng=np.random.default_rng(0))
    graph, u4 = keep["server"].graph, set(keep["server"].sets["U4"])
    got = {}
    for u, payload in net.down:
        h, body = decode(payload, SERVER)
        if h.type == MsgType.SIGNATURES:
            got[u] = {v for v, _ in body.entries}
    assert set(got) == u4 and 3 not in u4
    for u, signers in got.items():
        assert signers == ({u, *graph[u]} & u4)


@pytest.mark.slow
def test_active_client_parties_on_ray_actors_give_the_same_round():
    ray = pytest.importorskip("ray")
    from fedsafe.protocols.secagg.ray_parties import ray_client_factory
    from fedsafe.protocols.secagg.session import seeded_randomness

    ids = list(range(5))
    inputs = make_inputs(ids)
    enrolment = seeded_enrolment()
    local = run_round(inputs, ACTIVE, drop_at={3: "consistency"}, randomness=seeded_randomness(1, 1),
                      enrolment=enrolment)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = run_round(inputs, ACTIVE, drop_at={3: "consistency"}, randomness=seeded_randomness(1, 1),
                           enrolment=enrolment, client_factory=ray_client_factory())
    finally:
        ray.shutdown()
    assert np.array_equal(local.total, remote.total) and local.survivors == remote.survivors
    assert remote.aborted_clients == () and remote.rejected == []


@pytest.mark.parametrize("n", [4, 10])
def test_the_active_variant_costs_the_bytes_of_its_signatures_and_lists(n):
    """Per client, against the semi-honest round (complete graph, no dropout): up, a 64-byte
    signature on ADVERTISE and a CONSISTENCY_SIGNATURE (32-byte header + 64); down, 64 bytes per
    relayed key pair, CONSISTENCY_CHECK (32 + 2 + 4n) and SIGNATURES (32 + 2 + 68n) in place of
    UNMASK_REQUEST (32 + 2 + 4n + 2)."""
    ids = list(range(n))
    inputs = make_inputs(ids)
    semi = run_round(inputs, SecAggConfig())
    active = run_round(inputs, ACTIVE)
    for c in ids:
        assert active.bytes_up[c] - semi.bytes_up[c] == 64 + 32 + 64
        assert active.bytes_down[c] - semi.bytes_down[c] == 64 * (n - 1) + (34 + 4 * n) + (34 + 68 * n) - (36 + 4 * n)
