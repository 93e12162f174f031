"""The wire format: versioned, typed binary messages, every field length- and range-checked.

Nothing received is ever unpickled or evaluated: a message is a fixed 32-byte header followed
by a body whose layout is fixed by the message type. Integers are big-endian (network order);
the masked vector is little-endian words (zero-copy on common hardware).

Header (32 bytes)::

    magic "SA" | version u8 | type u8 | session 16B | round u32 | sender u32 | recipient u32

``sender`` / ``recipient`` are client ids, or ``SERVER`` (0xFFFFFFFF). Bodies::

    SETUP          s->c  dim u32 | bits u8 | quant_bits u8 | threshold u16 |
                         runs u16 | (length u32 | lo f64 | hi f64) x runs  (encoding ranges, lengths
                                                                            summing to dim) |
                         count u16 | neighbour ids u32 x count           (strictly increasing)
    ADVERTISE      c->s  c_pk 32B | s_pk 32B                             (distinct X25519 keys)
    KEYS           s->c  count u16 | (id u32 | c_pk 32B | s_pk 32B) x count
    SHARES         c->s  count u16 | (recipient u32 | sealed share 90B) x count
    FORWARD        s->c  count u16 | (sender u32 | sealed share 90B) x count
    MASKED         c->s  dim u32 | width u8 (4|8) | dim words of width bytes, each < 2^bits
                         (the SETUP dim plus the two clipping-statistics words)
    UNMASK_REQUEST s->c  count u16 | survivor ids | count u16 | dropped ids (disjoint)
    UNMASK         c->s  count u16 | (owner u32 | kind u8 | share 33B) x count

and, in the active-adversary variant (``adversary = "active"``), instead of ADVERTISE, KEYS and
UNMASK_REQUEST (Ed25519 signatures, 64 bytes, over the transcripts of :mod:`.pki`)::

    SIGNED_ADVERTISE      c->s  c_pk 32B | s_pk 32B | signature 64B
    SIGNED_KEYS           s->c  count u16 | (id u32 | c_pk 32B | s_pk 32B | signature 64B) x count
    CONSISTENCY_CHECK     s->c  count u16 | survivor ids (U3, at least one)
    CONSISTENCY_SIGNATURE c->s  signature 64B
    SIGNATURES            s->c  count u16 | (id u32 | signature 64B) x count

and inside a sealed share (AES-GCM, 74-byte plaintext)::

    owner u32 | holder u32 | mask-key share 33B | self-mask-seed share 33B

Id lists are strictly increasing, which also rules out repeats; in UNMASK that means a client
reveals at most one kind of share per owner. Decoders raise only :class:`SecAggError`, naming the
sender and the field. Stateful checks (replayed, out-of-order, duplicated messages) are
:func:`check_header`'s, called by each party with what it expects now.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Union

import numpy as np

from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.shamir import PRIME, SHARE_BYTES

MAGIC = b"SA"
VERSION = 2  # 2: per-run encoding ranges in SETUP, clipping statistics in MASKED
SERVER = 0xFFFFFFFF
SESSION_BYTES = 16
PK_BYTES = 32
HEADER = struct.Struct("!2sBB16sIII")
HEADER_BYTES = HEADER.size  # 32
SHARE_PLAINTEXT = struct.Struct(f"!II{SHARE_BYTES}s{SHARE_BYTES}s")
SEALED_BYTES = SHARE_PLAINTEXT.size + 16  # AES-GCM tag
SIGNATURE_BYTES = 64  # Ed25519
MAX_COUNT = 0xFFFF
MIN_BITS, MAX_BITS, MAX_QUANT_BITS = 16, 62, 52


class MsgType(IntEnum):
    SETUP = 1
    ADVERTISE = 2
    KEYS = 3
    SHARES = 4
    FORWARD = 5
    MASKED = 6
    UNMASK_REQUEST = 7
    UNMASK = 8
    SIGNED_ADVERTISE = 9
    SIGNED_KEYS = 10
    CONSISTENCY_CHECK = 11
    CONSISTENCY_SIGNATURE = 12
    SIGNATURES = 13


UPLINK = frozenset({
    MsgType.ADVERTISE, MsgType.SHARES, MsgType.MASKED, MsgType.UNMASK, MsgType.SIGNED_ADVERTISE,
    MsgType.CONSISTENCY_SIGNATURE,
})


class ShareKind(IntEnum):
    SELF_MASK_SEED = 1  # revealed for survivors
    MASK_KEY = 2  # revealed for clients that dropped after sharing


@dataclass(frozen=True)
class Header:
    type: MsgType
    session: bytes
    round: int
    sender: int
    recipient: int


@dataclass(frozen=True)
class Setup:
    dim: int
    bits: int
    quant_bits: int
    threshold: int
    ranges: tuple[tuple[int, float, float], ...]  # (length, lo, hi) per run of coordinates
    neighbors: tuple[int, ...]


@dataclass(frozen=True)
class Advertise:
    c_pk: bytes  # encryption key (shares)
    s_pk: bytes  # masking key (pairwise seeds)


@dataclass(frozen=True)
class Keys:
    entries: tuple[tuple[int, bytes, bytes], ...]  # (id, c_pk, s_pk)


@dataclass(frozen=True)
class Shares:
    entries: tuple[tuple[int, bytes], ...]  # (recipient, sealed)


@dataclass(frozen=True)
class Forward:
    entries: tuple[tuple[int, bytes], ...]  # (original sender, sealed)


@dataclass(frozen=True, eq=False)
class Masked:
    values: np.ndarray  # read-only view of the payload


@dataclass(frozen=True)
class UnmaskRequest:
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]


@dataclass(frozen=True)
class Unmask:
    entries: tuple[tuple[int, ShareKind, int], ...]  # (owner, kind, share)


@dataclass(frozen=True)
class SignedAdvertise:
    c_pk: bytes
    s_pk: bytes
    signature: bytes  # over pki.advertisement_transcript


@dataclass(frozen=True)
class SignedKeys:
    entries: tuple[tuple[int, bytes, bytes, bytes], ...]  # (id, c_pk, s_pk, signature)


@dataclass(frozen=True)
class ConsistencyCheck:
    survivors: tuple[int, ...]  # U3


@dataclass(frozen=True)
class ConsistencySignature:
    signature: bytes  # over pki.consistency_transcript(U3)


@dataclass(frozen=True)
class Signatures:
    entries: tuple[tuple[int, bytes], ...]  # (signer, signature)


@dataclass(frozen=True)
class SharePlaintext:
    owner: int
    holder: int
    mask_key_share: int
    seed_share: int


Body = Union[
    Setup, Advertise, Keys, Shares, Forward, Masked, UnmaskRequest, Unmask, SignedAdvertise, SignedKeys,
    ConsistencyCheck, ConsistencySignature, Signatures,
]
BODY_TYPE: dict[type, MsgType] = {
    Setup: MsgType.SETUP, Advertise: MsgType.ADVERTISE, Keys: MsgType.KEYS, Shares: MsgType.SHARES,
    Forward: MsgType.FORWARD, Masked: MsgType.MASKED, UnmaskRequest: MsgType.UNMASK_REQUEST,
    Unmask: MsgType.UNMASK, SignedAdvertise: MsgType.SIGNED_ADVERTISE, SignedKeys: MsgType.SIGNED_KEYS,
    ConsistencyCheck: MsgType.CONSISTENCY_CHECK, ConsistencySignature: MsgType.CONSISTENCY_SIGNATURE,
    Signatures: MsgType.SIGNATURES,
}


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts beyond the format itself: vector length and modulus bits of
    MASKED (``None``: any allowed by the format), and the largest dimension."""

    dim: int | None = None
    bits: int | None = None
    max_dim: int = 1 << 28


