"""A client party of the protocol (Bonawitz et al. 2017, Fig. 4; SecAgg+ neighbours).

Stages, as the client sees them (semi-honest variant)::

    SETUP          -> check the announced threshold t against its own share group g
                      (g/2 < t <= g, else abort); draw key pairs (c: encryption, s: masking)
                      and self-mask seed b;                                          ADVERTISE
    KEYS           -> Shamir-share s_sk and b among {self} + neighbours that advertised usable
                      keys, seal each share for its holder (X25519 + HKDF -> AES-GCM);   SHARES
    FORWARD        -> open the shares held for others; mask the quantized update:
                      y = x + PRG(b) + sum_{v in U2, v > u} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)
                                                                                        MASKED
    UNMASK_REQUEST -> reveal the seed share of each listed survivor and the mask-key share of
                      each listed dropped client — never both for one client (the lists are
                      disjoint and only one request is answered)                      UNMASK

With an :class:`~.pki.Identity` the client runs the active-adversary variant (Fig. 4 with
signatures; see the package docstring for the threat model)::

    SETUP             -> as above, advertising the key pair with its signature   SIGNED_ADVERTISE
    SIGNED_KEYS       -> every neighbour must be enrolled and its signature valid, else abort;
                         then as KEYS                                                    SHARES
    FORWARD           -> as above                                                        MASKED
    CONSISTENCY_CHECK -> U3 must hold this client and at least t clients, else abort;
                         sign (session, round, U3)                          CONSISTENCY_SIGNATURE
    SIGNATURES        -> at least t signatures, every one by a distinct member of U3 and valid
                         over this client's U3, else abort; then reveal the seed share of each
                         held client in U3 and the mask-key share of each held client not in U3
                         (the lists come from the signed U3, not from the server)        UNMASK

Every received message is decoded by :mod:`wire` and checked against the current stage; a
rejected message is recorded in ``rejected`` and otherwise ignored, so a client that never gets a
valid message for its stage simply drops out. A client that cannot continue safely (an unsafe
threshold, too few neighbours, a forged key or signature, an inconsistent survivor list) aborts:
``abort_reason`` names the field, and it sends nothing more.
"""

from __future__ import annotations

import numpy as np

from fedsafe.protocols.secagg import crypto, fixedpoint, pki, shamir
from fedsafe.protocols.secagg.config import min_threshold
from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.transport import Transport
from fedsafe.protocols.secagg.wire import (
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
    check_header,
    decode_body,
    decode_header,
    decode_share_plaintext,
    encode,
    encode_share_plaintext,
)

_EXPECT = {
    "setup": MsgType.SETUP, "keys": MsgType.KEYS, "forward": MsgType.FORWARD,
    "unmask": MsgType.UNMASK_REQUEST, "done": None, "aborted": None,
}
_EXPECT_ACTIVE = {
    **_EXPECT, "keys": MsgType.SIGNED_KEYS, "consistency": MsgType.CONSISTENCY_CHECK, "unmask": MsgType.SIGNATURES,
}


def share_aad(session: bytes, round_: int) -> bytes:
    """Associated data of every sealed share: binds it to the round's session."""
    return b"secagg-share" + session + round_.to_bytes(4, "big")


