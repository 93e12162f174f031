"""Federated partitioners: pure functions ``(labels, num_clients, rng, *, params) -> parts``.

Every partitioner returns ``num_clients`` sorted int64 index arrays into ``labels`` that are
pairwise disjoint, together cover every index, and are each non-empty. It reads randomness only
from ``rng`` (a ``numpy.random.Generator``, in fedsafe a named stream such as
``numpy_stream(seed, "data.partition")``) and never modifies ``labels``.

Requests that cannot satisfy these guarantees (more clients than samples, more shards than
samples) are refused with :class:`ValueError`. Where a random draw can leave a client empty
(``dirichlet``), the fix is deterministic given ``rng`` and documented on the partitioner.

``PARTITIONERS`` maps the config names to the functions; ``partition(name, ...)`` is the entry
point used by :func:`fedsafe.data.load_federated`. (``natural`` is not here: it is defined by a
dataset's own generator, see :mod:`fedsafe.data.synthetic`.)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np

from fedsafe.core.registry import Registry

Partitioner = Callable[..., list[np.ndarray]]

PARTITIONERS: Registry = Registry("partition")


def _check_request(labels: np.ndarray, num_clients: int, name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name}: labels must be 1-D, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name}: labels must be integers, got dtype {labels.dtype}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)):
        raise ValueError(f"{name}: num_clients must be an int, got {num_clients!r}")
    if num_clients < 1:
        raise ValueError(f"{name}: num_clients must be >= 1, got {num_clients}")
    if num_clients > labels.size:
        raise ValueError(
            f"{name}: num_clients={num_clients} exceeds the {labels.size} samples to partition; "
            f"every client needs at least one sample (valid: 1..{labels.size})"
        )
    return labels


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _fill_empty(parts: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Give each empty client (in id order) one sample taken from the currently largest client.

    The donor is the client with the most samples (lowest id on ties) and the moved sample is
    drawn uniformly from the donor with ``rng``. This always succeeds when there are at least as
    many samples as clients: while some client is empty, the others hold >= num_clients samples
    in num_clients - 1 clients, so the largest holds >= 2 and stays non-empty after donating.
    The largest client is kept in a heap, so filling E empty clients of K costs
    O((K + E) log K), not O(E·K) (a Dirichlet over 10^5 clients leaves thousands empty).
    """
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    empty = [k for k, p in enumerate(parts) if not p.size]
    if not empty:
        return parts
    # (−size, id): the heap's top is the largest client, lowest id on ties. A filled client
    # (one sample) never donates: some donor always holds >= 2 (see above).
    heap = [(-p.size, k) for k, p in enumerate(parts) if p.size]
    heapq.heapify(heap)
    for k in empty:
        _, donor = heap[0]
        j = int(rng.integers(parts[donor].size))
        parts[k] = parts[donor][j : j + 1].copy()
        parts[donor] = np.delete(parts[donor], j)
        heapq.heapreplace(heap, (-parts[donor].size, donor))
    return parts


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """IID: a uniformly random permutation of the N indices cut into ``num_clients`` pieces.

    Client k receives ``floor(N/K) + [k < N mod K]`` samples (sizes differ by at most one).
    Each client's class histogram is then multivariate-hypergeometric around the global one.
    """
    labels = _check_request(labels, num_clients, "iid")
    perm = rng.permutation(labels.size)
    return _finish(np.array_split(perm, num_clients))


