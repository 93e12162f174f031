"""Cryptographic primitives of the protocol, all from ``cryptography`` (OpenSSL).

* Key agreement: X25519, the raw shared secret run through HKDF-SHA256 with the round's session
  id as salt and a purpose label (plus the two party ids) as info, so keys never repeat across
  rounds, purposes or pairs. Public keys of small order (the all-zero shared secret with every
  private key) are refused: :func:`is_small_order`.
* Signatures (``adversary = "active"``): Ed25519 with long-term keys registered in a PKI
  (:mod:`.pki`).
* Share encryption: AES-256-GCM; the nonce is derived from (sender, recipient), which is unique
  per key (one key per pair and round, one message per direction).
* Mask expansion: AES-256-CTR keyed with the full 32-byte seed, zero IV, producing the whole
  mask vector in one OpenSSL call, read as little-endian words.
* Randomness: :class:`OsRandomness` (``os.urandom``) for real use; :class:`SeededRandomness`
  derives every byte from a seed and is **for tests and reproducible benchmarks only** — its
  keys are as secret as the seed.
"""

from __future__ import annotations

import os
import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedsafe.privacy.secagg.errors import SecAggError

KEY_BYTES = 32
TAG_BYTES = 16
_LABEL = b"fedsafe/secagg/v1/"


# --- randomness ---------------------------------------------------------------------------------


class OsRandomness:
    """Bytes from the operating system's CSPRNG."""

    def bytes(self, n: int) -> bytes:
        return os.urandom(n)


class SeededRandomness:
    """A deterministic byte stream: AES-256-CTR keyed by HKDF(seed, label).

    For tests and reproducible benchmarks only: anyone who knows the seed knows every key."""

    def __init__(self, seed: int | bytes, label: str) -> None:
        raw = seed if isinstance(seed, bytes) else int(seed).to_bytes(16, "big", signed=False)
        self.spec = (raw, label)  # to rebuild the same fresh stream in another process
        key = hkdf(raw, salt=b"fedsafe-test-randomness", info=label.encode())
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def bytes(self, n: int) -> bytes:
        return self._enc.update(bytes(n))


# --- keys -------------------------------------------------------------------------------------


def hkdf(secret: bytes, *, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


def new_private_key(rand: OsRandomness | SeededRandomness) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(rand.bytes(KEY_BYTES))


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes_of(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


# Any fixed scalar detects small order: X25519 clamps every scalar to a multiple of 8, the
# cofactor, so the product with a point of order 1, 2, 4 or 8 is the identity, whatever the scalar.
_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(1, KEY_BYTES + 1)))


def is_small_order(public: bytes) -> bool:
    """True when the 32-byte X25519 public key has small order (1, 2, 4 or 8): every key
    agreement with it yields the all-zero shared secret, so a party advertising it could not
    share a secret with anyone (and would make every peer reject it). Canonical or not (the
    u-coordinate is read mod p, the top bit ignored), such keys are exactly those for which the
    exchange with a fixed key gives zero; OpenSSL refuses that exchange."""
    if len(public) != KEY_BYTES:
        raise ValueError(f"an X25519 public key has {KEY_BYTES} bytes, got {len(public)}")
    try:
        _PROBE.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:
        return True
    return False


def agree(
    private: X25519PrivateKey, peer_public: bytes, *, session: bytes, purpose: str, a: int, b: int,
    peer: int | str | None = None, field: str | None = None,
) -> bytes:
    """A 32-byte key shared by the holders of ``private`` and of ``peer_public``.

    ``a``, ``b`` are the two party ids (order-independent). A public key that yields the all-zero
    shared secret (a small-order point) is rejected, naming ``peer`` and ``field``."""
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as e:
        raise SecAggError(f"unusable X25519 public key ({e})", sender=peer, field=field) from None
    lo, hi = min(a, b), max(a, b)
    return hkdf(shared, salt=session, info=_LABEL + purpose.encode() + struct.pack("!II", lo, hi))


# --- signatures (long-term identity keys) -------------------------------------------------------


def new_signing_key(rand: OsRandomness | SeededRandomness) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(rand.bytes(KEY_BYTES))


def signing_key_from_bytes(raw: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(raw)


def signing_key_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def verification_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def sign(key: Ed25519PrivateKey, message: bytes) -> bytes:
    return key.sign(message)


def verify(verification_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under the raw 32-byte
    ``verification_key`` (a malformed key or signature is simply invalid)."""
    try:
        Ed25519PublicKey.from_public_bytes(verification_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# --- share encryption -------------------------------------------------------------------------


def _nonce(sender: int, recipient: int) -> bytes:
    return struct.pack("!IIxxxx", sender, recipient)


def seal(key: bytes, sender: int, recipient: int, plaintext: bytes, aad: bytes) -> bytes:
    return AESGCM(key).encrypt(_nonce(sender, recipient), plaintext, aad)


def open_sealed(
    key: bytes, sender: int, recipient: int, ciphertext: bytes, aad: bytes, *, field: str,
    via: int | str | None = None,
) -> bytes:
    """Decrypt a share sealed by ``sender`` for ``recipient``; ``via`` is the party that
    delivered it (named in the error, since either it or the author may have altered it)."""
    try:
        return AESGCM(key).decrypt(_nonce(sender, recipient), ciphertext, aad)
    except InvalidTag:
        raise SecAggError(
            f"sealed share of client {sender} for client {recipient} failed authentication",
            sender=via if via is not None else sender, field=field,
        ) from None


# --- mask expansion -----------------------------------------------------------------------------


class MaskExpander:
    """Expands 32-byte seeds into mask vectors of ``dim`` words of ``dtype`` (AES-256-CTR).

    Reuses one zero input and one output buffer across calls, so an expansion is a single OpenSSL
    call with no allocation; the returned array is a view of that buffer, valid until the next
    call."""

    def __init__(self, dim: int, dtype: np.dtype) -> None:
        self.dim = dim
        self.dtype = np.dtype(dtype)
        self.nbytes = dim * self.dtype.itemsize
        self._zeros = bytes(self.nbytes)
        self._buf = bytearray(self.nbytes + 15)  # update_into wants block_size - 1 spare bytes

    def __call__(self, seed: bytes) -> np.ndarray:
        if len(seed) != KEY_BYTES:
            raise ValueError(f"mask seed must be {KEY_BYTES} bytes")
        enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
        enc.update_into(self._zeros, self._buf)
        return np.frombuffer(self._buf, dtype=self.dtype, count=self.dim)


def expand_mask(seed: bytes, dim: int, dtype: np.dtype) -> np.ndarray:
    """A fresh mask vector (see :class:`MaskExpander`)."""
    return MaskExpander(dim, dtype)(seed).copy()