class ClientParty:
    """One client. It holds its update ``vector`` (float) and talks only through ``transport``.

    ``identity`` (its long-term signing key and the PKI directory) selects the active-adversary
    variant; without it the client runs the semi-honest protocol."""

    def __init__(
        self, client_id: int, vector: np.ndarray, transport: Transport, *, round_: int,
        rand: crypto.OsRandomness | crypto.SeededRandomness | None = None,
        identity: pki.Identity | None = None,
    ) -> None:
        if not 0 <= client_id < SERVER:
            raise ValueError(f"client id must be in [0, {SERVER}), got {client_id}")
        self.id = client_id
        self.round = round_
        self.transport = transport
        self.rand = rand or crypto.OsRandomness()
        self._vector: np.ndarray | None = np.asarray(vector)
        self.clipped: int | None = None  # coordinates its encoding clipped (known to this client only)
        self.stage = "setup"
        self.session: bytes | None = None
        self.rejected: list[SecAggError] = []
        self.abort_reason: SecAggError | None = None
        self._accepted: set[tuple[int, MsgType]] = set()
        self.identity = identity
        self._expect = _EXPECT_ACTIVE if identity is not None else _EXPECT

    # --- message loop -----------------------------------------------------------------------

    def step(self) -> None:
        """Handle everything waiting in this client's mailbox."""
        for sender, payload in self.transport.receive(self.id):
            try:
                self.receive(sender, payload)
            except SecAggError as e:
                self.rejected.append(e)

    def receive(self, sender: int, payload: bytes) -> None:
        h = decode_header(payload, sender)
        check_header(
            h, me=self.id, session=self.session, round_=self.round, expected=self._expect[self.stage],
            stage=self.stage, accepted=self._accepted,
        )
        body = decode_body(h, payload, Limits())
        handler = {
            MsgType.SETUP: self._on_setup, MsgType.KEYS: self._on_keys, MsgType.SIGNED_KEYS: self._on_keys,
            MsgType.FORWARD: self._on_forward, MsgType.UNMASK_REQUEST: self._on_unmask_request,
            MsgType.CONSISTENCY_CHECK: self._on_consistency_check, MsgType.SIGNATURES: self._on_signatures,
        }[h.type]
        handler(h, body)  # raises to reject the message; an abort also sets abort_reason
        self._accepted.add((h.sender, h.type))

    def _send(self, mtype: MsgType, body) -> None:
        h = Header(mtype, self.session, self.round, self.id, SERVER)
        self.transport.send(self.id, SERVER, encode(h, body))

    def _abort(self, reason: str, field: str | None = None) -> SecAggError:
        """Stop taking part in the round (nothing more is sent) and return the reason to raise;
        ``field`` names the server's message field that made the client stop, if any."""
        e = SecAggError(f"client {self.id} aborts: {reason}", sender=None if field is None else "server", field=field)
        self.abort_reason = e
        self.stage = "aborted"
        return e

    # --- stages -------------------------------------------------------------------------------

    def _on_setup(self, h: Header, b: Setup) -> None:
        # The client's own check of the announced threshold: a server must not be able to lower
        # it to half of the group, from which it could rebuild both secrets of one client.
        g = len(b.neighbors) + 1
        if b.threshold < min_threshold(g):
            raise self._abort(
                f"announced threshold {b.threshold} is at most half of its share group of {g}; "
                f"valid: [{min_threshold(g)}, {g}]", field="threshold",
            )
        self.session = h.session
        self.params = b
        self.neighbors = frozenset(b.neighbors)
        self._c_key = crypto.new_private_key(self.rand)
        self._s_key = crypto.new_private_key(self.rand)
        self._seed = self.rand.bytes(shamir.SECRET_BYTES)
        self._c_pk = crypto.public_bytes(self._c_key)
        self._s_pk = crypto.public_bytes(self._s_key)
        if self.identity is None:
            self._send(MsgType.ADVERTISE, Advertise(self._c_pk, self._s_pk))
        else:
            msg = pki.advertisement_transcript(self.session, self.round, self.id, self._c_pk, self._s_pk)
            sig = crypto.sign(self.identity.signing_key, msg)
            self._send(MsgType.SIGNED_ADVERTISE, SignedAdvertise(self._c_pk, self._s_pk, sig))
        self.stage = "keys"

    def _on_keys(self, h: Header, b: Keys | SignedKeys) -> None:
        t = self.params.threshold
        keys = {}
        enc: dict[int, bytes] = {}  # the share-encryption key of each neighbour, agreed once
        seen_pks = {self._c_pk, self._s_pk}
        for i, (v, c_pk, s_pk, *sig) in enumerate(b.entries):
            if v not in self.neighbors:
                raise SecAggError(f"client {v} is not a neighbour", sender="server", field=f"entries[{i}].id")
            if self.identity is not None:
                self._check_advertisement(i, v, c_pk, s_pk, sig[0])
            if c_pk in seen_pks or s_pk in seen_pks:
                raise SecAggError("public key repeated across clients", sender="server", field=f"entries[{i}]")
            seen_pks.update((c_pk, s_pk))
            # The agreement on c_pk fails exactly when c_pk has small order (the all-zero
            # secret), so it is its own small-order check: one X25519 exchange, not two.
            try:
                enc[v] = crypto.agree(
                    self._c_key, c_pk, session=self.session, purpose="enc", a=self.id, b=v,
                    peer="server", field=f"KEYS[{v}].c_pk",
                )
                bad = ["s_pk"] if crypto.is_small_order(s_pk) else []
            except SecAggError:
                bad = ["c_pk"]
            if bad:
                # Defence in depth (the server drops such clients at advertise time): leave the
                # neighbour out of the share group and go on with the others.
                self.rejected.append(SecAggError(
                    f"client {v}'s key has small order; left out of the share group", sender="server",
                    field=f"entries[{i}].{bad[0]}",
                ))
                continue
            keys[v] = (c_pk, s_pk)
        group = sorted([self.id, *keys])
        if len(group) < t:
            raise self._abort(f"{len(group)} clients in its share group, threshold {t}")
        xs = [v + 1 for v in group]  # share index 0 would be the secret itself
        mk = shamir.split(crypto.private_bytes(self._s_key), xs, t, self.rand.bytes)
        sd = shamir.split(self._seed, xs, t, self.rand.bytes)
        aad = share_aad(self.session, self.round)
        entries = []
        for v, mk_share, sd_share in zip(group, mk, sd):
            if v == self.id:
                self._own_shares = (mk_share, sd_share)
                continue
            pt = encode_share_plaintext(SharePlaintext(self.id, v, mk_share, sd_share))
            entries.append((v, crypto.seal(enc[v], self.id, v, pt, aad)))
        self._keys = keys
        self._enc = {v: enc[v] for v in keys}
        self._send(MsgType.SHARES, Shares(tuple(entries)))
        self.stage = "forward"

    def _check_advertisement(self, i: int, v: int, c_pk: bytes, s_pk: bytes, signature: bytes) -> None:
        """Active variant: the keys the server relays for ``v`` must carry ``v``'s signature for
        this round under its enrolled key; otherwise the server forged them (an honest server
        verifies every advertisement before relaying it), and the client aborts."""
        vk = self.identity.directory.lookup(v)
        if vk is None:
            raise self._abort(f"neighbour {v} is not enrolled in the PKI", field=f"entries[{i}].id")
        msg = pki.advertisement_transcript(self.session, self.round, v, c_pk, s_pk)
        if not crypto.verify(vk, signature, msg):
            raise self._abort(f"the keys relayed for client {v} do not carry its signature",
                              field=f"entries[{i}].signature")

    def _on_forward(self, h: Header, b: Forward) -> None:
        p = self.params
        aad = share_aad(self.session, self.round)
        held: dict[int, tuple[int, int]] = {}
        for i, (v, sealed) in enumerate(b.entries):
            if v not in self._keys:
                raise SecAggError(f"share from client {v}, which did not advertise keys to this client",
                                  sender="server", field=f"entries[{i}].id")
            key = self._enc[v]  # agreed with v's c_pk when the keys arrived (_on_keys)
            pt = crypto.open_sealed(key, v, self.id, sealed, aad, field=f"entries[{i}].sealed", via="server")
            sp = decode_share_plaintext(pt, sender=v, holder=self.id)
            held[v] = (sp.mask_key_share, sp.seed_share)
        if len(held) + 1 < p.threshold:
            raise self._abort(f"{len(held) + 1} clients shared keys in its group, threshold {p.threshold}")
        self._held = held
        self._held[self.id] = self._own_shares
        self._send(MsgType.MASKED, Masked(self.masked_input(sorted(v for v in held if v != self.id))))
        self._vector = None  # the update has left, masked; nothing else needs it
        self.stage = "unmask" if self.identity is None else "consistency"

    def masked_input(self, partners: list[int]) -> np.ndarray:
        """``x + PRG(b) +- PRG(s_uv)`` over ``partners`` in Z_{2^bits} (the client-side cost).

        ``x`` is the update encoded in the announced ranges, followed by the two clipping
        statistics (whether this client clipped a coordinate, and how many): masked like the
        update, so the server learns only their sums. ``clipped`` keeps the count."""
        p = self.params
        x = np.asarray(self._vector, dtype=np.float64).reshape(-1)
        if x.size != p.dim:
            raise self._abort(f"update has {x.size} coordinates, the round expects {p.dim}")
        dtype = fixedpoint.word_dtype(p.bits)
        y, self.clipped = fixedpoint.encode_counting(x, fixedpoint.Ranges(p.ranges), p.quant_bits, p.bits)
        y = np.concatenate([y, fixedpoint.encode_stats(self.clipped, p.dim, p.quant_bits, p.bits)])
        expand = crypto.MaskExpander(y.size, dtype)
        np.add(y, expand(self._seed), out=y)
        for v in partners:
            seed = crypto.agree(
                self._s_key, self._keys[v][1], session=self.session, purpose="mask", a=self.id, b=v,
                peer="server", field=f"KEYS[{v}].s_pk",
            )
            if self.id < v:
                np.add(y, expand(seed), out=y)
            else:
                np.subtract(y, expand(seed), out=y)
        return fixedpoint.reduce(y, p.bits)

    def _on_unmask_request(self, h: Header, b: UnmaskRequest) -> None:
        if self.id not in b.survivors:
            raise SecAggError("this client is not listed as a survivor", sender="server", field="survivors")
        for field, ids in (("survivors", b.survivors), ("dropped", b.dropped)):
            for v in ids:
                if v not in self._held:
                    raise SecAggError(f"client {v}: no share of it is held here", sender="server", field=field)
        if len(b.survivors) < self.params.threshold:
            raise SecAggError(
                f"{len(b.survivors)} survivors in this client's group, threshold {self.params.threshold}",
                sender="server", field="survivors",
            )
        self._reveal(set(b.survivors), set(b.dropped))

    def _reveal(self, survivors: set[int], dropped: set[int]) -> None:
        """Send the seed share of each survivor and the mask-key share of each dropped client
        (disjoint sets), and answer nothing after: one reveal per round."""
        entries = []
        for v in sorted(survivors | dropped):
            mk_share, sd_share = self._held[v]
            if v in survivors:
                entries.append((v, ShareKind.SELF_MASK_SEED, sd_share))
            else:
                entries.append((v, ShareKind.MASK_KEY, mk_share))
        self._send(MsgType.UNMASK, Unmask(tuple(entries)))
        self.stage = "done"

    # --- active variant: consistency check ------------------------------------------------------

    def _on_consistency_check(self, h: Header, b: ConsistencyCheck) -> None:
        t = self.params.threshold
        if self.id not in b.survivors:
            raise self._abort("the survivor list U3 leaves out this client, which sent its masked input",
                              field="survivors")
        if len(b.survivors) < t:
            raise self._abort(f"the survivor list U3 has {len(b.survivors)} clients, threshold {t}", field="survivors")
        self._u3 = b.survivors
        sig = crypto.sign(self.identity.signing_key, pki.consistency_transcript(self.session, self.round, b.survivors))
        self._send(MsgType.CONSISTENCY_SIGNATURE, ConsistencySignature(sig))
        self.stage = "unmask"

    def _on_signatures(self, h: Header, b: Signatures) -> None:
        """Release shares only once at least t members of U3 have signed this client's U3: every
        honest client that releases shares then does so for the same survivor list."""
        t = self.params.threshold
        u3 = set(self._u3)
        msg = pki.consistency_transcript(self.session, self.round, self._u3)
        for i, (v, sig) in enumerate(b.entries):
            if v not in u3:
                raise self._abort(f"a signature of client {v}, which is not in U3", field=f"entries[{i}].id")
            vk = self.identity.directory.lookup(v)
            if vk is None or not crypto.verify(vk, sig, msg):
                raise self._abort(f"client {v}'s signature is not valid over this client's U3",
                                  field=f"entries[{i}].signature")
        if len(b.entries) < t:
            raise self._abort(f"{len(b.entries)} signatures of U3, threshold {t}", field="entries.count")
        held = set(self._held)
        self._reveal(held & u3, held - u3)
