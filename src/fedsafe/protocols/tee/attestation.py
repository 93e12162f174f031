"""Simulated remote attestation and sealing: a software stand-in for SGX, **not** a hardware
guarantee.

What real SGX gives (Costan & Devadas 2016): the CPU measures the enclave's code (MRENCLAVE),
and a quoting enclave signs that measurement together with data the enclave chooses (here its
X25519 public key and the verifier's nonce) with a key rooted in the CPU's fuses; a verifier
checks the signature against the vendor's root and the measurement against the build it
audited. Sealing keys are derived from a fused secret and the measurement, so only the same
code on the same CPU can unseal.

What this module does instead:

* :func:`measure` hashes the source files of the modules that run inside the enclave
  (:data:`ENCLAVE_MODULES`): change one byte of them and the measurement changes.
* :class:`SimulatedPlatform` holds an Ed25519 *quoting key* and a 32-byte *fuse secret*, both
  ordinary software keys. The host process creates the platform and hands its secrets to the
  enclave process at start-up, keeping only the verification key; clients trust that key as
  they would trust the vendor's root certificate.
* :func:`verify_quote` is what a client runs before sending anything: signature, measurement,
  nonce, and it returns the enclave public key the quote binds.

Freshness: the nonce is the *verifier's*. Every client draws its own ``NONCE_BYTES`` random
bytes (``TEEClient.challenge``) for every quote it will accept; the host only relays it to the
enclave, which quotes over it, and the client refuses a quote over any other nonce. A quote the
host kept from an earlier round, or one made for another client, therefore never verifies: the
host cannot predict a nonce that did not exist when that quote was signed (2⁻²⁵⁶ per guess).

So the protocol logic (clients refuse an enclave whose code or signature is wrong; nothing is
sent before verification; sealed data is bound to the measurement) is real and tested, but the
roots of trust are not: a malicious host that created the platform could forge quotes and
unseal. Treat attestation results here as protocol simulation only.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import os
from dataclasses import dataclass

from fedsafe.core.errors import FedsafeError
from fedsafe.protocols.crypto import (
    ed25519_private_key,
    hkdf,
    private_bytes,
    public_bytes,
    sign,
    verify,
)
from fedsafe.protocols.tee.wire import WireError, pack, unpack

# The trusted computing base: every fedsafe module whose code executes inside the enclave.
ENCLAVE_MODULES: tuple[str, ...] = (
    "fedsafe.protocols.crypto",
    "fedsafe.protocols.tee.wire",
    "fedsafe.protocols.tee.channel",
    "fedsafe.protocols.tee.attestation",
    "fedsafe.protocols.tee.noise",
    "fedsafe.protocols.tee.numerics",
    "fedsafe.protocols.tee.leakage",
    "fedsafe.robust.filters",
    "fedsafe.protocols.tee.rules",
    "fedsafe.protocols.tee.enclave",
    "fedsafe.robust.distances",
    "fedsafe.robust.krum",
    "fedsafe.robust.rows",
    "fedsafe.robust.rowwise",
    "fedsafe.robust.aggregators",
    "fedsafe.robust.defences",
    "fedsafe.robust.flame",
    "fedsafe.robust.foolsgold",
    "fedsafe.robust.fltrust",
    "fedsafe.robust.rlr",
    "fedsafe.robust.freqfed",
    "fedsafe.robust.fldetector",
    "fedsafe.robust.selection",
    "fedsafe.robust.split",
    "fedsafe.core.registry",  # decides which selection a rule name runs
    "fedsafe.core.errors",
    "fedsafe.core.streams",
    "fedsafe.core.lazy",
    # package initialisers run inside the enclave too
    "fedsafe",
    "fedsafe.core",
    "fedsafe.protocols",
    "fedsafe.protocols.tee",
    "fedsafe.robust",
)

_QUOTE_DOMAIN = b"fedsafe/tee/quote/v1"
# Bytes of a verifier's nonce: drawn by the client, never by the host or the enclave.
NONCE_BYTES = 32
# The shortest nonce a quote may be verified against (128 bits).
MIN_NONCE_BYTES = 16


class AttestationError(FedsafeError, ValueError):
    """A quote that must not be trusted: bad signature, unexpected measurement, stale nonce."""


def measure(modules: tuple[str, ...] = ENCLAVE_MODULES) -> bytes:
    """SHA-256 over ``(module name, source length, source bytes)`` of each enclave module, in
    order: the simulated MRENCLAVE."""
    h = hashlib.sha256(b"fedsafe/tee/measurement/v1")
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise AttestationError(f"cannot measure enclave module {name!r}: not found")
        with open(spec.origin, "rb") as fh:
            src = fh.read()
        h.update(name.encode() + b"\0" + len(src).to_bytes(8, "little") + src)
    return h.digest()


@dataclass(frozen=True)
class Quote:
    """A signed statement: code with ``measurement`` holds the private key of
    ``enclave_public``; fresh for the verifier's ``nonce``."""

    measurement: bytes
    enclave_public: bytes
    nonce: bytes
    signature: bytes

    def body(self) -> bytes:
        return b"|".join([_QUOTE_DOMAIN, self.measurement, self.enclave_public, self.nonce])

    def to_bytes(self) -> bytes:
        return pack({"quote": 1}, blobs={
            "measurement": self.measurement, "enclave_public": self.enclave_public,
            "nonce": self.nonce, "signature": self.signature,
        })

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Quote:
        try:
            head, _, b = unpack(data)
            q = cls(bytes(b["measurement"]), bytes(b["enclave_public"]), bytes(b["nonce"]), bytes(b["signature"]))
        except (WireError, KeyError) as e:
            raise AttestationError(f"malformed quote: {e}") from None
        if head.get("quote") != 1 or len(q.measurement) != 32 or len(q.enclave_public) != 32:
            raise AttestationError("malformed quote: wrong version or field lengths")
        return q


