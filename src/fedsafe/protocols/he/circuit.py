"""The SABLE trimmed-sum circuit (HTS / HMED), written once for every backend.

Input: for each of n nodes, the base-B digits (mixed radix, least significant first) of its
shifted quantized value ``a_i = q_i + o`` in {0..M}, one slot vector per digit. Output, per slot:
the sum of the values of ranks lo..hi, minus ``(hi - lo + 1) * o`` (so the signed trimmed sum).

Steps (Choffrut et al., Sec. 4.3-4.4; every step is slot-wise):

1. **Comparison** of each pair i < j, digit by digit, most significant first (eq. 9-10)::

       LT(a_j, a_i) = sum_k Neg(e_k) * prod_{m>k} Zero(e_m),   e_k = c_{j,k} - c_{i,k}

   with ``Neg``/``Zero`` the Lagrange polynomials on {-D_k..D_k}. Neg and Zero of one digit
   difference share one power ladder (Paterson–Stockmeyer), and the digit terms are combined
   by the associative rule ``(N_h, Z_h) o (N_l, Z_l) = (N_h + Z_h N_l, Z_h Z_l)`` in a balanced
   tree (depth ceil(log2 L) instead of L-1).
2. **Rank with index tie-breaking** (eq. 12-15): ``rk_i = #{j: a_j < a_i} + #{j < i: a_j = a_i}``,
   a permutation of 0..n-1. One comparison per unordered pair: with ``T = LT(a_j, a_i)`` for
   i < j, ``rk_i += T`` and ``rk_j += 1 - T``. (The paper's ranks count larger values, i.e.
   descending ranks; the trimmed band is symmetric, so the sum is the same.)
3. **Between** (eq. 16-17): ``s_i = Btw[rk_i; lo, hi]``. The band is symmetric about the middle
   rank, so Btw is evaluated as a polynomial in ``w = (2 rk - (n-1))^2`` of degree
   ceil(n/2) - 1 rather than in rk of degree n - 1.
4. **Selected sum**: ``sum_i s_i * a_i`` with ``a_i = sum_k W_k c_{i,k}``, minus the offsets.

HTS keeps ranks f..n-f-1 (``n - 2f`` values). HMED is HTS with ``f = floor((n-1)/2)``: the middle
value for odd n and, for even n, the two middle values (ranks n/2-1 and n/2), whose sum the
nodes halve after decryption -- the library's median convention (mean of the two middle
values). The paper's eq. 19 (f = floor(n/2)) selects nothing for even n.

If the band is all ranks (f = 0) the circuit is the plain sum: no comparison at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fedsafe.protocols.he.polynomials import (
    PowerLadder,
    btw_poly_symmetric,
    neg_poly,
    zero_poly,
)


@dataclass(frozen=True)
class DigitStrategy:
    """How Neg/Zero of one digit difference e are evaluated: ``direct`` (Paterson–Stockmeyer on
    e with baby steps e..e^k) or ``evenodd`` (on y = e^2: Zero(e) = Z(y), Neg(e) = E(y) + e O(y),
    halving the degrees at the price of one product)."""

    mode: Literal["direct", "evenodd"] = "direct"
    k: int = 2
    depth_weight: float = 0.0


@dataclass(frozen=True)
class CircuitSpec:
    """Everything the server needs to evaluate HTS on one block of slots (public)."""

    n: int  # number of inputs (nodes, after subsampling)
    lo: int  # lowest selected rank
    hi: int  # highest selected rank (lo + hi == n - 1)
    p: int  # plaintext modulus
    digit_max: tuple[int, ...]  # largest value of each digit, least significant first
    weights: tuple[int, ...]  # place value of each digit
    offset: int  # value shift o: a = q + o
    strategies: tuple[DigitStrategy, ...]  # one per digit
    btw_k: int = 2
    btw_depth_weight: float = 0.0
    # budget (bits) the rest of the circuit consumes from each stage on (set by the planner;
    # used by BFV to drop primes early); absent -> never switch modulus mid-circuit
    stage_need: tuple[tuple[str, float], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not 0 <= self.lo <= self.hi < self.n or self.lo + self.hi != self.n - 1:
            raise ValueError(f"rank band [{self.lo}, {self.hi}] must be symmetric in 0..{self.n - 1}")
        if not (len(self.digit_max) == len(self.weights) == len(self.strategies) >= 1):
            raise ValueError("digit_max, weights and strategies need one entry per digit")

    @property
    def digits(self) -> int:
        return len(self.digit_max)

    @property
    def selects_all(self) -> bool:
        return self.lo == 0 and self.hi == self.n - 1

    @property
    def selected(self) -> int:
        return self.hi - self.lo + 1

    def need(self, stage: str) -> float | None:
        return dict(self.stage_need).get(stage)


# ----------------------------------------------------------------------------- helpers


def _mul(ops: Any, a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        return ops.lincomb([(a, b)], 0) if a else 0
    if isinstance(b, int):
        return ops.lincomb([(b, a)], 0) if b else 0
    return ops.mul(a, b)


def _add(ops: Any, a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int):
        return ops.lincomb([(1, b)], a)
    if isinstance(b, int):
        return ops.lincomb([(1, a)], b)
    return ops.add(a, b)


def digit_tests(ops: Any, e: Any, dmax: int, need_zero: bool, strat: DigitStrategy, p: int) -> tuple[Any, Any]:
    """(Neg(e), Zero(e) or None) for a digit difference e in {-dmax..dmax}."""
    neg = neg_poly(dmax, p)
    zero = zero_poly(dmax, p) if need_zero else None
    if strat.mode == "direct":
        ladder = PowerLadder(ops, e, strat.k)
        n_val = ladder.evaluate(neg, p, strat.depth_weight)
        z_val = ladder.evaluate(zero, p, strat.depth_weight) if zero is not None else None
        return n_val, z_val
    y = ops.square(e)
    ladder = PowerLadder(ops, y, strat.k)
    even, odd = list(neg[0::2]), list(neg[1::2])
    n_even = ladder.evaluate(even, p, strat.depth_weight)
    n_odd = ladder.evaluate(odd, p, strat.depth_weight) if odd else 0
    n_val = _add(ops, n_even, _mul(ops, e, n_odd))
    z_val = None
    if zero is not None:
        assert all(c == 0 for c in zero[1::2]), "Zero is even"
        z_val = ladder.evaluate(list(zero[0::2]), p, strat.depth_weight)
    return n_val, z_val


def _combine(ops: Any, items: list[tuple[Any, Any]], need_z: bool) -> tuple[Any, Any]:
    """Fold (Neg, Zero) pairs ordered most significant first into (LT, all-equal)."""
    if len(items) == 1:
        return items[0][0], (items[0][1] if need_z else None)
    mid = len(items) // 2
    n_hi, z_hi = _combine(ops, items[:mid], True)
    n_lo, z_lo = _combine(ops, items[mid:], need_z)
    n_val = _add(ops, n_hi, _mul(ops, z_hi, n_lo))
    z_val = _mul(ops, z_hi, z_lo) if need_z else None
    return n_val, z_val


def less_than(ops: Any, x: Sequence[Any], y: Sequence[Any], spec: CircuitSpec) -> Any:
    """1(x < y) from digit vectors (least significant first)."""
    items = []
    for k in range(spec.digits - 1, -1, -1):
        e = ops.sub(x[k], y[k])
        items.append(digit_tests(ops, e, spec.digit_max[k], k > 0, spec.strategies[k], spec.p))
    lt, _ = _combine(ops, items, False)
    return lt


def ranks(ops: Any, digits: Sequence[Sequence[Any]], spec: CircuitSpec) -> list[Any]:
    """rk_i = #{j: a_j < a_i} + #{j < i: a_j == a_i} for every node (ascending, ties by index)."""
    n = spec.n
    acc: list[Any] = [None] * n
    for i in range(n):
        for j in range(i + 1, n):
            t = less_than(ops, digits[j], digits[i], spec)  # 1(a_j < a_i)
            if isinstance(t, int):
                raise AssertionError("a comparison polynomial cannot be constant")
            acc[i] = t if acc[i] is None else ops.add(acc[i], t)
            acc[j] = ops.lincomb([(-1, t)], 0) if acc[j] is None else ops.sub(acc[j], t)
    # + #{j < i}: the 1 in each (1 - T) of step 2
    return [ops.lincomb([(1, acc[i])], i) for i in range(n)]