@PARTITIONERS.register("dirichlet")
def dirichlet(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, alpha: float = 0.5
) -> list[np.ndarray]:
    """Label-skewed split of Hsu, Qi & Brown (2019): per class, client shares ~ Dir(alpha·1_K).

    For each class c (in increasing label order) with n_c samples: draw proportions
    p_c ~ Dir(alpha, ..., alpha) over the K clients, shuffle the class's indices, and cut them at
    ``round(n_c · (p_c1 + ... + p_ck))`` for k = 1..K-1, so client k receives about n_c·p_ck
    samples of class c. Small alpha concentrates each class on few clients (strong skew); as
    alpha -> inf every p_ck -> 1/K (IID). E[p_ck] = 1/K, Var[p_ck] = (1/K)(1 - 1/K)/(K·alpha + 1).

    A client left with no sample at all receives one, see :func:`_fill_empty` (deterministic
    given ``rng``; it moves at most one sample per empty client).
    """
    labels = _check_request(labels, num_clients, "dirichlet")
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"dirichlet: alpha must be a finite number > 0, got {alpha}")
    # Each class's pieces, client by client, as one (index, client) assignment: a stable sort by
    # client then gives every client its pieces in class order, as concatenating them would,
    # without a Python list per client (a Dirichlet over 10^5 clients stays vectorised).
    got_idx, got_client = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        p = rng.dirichlet(np.full(num_clients, float(alpha)))
        # Generator.dirichlet is exact for tiny alpha, but guard against a degenerate draw.
        if not np.all(np.isfinite(p)) or p.sum() <= 0:
            p = np.full(num_clients, 1.0 / num_clients)
        cuts = np.clip(np.rint(np.cumsum(p)[:-1] / p.sum() * idx.size).astype(np.int64), 0, idx.size)
        counts = np.diff(np.concatenate([[0], cuts, [idx.size]]))
        got_idx.append(idx)
        got_client.append(np.repeat(np.arange(num_clients, dtype=np.int64), counts))
    flat_idx = np.concatenate(got_idx).astype(np.int64, copy=False)
    flat_client = np.concatenate(got_client)
    order = np.argsort(flat_client, kind="stable")
    sizes = np.bincount(flat_client, minlength=num_clients)
    merged = np.split(flat_idx[order], np.cumsum(sizes)[:-1])
    return _finish(_fill_empty(merged, rng))


@PARTITIONERS.register("shards")
def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, shards_per_client: int = 2
) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al. (2017): label-sorted shards.

    Sort the indices by label (random order within a class), cut the sorted sequence into
    S = K·shards_per_client contiguous shards of near-equal size (``floor(N/S)`` or one more,
    so that every sample is used), and give each client ``shards_per_client`` shards chosen by
    a uniformly random permutation of the shards. When every shard lies within one class, a
    client sees at most ``shards_per_client`` distinct labels. Requires S <= N.
    """
    labels = _check_request(labels, num_clients, "shards")
    if isinstance(shards_per_client, bool) or int(shards_per_client) != shards_per_client or shards_per_client < 1:
        raise ValueError(f"shards: shards_per_client must be an int >= 1, got {shards_per_client!r}")
    num_shards = num_clients * int(shards_per_client)
    if num_shards > labels.size:
        raise ValueError(
            f"shards: num_clients * shards_per_client = {num_clients} * {shards_per_client} = "
            f"{num_shards} shards exceed the {labels.size} samples; lower shards_per_client to at "
            f"most {labels.size // num_clients} or use fewer clients"
        )
    shuffled = rng.permutation(labels.size)
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    cut = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, int(shards_per_client))
    return _finish([np.concatenate([cut[s] for s in row]) for row in assignment])


@PARTITIONERS.register("gamma")
def gamma(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, gamma: float = 0.5
) -> list[np.ndarray]:
    """γ-heterogeneity (Karimireddy et al. 2020, "s% similarity"; Allouah et al. 2023).

    A uniformly random subset of ``round(γ·N)`` samples is dealt IID (random permutation cut
    into K near-equal pieces); the remaining samples are sorted by label (random order within a
    class) and cut into K contiguous blocks, client k taking block k. Block sizes are chosen so
    client k's total is ``floor(N/K) + [k < N mod K]``, the same as ``iid``. γ = 1 is IID;
    γ = 0 gives label-sorted contiguous blocks, so client k's labels all lie between those of
    client k-1 and client k+1.
    """
    labels = _check_request(labels, num_clients, "gamma")
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma: gamma must be in [0, 1], got {gamma}")
    n = labels.size
    perm = rng.permutation(n)
    n_iid = int(round(gamma * n))
    iid_parts = np.array_split(perm[:n_iid], num_clients)
    rest = perm[n_iid:]
    rest = rest[np.argsort(labels[rest], kind="stable")]
    totals = np.array([len(p) for p in np.array_split(np.arange(n), num_clients)])
    # Extra samples go to the lowest ids in both array_splits, so totals - iid sizes >= 0.
    block_sizes = totals - np.array([len(p) for p in iid_parts])
    blocks = np.split(rest, np.cumsum(block_sizes)[:-1])
    return _finish([np.concatenate([a, b]) for a, b in zip(iid_parts, blocks, strict=True)])


def partition(
    name: str, labels: np.ndarray, num_clients: int, rng: np.random.Generator, **params: Any
) -> list[np.ndarray]:
    """Run the partitioner registered as ``name`` with keyword ``params`` (checked by name)."""
    return PARTITIONERS.get(name, params)(labels, num_clients, rng)
