"""The protocol's cryptography: its labels, nonces and key schedule on the primitives of
:mod:`fedsafe.protocols.crypto` (X25519, HKDF-SHA256, AES-256-GCM/CTR, Ed25519 from
``cryptography``), which this module re-exports under the names the protocol uses.

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
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedsafe.protocols.crypto import (
    KEY_BYTES,
    IntegrityError,
    KeyAgreementError,
    aes_ctr_keystream,
    aes_gcm_decrypt,
    aes_gcm_encrypt,
    ed25519_private_key,
    hkdf,
    is_small_order,
    private_bytes,
    public_bytes,
    sign,
    verify,
    x25519_agree,
    x25519_private_key,
)
from fedsafe.protocols.secagg.errors import SecAggError

# Re-exported: the protocol's modules and tests reach every primitive through this module.
__all__ = [
    "KEY_BYTES", "MaskExpander", "OsRandomness", "SeededRandomness", "agree", "ed25519_private_key", "expand_mask",
    "hkdf", "is_small_order", "new_private_key", "new_signing_key", "open_sealed", "private_bytes", "public_bytes",
    "seal", "sign", "verification_bytes", "verify", "x25519_private_key",
]

_LABEL = b"fedsafe/secagg/v1/"

# An Ed25519 verification key is the raw public key of the signing key.
verification_bytes = public_bytes


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
        self._enc = aes_ctr_keystream(hkdf(raw, salt=b"fedsafe-test-randomness", info=label.encode()))

    def bytes(self, n: int) -> bytes:
        return self._enc.update(bytes(n))


# --- keys -------------------------------------------------------------------------------------


def new_private_key(rand: OsRandomness | SeededRandomness) -> X25519PrivateKey:
    """An X25519 private key drawn from ``rand``."""
    return x25519_private_key(rand.bytes(KEY_BYTES))


def agree(
    private: X25519PrivateKey, peer_public: bytes, *, session: bytes, purpose: str, a: int, b: int,
    peer: int | str | None = None, field: str | None = None,
) -> bytes:
    """A 32-byte key shared by the holders of ``private`` and of ``peer_public``.

    ``a``, ``b`` are the two party ids (order-independent). A public key that yields the all-zero
    shared secret (a small-order point) is rejected, naming ``peer`` and ``field``."""
    lo, hi = min(a, b), max(a, b)
    try:
        return x25519_agree(private, peer_public, salt=session,
                            info=_LABEL + purpose.encode() + struct.pack("!II", lo, hi))
    except KeyAgreementError as e:
        raise SecAggError(f"unusable X25519 public key ({e})", sender=peer, field=field) from None


# --- signatures (long-term identity keys) -------------------------------------------------------


def new_signing_key(rand: OsRandomness | SeededRandomness) -> Ed25519PrivateKey:
    """An Ed25519 signing key drawn from ``rand``."""
    return ed25519_private_key(rand.bytes(KEY_BYTES))


# --- share encryption -------------------------------------------------------------------------


def _nonce(sender: int, recipient: int) -> bytes:
    return struct.pack("!IIxxxx", sender, recipient)


def seal(key: bytes, sender: int, recipient: int, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM of a share from ``sender`` to ``recipient`` (the pair's key, its own nonce)."""
    return aes_gcm_encrypt(key, _nonce(sender, recipient), plaintext, aad)


def open_sealed(
    key: bytes, sender: int, recipient: int, ciphertext: bytes, aad: bytes, *, field: str,
    via: int | str | None = None,
) -> bytes:
    """Decrypt a share sealed by ``sender`` for ``recipient``; ``via`` is the party that
    delivered it (named in the error, since either it or the author may have altered it)."""
    try:
        return aes_gcm_decrypt(key, _nonce(sender, recipient), ciphertext, aad)
    except IntegrityError:
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
        aes_ctr_keystream(seed).update_into(self._zeros, self._buf)
        return np.frombuffer(self._buf, dtype=self.dtype, count=self.dim)


def expand_mask(seed: bytes, dim: int, dtype: np.dtype) -> np.ndarray:
    """A fresh mask vector (see :class:`MaskExpander`)."""
    return MaskExpander(dim, dtype)(seed).copy()
