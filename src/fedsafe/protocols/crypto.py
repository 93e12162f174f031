"""The cryptographic primitives shared by the privacy protocols, all from ``cryptography`` (OpenSSL).

What it offers:

* **Keys**: X25519 (key agreement) and Ed25519 (signatures) private keys, fresh or from their
  raw bytes (:func:`x25519_private_key`, :func:`ed25519_private_key`), and their raw encodings
  (:func:`public_bytes`, :func:`private_bytes`).
* **Key agreement**: :func:`x25519_agree` runs X25519 and feeds the raw shared secret straight
  into HKDF-SHA256, refusing peer keys of small order (:func:`is_small_order`), with which every
  agreement yields the all-zero secret: :class:`KeyAgreementError`.
* **Key derivation**: :func:`hkdf`, HKDF-SHA256 with the salt and info always named by the
  caller.
* **Signatures**: :func:`sign`, :func:`verify` (Ed25519).
* **Authenticated encryption**: AES-256-GCM, to fresh bytes or into a caller's buffer, and a
  sequence of chunks into one buffer (:func:`aes_gcm_decrypt_chunks`); a failed tag is an
  :class:`IntegrityError`.
* **Keystreams**: :func:`aes_ctr_keystream`, AES-256-CTR from a zero counter block, for
  expanding a 32-byte key into as many pseudorandom bytes as needed.

Why one module: secure aggregation (``secagg``) and the TEE protocol (``tee``) use the same
X25519/HKDF/AES constructions, and each had its own copy, down to the same workaround for old
``cryptography`` releases. One copy means one place to review, one set of length checks and one
error type for a failed tag. What stays with each protocol is what makes it *that* protocol:
its labels (HKDF ``info`` strings and salts), key schedules, nonce layouts, associated data,
message formats and the errors it reports. This module imports only the standard library,
``cryptography`` and ``fedsafe.core.errors`` (the base of its errors), so the enclave can measure it
(``tee.attestation.ENCLAVE_MODULES``) without pulling in anything else.

Conventions (all lengths in bytes):

* X25519 and Ed25519 keys, raw: 32 (private and public); Ed25519 signatures: 64.
* AES keys: 32 (AES-256) for GCM and CTR alike; a shorter key is refused, never silently run as
  AES-128.
* GCM nonces: 12 (96 bits), tags: 16, appended to the ciphertext. Nonces are the caller's: each
  protocol builds them from counters or party ids so that a (key, nonce) pair never repeats, and
  says why in its own module.
* CTR: the initial counter block is 16 zero bytes; every key must therefore be used for one
  stream only (the callers derive a fresh key or seed per stream).
* HKDF-SHA256 output defaults to 32 bytes; ``salt=None`` is HKDF's all-zero salt (RFC 5869).
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import (
    Cipher,
    CipherContext,
    algorithms,
    modes,
)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from fedsafe.core.errors import FedsafeError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16

Buffer = bytes | bytearray | memoryview

# encrypt_into / decrypt_into (no intermediate copy of large payloads) exist from cryptography 44.
_HAS_INTO = hasattr(AESGCM, "decrypt_into") and hasattr(AESGCM, "encrypt_into")


class IntegrityError(FedsafeError, ValueError):
    """A ciphertext failed authentication (tampered, replayed, reordered, or the wrong key)."""


class KeyAgreementError(FedsafeError, ValueError):
    """A peer's X25519 public key cannot be used: wrong length, or of small order."""


# --- keys ---------------------------------------------------------------------------------------


def x25519_private_key(raw: bytes | None = None) -> X25519PrivateKey:
    """The X25519 private key with these 32 raw bytes; a fresh one from the OS when ``None``."""
    return X25519PrivateKey.generate() if raw is None else X25519PrivateKey.from_private_bytes(raw)


def ed25519_private_key(raw: bytes | None = None) -> Ed25519PrivateKey:
    """The Ed25519 private key with these 32 raw bytes; a fresh one from the OS when ``None``."""
    return Ed25519PrivateKey.generate() if raw is None else Ed25519PrivateKey.from_private_bytes(raw)


