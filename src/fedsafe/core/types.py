"""Core types of a federated round (see docs/architecture.md, "The round, as data flows through it")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch loads with the first round, not with the config (fast --help, list)
    from torch import Tensor


@dataclass(frozen=True)
class RoundContext:
    """What every party may know in round ``round``."""

    round: int
    seed: int  # the experiment seed; round streams are derived from (seed, name, round, ...)
    participants: tuple[int, ...]  # client ids sampled this round, honest then Byzantine
    num_byzantine: int  # how many of ``participants`` are Byzantine (the last ones)


@dataclass
class Message:
    """One client's upload, in its message space (d parameters, K zeroth-order scalars, ...)."""

    client_id: int
    vector: Tensor
    weight: float = 1.0


@dataclass
class Aggregate:
    """A protocol's result: the aggregate in the message space plus what the round cost.

    ``cost`` holds seconds per phase (keys ending in ``_seconds``) and bytes per direction
    (``bytes_up``, ``bytes_down``); ``seen`` records what each non-client party received, so
    tests and audits can check what was revealed; ``metrics`` carries per-round figures the
    protocol wants in ``metrics.jsonl`` (e.g. ``excluded_nonfinite``).
    """

    vector: Tensor
    count: int = 0  # how many messages the vector averages (survivors, non-finite excluded)
    cost: dict[str, float] = field(default_factory=dict)
    seen: dict[str, object] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # ids of the clients whose vectors are in ``vector`` (None: the protocol does not say); DP
    # accounts distributed noise from the honest ones among them
    included: tuple[int, ...] | None = None


class Messages(Sequence[Message]):
    """A round's messages held as one ``(n, dim)`` matrix with their client ids and weights.

    It is a sequence of :class:`Message` (indexing gives a message whose vector is a view of
    the row), so code that iterates messages works unchanged, while the engine and the plain
    protocol use :attr:`matrix` directly: the honest clients' updates go from client work to
    the robust rule without being split into rows and stacked again. ``+`` with messages
    (another ``Messages`` or a list) concatenates into a new matrix: one copy.
    """

    __slots__ = ("matrix", "ids", "weights")

    def __init__(self, ids: Sequence[int] | np.ndarray, matrix: Tensor, weights: Sequence[float] | None = None) -> None:
        if matrix.ndim != 2 or matrix.shape[0] != len(ids):
            raise ValueError(f"messages: a ({len(ids)}, dim) matrix is needed, got shape {tuple(matrix.shape)}")
        self.matrix = matrix
        self.ids = np.asarray(ids, dtype=np.int64)
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float64)

    @classmethod
    def of(cls, messages: Sequence[Message]) -> Messages:
        """``messages`` as a :class:`Messages` (itself when it already is one): a copy, the stack."""
        if isinstance(messages, Messages):
            return messages
        weights = [m.weight for m in messages]
        return cls([m.client_id for m in messages], stack_messages(messages),
                   None if all(w == 1.0 for w in weights) else weights)

    def __len__(self) -> int:
        return self.matrix.shape[0]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return Messages(self.ids[i], self.matrix[i], None if self.weights is None else self.weights[i])
        return Message(int(self.ids[i]), self.matrix[i], 1.0 if self.weights is None else float(self.weights[i]))

    def __add__(self, other: Sequence[Message]) -> Messages:
        if len(other) == 0:
            return self
        o = Messages.of(other)
        if self.weights is None and o.weights is None:
            weights = None
        else:
            weights = np.concatenate([
                np.ones(len(self)) if self.weights is None else self.weights,
                np.ones(len(o)) if o.weights is None else o.weights,
            ])
        import torch

        return Messages(np.concatenate([self.ids, o.ids]), torch.cat([self.matrix, o.matrix.to(self.matrix.dtype)]), weights)

    def __repr__(self) -> str:
        return f"Messages(n={len(self)}, dim={self.matrix.shape[1]})"


def client_ids(messages: Sequence[Message]) -> tuple[int, ...]:
    """The clients of ``messages``, in order."""
    if isinstance(messages, Messages):
        return tuple(messages.ids.tolist())
    return tuple(int(m.client_id) for m in messages)


def stack_messages(messages: Sequence[Message]) -> Tensor:
    """The (n, dim) matrix of message vectors, in message order (for :class:`Messages`, its
    matrix itself: no copy)."""
    if isinstance(messages, Messages):
        return messages.matrix
    if not messages:
        raise ValueError("no messages to aggregate")
    dims = {m.vector.shape for m in messages}
    if len(dims) != 1:
        raise ValueError(f"messages have different shapes: {sorted(map(tuple, dims))}")
    import torch

    return torch.stack([m.vector for m in messages])


def vector_problem(v: object, dim: int) -> str | None:
    """Why ``v`` (e.g. an optimizer buffer read from a checkpoint) is not a finite float vector
    of ``dim`` entries, or None when it is."""
    import torch

    if not isinstance(v, torch.Tensor) or not v.is_floating_point() or tuple(v.shape) != (dim,):
        shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
        return f"expected a float vector of {dim} entries, got {shape}"
    if not bool(torch.isfinite(v).all()):
        return "holds NaN or infinite values"
    return None