# --- encoding ---------------------------------------------------------------------------------


def encode(header: Header, body: Body) -> bytes:
    if BODY_TYPE[type(body)] != header.type:
        raise ValueError(f"header type {header.type.name} does not match body {type(body).__name__}")
    if len(header.session) != SESSION_BYTES:
        raise ValueError("session id must be 16 bytes")
    head = HEADER.pack(MAGIC, VERSION, int(header.type), header.session, header.round, header.sender, header.recipient)
    return head + _encode_body(body)


def _ids(ids: tuple[int, ...]) -> bytes:
    return struct.pack(f"!H{len(ids)}I", len(ids), *ids)


def _encode_body(b: Body) -> bytes:
    if isinstance(b, Setup):
        runs = struct.pack("!H", len(b.ranges)) + b"".join(struct.pack("!Idd", n, lo, hi) for n, lo, hi in b.ranges)
        return struct.pack("!IBBH", b.dim, b.bits, b.quant_bits, b.threshold) + runs + _ids(b.neighbors)
    if isinstance(b, Advertise):
        return b.c_pk + b.s_pk
    if isinstance(b, Keys):
        return struct.pack("!H", len(b.entries)) + b"".join(struct.pack("!I", i) + c + s for i, c, s in b.entries)
    if isinstance(b, (Shares, Forward)):
        return struct.pack("!H", len(b.entries)) + b"".join(struct.pack("!I", i) + ct for i, ct in b.entries)
    if isinstance(b, Masked):
        v = np.ascontiguousarray(b.values)
        if v.dtype not in (np.dtype("<u4"), np.dtype("<u8")):
            v = v.astype("<u8")
        return struct.pack("!IB", v.size, v.dtype.itemsize) + v.tobytes()
    if isinstance(b, UnmaskRequest):
        return _ids(b.survivors) + _ids(b.dropped)
    if isinstance(b, Unmask):
        return struct.pack("!H", len(b.entries)) + b"".join(
            struct.pack("!IB", o, int(k)) + s.to_bytes(SHARE_BYTES, "big") for o, k, s in b.entries
        )
    if isinstance(b, SignedAdvertise):
        return b.c_pk + b.s_pk + b.signature
    if isinstance(b, SignedKeys):
        return struct.pack("!H", len(b.entries)) + b"".join(
            struct.pack("!I", i) + c + s + sig for i, c, s, sig in b.entries
        )
    if isinstance(b, ConsistencyCheck):
        return _ids(b.survivors)
    if isinstance(b, ConsistencySignature):
        return b.signature
    if isinstance(b, Signatures):
        return struct.pack("!H", len(b.entries)) + b"".join(struct.pack("!I", i) + sig for i, sig in b.entries)
    raise TypeError(f"not a message body: {type(b).__name__}")