class SimulatedPlatform:
    """The simulated hardware roots of trust: a quoting key and a fuse secret (see module doc)."""

    def __init__(self, quoting_key: bytes | None = None, fuse_secret: bytes | None = None) -> None:
        self._quoting = ed25519_private_key(quoting_key or None)  # empty or None: a fresh key
        self._fuse = fuse_secret if fuse_secret is not None else os.urandom(32)
        if len(self._fuse) != 32:
            raise ValueError("fuse secret must be 32 bytes")

    @property
    def verification_key(self) -> bytes:
        """The public half of the quoting key: what clients pin (the 'vendor root')."""
        return public_bytes(self._quoting)

    def secrets(self) -> bytes:
        """The private material, for handing to the enclave process at start-up only."""
        return private_bytes(self._quoting) + self._fuse

    @classmethod
    def from_secrets(cls, data: bytes) -> SimulatedPlatform:
        if len(data) != 64:
            raise ValueError("platform secrets are 64 bytes")
        return cls(bytes(data[:32]), bytes(data[32:]))

    def quote(self, *, measurement: bytes, enclave_public: bytes, nonce: bytes) -> Quote:
        """What the quoting enclave does: sign (measurement, enclave key, nonce)."""
        unsigned = Quote(measurement, enclave_public, nonce, b"")
        return Quote(measurement, enclave_public, nonce, sign(self._quoting, unsigned.body()))

    def sealing_key(self, measurement: bytes) -> bytes:
        """Key only code with ``measurement`` on this platform obtains (SGX's MRENCLAVE policy)."""
        return hkdf(self._fuse, salt=None, info=b"fedsafe/tee/seal/v1|" + measurement)


def verify_quote(
    quote: bytes | memoryview | Quote,
    *,
    verification_key: bytes,
    expected_measurement: bytes,
    nonce: bytes,
) -> bytes:
    """Check a quote as a client must before sending its update; returns the enclave's X25519
    public key. ``nonce`` is the one the verifier itself drew for this quote (at least
    ``MIN_NONCE_BYTES``). Raises AttestationError naming the failed check."""
    if len(nonce) < MIN_NONCE_BYTES:
        raise AttestationError(
            f"verifier nonce of {len(nonce)} bytes: need at least {MIN_NONCE_BYTES} fresh random bytes"
        )
    q = quote if isinstance(quote, Quote) else Quote.from_bytes(quote)
    if not verify(verification_key, q.signature, q.body()):
        raise AttestationError("quote signature does not verify under the platform's verification key")
    if q.measurement != expected_measurement:
        raise AttestationError(
            f"enclave measurement {q.measurement.hex()[:16]}… differs from the expected "
            f"{bytes(expected_measurement).hex()[:16]}… (the enclave runs other code)"
        )
    if not hmac.compare_digest(q.nonce, bytes(nonce)):
        raise AttestationError("quote nonce differs from the verifier's: a replayed quote")
    return q.enclave_public
