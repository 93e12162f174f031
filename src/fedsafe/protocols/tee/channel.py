"""Authenticated encryption between parties: X25519 key agreement, HKDF-SHA256, AES-256-GCM
(the primitives of :mod:`fedsafe.protocols.crypto`; this module holds the TEE's labels, nonces,
associated data and framing).

Two shapes of channel:

* **Client → enclave** (:func:`seal_for` / :func:`open_sealed`): one-shot, ECIES-style. The
  client draws an ephemeral X25519 key, agrees a secret with the enclave's attested public key,
  derives a single-use AES key with HKDF whose ``info`` binds the enclave measurement, both
  public keys and the caller's context (round, client id), and encrypts with the header as
  associated data. A ciphertext replayed into another round or under another client id fails
  authentication.
* **Enclave ↔ accelerator** (:class:`ChannelEnd`): a session from one X25519 agreement. HKDF
  gives one key per direction; every message carries a sequence number that is the GCM nonce
  and part of the associated data, and the receiver accepts only the next number, so a
  dropped, replayed or reordered message is an error. Long messages are cut into 64 MiB
  chunks (GCM's per-call limit is 2^31 bytes), each authenticated with its index and the
  chunk count.

Who can read what: the host relays every byte and sees only ciphertexts and headers (sizes,
round numbers). The channel does not authenticate *which* accelerator is at the other end:
under the paper's honest-but-curious host, the host wires the enclave to two distinct,
non-colluding accelerators; a host that man-in-the-middles both channels is equivalent to
colluding accelerators (see ``threats``).
"""

from __future__ import annotations

import hashlib
import os
import struct

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

# IntegrityError and public_bytes are also this module's own interface (enclave, accelerator,
# host and tests import them from here).
from fedsafe.protocols.crypto import (
    KEY_BYTES,
    TAG_BYTES,
    IntegrityError,
    aes_gcm_decrypt,
    aes_gcm_decrypt_chunks,
    aes_gcm_encrypt,
    aes_gcm_encrypt_into,
    public_bytes,
    x25519_agree,
    x25519_private_key,
)
from fedsafe.protocols.tee.wire import WireError, frame_with_slots, unpack

CHUNK = 64 << 20  # bytes of plaintext per GCM call

_CLIENT_INFO = b"fedsafe/tee/client->enclave/v1|"
_CHANNEL_INFO = b"fedsafe/tee/channel/v1|"


def _agree(private: X25519PrivateKey, peer_public: bytes, info: bytes, length: int) -> bytes:
    # The host relays every public key, so a key of the wrong length is a tampered message
    # (IntegrityError); a small-order key stays a ValueError (KeyAgreementError), as before.
    if len(peer_public) != KEY_BYTES:
        raise IntegrityError(f"an X25519 public key has {KEY_BYTES} bytes, got {len(peer_public)}")
    return x25519_agree(private, peer_public, salt=None, info=info, length=length)


# --- client -> enclave ---------------------------------------------------------------------


def seal_for(recipient_public: bytes, plaintext: bytes | memoryview, *, context: bytes, aad: bytes) -> bytes:
    """Encrypt ``plaintext`` to the holder of ``recipient_public``'s private key.

    ``context`` goes into the key derivation (e.g. measurement, round, client id); ``aad`` is
    authenticated but not encrypted. Returns ``ephemeral_public (32) | ciphertext``."""
    eph = x25519_private_key()
    eph_pub = public_bytes(eph)
    key = _agree(eph, recipient_public, _CLIENT_INFO + context + eph_pub + bytes(recipient_public), 32)
    # The key is used once, so a fixed nonce is safe.
    return eph_pub + aes_gcm_encrypt(key, bytes(12), plaintext, aad)


def open_sealed(private: X25519PrivateKey, sealed: bytes | memoryview, *, context: bytes, aad: bytes) -> bytes:
    """Inverse of :func:`seal_for`; raises IntegrityError if anything was changed."""
    sealed = memoryview(sealed)
    if sealed.nbytes < KEY_BYTES + TAG_BYTES:
        raise IntegrityError(f"sealed message of {sealed.nbytes} bytes is too short")
    eph_pub = bytes(sealed[:KEY_BYTES])
    key = _agree(private, eph_pub, _CLIENT_INFO + context + eph_pub + public_bytes(private), 32)
    try:
        return aes_gcm_decrypt(key, bytes(12), sealed[KEY_BYTES:], aad)
    except IntegrityError:
        raise IntegrityError("client ciphertext failed authentication") from None


def client_binding(measurement: bytes, round_: int, client_id: int, dim: int) -> tuple[bytes, bytes]:
    """``(context, aad)`` binding a client's upload to the enclave build, the round, the client
    id and the vector's length (float32): a ciphertext moved to another round or relabelled
    as another client fails authentication."""
    fields = struct.pack("<qqq", round_, client_id, dim)
    return bytes(measurement) + fields, b"fedsafe/tee/update/v1|<f4|" + fields


# --- enclave <-> accelerator ---------------------------------------------------------------


