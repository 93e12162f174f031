"""The one error type of the secure-aggregation protocol."""

from __future__ import annotations

from fedsafe.core.errors import ProtocolError


class SecAggError(ProtocolError):
    """A round that cannot complete, or a message that was rejected.

    ``sender`` names the party whose message was rejected (a client id, ``"server"``, or
    ``None`` for round-level failures such as too few survivors); ``field`` names the message
    field that failed its check. Subclassing :class:`ProtocolError` makes the engine treat an
    aborted round as a skipped round.
    """

    def __init__(self, message: str, *, sender: int | str | None = None, field: str | None = None) -> None:
        self.sender = sender
        self.field = field
        where = []
        if sender is not None:
            where.append(f"from {_party(sender)}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"secagg: {', '.join(where)}: {message}" if where else f"secagg: {message}")


def _party(p: int | str) -> str:
    return p if isinstance(p, str) else f"client {p}"
