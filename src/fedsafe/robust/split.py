"""Rules that split into a selection on an (n, n) matrix and an aggregation of selected rows.

Krum, Multi-Krum, Bulyan and the norm and cosine filters need nothing of the updates but their
pairwise squared distances ``D`` or their Gram matrix ``G``, until they aggregate the rows they
selected. Such a rule is registered in ``AGGREGATORS`` with the tag ``"distance_split"`` and a
:class:`DistanceSplit` under ``split``; the TEE protocol reads both from the registry, runs the
selection on the matrix it decodes from the untrusted accelerators and the aggregation inside
the enclave, with the same functions the plaintext rule calls, so both select identically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

TAG = "distance_split"


@dataclass(frozen=True)
class DistanceSplit:
    """``select(matrix, f, **params) -> indices`` on ``D`` (``matrix = "distances"``) or ``G``
    (``"gram"``), then ``combine(updates, indices, f) -> aggregate``."""

    matrix: Literal["distances", "gram"]
    select: Callable[..., Tensor]
    combine: Callable[[Tensor, Tensor, int], Tensor]


def split_of(registry: Any, rule: str) -> DistanceSplit | None:
    """The rule's split, or None when it is not a distance-split rule."""
    entry = registry.entry(rule)
    return entry.meta.get("split") if TAG in entry.tags else None