class ChannelEnd:
    """One end of an enclave ↔ accelerator session.

    Both ends compute the same 64 bytes ``HKDF(X25519(a, B), info = name | enclave_pub |
    accelerator_pub)`` and split them into the enclave→accelerator and accelerator→enclave
    keys. ``role`` is ``"enclave"`` or ``"accelerator"``.
    """

    def __init__(self, private: X25519PrivateKey, peer_public: bytes, *, name: str, role: str) -> None:
        if role not in ("enclave", "accelerator"):
            raise ValueError(f"role must be 'enclave' or 'accelerator', got {role!r}")
        mine, theirs = public_bytes(private), bytes(peer_public)
        enclave_pub, acc_pub = (mine, theirs) if role == "enclave" else (theirs, mine)
        okm = _agree(private, theirs, _CHANNEL_INFO + name.encode() + b"|" + enclave_pub + acc_pub, 64)
        e2a, a2e = okm[:32], okm[32:]
        self.name = name
        self._send_key, self._recv_key = (e2a, a2e) if role == "enclave" else (a2e, e2a)
        self._send_dir = b"E2A" if role == "enclave" else b"A2E"
        self._recv_dir = b"A2E" if role == "enclave" else b"E2A"
        self._send_seq = 0
        self._recv_seq = 0

    def _aad(self, direction: bytes, seq: int, kind: str, index: int, count: int) -> bytes:
        return b"|".join([b"fedsafe/tee", self.name.encode(), direction, kind.encode(),
                          struct.pack("<QII", seq, index, count)])

    @staticmethod
    def _nonce(seq: int, index: int) -> bytes:
        # seq and chunk index are unique per key, so nonces never repeat under one key.
        return struct.pack("<QI", seq, index)

    def seal(self, plaintext: bytes | bytearray | memoryview | list, *, kind: str) -> bytearray:
        """Encrypt the next message of this direction; ``kind`` names what it is.

        ``plaintext`` may be a list of buffers (``wire.pack_parts``): each is encrypted in
        place into the output frame, in chunks of at most 64 MiB, with no intermediate copy."""
        parts = plaintext if isinstance(plaintext, list) else [plaintext]
        views = [memoryview(p).cast("B") for p in parts]
        pieces = [v[i : i + CHUNK] for v in views for i in range(0, max(v.nbytes, 1), CHUNK)]
        pieces = [p for p in pieces if p.nbytes] or [memoryview(b"")]
        seq = self._send_seq
        self._send_seq += 1
        count = len(pieces)
        frame, slots = frame_with_slots(
            {"channel": self.name, "seq": seq, "kind": kind, "chunks": count},
            {f"c{i}": p.nbytes + TAG_BYTES for i, p in enumerate(pieces)},
        )
        for i, p in enumerate(pieces):
            nonce, aad = self._nonce(seq, i), self._aad(self._send_dir, seq, kind, i, count)
            aes_gcm_encrypt_into(self._send_key, nonce, p, aad, slots[f"c{i}"])
        return frame

    def open(self, message: bytes | bytearray | memoryview, *, kind: str) -> bytearray:
        """Decrypt the next message from the other end into a new writable buffer; anything
        but the expected sequence number, kind and untouched bytes raises IntegrityError."""
        try:
            head, _, blobs = unpack(message)
        except WireError as e:
            raise IntegrityError(f"channel {self.name}: malformed message: {e}") from None
        seq, count = head.get("seq"), head.get("chunks")
        if head.get("channel") != self.name or head.get("kind") != kind:
            raise IntegrityError(
                f"channel {self.name}: expected a {kind!r} message, got {head.get('kind')!r} "
                f"on channel {head.get('channel')!r}"
            )
        if seq != self._recv_seq:
            raise IntegrityError(
                f"channel {self.name}: expected message {self._recv_seq}, got {seq} (replayed, "
                "dropped or reordered)"
            )
        if not isinstance(count, int) or count < 1 or len(blobs) != count:
            raise IntegrityError(f"channel {self.name}: bad chunk count {count!r}")
        try:
            chunks = [blobs[f"c{i}"] for i in range(count)]
        except KeyError:
            raise IntegrityError(f"channel {self.name}: message {seq} lacks a chunk") from None
        if any(c.nbytes < TAG_BYTES for c in chunks):
            raise IntegrityError(f"channel {self.name}: message {seq} has a truncated chunk")
        try:
            out = aes_gcm_decrypt_chunks(
                self._recv_key, chunks, [self._nonce(seq, i) for i in range(count)],
                [self._aad(self._recv_dir, seq, kind, i, count) for i in range(count)],
            )
        except IntegrityError:
            raise IntegrityError(f"channel {self.name}: message {seq} failed authentication") from None
        self._recv_seq += 1
        return out


def digest(data: bytes | memoryview) -> str:
    """SHA-256 hex digest (what a party received, for ``Aggregate.seen`` and audits)."""
    return hashlib.sha256(data).hexdigest()


def random_bytes(n: int) -> bytes:
    return os.urandom(n)
