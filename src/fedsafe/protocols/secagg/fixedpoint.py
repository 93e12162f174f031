"""Fixed-point encoding of updates into Z_{2^bits}, with a range per run of coordinates.

The coordinates are split into consecutive runs (:class:`Ranges`), each with its own interval
``[lo, hi]``. A coordinate of a run is encoded as
``encode(x) = rint((clip(x, lo, hi) - lo) (2^q - 1) / (hi - lo))``, an integer in ``[0, 2^q)``;
the sum of ``m`` encodings is below ``m (2^q - 1) < 2^bits`` (checked by
:meth:`SecAggConfig.effective_quant_bits`) whatever the ranges, so it is recovered exactly modulo
``2^bits``, and ``decode_mean(S, m) = S / m (hi - lo) / (2^q - 1) + lo`` is the mean of the clipped
inputs up to half a quantization step ``(hi - lo) / (2^q - 1)`` of that run. One range
``[-c, c]`` for every coordinate (:meth:`Ranges.uniform`) is the encoding of ``secagg.range = c``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ranges:
    """The encoding interval of each coordinate: ``runs`` of ``(length, lo, hi)``, consecutive,
    covering ``dim = sum of lengths`` coordinates; every ``lo < hi`` finite, with a finite width."""

    runs: tuple[tuple[int, float, float], ...]

    def __post_init__(self) -> None:
        runs = tuple((int(n), float(lo), float(hi)) for n, lo, hi in self.runs)
        if not runs:
            raise ValueError("Ranges needs at least one run")
        for i, (n, lo, hi) in enumerate(runs):
            if n < 1:
                raise ValueError(f"run {i}: length {n} < 1")
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi and math.isfinite(hi - lo)):
                raise ValueError(f"run {i}: [{lo}, {hi}] is not a finite interval with lo < hi")
        object.__setattr__(self, "runs", runs)

    @classmethod
    def uniform(cls, dim: int, clip: float) -> Ranges:
        """``[-clip, clip]`` for all ``dim`` coordinates (``secagg.range`` as a number)."""
        return cls(((dim, -float(clip), float(clip)),))

    @property
    def dim(self) -> int:
        return sum(n for n, _, _ in self.runs)

    def slices(self) -> Iterator[tuple[slice, float, float]]:
        """``(coordinates, lo, hi)`` of each run."""
        start = 0
        for n, lo, hi in self.runs:
            yield slice(start, start + n), lo, hi
            start += n

    def steps(self, quant_bits: int) -> tuple[float, ...]:
        """Each run's quantization step ``(hi - lo) / (2^q - 1)``."""
        levels = (1 << quant_bits) - 1
        return tuple((hi - lo) / levels for _, lo, hi in self.runs)

    def max_abs(self) -> float:
        """The largest ``|lo|`` or ``|hi|``: what bounds the float64 error of the arithmetic."""
        return max(max(abs(lo), abs(hi)) for _, lo, hi in self.runs)

    def then(self, other: Ranges) -> Ranges:
        """These runs followed by ``other``'s."""
        return Ranges(self.runs + other.runs)


def as_ranges(ranges: Ranges | float, dim: int) -> Ranges:
    """``ranges``, or ``Ranges.uniform(dim, ranges)`` for a number; its size must be ``dim``."""
    r = ranges if isinstance(ranges, Ranges) else Ranges.uniform(dim, float(ranges))
    if r.dim != dim:
        raise ValueError(f"ranges cover {r.dim} coordinates, the vector has {dim}")
    return r


def word_dtype(bits: int) -> np.dtype:
    """The little-endian unsigned word that holds Z_{2^bits}: 32 bits when it fits, else 64.
    Addition in it wraps modulo 2^32 / 2^64, a multiple of 2^bits, so masking at the end is exact."""
    return np.dtype("<u4") if bits <= 32 else np.dtype("<u8")


