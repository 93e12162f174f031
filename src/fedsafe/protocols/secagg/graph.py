"""Who masks with whom: the complete graph (Bonawitz et al.) or a random k-regular Harary graph
(SecAgg+, Bell et al. 2020)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def complete_graph(ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Every participant is every other's neighbour."""
    ordered = sorted(ids)
    return {u: tuple(v for v in ordered if v != u) for u in ordered}


def harary_graph(ids: Sequence[int], k: int, rng: np.random.Generator) -> dict[int, tuple[int, ...]]:
    """A random k-regular graph: the ids in a random ring order, each joined to the ``k / 2``
    nearest on either side. ``k`` must be even; ``k >= n - 1`` gives the complete graph."""
    n = len(ids)
    if k % 2:
        raise ValueError(f"k must be even, got {k}")
    if k >= n - 1:
        return complete_graph(ids)
    ring = [int(ids[i]) for i in rng.permutation(n)]
    half = k // 2
    out: dict[int, tuple[int, ...]] = {}
    for pos, u in enumerate(ring):
        nb = {ring[(pos + off) % n] for off in range(-half, half + 1) if off}
        out[u] = tuple(sorted(nb))
    return out
