"""Polynomials over Z_p: Lagrange interpolation of the SABLE tests, and their evaluation.

SABLE's non-linear steps are tests on small integer ranges, turned into polynomials by Lagrange
interpolation modulo the plaintext prime p (Choffrut et al., Sec. 4.3):

* ``Neg[u; -D, D]``  = 1 where u < 0, else 0, for u in {-D, ..., D}  (degree 2D),
* ``Zero[u; -D, D]`` = 1 where u == 0, else 0                         (degree 2D, even),
* ``Btw[r; lo, hi]`` = 1 where lo <= r <= hi, else 0, for a rank r in {0, ..., n-1}.

and, for the digit check (:mod:`~fedsafe.protocols.he.validity`), ``V[x; 0, D] = prod_{v=0}^{D}
(x - v)``: 0 on the allowed digits, nonzero on every other residue mod p (a product, not an
interpolation: its value off the range is what the check is about).

The polynomial through the points is unique of degree < #points, so the value on any point of
the range is exact mod p; off the range it is meaningless (the circuit's range assumption).

Evaluation is Paterson–Stockmeyer (baby-step giant-step): the powers x^1..x^k of one input (the
*power ladder*, shared by every polynomial of that input: Neg and Zero of one digit difference)
are built once with depth ceil(log2 i); giant powers x^(k 2^m) by squaring. A polynomial is
split recursively as ``P = L + x^g H`` (deg L < g) until a part has degree <= k, which is a
scalar combination of the ladder (no ciphertext product). The split points are chosen by a
small dynamic programme that minimises ciphertext products (then depth).

Everything here is pure integer arithmetic on Python ints; ciphertexts only appear through
the ``ops`` object handed to :class:`PowerLadder` (see :mod:`fedsafe.protocols.he.ops`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any


def centered(c: int, p: int) -> int:
    """The representative of c mod p in (-p/2, p/2] (its size drives BFV noise growth)."""
    c %= p
    return c - p if c > p // 2 else c


def interpolate(points: Sequence[int], values: Sequence[int], p: int) -> list[int]:
    """Coefficients (constant first, reduced mod p) of the unique polynomial of degree
    < len(points) through ``(points[i], values[i])`` over Z_p; trailing zeros are dropped.

    Newton's divided differences, then expansion of the Newton form; the points must be
    distinct mod p."""
    xs = [x % p for x in points]
    if len(set(xs)) != len(xs):
        raise ValueError(f"interpolation points are not distinct mod p={p}")
    m = len(xs)
    dd = [v % p for v in values]
    for j in range(1, m):
        for i in range(m - 1, j - 1, -1):
            dd[i] = (dd[i] - dd[i - 1]) * pow(xs[i] - xs[i - j], -1, p) % p
    coeffs = [0] * m
    for i in range(m - 1, -1, -1):  # Horner on the Newton form: c <- c * (x - x_i) + dd_i
        coeffs = [(a - xs[i] * b) % p for a, b in zip([0] + coeffs[:-1], coeffs + [0])][:m]
        coeffs[0] = (coeffs[0] + dd[i]) % p
    while len(coeffs) > 1 and coeffs[-1] == 0:
        coeffs.pop()
    return coeffs


def evaluate(coeffs: Sequence[int], x: int, p: int) -> int:
    """P(x) mod p (Horner), for checks."""
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % p
    return acc


@functools.lru_cache(maxsize=None)
def neg_poly(d: int, p: int) -> tuple[int, ...]:
    """Neg[u; -d, d]: 1 for u in {-d..-1}, 0 for u in {0..d}."""
    pts = list(range(-d, d + 1))
    return tuple(interpolate(pts, [1 if u < 0 else 0 for u in pts], p))


@functools.lru_cache(maxsize=None)
def zero_poly(d: int, p: int) -> tuple[int, ...]:
    """Zero[u; -d, d]: 1 for u == 0, else 0, on {-d..d}."""
    pts = list(range(-d, d + 1))
    return tuple(interpolate(pts, [1 if u == 0 else 0 for u in pts], p))


@functools.lru_cache(maxsize=None)
def valid_poly(d: int, p: int) -> tuple[int, ...]:
    """V[x; 0, d] = prod_{v=0}^{d} (x - v) mod p: 0 exactly on the allowed digits {0..d}.

    p is prime, so a product of factors that are all nonzero mod p is nonzero: V(x) != 0 for
    every residue x outside {0..d} (needs d < p). Degree d + 1; the constant term is 0."""
    if not 0 <= d < p:
        raise ValueError(f"digit range 0..{d} must lie inside Z_{p}")
    coeffs = [1]
    for v in range(d + 1):  # multiply by (x - v)
        coeffs = [(a - v * b) % p for a, b in zip([0] + coeffs, coeffs + [0])]
    return tuple(coeffs)


@functools.lru_cache(maxsize=None)
def btw_poly(n: int, lo: int, hi: int, p: int) -> tuple[int, ...]:
    """Btw[r; lo, hi] for a rank r in {0..n-1}, as a polynomial in r (degree <= n-1)."""
    pts = list(range(n))
    return tuple(interpolate(pts, [1 if lo <= r <= hi else 0 for r in pts], p))


@functools.lru_cache(maxsize=None)
def btw_poly_symmetric(n: int, lo: int, hi: int, p: int) -> tuple[int, ...]:
    """Btw for a band symmetric about the middle rank (lo + hi == n - 1), as a polynomial in
    ``w = (2r - (n-1))^2``: the test only depends on |2r - (n-1)|, so the degree halves to
    ceil(n/2) - 1 (points w = (n-1-2r)^2 for r = 0..floor((n-1)/2))."""
    if lo + hi != n - 1:
        raise ValueError(f"band [{lo}, {hi}] is not symmetric in ranks 0..{n - 1}")
    rs = range((n - 1) // 2 + 1)
    pts = [(n - 1 - 2 * r) ** 2 for r in rs]
    return tuple(interpolate(pts, [1 if lo <= r <= hi else 0 for r in rs], p))


# ----------------------------------------------------------------------------- evaluation plan


def _giants(k: int, degree: int) -> list[int]:
    g, out = k, []
    while g <= degree:
        out.append(g)
        g *= 2
    return out


def power_depth(e: int) -> int:
    """Multiplicative depth of x^e built as in :class:`PowerLadder` (x itself: 0)."""
    return (e - 1).bit_length()


@functools.lru_cache(maxsize=None)
def split_plan(degree: int, k: int, depth_weight: float) -> tuple[tuple[int, ...], int, int]:
    """Best Paterson–Stockmeyer split for a generic polynomial of ``degree`` with baby steps up
    to x^k: returns ``(tree, products, depth)`` where ``tree`` is ``()`` for a leaf (degree <= k,
    a scalar combination of the ladder) or ``(g,) + ...`` meaning ``L + x^g H``; encoded as a
    nested tuple ``(g, tree_L, tree_H)``. Minimises ``products + depth_weight * depth``.

    Giant powers are x^(k 2^m); their construction is shared and not counted here."""
    if degree <= k:
        return (), 0, power_depth(max(degree, 1)) if degree >= 1 else 0
    best: tuple[float, tuple, int, int] | None = None
    for g in _giants(k, degree):
        tl, ml, dl = split_plan(g - 1, k, depth_weight)
        th, mh, dh = split_plan(degree - g, k, depth_weight)
        prods = ml + mh + (1 if degree - g >= 1 else 0)
        depth = max(dl, max(dh, power_depth(g)) + (1 if degree - g >= 1 else 0))
        score = prods + depth_weight * depth
        if best is None or score < best[0] - 1e-9:
            best = (score, (g, tl, th), prods, depth)
    assert best is not None
    return best[1], best[2], best[3]


class PowerLadder:
    """Powers of one value ``x`` under ``ops``: baby steps x^1..x^k and giants x^(k 2^m), each
    built once on first use (x^e = x^h * x^(e-h) with h the largest power of two below e, so
    x^e has the minimal depth ceil(log2 e))."""

    def __init__(self, ops: Any, x: Any, k: int) -> None:
        if k < 1:
            raise ValueError("baby-step count k must be >= 1")
        self.ops = ops
        self.k = k
        self._pows: dict[int, Any] = {1: x}

    def power(self, e: int) -> Any:
        got = self._pows.get(e)
        if got is not None:
            return got
        if e & (e - 1) == 0:
            half = self.power(e // 2)
            val = self.ops.square(half)
        elif e > self.k and e % 2 == 0 and (e // 2) in self._pows:
            val = self.ops.square(self._pows[e // 2])
        else:
            h = 1 << ((e - 1).bit_length() - 1)
            val = self.ops.mul(self.power(h), self.power(e - h))
        self._pows[e] = val
        return val

    def evaluate(self, coeffs: Sequence[int], p: int, depth_weight: float = 0.0) -> Any:
        """P(x) for ``coeffs`` (constant first, mod p): a ciphertext-like value, or a plain int
        when P is constant."""
        cs = [c % p for c in coeffs]
        while len(cs) > 1 and cs[-1] == 0:
            cs.pop()
        tree, _, _ = split_plan(len(cs) - 1, self.k, depth_weight)
        return self._eval(cs, tree, p)

    def _eval(self, cs: list[int], tree: tuple, p: int) -> Any:
        while len(cs) > 1 and cs[-1] == 0:
            cs = cs[:-1]
        if len(cs) == 1:
            return cs[0]
        if not tree or len(cs) - 1 <= self.k:
            terms = [(c, self.power(i)) for i, c in enumerate(cs) if i >= 1 and c]
            return self.ops.lincomb(terms, cs[0])
        g, tl, th = tree
        if len(cs) - 1 < g:  # zero high coefficients made the split unnecessary
            return self._eval(cs, tl, p)
        low = self._eval(cs[:g], tl, p)
        high = self._eval(cs[g:], th, p)
        giant = self.power(g)
        if isinstance(high, int):
            prod = self.ops.lincomb([(high, giant)], 0) if high else None
        else:
            prod = self.ops.mul(high, giant)
        if prod is None:
            return low
        if isinstance(low, int):
            return self.ops.lincomb([(1, prod)], low)
        return self.ops.add(low, prod)

