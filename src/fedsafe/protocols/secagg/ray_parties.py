"""Secure-aggregation client parties on Ray actors (``secagg.execution = "ray"``).

Each client party lives in its own Ray actor, where it holds its update and its secrets; the
driver keeps the server party and the transport. Parties only ever see ``(sender, bytes)``, so
the actor's party talks through a relay transport: each step the driver hands it the bytes
waiting in its mailbox and posts the bytes it sends. Nothing but bytes (and, at construction,
the client's own input and, in the active variant, its long-term signing key and the public
directory) crosses the actor boundary; the driver never sees a client's round keys or unmasked
update.
"""

from __future__ import annotations

import numpy as np

from fedsafe.protocols.secagg.client import ClientParty
from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.pki import Identity
from fedsafe.protocols.secagg.transport import Transport


class RelayTransport(Transport):
    """Inside an actor: incoming bytes are handed in by the driver, outgoing bytes collected."""

    def __init__(self) -> None:
        self.inbox: list[tuple[int, bytes]] = []
        self.outbox: list[tuple[int, bytes]] = []

    def send(self, sender: int, recipient: int, payload: bytes) -> None:
        self.outbox.append((recipient, bytes(payload)))

    def receive(self, recipient: int) -> list[tuple[int, bytes]]:
        out, self.inbox = self.inbox, []
        return out


class ClientActor:
    """The actor body: one :class:`ClientParty` behind a relay transport."""

    def __init__(
        self, client_id: int, vector: np.ndarray, round_: int, seeded: tuple | None = None,
        identity: tuple | None = None,
    ) -> None:
        from fedsafe.protocols.secagg.crypto import SeededRandomness

        rand = None if seeded is None else SeededRandomness(*seeded)  # None: the OS, in the actor
        ident = None if identity is None else Identity.from_spec(identity)
        self.net = RelayTransport()
        self.party = ClientParty(client_id, vector, self.net, round_=round_, rand=rand, identity=ident)

    def step(self, messages: list[tuple[int, bytes]]) -> tuple[list[tuple[int, bytes]], list[str], str | None]:
        self.net.inbox = list(messages)
        self.party.step()
        out, self.net.outbox = self.net.outbox, []
        abort = None if self.party.abort_reason is None else str(self.party.abort_reason)
        return out, [str(e) for e in self.party.rejected], abort


class RayClientProxy:
    """Driver-side stand-in with ClientParty's ``step``/``rejected``/``abort_reason``."""

    def __init__(
        self, actor_cls, client_id: int, vector: np.ndarray, transport: Transport, *, round_: int, rand=None,
        identity: Identity | None = None,
    ) -> None:
        import ray

        self._ray = ray
        self.id = client_id
        self.transport = transport
        # A party's randomness is created where the party lives: OS randomness in the actor, or
        # (tests only) the same seeded stream, rebuilt from its seed and label.
        seeded = getattr(rand, "spec", None)
        spec = None if identity is None else identity.spec()
        self.actor = actor_cls.remote(client_id, np.asarray(vector), round_, seeded, spec)
        self.rejected: list[SecAggError] = []
        self.abort_reason: SecAggError | None = None

    def step(self) -> None:
        out, rejected, abort = self._ray.get(self.actor.step.remote(self.transport.receive(self.id)))
        for recipient, payload in out:
            self.transport.send(self.id, recipient, payload)
        self.rejected = [SecAggError(r) for r in rejected]
        self.abort_reason = None if abort is None else SecAggError(abort)

    def close(self) -> None:
        self._ray.kill(self.actor)


def ray_client_factory(num_cpus: float = 0.25):
    """A ``client_factory`` for :func:`run_round` placing each client party on a Ray actor."""
    import ray

    actor_cls = ray.remote(num_cpus=num_cpus)(ClientActor)

    def make(
        client_id: int, vector: np.ndarray, transport: Transport, *, round_: int, rand=None,
        identity: Identity | None = None,
    ) -> RayClientProxy:
        return RayClientProxy(actor_cls, client_id, vector, transport, round_=round_, rand=rand, identity=identity)

    return make