def encode_counting(x: np.ndarray, ranges: Ranges | float, quant_bits: int, bits: int) -> tuple[np.ndarray, int]:
    """:func:`encode`, and how many coordinates lay outside their range (were clipped)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise ValueError("cannot encode a vector with non-finite entries")
    r = as_ranges(ranges, x.size)
    levels = (1 << quant_bits) - 1
    y = x.copy()
    clipped = 0
    for sl, lo, hi in r.slices():
        seg = y[sl]
        clipped += int(np.count_nonzero(seg < lo)) + int(np.count_nonzero(seg > hi))
        np.clip(seg, lo, hi, out=seg)
        seg -= lo
        seg *= levels / (hi - lo)
    np.rint(y, out=y)
    np.clip(y, 0, levels, out=y)  # float rounding at the top level must not reach 2^q
    return y.astype(word_dtype(bits)), clipped


def encode(x: np.ndarray, ranges: Ranges | float, quant_bits: int, bits: int) -> np.ndarray:
    """Quantize a finite float vector to integers in ``[0, 2^quant_bits)``, as ``word_dtype(bits)``;
    ``ranges`` is a :class:`Ranges` or a number ``c`` (every coordinate in ``[-c, c]``)."""
    return encode_counting(x, ranges, quant_bits, bits)[0]


def decode_mean(total: np.ndarray, count: int, ranges: Ranges | float, quant_bits: int) -> np.ndarray:
    """The float64 mean of ``count`` encodings whose exact integer sum is ``total``."""
    if count < 1:
        raise ValueError("decode_mean needs count >= 1")
    levels = (1 << quant_bits) - 1
    out = np.asarray(total).astype(np.float64).reshape(-1)
    r = as_ranges(ranges, out.size)
    for sl, lo, hi in r.slices():
        seg = out[sl]
        seg *= (hi - lo) / (levels * count)
        seg += lo
    return out


# --- clipping statistics ------------------------------------------------------------------------
#
# Every client appends CLIP_STATS words to its encoded update, masked and summed like the rest:
# whether it clipped any coordinate (0 or 1, encoded as 0 or 2^q - 1) and how many coordinates it
# clipped (c in [0, d], encoded as c itself when d <= 2^q - 1, else rounded on [0, d]). The server
# learns only their sums over the survivors: the number of clients that clipped and the number of
# clipped coordinates.

CLIP_STATS = 2


def stats_ranges(dim: int, quant_bits: int) -> Ranges:
    """The ranges of the two clipping-statistics words, for ``dim``-coordinate updates."""
    levels = (1 << quant_bits) - 1
    return Ranges(((1, 0.0, 1.0), (1, 0.0, float(max(dim, levels)))))


def encode_stats(clipped: int, dim: int, quant_bits: int, bits: int) -> np.ndarray:
    """The two statistics words of a client that clipped ``clipped`` of its ``dim`` coordinates."""
    return encode(np.array([float(clipped > 0), float(clipped)]), stats_ranges(dim, quant_bits), quant_bits, bits)


def decode_stats(total: np.ndarray, count: int, dim: int, quant_bits: int) -> tuple[int, int]:
    """``(clients that clipped, clipped coordinates)`` from the exact sum ``total`` of ``count``
    clients' statistics words (clamped to what ``count`` clients can hold: a client that does not
    follow the protocol can put anything in its words)."""
    levels = (1 << quant_bits) - 1
    clients = round(int(total[0]) / levels)
    coords = int(total[1]) if dim <= levels else round(int(total[1]) * dim / levels)
    return min(max(clients, 0), count), min(max(coords, 0), count * dim)


def reduce(words: np.ndarray, bits: int) -> np.ndarray:
    """Reduce words modulo 2^bits in place (a no-op when bits is the word size) and return them."""
    width = words.dtype.itemsize * 8
    if bits < width:
        np.bitwise_and(words, words.dtype.type((1 << bits) - 1), out=words)
    return words
