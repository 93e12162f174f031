"""Core types of a federated round (see docs/architecture.md, "The round, as data flows through it")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
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


def stack_messages(messages: list[Message]) -> Tensor:
    """The (n, dim) matrix of message vectors, in message order."""
    if not messages:
        raise ValueError("no messages to aggregate")
    dims = {m.vector.shape for m in messages}
    if len(dims) != 1:
        raise ValueError(f"messages have different shapes: {sorted(map(tuple, dims))}")
    return torch.stack([m.vector for m in messages])


def vector_problem(v: object, dim: int) -> str | None:
    """Why ``v`` (e.g. an optimizer buffer read from a checkpoint) is not a finite float vector
    of ``dim`` entries, or None when it is."""
    if not isinstance(v, Tensor) or not v.is_floating_point() or tuple(v.shape) != (dim,):
        shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
        return f"expected a float vector of {dim} entries, got {shape}"
    if not bool(torch.isfinite(v).all()):
        return "holds NaN or infinite values"
    return None
