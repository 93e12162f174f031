"""Which clients take part in a round, and which clients are Byzantine."""

from __future__ import annotations

import numpy as np

from fedsafe.core.randomness import RandomSource, sample_subset
from fedsafe.core.streams import numpy_stream


def byzantine_ids(seed: int, num_clients: int, f: int) -> frozenset[int]:
    """A fixed, seeded set of ``f`` Byzantine client ids (drawn once per experiment)."""
    if not 0 <= f < num_clients:
        raise ValueError(f"need 0 <= f < num_clients, got f={f}, num_clients={num_clients}")
    rng = numpy_stream(seed, "byzantine")
    return frozenset(int(i) for i in rng.choice(num_clients, size=f, replace=False))


def sample_clients(
    seed: int,
    round_: int,
    num_clients: int,
    scheme: str,
    *,
    sample_size: int | None = None,
    sample_rate: float | None = None,
    source: RandomSource | None = None,
) -> np.ndarray:
    """Sorted ids of the clients sampled in ``round_``.

    ``all``: every client. ``fixed``: ``sample_size`` clients uniformly without replacement.
    ``poisson``: each client independently with probability ``sample_rate`` (may be empty; the
    engine then records a skipped round). Poisson is the scheme DP amplification assumes.

    The draw comes from ``source``'s stream ``("sampling", round_)`` when given (under DP the
    engine passes its secret source: amplification by sampling assumes nobody can predict the
    sample), else from the seeded stream of the same name.
    """
    if scheme == "all":
        return np.arange(num_clients)
    stream = (source or RandomSource.seeded(seed)).stream("sampling", round_)
    if scheme == "fixed":
        if sample_size is None or not 1 <= sample_size <= num_clients:
            raise ValueError(f"sample_size must be in [1, {num_clients}], got {sample_size}")
        return sample_subset(stream, num_clients, sample_size)
    if scheme == "poisson":
        if sample_rate is None or not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        return np.flatnonzero(stream.uniform(num_clients) < sample_rate)
    raise ValueError(f"unknown sampling scheme {scheme!r}; valid: all, fixed, poisson")
