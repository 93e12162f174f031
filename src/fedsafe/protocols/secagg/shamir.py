"""Shamir t-of-n secret sharing of 32-byte secrets over the prime field GF(p), p = 2^256 + 297.

A secret ``s < 2^256 < p`` is the constant term of a random polynomial ``f`` of degree ``t - 1``;
the share of party ``x`` (``x != 0``) is ``f(x)``. Any ``t`` shares determine ``f`` and so
``s = f(0) = sum_i y_i prod_{j != i} x_j / (x_j - x_i)`` (Lagrange at zero); fewer than ``t``
reveal nothing, since every secret is consistent with them. ``p`` is the smallest prime above
2^256, so every 32-byte secret is a field element and a share fits in 33 bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

PRIME = (1 << 256) + 297
SECRET_BYTES = 32
SHARE_BYTES = 33
_COEFF_BYTES = 48  # 384 random bits reduced mod p: bias below 2^-128


def split(secret: bytes, xs: Sequence[int], t: int, random_bytes: Callable[[int], bytes]) -> list[int]:
    """Shares ``f(x)`` for each evaluation point in ``xs`` of a fresh polynomial with ``f(0) = secret``."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= t <= len(xs):
        raise ValueError(f"threshold t = {t} must be in [1, {len(xs)}] for {len(xs)} shares")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("evaluation points must be distinct and in [1, p)")
    coeffs = [int.from_bytes(secret, "big")]
    coeffs += [int.from_bytes(random_bytes(_COEFF_BYTES), "big") % PRIME for _ in range(t - 1)]
    shares = []
    for x in xs:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % PRIME
        shares.append(acc)
    return shares


def combine(points: Sequence[tuple[int, int]], t: int) -> bytes:
    """The secret from at least ``t`` shares ``(x, f(x))``.

    The first ``t`` shares determine ``f``; when more are given, one more is checked to lie on
    ``f``, which detects corrupted shares whenever there is redundancy. Raises ``ValueError``
    for too few or repeated points, values outside the field, inconsistent shares, or a result
    that is not a 32-byte secret."""
    if t < 1 or len(points) < t:
        raise ValueError(f"need {t} shares, got {len(points)}")
    xs = [x for x, _ in points]
    if len(set(xs)) != len(xs):
        raise ValueError("repeated share index")
    for x, y in points:
        if not (0 < x < PRIME and 0 <= y < PRIME):
            raise ValueError("share outside the field")
    basis = list(points[:t])
    if len(points) > t:
        x, y = points[t]
        if _interpolate(basis, x) != y:
            raise ValueError("shares are inconsistent (they do not lie on one polynomial of degree t - 1)")
    secret = _interpolate(basis, 0)
    if secret >> (8 * SECRET_BYTES):
        raise ValueError("shares are inconsistent (the result is not a 32-byte secret)")
    return secret.to_bytes(SECRET_BYTES, "big")


def _interpolate(points: Sequence[tuple[int, int]], z: int) -> int:
    """``f(z)`` for the polynomial of degree ``len(points) - 1`` through ``points`` (Lagrange)."""
    coeffs = lagrange_coefficients(tuple(x for x, _ in points), z)
    return sum(c * y for c, (_, y) in zip(coeffs, points)) % PRIME


@lru_cache(maxsize=4096)
def lagrange_coefficients(xs: tuple[int, ...], z: int) -> tuple[int, ...]:
    """``c_i = prod_{j != i} (z - x_j) / (x_i - x_j)`` mod p, so ``f(z) = sum_i c_i f(x_i)``.

    Cached: the server rebuilds many secrets from shares held by the same parties (every
    survivor's seed, in the complete graph), so the O(t^2) products are paid once per set."""
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (z - xj) % PRIME
                den = den * (xi - xj) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)