def select(ops: Any, rks: Sequence[Any], spec: CircuitSpec) -> list[Any]:
    """s_i = Btw[rk_i; lo, hi] through w = (2 rk - (n-1))^2."""
    poly = btw_poly_symmetric(spec.n, spec.lo, spec.hi, spec.p)
    out = []
    for rk in rks:
        u = ops.lincomb([(2, rk)], -(spec.n - 1))
        w = ops.square(u)
        out.append(PowerLadder(ops, w, spec.btw_k).evaluate(poly, spec.p, spec.btw_depth_weight))
    return out


def trimmed_sum(ops: Any, digits: Sequence[Sequence[Any]], spec: CircuitSpec) -> Any:
    """HTS over ``digits[i][k]`` (node i, digit k): the signed sum of the selected values."""
    if len(digits) != spec.n or any(len(d) != spec.digits for d in digits):
        raise ValueError(f"expected {spec.n} nodes x {spec.digits} digits")
    values = [ops.lincomb([(w, d[k]) for k, w in enumerate(spec.weights)], 0) for d in digits]
    const = -spec.selected * spec.offset
    if spec.selects_all:
        out = ops.lincomb([(1, v) for v in values], const)
    else:
        rks = ranks(ops, digits, spec)
        ops.hint("ranks", rks)
        sel = select(ops, rks, spec)
        ops.hint("select", sel)
        terms = [_mul(ops, s, v) for s, v in zip(sel, values)]
        terms = [t for t in terms if not isinstance(t, int)]
        out = ops.lincomb([(1, t) for t in terms], const)
    finish = getattr(ops, "finish", None)
    return finish(out) if finish is not None else out
