"""Named, seeded random streams.

Every random draw in fedsafe comes from a stream identified by ``(seed, name, *keys)``, e.g.
``("batches", round, client)``. A stream is a pure function of its identity, so a run is
reproducible, independent of execution order or backend, and resumable from a checkpoint
without saving any generator state.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch


def _entropy(seed: int, name: str, keys: tuple[int, ...]) -> list[int]:
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    # The name is hashed rather than used as an index, so adding a new stream never shifts
    # the draws of existing ones.
    digest = hashlib.sha256(name.encode()).digest()
    name_words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    for k in keys:
        if k < 0:
            raise ValueError(f"stream keys must be >= 0, got {keys} for stream {name!r}")
    return [int(seed), *name_words, *map(int, keys)]


def numpy_stream(seed: int, name: str, *keys: int) -> np.random.Generator:
    """A numpy Generator (PCG64) for the stream ``(seed, name, *keys)``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(_entropy(seed, name, keys))))


def torch_stream(seed: int, name: str, *keys: int) -> torch.Generator:
    """A CPU torch Generator for the stream ``(seed, name, *keys)``."""
    ss = np.random.SeedSequence(_entropy(seed, name, keys))
    g = torch.Generator()
    g.manual_seed(int(ss.generate_state(1, dtype=np.uint64)[0] & ((1 << 63) - 1)))
    return g


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


_MASK64 = (1 << 64) - 1


def _splitmix64_int(x: int) -> int:
    """:func:`_splitmix64` of one word, in Python integers (no numpy call per operation)."""
    x = (x + int(_GOLDEN)) & _MASK64
    x = ((x ^ (x >> 30)) * int(_M1)) & _MASK64
    x = ((x ^ (x >> 27)) * int(_M2)) & _MASK64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=64)
def counter_base(seed: int, name: str) -> int:
    """The state of stream ``(seed, name)`` before its keys: splitmix64 chained over the
    stream's words (cached: a round draws from a few streams many times)."""
    state = 0
    for w in _entropy(seed, name, ()):
        state = _splitmix64_int(state ^ (w & _MASK64))
    return state


def counter_uniform(seed: int, name: str, *keys: np.ndarray | int) -> np.ndarray:
    """Uniform floats in [0, 1), one per element of the broadcast ``keys``, counter-based.

    Each output is a pure function of ``(seed, name, key_1, ..., key_k)`` (splitmix64 chained
    over the key words, top 53 bits), so a whole batch of draws for many clients is produced in
    one vectorised call, and any element is the same whichever other elements are requested.
    Used where creating one generator per client would dominate a round (minibatch selection).
    """
    with np.errstate(over="ignore"):
        # Each key is folded in at its own shape and broadcast only as far as it needs: keys
        # (client[:, None], round, step, position[None, :]) cost one (n, 1) pass per leading key
        # and two (n, w) passes in all, not one per key (the values are the same either way).
        h = np.asarray(counter_base(seed, name), dtype=np.uint64)
        for k in keys:
            a = np.asarray(k, dtype=np.int64)
            if (a < 0).any():
                raise ValueError(f"counter keys must be >= 0 (stream {name!r})")
            h = _splitmix64(h ^ a.astype(np.uint64))
        h = _splitmix64(h)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
