"""The server party: relays keys and sealed shares, sums masked inputs, and removes the masks.

What it stores is limited by construction: public keys, sealed shares it cannot open, the
*running sum* of masked inputs (each MASKED message is added and dropped at once, never kept),
the shares clients reveal, and the secrets rebuilt from them — self-mask seeds of survivors and
mask keys of clients that dropped after sharing, never both for one client. ``log`` records the
type, sender and size of every message received: that is what the engine reports as
``seen["server"]``.

Sets follow Bonawitz et al.: U1 advertised keys, U2 sent shares, U3 sent masked inputs, U4 signed
U3 (active variant only), U5 answered the unmask request. The round aborts (:class:`SecAggError`,
no sender) when any of them is below the threshold or a needed secret has fewer than ``t`` shares.

A client whose advertised public key has small order is refused at advertise time (it never
enters U1: a dropout), so it cannot make its neighbours reject their KEYS and abort the round.
In the active variant (``adversary = "active"``) the server also verifies each advertisement's
signature against the PKI directory before relaying it, runs the consistency check after
masked-input collection (U3 to every member, signatures back, all valid signatures forwarded),
and verifies each consistency signature on receipt, so that a misbehaving client can only drop
itself, never make honest clients abort.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsafe.protocols.secagg import crypto, fixedpoint, pki, shamir
from fedsafe.protocols.secagg.config import SecAggConfig
from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.graph import complete_graph, harary_graph
from fedsafe.protocols.secagg.transport import Transport
from fedsafe.protocols.secagg.wire import (
    SERVER,
    SESSION_BYTES,
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
    Shares,
    Signatures,
    SignedAdvertise,
    SignedKeys,
    Unmask,
    UnmaskRequest,
    check_header,
    decode_body,
    decode_header,
    encode,
)

_EXPECT = {
    "advertise": MsgType.ADVERTISE, "share": MsgType.SHARES, "mask": MsgType.MASKED,
    "unmask": MsgType.UNMASK, "done": None,
}
_EXPECT_ACTIVE = {**_EXPECT, "advertise": MsgType.SIGNED_ADVERTISE, "consistency": MsgType.CONSISTENCY_SIGNATURE}


class ServerParty:
    """The aggregation server of one round among ``participants`` with ``dim``-long updates.

    ``ranges`` (a :class:`~.fixedpoint.Ranges` over ``dim`` coordinates) is the encoding it
    announces; default ``[-c, c]`` everywhere, ``c = config.fixed_range``. Masked inputs hold
    ``dim`` words and then the two clipping-statistics words (:data:`.fixedpoint.CLIP_STATS`);
    after the round, ``total`` is the sum of the update words and ``clip_stats`` that of the
    statistics words. ``directory`` (the PKI's verification keys) is required with
    ``config.adversary = "active"``."""

    def __init__(
        self, participants: Sequence[int], config: SecAggConfig, dim: int, transport: Transport, *,
        round_: int, rand: crypto.OsRandomness | crypto.SeededRandomness | None = None,
        graph_rng: np.random.Generator | None = None, directory: pki.Directory | None = None,
        ranges: fixedpoint.Ranges | None = None,
    ) -> None:
        ids = [int(p) for p in participants]
        if len(set(ids)) != len(ids):
            raise SecAggError("participant ids repeat")
        n = len(ids)
        self.participants = tuple(sorted(ids))
        self.config = config
        self.dim = dim
        self.ranges = ranges if ranges is not None else fixedpoint.Ranges.uniform(dim, config.fixed_range)
        if self.ranges.dim != dim:
            raise SecAggError(f"encoding ranges cover {self.ranges.dim} coordinates, the updates have {dim}")
        self.width = dim + fixedpoint.CLIP_STATS  # words per masked input
        self.round = round_
        self.transport = transport
        self.rand = rand or crypto.OsRandomness()
        self.bits = config.bits
        self.quant_bits = config.effective_quant_bits(n)
        self.threshold = config.share_threshold(n)
        self.k = config.num_neighbors(n)
        if self.k >= n - 1:
            self.graph = complete_graph(ids)
        else:
            self.graph = harary_graph(ids, self.k, graph_rng if graph_rng is not None else np.random.default_rng())
        self.dtype = fixedpoint.word_dtype(self.bits)
        self.limits = Limits(dim=self.width, bits=self.bits)
        self.active = config.adversary == "active"
        if self.active and directory is None:
            raise SecAggError("secagg.adversary = 'active' needs the PKI directory of the clients' verification keys")
        self.directory = directory
        self.stages = config.stages
        self._expect = _EXPECT_ACTIVE if self.active else _EXPECT
        self.stage = "advertise"
        self.session = b""
        self.log: list[dict[str, object]] = []
        self.rejected: list[SecAggError] = []
        self._accepted: set[tuple[int, MsgType]] = set()
        # protocol state
        self.pks: dict[int, tuple[bytes, bytes]] = {}
        self._key_owner: dict[bytes, int] = {}
        self._keys_sent: dict[int, frozenset[int]] = {}
        self._sealed: dict[int, dict[int, bytes]] = {}  # sender -> recipient -> sealed share
        self._forwarded: dict[int, frozenset[int]] = {}
        self.u3: list[int] = []
        self._masked_sum: np.ndarray | None = None
        self._advert_sigs: dict[int, bytes] = {}
        self._consistency_sigs: dict[int, bytes] = {}
        self._requested: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
        self._seed_points: dict[int, list[tuple[int, int]]] = {}
        self._key_points: dict[int, list[tuple[int, int]]] = {}
        self.responders: list[int] = []
        self.total: np.ndarray | None = None
        self.clip_stats: np.ndarray | None = None
        self.survivors: tuple[int, ...] = ()
        self.sets: dict[str, tuple[int, ...]] = {}

    # --- message loop -----------------------------------------------------------------------

    def start(self) -> None:
        """Open the round: a fresh session id, and SETUP (parameters, neighbours) to everyone."""
        self.session = self.rand.bytes(SESSION_BYTES)
        for u in self.participants:
            body = Setup(self.dim, self.bits, self.quant_bits, self.threshold, self.ranges.runs, self.graph[u])
            self._send(u, MsgType.SETUP, body)

    def step(self) -> None:
        """Handle everything waiting in the server's mailbox."""
        for sender, payload in self.transport.receive(SERVER):
            try:
                self.receive(sender, payload)
            except SecAggError as e:
                self.rejected.append(e)

    def receive(self, sender: int, payload: bytes) -> None:
        entry: dict[str, object] = {"sender": sender, "bytes": len(payload), "type": "undecodable"}
        self.log.append(entry)
        h = decode_header(payload, sender)
        entry["type"] = h.type.name
        check_header(
            h, me=SERVER, session=self.session, round_=self.round, expected=self._expect[self.stage],
            stage=self.stage, accepted=self._accepted,
        )
        body = decode_body(h, payload, self.limits)
        {
            MsgType.ADVERTISE: self._on_advertise, MsgType.SIGNED_ADVERTISE: self._on_advertise,
            MsgType.SHARES: self._on_shares, MsgType.MASKED: self._on_masked, MsgType.UNMASK: self._on_unmask,
            MsgType.CONSISTENCY_SIGNATURE: self._on_consistency_signature,
        }[h.type](h.sender, body)
        self._accepted.add((h.sender, h.type))
        entry["accepted"] = True

    def _send(self, u: int, mtype: MsgType, body) -> None:
        self.transport.send(SERVER, u, encode(Header(mtype, self.session, self.round, SERVER, u), body))

    def close_stage(self) -> None:
        """End the current stage (its deadline passed): check the threshold and send the next
        stage's messages, or finish the round. Raises :class:`SecAggError` to abort."""
        {"advertise": self._close_advertise, "share": self._close_share, "mask": self._close_mask,
         "consistency": self._close_consistency, "unmask": self._close_unmask}[self.stage]()
        i = self.stages.index(self.stage)
        self.stage = self.stages[i + 1] if i + 1 < len(self.stages) else "done"

    def _require(self, have: int, what: str) -> None:
        if have < self.threshold:
            raise SecAggError(
                f"round aborted: only {have} clients {what}, threshold t = {self.threshold} "
                f"(of {len(self.participants)} participants)"
            )

    # --- advertise keys -----------------------------------------------------------------------

    def _on_advertise(self, u: int, b: Advertise | SignedAdvertise) -> None:
        if u not in self.graph:
            raise SecAggError("not a participant of this round", sender=u, field="sender")
        for field, pk in (("c_pk", b.c_pk), ("s_pk", b.s_pk)):
            if pk in self._key_owner:
                raise SecAggError(f"reuses a public key of client {self._key_owner[pk]}", sender=u, field=field)
            if crypto.is_small_order(pk):
                raise SecAggError("small-order X25519 public key (every key agreement with it is all zeros); "
                                  "the client is left out of the round", sender=u, field=field)
        if self.active:
            vk = self.directory.lookup(u)
            if vk is None:
                raise SecAggError("not enrolled in the PKI", sender=u, field="sender")
            msg = pki.advertisement_transcript(self.session, self.round, u, b.c_pk, b.s_pk)
            if not crypto.verify(vk, b.signature, msg):
                raise SecAggError("signature of the key pair is not valid under its enrolled key", sender=u,
                                  field="signature")
            self._advert_sigs[u] = b.signature
        self.pks[u] = (b.c_pk, b.s_pk)
        self._key_owner[b.c_pk] = u
        self._key_owner[b.s_pk] = u

    def _close_advertise(self) -> None:
        u1 = sorted(self.pks)
        self.sets["U1"] = tuple(u1)
        self._require(len(u1), "advertised keys")
        for u in u1:
            live = [v for v in self.graph[u] if v in self.pks]
            self._keys_sent[u] = frozenset(live)
            if self.active:
                signed = tuple((v, *self.pks[v], self._advert_sigs[v]) for v in live)
                self._send(u, MsgType.SIGNED_KEYS, SignedKeys(signed))
            else:
                self._send(u, MsgType.KEYS, Keys(tuple((v, *self.pks[v]) for v in live)))

    # --- share keys -----------------------------------------------------------------------------

    def _on_shares(self, u: int, b: Shares) -> None:
        if u not in self._keys_sent:
            raise SecAggError("sent shares without having advertised keys", sender=u, field="type")
        got = frozenset(v for v, _ in b.entries)
        if got != self._keys_sent[u]:
            missing = sorted(self._keys_sent[u] - got)
            extra = sorted(got - self._keys_sent[u])
            raise SecAggError(f"shares do not match its neighbours (missing {missing}, unexpected {extra})",
                              sender=u, field="entries.id")
        self._sealed[u] = dict(b.entries)

    def _close_share(self) -> None:
        u2 = sorted(self._sealed)
        self.sets["U2"] = tuple(u2)
        self._require(len(u2), "shared keys")
        for v in u2:
            entries = tuple((u, self._sealed[u][v]) for u in u2 if v in self._sealed[u])
            self._forwarded[v] = frozenset(u for u, _ in entries)
            self._send(v, MsgType.FORWARD, Forward(entries))

    # --- masked input collection ----------------------------------------------------------------

    def _on_masked(self, u: int, b: Masked) -> None:
        if u not in self._forwarded:
            raise SecAggError("sent a masked input without having shared keys", sender=u, field="type")
        if self._masked_sum is None:
            self._masked_sum = np.zeros(self.width, dtype=self.dtype)
        np.add(self._masked_sum, b.values, out=self._masked_sum)  # added, not kept
        self.u3.append(u)

    def _close_mask(self) -> None:
        u3 = set(self.u3)
        self.sets["U3"] = tuple(sorted(u3))
        self._require(len(u3), "sent masked inputs")
        if self.active:
            for u in self.sets["U3"]:
                self._send(u, MsgType.CONSISTENCY_CHECK, ConsistencyCheck(self.sets["U3"]))
            return
        for u in sorted(u3):
            surv, drop = self._unmask_lists(u)
            self._requested[u] = (surv, drop)
            self._send(u, MsgType.UNMASK_REQUEST, UnmaskRequest(tuple(sorted(surv)), tuple(sorted(drop))))

    def _unmask_lists(self, u: int) -> tuple[frozenset[int], frozenset[int]]:
        """Whose seed share (survivors: in U3) and whose mask-key share (dropped: in U2, not in
        U3) client ``u`` reveals: among the clients whose shares it was forwarded, and itself."""
        u3 = set(self.sets["U3"])
        fw = self._forwarded[u]
        return frozenset({u} | (fw & u3)), frozenset(fw - u3)

    # --- consistency check (active variant) -----------------------------------------------------

    def _on_consistency_signature(self, u: int, b: ConsistencySignature) -> None:
        if u not in self.sets["U3"]:
            raise SecAggError("signed a survivor list it was not sent (not in U3)", sender=u, field="sender")
        msg = pki.consistency_transcript(self.session, self.round, self.sets["U3"])
        if not crypto.verify(self.directory.lookup(u), b.signature, msg):
            raise SecAggError("signature of U3 is not valid under its enrolled key", sender=u, field="signature")
        self._consistency_sigs[u] = b.signature

    def _close_consistency(self) -> None:
        """Forward to each signer the signatures of its share group (itself and its neighbours):
        all of U4 for the complete graph, O(k) for SecAgg+. A group with fewer than ``t`` signers
        could not rebuild its members' secrets anyway, so this costs no round that could finish."""
        u4 = sorted(self._consistency_sigs)
        self.sets["U4"] = tuple(u4)
        self._require(len(u4), "signed the survivor list")
        for u in u4:
            group = set(self.graph[u]) | {u}
            self._requested[u] = self._unmask_lists(u)
            sigs = tuple((v, self._consistency_sigs[v]) for v in u4 if v in group)
            self._send(u, MsgType.SIGNATURES, Signatures(sigs))

    # --- unmasking ------------------------------------------------------------------------------

    def _on_unmask(self, u: int, b: Unmask) -> None:
        if u not in self._requested:
            raise SecAggError("sent shares without an unmask request", sender=u, field="type")
        surv, drop = self._requested[u]
        owners = {o for o, _, _ in b.entries}
        if owners != surv | drop:
            raise SecAggError(
                f"revealed shares of {sorted(owners)}, asked for {sorted(surv | drop)}", sender=u, field="entries.owner"
            )
        for i, (o, kind, _) in enumerate(b.entries):
            want = ShareKind.SELF_MASK_SEED if o in surv else ShareKind.MASK_KEY
            if kind != want:
                raise SecAggError(f"share kind {kind.name} for client {o}, asked for {want.name}",
                                  sender=u, field=f"entries[{i}].kind")
        x = u + 1
        for o, kind, share in b.entries:
            points = self._seed_points if kind == ShareKind.SELF_MASK_SEED else self._key_points
            points.setdefault(o, []).append((x, share))
        self.responders.append(u)

    def _close_unmask(self) -> None:
        t = self.threshold
        u3 = sorted(self.u3)
        u3_set = set(u3)
        self.sets["U5"] = tuple(sorted(self.responders))
        self._require(len(self.responders), "answered the unmask request")
        total = self._masked_sum
        expand = crypto.MaskExpander(self.width, self.dtype)
        for u in u3:
            seed = self._rebuild(self._seed_points.get(u, []), u, "self-mask seed")
            np.subtract(total, expand(seed), out=total)
        for v in sorted(set(self._sealed) - u3_set):
            partners = sorted(u for u in u3 if v in self._forwarded[u])
            if not partners:
                continue
            sk_bytes = self._rebuild(self._key_points.get(v, []), v, "mask key")
            sk = crypto.x25519_private_key(sk_bytes)
            if crypto.public_bytes(sk) != self.pks[v][1]:
                raise SecAggError(f"round aborted: the mask key rebuilt for client {v} does not match its public key "
                                  "(inconsistent shares)")
            for u in partners:
                seed = crypto.agree(sk, self.pks[u][1], session=self.session, purpose="mask", a=u, b=v)
                # u added +PRG(s_uv) if u < v, else subtracted it
                if u < v:
                    np.subtract(total, expand(seed), out=total)
                else:
                    np.add(total, expand(seed), out=total)
        total = fixedpoint.reduce(total, self.bits)
        self.total, self.clip_stats = total[: self.dim], total[self.dim :]
        self._masked_sum = None
        self.survivors = tuple(u3)

    def _rebuild(self, points: list[tuple[int, int]], owner: int, what: str) -> bytes:
        if len(points) < self.threshold:
            raise SecAggError(
                f"round aborted: {len(points)} shares of the {what} of client {owner}, threshold t = {self.threshold}"
            )
        try:
            return shamir.combine(points, self.threshold)
        except ValueError as e:
            raise SecAggError(f"round aborted: {what} of client {owner}: {e}") from None