def public_bytes(key: X25519PrivateKey | X25519PublicKey | Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key, or of a private key's public half."""
    pub = key.public_key() if isinstance(key, (X25519PrivateKey, Ed25519PrivateKey)) else key
    return pub.public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey | Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of a private key (to be secret-shared or handed to another process)."""
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


# --- key agreement ------------------------------------------------------------------------------


def _exchange(private: X25519PrivateKey, peer_public: Buffer) -> bytes:
    if len(peer_public) != KEY_BYTES:
        raise KeyAgreementError(f"an X25519 public key has {KEY_BYTES} bytes, got {len(peer_public)}")
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError:
        # OpenSSL refuses exactly the exchanges whose result is all zeros (RFC 7748, sec. 6.1).
        raise KeyAgreementError(
            "small-order X25519 public key: every key agreement with it gives the all-zero secret"
        ) from None


# Any fixed scalar detects small order: X25519 clamps every scalar to a multiple of 8, the
# cofactor, so the product with a point of order 1, 2, 4 or 8 is the identity, whatever the scalar.
_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(1, KEY_BYTES + 1)))


def is_small_order(public: Buffer) -> bool:
    """True when the 32-byte X25519 public key has small order (1, 2, 4 or 8): every key
    agreement with it yields the all-zero shared secret, so a party advertising it could not
    share a secret with anyone (and would make every peer reject it). Canonical or not (the
    u-coordinate is read mod p, the top bit ignored), such keys are exactly those for which the
    exchange with a fixed key gives zero; OpenSSL refuses that exchange. Raises ValueError for
    a key that is not 32 bytes."""
    if len(public) != KEY_BYTES:
        raise ValueError(f"an X25519 public key has {KEY_BYTES} bytes, got {len(public)}")
    try:
        _exchange(_PROBE, public)
    except KeyAgreementError:
        return True
    return False


def x25519_agree(
    private: X25519PrivateKey, peer_public: Buffer, *, salt: bytes | None, info: bytes, length: int = KEY_BYTES,
) -> bytes:
    """``HKDF-SHA256(X25519(private, peer_public), salt, info)``: ``length`` bytes that the
    holders of ``private`` and of ``peer_public``'s private key both derive. The raw shared
    secret never leaves this function. Raises :class:`KeyAgreementError` for a peer key that is
    not 32 bytes or has small order."""
    return hkdf(_exchange(private, peer_public), salt=salt, info=info, length=length)


# --- key derivation -----------------------------------------------------------------------------


def hkdf(secret: bytes, *, salt: bytes | None, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``secret``: ``length`` bytes bound to ``salt`` and ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


# --- signatures ---------------------------------------------------------------------------------


def sign(key: Ed25519PrivateKey, message: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``message``."""
    return key.sign(message)


def verify(verification_key: Buffer, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under the raw 32-byte
    ``verification_key`` (a malformed key or signature is simply invalid)."""
    try:
        Ed25519PublicKey.from_public_bytes(bytes(verification_key)).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# --- authenticated encryption: AES-256-GCM ------------------------------------------------------


def _gcm(key: bytes, nonce: bytes) -> AESGCM:
    # AESGCM would also take 16- or 24-byte keys and other nonce lengths; the protocols never
    # mean to, so such a call is a bug to surface, not a weaker cipher to run.
    if len(key) != KEY_BYTES:
        raise ValueError(f"an AES-256 key has {KEY_BYTES} bytes, got {len(key)}")
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"an AES-GCM nonce has {NONCE_BYTES} bytes, got {len(nonce)}")
    return AESGCM(key)


def aes_gcm_encrypt(key: bytes, nonce: bytes, plaintext: Buffer, aad: bytes) -> bytes:
    """``ciphertext | tag`` (``len(plaintext) + 16`` bytes) of ``plaintext``, authenticating
    ``aad`` too. The caller guarantees ``nonce`` is never reused under ``key``."""
    return _gcm(key, nonce).encrypt(nonce, plaintext, aad)


def aes_gcm_encrypt_into(key: bytes, nonce: bytes, plaintext: Buffer, aad: bytes, out: memoryview) -> None:
    """:func:`aes_gcm_encrypt` written into ``out`` (exactly ``len(plaintext) + 16`` bytes),
    without an intermediate copy where ``cryptography`` allows it."""
    aead = _gcm(key, nonce)
    if _HAS_INTO:
        aead.encrypt_into(nonce, plaintext, aad, out)
    else:  # cryptography < 44
        out[:] = aead.encrypt(nonce, plaintext, aad)


def aes_gcm_decrypt(key: bytes, nonce: bytes, ciphertext: Buffer, aad: bytes) -> bytes:
    """The plaintext of ``ciphertext | tag``; raises :class:`IntegrityError` if the ciphertext,
    the tag, ``aad``, ``nonce`` or ``key`` differ from what was sealed."""
    try:
        return _gcm(key, nonce).decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise IntegrityError("AES-GCM ciphertext failed authentication") from None


def aes_gcm_decrypt_into(key: bytes, nonce: bytes, ciphertext: Buffer, aad: bytes, out: memoryview) -> None:
    """:func:`aes_gcm_decrypt` written into ``out`` (exactly ``len(ciphertext) - 16`` bytes).
    On :class:`IntegrityError` the contents of ``out`` are unspecified."""
    aead = _gcm(key, nonce)
    try:
        if _HAS_INTO:
            aead.decrypt_into(nonce, ciphertext, aad, out)
        else:  # cryptography < 44
            out[:] = aead.decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise IntegrityError("AES-GCM ciphertext failed authentication") from None


def aes_gcm_decrypt_chunks(
    key: bytes, chunks: Sequence[memoryview], nonces: Sequence[bytes], aads: Sequence[bytes],
) -> bytearray:
    """Decrypt ``chunks[i]`` under ``nonces[i]`` and ``aads[i]``, in order, into one new
    writable buffer of their plaintexts laid end to end (each decrypted in place, no copies).

    Messages larger than GCM's per-call limit (2^31 bytes) are sealed as such chunks; binding
    each chunk's index and the count into its nonce or ``aad`` is the caller's job. Raises
    :class:`IntegrityError` if any chunk is shorter than a tag or fails authentication."""
    if not len(chunks) == len(nonces) == len(aads):
        raise ValueError(f"{len(chunks)} chunks, {len(nonces)} nonces and {len(aads)} aads")
    if any(c.nbytes < TAG_BYTES for c in chunks):
        raise IntegrityError("AES-GCM chunk shorter than its tag")
    out = bytearray(sum(c.nbytes - TAG_BYTES for c in chunks))
    mv, at = memoryview(out), 0
    for c, nonce, aad in zip(chunks, nonces, aads):
        n = c.nbytes - TAG_BYTES
        aes_gcm_decrypt_into(key, nonce, c, aad, mv[at : at + n])
        at += n
    return out


# --- keystreams: AES-256-CTR --------------------------------------------------------------------


def aes_ctr_keystream(key: bytes) -> CipherContext:
    """The AES-256-CTR encryptor of ``key`` from the all-zero counter block: encrypting ``n``
    zero bytes with it (``update`` / ``update_into``) returns the next ``n`` keystream bytes,
    so successive calls continue one stream. Deterministic in ``key``."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"an AES-256 key has {KEY_BYTES} bytes, got {len(key)}")
    return Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