def encode_share_plaintext(p: SharePlaintext) -> bytes:
    return SHARE_PLAINTEXT.pack(
        p.owner, p.holder, p.mask_key_share.to_bytes(SHARE_BYTES, "big"), p.seed_share.to_bytes(SHARE_BYTES, "big")
    )


# --- decoding ---------------------------------------------------------------------------------


class _Reader:
    def __init__(self, buf: bytes, pos: int, sender: int | str, what: str) -> None:
        self.buf, self.pos, self.sender, self.what = buf, pos, sender, what

    def fail(self, field: str, reason: str) -> SecAggError:
        return SecAggError(f"{self.what}: {reason}", sender=self.sender, field=field)

    def take(self, n: int, field: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(field, f"truncated: needs {n} bytes at offset {self.pos}, message has {len(self.buf)}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, field: str) -> tuple:
        s = struct.Struct("!" + fmt)
        return s.unpack(self.take(s.size, field))

    def u8(self, field: str) -> int:
        return self.unpack("B", field)[0]

    def u16(self, field: str) -> int:
        return self.unpack("H", field)[0]

    def u32(self, field: str) -> int:
        return self.unpack("I", field)[0]

    def client_id(self, field: str) -> int:
        v = self.u32(field)
        if v == SERVER:
            raise self.fail(field, "the server's id where a client id belongs")
        return v

    def ids(self, field: str, *, min_count: int = 0) -> tuple[int, ...]:
        count = self.u16(f"{field}.count")
        if count < min_count:
            raise self.fail(f"{field}.count", f"{count} ids, at least {min_count} required")
        raw = self.take(4 * count, field)
        ids = struct.unpack(f"!{count}I", raw)
        self.increasing(ids, field)
        if ids and ids[-1] == SERVER:
            raise self.fail(field, "the server's id where a client id belongs")
        return ids

    def increasing(self, ids, field: str) -> None:
        for a, b in zip(ids, ids[1:]):
            if b <= a:
                raise self.fail(field, f"ids not strictly increasing ({a} then {b}): repeated or unordered")

    def share(self, field: str) -> int:
        v = int.from_bytes(self.take(SHARE_BYTES, field), "big")
        if v >= PRIME:
            raise self.fail(field, "share is not a field element (>= p)")
        return v

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail("length", f"{len(self.buf) - self.pos} trailing bytes")


def decode_header(payload: bytes, sender: int) -> Header:
    """The header, checked against the format and against the transport-level ``sender``."""
    who: int | str = "server" if sender == SERVER else sender
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise SecAggError(f"payload is {type(payload).__name__}, not bytes", sender=who, field="payload")
    payload = bytes(payload)
    if len(payload) < HEADER_BYTES:
        raise SecAggError(f"truncated header: {len(payload)} of {HEADER_BYTES} bytes", sender=who, field="header")
    magic, version, typ, session, rnd, snd, rcp = HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise SecAggError(f"bad magic {magic!r}", sender=who, field="magic")
    if version != VERSION:
        raise SecAggError(f"unsupported version {version} (this is version {VERSION})", sender=who, field="version")
    try:
        mtype = MsgType(typ)
    except ValueError:
        raise SecAggError(f"unknown message type {typ}", sender=who, field="type") from None
    if snd != sender:
        raise SecAggError(f"header names sender {snd}, the channel says {sender}", sender=who, field="sender")
    uplink = mtype in UPLINK
    if uplink and (snd == SERVER or rcp != SERVER):
        raise SecAggError(f"{mtype.name} must go from a client to the server", sender=who, field="recipient")
    if not uplink and (snd != SERVER or rcp == SERVER):
        raise SecAggError(f"{mtype.name} must go from the server to a client", sender=who, field="sender")
    return Header(mtype, session, rnd, snd, rcp)


def decode_body(header: Header, payload: bytes, limits: Limits = Limits()) -> Body:
    who: int | str = "server" if header.sender == SERVER else header.sender
    r = _Reader(bytes(payload), HEADER_BYTES, who, header.type.name)
    body = _DECODERS[header.type](r, header, limits)
    r.end()
    return body


def decode(payload: bytes, sender: int, limits: Limits = Limits()) -> tuple[Header, Body]:
    """Header and body of one message (format checks only; see :func:`check_header`)."""
    header = decode_header(payload, sender)
    return header, decode_body(header, payload, limits)


def _setup(r: _Reader, h: Header, lim: Limits) -> Setup:
    dim = r.u32("dim")
    if not 1 <= dim <= lim.max_dim:
        raise r.fail("dim", f"{dim} outside [1, {lim.max_dim}]")
    bits = r.u8("bits")
    if not MIN_BITS <= bits <= MAX_BITS:
        raise r.fail("bits", f"{bits} outside [{MIN_BITS}, {MAX_BITS}]")
    q = r.u8("quant_bits")
    if not 1 <= q <= min(MAX_QUANT_BITS, bits - 1):
        raise r.fail("quant_bits", f"{q} outside [1, {min(MAX_QUANT_BITS, bits - 1)}]")
    t = r.u16("threshold")
    count = r.u16("ranges.count")
    if not 1 <= count <= dim:
        raise r.fail("ranges.count", f"{count} runs outside [1, dim = {dim}]")
    ranges = []
    for i in range(count):
        n = r.u32(f"ranges[{i}].length")
        lo, hi = r.unpack("dd", f"ranges[{i}]")
        if n < 1:
            raise r.fail(f"ranges[{i}].length", "is 0")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi and math.isfinite(hi - lo)):
            raise r.fail(f"ranges[{i}]", f"[{lo}, {hi}] is not a finite interval with lo < hi")
        ranges.append((n, lo, hi))
    if sum(n for n, _, _ in ranges) != dim:
        raise r.fail("ranges", f"runs cover {sum(n for n, _, _ in ranges)} coordinates, dim is {dim}")
    nb = r.ids("neighbours", min_count=1)
    if h.recipient in nb:
        raise r.fail("neighbours", "lists the recipient itself")
    if not 2 <= t <= len(nb) + 1:
        raise r.fail("threshold", f"{t} outside [2, {len(nb) + 1}] (share group of {len(nb) + 1})")
    return Setup(dim, bits, q, t, tuple(ranges), nb)


def _key_pair(r: _Reader, prefix: str) -> tuple[bytes, bytes]:
    c_pk = r.take(PK_BYTES, f"{prefix}c_pk")
    s_pk = r.take(PK_BYTES, f"{prefix}s_pk")
    if c_pk == s_pk:
        raise r.fail(f"{prefix}s_pk", "equals c_pk; the two key pairs must differ")
    return c_pk, s_pk


def _advertise(r: _Reader, h: Header, lim: Limits) -> Advertise:
    return Advertise(*_key_pair(r, ""))


def _signed_advertise(r: _Reader, h: Header, lim: Limits) -> SignedAdvertise:
    c_pk, s_pk = _key_pair(r, "")
    return SignedAdvertise(c_pk, s_pk, r.take(SIGNATURE_BYTES, "signature"))


def _keys(r: _Reader, h: Header, lim: Limits) -> Keys:
    count = r.u16("entries.count")
    entries = []
    for i in range(count):
        cid = r.client_id(f"entries[{i}].id")
        entries.append((cid, *_key_pair(r, f"entries[{i}].")))
    r.increasing([e[0] for e in entries], "entries.id")
    return Keys(tuple(entries))


def _signed_keys(r: _Reader, h: Header, lim: Limits) -> SignedKeys:
    count = r.u16("entries.count")
    entries = []
    for i in range(count):
        cid = r.client_id(f"entries[{i}].id")
        c_pk, s_pk = _key_pair(r, f"entries[{i}].")
        entries.append((cid, c_pk, s_pk, r.take(SIGNATURE_BYTES, f"entries[{i}].signature")))
    r.increasing([e[0] for e in entries], "entries.id")
    return SignedKeys(tuple(entries))


def _consistency_check(r: _Reader, h: Header, lim: Limits) -> ConsistencyCheck:
    return ConsistencyCheck(r.ids("survivors", min_count=1))


def _consistency_signature(r: _Reader, h: Header, lim: Limits) -> ConsistencySignature:
    return ConsistencySignature(r.take(SIGNATURE_BYTES, "signature"))


def _signatures(r: _Reader, h: Header, lim: Limits) -> Signatures:
    count = r.u16("entries.count")
    entries = []
    for i in range(count):
        cid = r.client_id(f"entries[{i}].id")
        entries.append((cid, r.take(SIGNATURE_BYTES, f"entries[{i}].signature")))
    r.increasing([e[0] for e in entries], "entries.id")
    return Signatures(tuple(entries))


def _sealed_entries(r: _Reader, h: Header, lim: Limits) -> tuple[tuple[int, bytes], ...]:
    count = r.u16("entries.count")
    entries = []
    for i in range(count):
        cid = r.client_id(f"entries[{i}].id")
        entries.append((cid, r.take(SEALED_BYTES, f"entries[{i}].sealed")))
    r.increasing([e[0] for e in entries], "entries.id")
    return tuple(entries)


def _shares(r: _Reader, h: Header, lim: Limits) -> Shares:
    return Shares(_sealed_entries(r, h, lim))


def _forward(r: _Reader, h: Header, lim: Limits) -> Forward:
    entries = _sealed_entries(r, h, lim)
    if any(cid == h.recipient for cid, _ in entries):
        raise r.fail("entries.id", "forwards a share from the recipient to itself")
    return Forward(entries)


def _masked(r: _Reader, h: Header, lim: Limits) -> Masked:
    dim = r.u32("dim")
    if lim.dim is not None and dim != lim.dim:
        raise r.fail("dim", f"{dim}, expected {lim.dim}")
    if not 1 <= dim <= lim.max_dim:
        raise r.fail("dim", f"{dim} outside [1, {lim.max_dim}]")
    width = r.u8("width")
    if width not in (4, 8):
        raise r.fail("width", f"{width} bytes per word, expected 4 or 8")
    if lim.bits is not None and width != (4 if lim.bits <= 32 else 8):
        raise r.fail("width", f"{width} bytes per word for {lim.bits}-bit arithmetic")
    raw = r.take(dim * width, "values")
    values = np.frombuffer(raw, dtype=np.dtype("<u4") if width == 4 else np.dtype("<u8"))
    if lim.bits is not None and lim.bits < 8 * width:
        top = int(values.max())
        if top >> lim.bits:
            raise r.fail("values", f"word {top} outside Z_2^{lim.bits}")
    return Masked(values)


def _unmask_request(r: _Reader, h: Header, lim: Limits) -> UnmaskRequest:
    surv = r.ids("survivors", min_count=1)
    drop = r.ids("dropped")
    both = set(surv) & set(drop)
    if both:
        raise r.fail("dropped", f"client {min(both)} listed as both survivor and dropped")
    return UnmaskRequest(surv, drop)


def _unmask(r: _Reader, h: Header, lim: Limits) -> Unmask:
    count = r.u16("entries.count")
    entries = []
    for i in range(count):
        owner = r.client_id(f"entries[{i}].owner")
        kind = r.u8(f"entries[{i}].kind")
        try:
            k = ShareKind(kind)
        except ValueError:
            raise r.fail(f"entries[{i}].kind", f"unknown share kind {kind}") from None
        entries.append((owner, k, r.share(f"entries[{i}].share")))
    r.increasing([e[0] for e in entries], "entries.owner")
    return Unmask(tuple(entries))


_DECODERS = {
    MsgType.SETUP: _setup, MsgType.ADVERTISE: _advertise, MsgType.KEYS: _keys, MsgType.SHARES: _shares,
    MsgType.FORWARD: _forward, MsgType.MASKED: _masked, MsgType.UNMASK_REQUEST: _unmask_request,
    MsgType.UNMASK: _unmask, MsgType.SIGNED_ADVERTISE: _signed_advertise, MsgType.SIGNED_KEYS: _signed_keys,
    MsgType.CONSISTENCY_CHECK: _consistency_check, MsgType.CONSISTENCY_SIGNATURE: _consistency_signature,
    MsgType.SIGNATURES: _signatures,
}


def decode_share_plaintext(pt: bytes, *, sender: int, holder: int) -> SharePlaintext:
    """The decrypted share from ``sender`` to ``holder``; its ids must name exactly those two."""
    r = _Reader(bytes(pt), 0, sender, "sealed share")
    owner = r.u32("owner")
    hold = r.u32("holder")
    if owner != sender:
        raise r.fail("owner", f"share of client {owner} sealed by client {sender}")
    if hold != holder:
        raise r.fail("holder", f"share for client {hold} delivered to client {holder}")
    mk = r.share("mask_key_share")
    sd = r.share("seed_share")
    r.end()
    return SharePlaintext(owner, hold, mk, sd)


# --- stateful checks ----------------------------------------------------------------------------


def check_header(
    h: Header, *, me: int, session: bytes | None, round_: int, expected: MsgType | None, stage: str,
    accepted: set[tuple[int, MsgType]],
) -> None:
    """Reject a message not meant for this party now: wrong recipient, another round or session
    (a replay), a second message of a type already accepted from this sender in this round (a
    duplicate), or a type this stage does not expect (out of order). ``session=None`` accepts
    any session (a client before SETUP)."""
    who: int | str = "server" if h.sender == SERVER else h.sender
    name = h.type.name
    if h.recipient != me:
        raise SecAggError(f"{name} addressed to {h.recipient}, not to this party ({me})", sender=who, field="recipient")
    if h.round != round_:
        raise SecAggError(f"{name} of round {h.round} in round {round_} (replayed?)", sender=who, field="round")
    if session is not None and h.session != session:
        raise SecAggError(f"{name} from another session (replayed?)", sender=who, field="session")
    if (h.sender, h.type) in accepted:
        raise SecAggError(f"duplicate {name} (one was already accepted this round)", sender=who, field="type")
    if expected is None or h.type != expected:
        want = expected.name if expected is not None else "nothing"
        raise SecAggError(f"out of order: {name} in stage {stage!r}, expecting {want}", sender=who, field="type")
