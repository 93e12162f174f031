"""How parties exchange bytes. Parties only ever see ``(sender, payload bytes)``, so the same
party code runs over the in-memory transport here, over Ray object refs or over sockets — a
transport only has to deliver bytes and authenticate the sending party (as TLS would)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter, defaultdict, deque


class Transport(ABC):
    """Point-to-point delivery of byte payloads between numbered parties."""

    @abstractmethod
    def send(self, sender: int, recipient: int, payload: bytes) -> None:
        """Queue ``payload`` for ``recipient``; the transport vouches that it came from ``sender``."""

    @abstractmethod
    def receive(self, recipient: int) -> list[tuple[int, bytes]]:
        """Everything delivered to ``recipient`` since its last call, oldest first."""


class InMemoryTransport(Transport):
    """Mailboxes in one process, counting bytes and messages each party sent and received.

    Payloads are copied to immutable ``bytes`` on send, so no object is shared between parties."""

    def __init__(self) -> None:
        self._boxes: dict[int, deque[tuple[int, bytes]]] = defaultdict(deque)
        self.bytes_sent: Counter[int] = Counter()
        self.bytes_received: Counter[int] = Counter()
        self.messages_sent: Counter[int] = Counter()

    def send(self, sender: int, recipient: int, payload: bytes) -> None:
        data = bytes(payload)
        self.bytes_sent[sender] += len(data)
        self.bytes_received[recipient] += len(data)
        self.messages_sent[sender] += 1
        self._boxes[recipient].append((sender, data))

    def receive(self, recipient: int) -> list[tuple[int, bytes]]:
        box = self._boxes.get(recipient)
        if not box:
            return []
        out = list(box)
        box.clear()
        return out

    def discard(self, recipient: int) -> int:
        """Drop whatever waits for ``recipient`` (a party that went offline); returns the count."""
        box = self._boxes.pop(recipient, None)
        return len(box) if box else 0
