"""The public-key infrastructure of the active-adversary variant (simulated).

Bonawitz et al. (CCS 2017, §4 and Fig. 4, the version secure against a malicious server) give
every client a long-term signing key whose verification key any party can look up in a PKI
that was set up before the protocol and is outside the server's control. Clients sign their
per-round key pair and, in the consistency check, the list of surviving clients; they verify
their peers' signatures before using anything the server relays. Without this a server could
hand a client keys it made itself in place of its neighbours' and open every share it sends.

Simulated here: :class:`Directory` is the trusted, public mapping ``client id -> Ed25519
verification key``; :class:`Enrolment` plays the enrolment authority, creating each client's
signing key and registering its verification key. In a deployment the signing key is made on
the client and never leaves it; here the driver hands it to that client's party only (never to
the server party, which gets the directory alone). Sybil clients are bounded by the directory:
the server cannot add a party that is not enrolled.

What is signed (domain-separated, bound to the round's session id and number, so a signature
is never valid in another round, another session or for another purpose)::

    advertisement: "fedsafe/secagg/v1/advertise\\0" | session 16B | round u32 | id u32 | c_pk 32B | s_pk 32B
    consistency:   "fedsafe/secagg/v1/consistent\\0" | session 16B | round u32 | count u32 | ids u32 x count
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedsafe.protocols.secagg import crypto

_ADVERTISE = b"fedsafe/secagg/v1/advertise\x00"
_CONSISTENT = b"fedsafe/secagg/v1/consistent\x00"
VERIFICATION_KEY_BYTES = 32


class Directory:
    """The trusted directory: client id -> 32-byte Ed25519 verification key.

    Public: the server and every client read it. Written only at enrolment; an id is bound to
    one key for good (re-registering another key is refused)."""

    def __init__(self, keys: Mapping[int, bytes] | None = None) -> None:
        self._keys: dict[int, bytes] = {}
        for cid, key in (keys or {}).items():
            self.register(cid, key)

    def register(self, client_id: int, key: bytes) -> None:
        key = bytes(key)
        if len(key) != VERIFICATION_KEY_BYTES:
            raise ValueError(f"a verification key has {VERIFICATION_KEY_BYTES} bytes, got {len(key)}")
        old = self._keys.get(int(client_id))
        if old is not None and old != key:
            raise ValueError(f"client {client_id} is already enrolled with another verification key")
        self._keys[int(client_id)] = key

    def lookup(self, client_id: int) -> bytes | None:
        return self._keys.get(client_id)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def entries(self) -> dict[int, bytes]:
        """A copy of the mapping (public data; e.g. to rebuild the directory in another process)."""
        return dict(self._keys)


@dataclass(frozen=True)
class Identity:
    """What a client party holds in the active variant: its long-term signing key and the
    directory it checks its peers against."""

    signing_key: Ed25519PrivateKey
    directory: Directory

    def spec(self) -> tuple[bytes, dict[int, bytes]]:
        """Raw bytes to rebuild this identity where the client party lives (a Ray actor)."""
        return crypto.private_bytes(self.signing_key), self.directory.entries()

    @classmethod
    def from_spec(cls, spec: tuple[bytes, Mapping[int, bytes]]) -> Identity:
        raw, keys = spec
        return cls(crypto.ed25519_private_key(raw), Directory(keys))


class Enrolment:
    """The enrolment authority of the simulation: one long-term key pair per client, made the
    first time the client is enrolled, its verification key registered in :attr:`directory`.

    ``rand_for(client_id)`` gives the randomness of a client's key (default: the OS; seeded
    sources for reproducible tests only)."""

    def __init__(self, rand_for: Callable[[int], crypto.OsRandomness | crypto.SeededRandomness] | None = None) -> None:
        self.directory = Directory()
        self._rand_for = rand_for or (lambda cid: crypto.OsRandomness())
        self._signing: dict[int, Ed25519PrivateKey] = {}

    def enrol(self, client_ids: Sequence[int]) -> None:
        for cid in client_ids:
            cid = int(cid)
            if cid not in self._signing:
                key = crypto.new_signing_key(self._rand_for(cid))
                self.directory.register(cid, crypto.verification_bytes(key))
                self._signing[cid] = key

    def identity(self, client_id: int) -> Identity:
        """The identity handed to client ``client_id``'s party (and to no other party)."""
        if client_id not in self._signing:
            raise KeyError(f"client {client_id} is not enrolled")
        return Identity(self._signing[client_id], self.directory)


# --- what is signed -----------------------------------------------------------------------------


def advertisement_transcript(session: bytes, round_: int, client_id: int, c_pk: bytes, s_pk: bytes) -> bytes:
    """The bytes a client signs to vouch for its key pair of this round."""
    return _ADVERTISE + session + struct.pack("!II", round_, client_id) + c_pk + s_pk


def consistency_transcript(session: bytes, round_: int, survivors: Sequence[int]) -> bytes:
    """The bytes a client signs to confirm the survivor list ``U3`` of this round."""
    ids = tuple(survivors)
    return _CONSISTENT + session + struct.pack(f"!II{len(ids)}I", round_, len(ids), *ids)
