"""Encoding ranges from what the messages hold: a signal bound and Gaussian noise per kind of
coordinate, and a tail bound on the probability of clipping any of it.

A plugin that transforms the clients' messages (DP) declares, per run of coordinates, a
:class:`NoisyRun`: before its noise, an honest client's coordinate lies in ``[lo, hi]`` (the DP
update's coordinates in ``[-C, C]``, since its L2 norm is at most ``C``; the adaptive-clipping
bit in ``[0, 1]``), and the client then adds ``N(0, σ²)`` to it. :func:`derive` widens each run
by ``k σ``, with ``k`` the :func:`tail_factor` of the round: by a union bound over the ``n d``
coordinates of ``n`` clients, each clipped with probability at most ``2 Φ(-k)`` (at most
``Φ(-k)`` on each side, whatever the signal in ``[lo, hi]``),

    P(some coordinate of some client is clipped) <= n d 2 Φ(-k) = p.

:func:`clip_probability` is the same bound for any given ranges (a user's ``secagg.range``): 1
when a range does not even contain its run's signal bounds.

Why a tail bound suffices for DP: on the event that nothing is clipped (probability at least
``1 - p`` per round, for every dataset), the released sum equals the unclipped one, so over
``T`` rounds the two mechanisms are within total variation ``T p`` of each other and an
``(ε, δ)`` guarantee of the unclipped mechanism holds for the clipped one as
``(ε, δ + (1 + e^ε) T p)``. With the default ``p = 1e-15`` that extra term is ``3e-9`` for
``ε = 8`` over ``T = 1000`` rounds and ``2.2e-7`` for ``ε = 10`` over ``T = 10^4`` (lower
``secagg.range_probability`` for such runs; ``k`` grows only like ``sqrt(2 ln(1/p))``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from fedsafe.protocols.secagg.fixedpoint import Ranges

_NORMAL = NormalDist()


@dataclass(frozen=True)
class NoisyRun:
    """``length`` coordinates whose honest value lies in ``[lo, hi]`` before each client adds
    ``N(0, noise_std²)`` to it."""

    length: int
    lo: float
    hi: float
    noise_std: float

    def __post_init__(self) -> None:
        if self.length < 1 or not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo <= self.hi):
            raise ValueError(f"NoisyRun: need length >= 1 and finite lo <= hi, got {self}")
        if not math.isfinite(self.noise_std) or self.noise_std < 0:
            raise ValueError(f"NoisyRun: noise std must be finite and >= 0, got {self.noise_std}")


def as_runs(declared: Sequence[NoisyRun | tuple[int, float, float, float]]) -> tuple[NoisyRun, ...]:
    """Runs from :class:`NoisyRun` or plain ``(length, lo, hi, noise_std)`` tuples."""
    return tuple(r if isinstance(r, NoisyRun) else NoisyRun(int(r[0]), float(r[1]), float(r[2]), float(r[3]))
                 for r in declared)


def tail_factor(probability: float, coordinates: int) -> float:
    """``k`` with ``coordinates · 2 Φ(-k) = probability``: the half-width, in noise stds, that a
    range needs beyond its signal bounds for the union bound to hold."""
    if not 0 < probability < 1 or coordinates < 1:
        raise ValueError(f"need 0 < probability < 1 and coordinates >= 1, got {probability}, {coordinates}")
    return max(0.0, -_NORMAL.inv_cdf(probability / (2.0 * coordinates)))


def derive(runs: Sequence[NoisyRun], clients: int, probability: float) -> tuple[Ranges, float]:
    """The ranges ``[lo - k σ, hi + k σ]`` of each run for a round of ``clients`` messages, and
    ``k``: clipping any coordinate of any client has probability at most ``probability``."""
    runs = as_runs(runs)
    k = tail_factor(probability, clients * sum(r.length for r in runs))
    out = []
    for r in runs:
        lo, hi = r.lo - k * r.noise_std, r.hi + k * r.noise_std
        if lo == hi:  # a constant coordinate without noise still needs an interval
            lo, hi = lo - 0.5, hi + 0.5
        out.append((r.length, lo, hi))
    return Ranges(tuple(out)), k


def clip_probability(ranges: Ranges, runs: Sequence[NoisyRun], clients: int) -> float:
    """Upper bound (union bound, at most 1) on the probability that ``ranges`` clip some noisy
    coordinate of some honest client among ``clients``: per coordinate ``Φ(-(a - lo)/σ) +
    Φ(-(hi - b)/σ)`` for the range ``[a, b]`` and the signal bounds ``[lo, hi]``; 1 when the range
    does not contain ``[lo, hi]`` (the signal itself can be clipped)."""
    runs = as_runs(runs)
    if ranges.dim != sum(r.length for r in runs):
        raise ValueError(f"ranges cover {ranges.dim} coordinates, the runs {sum(r.length for r in runs)}")
    total = 0.0
    for length, (a, b), r in _pieces(ranges, runs):
        if a > r.lo or b < r.hi:
            return 1.0
        if r.noise_std > 0:
            total += length * (_NORMAL.cdf(-(r.lo - a) / r.noise_std) + _NORMAL.cdf(-(b - r.hi) / r.noise_std))
    return min(1.0, clients * total)


def _pieces(ranges: Ranges, runs: tuple[NoisyRun, ...]):
    """The common refinement of the two partitions: ``(length, (a, b), run)`` pieces."""
    i = j = 0
    left_r, left_n = ranges.runs[0][0], runs[0].length
    while i < len(ranges.runs) and j < len(runs):
        take = min(left_r, left_n)
        _, a, b = ranges.runs[i]
        yield take, (a, b), runs[j]
        left_r -= take
        left_n -= take
        if left_r == 0:
            i += 1
            if i < len(ranges.runs):
                left_r = ranges.runs[i][0]
        if left_n == 0:
            j += 1
            if j < len(runs):
                left_n = runs[j].length
