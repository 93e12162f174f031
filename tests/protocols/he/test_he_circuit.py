"""SABLE circuit pieces and the exact emulator, against independent integer references.

Lagrange tests are checked point by point over their whole range; Paterson–Stockmeyer against
Horner; ranks against a stable argsort; the emulated HTS/HMED against a numpy sort-based trimmed
sum, bit for bit, on random inputs with many ties and extreme (clamped) values.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsafe.protocols.he.circuit import CircuitSpec, DigitStrategy, ranks, trimmed_sum
from fedsafe.protocols.he.emulator import (
    decode_centered,
    emulate_trimmed_sum,
    reference_trimmed_sum,
)
from fedsafe.protocols.he.encoding import DigitPlan, Quantizer
from fedsafe.protocols.he.ops import EmulatorOps, NoiseModel, TraceOps
from fedsafe.protocols.he.params import band, plan_hts
from fedsafe.protocols.he.polynomials import (
    PowerLadder,
    btw_poly,
    btw_poly_symmetric,
    evaluate,
    interpolate,
    neg_poly,
    zero_poly,
)

P = 65537


@pytest.mark.parametrize("d", [1, 2, 3, 4, 7, 14, 30])
def test_neg_and_zero_are_exact_on_their_range(d):
    neg, zero = neg_poly(d, P), zero_poly(d, P)
    assert len(neg) - 1 <= 2 * d and len(zero) - 1 <= 2 * d
    for u in range(-d, d + 1):
        assert evaluate(neg, u, P) == (1 if u < 0 else 0)
        assert evaluate(zero, u, P) == (1 if u == 0 else 0)
    assert all(c == 0 for c in zero[1::2])  # Zero is even


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 15, 16])
def test_btw_in_rank_and_in_w_agree(n):
    for lo in range(0, (n - 1) // 2 + 1):
        hi = n - 1 - lo
        direct = btw_poly(n, lo, hi, P)
        sym = btw_poly_symmetric(n, lo, hi, P)
        assert len(sym) - 1 <= max((n + 1) // 2 - 1, 0)
        for r in range(n):
            want = 1 if lo <= r <= hi else 0
            assert evaluate(direct, r, P) == want
            assert evaluate(sym, (2 * r - (n - 1)) ** 2, P) == want


def test_interpolation_rejects_repeated_points():
    with pytest.raises(ValueError, match="distinct"):
        interpolate([1, 1 + P], [0, 1], P)


@pytest.mark.parametrize("degree", [1, 2, 5, 6, 13, 28, 40])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dw", [0.0, 100.0])
def test_paterson_stockmeyer_matches_horner(degree, k, dw):
    rng = np.random.default_rng(degree * 100 + k)
    coeffs = [int(c) for c in rng.integers(0, P, size=degree + 1)]
    coeffs[-1] = coeffs[-1] or 1
    x = rng.integers(0, P, size=64)
    got = PowerLadder(EmulatorOps(P), x, k).evaluate(coeffs, P, dw)
    want = np.array([evaluate(coeffs, int(v), P) for v in x])
    assert np.array_equal(np.asarray(got) % P, want)


def test_paterson_stockmeyer_uses_few_products():
    # degree 28 (one 4-bit digit's Neg): ~2 sqrt(28) products, far below the 27 of the powers
    ops = TraceOps(NoiseModel(16384, P), 1000.0)
    PowerLadder(ops, ops.input(), 5).evaluate(list(neg_poly(14, P)), P)
    assert ops.products <= 12


def _spec(n, lo, hi, plan: DigitPlan, mode="direct", k=2):
    return CircuitSpec(n, lo, hi, P, plan.digit_max, plan.weights, 0, tuple(DigitStrategy(mode, k) for _ in plan.digit_max))


@pytest.mark.parametrize("radices", [(), (2,), (3,), (4,), (2, 2, 2)])
@pytest.mark.parametrize("mode", ["direct", "evenodd"])
def test_ranks_are_stable_argsort_ranks(radices, mode):
    rng = np.random.default_rng(len(radices))
    plan = DigitPlan(14, radices)
    n = 6
    a = rng.integers(0, 15, size=(n, 300))
    a[:, :40] = a[0, :40]  # all tied
    a[:3, 40:80] = 14
    spec = _spec(n, 1, n - 2, plan, mode, k=3)
    got = np.array(ranks(EmulatorOps(P), [plan.split(row) for row in a], spec))
    want = np.argsort(np.argsort(a, axis=0, kind="stable"), axis=0, kind="stable")
    assert np.array_equal(got % P, want)


def _inputs(rng, n, d, max_value):
    a = rng.integers(0, max_value + 1, size=(n, d))
    a[:, : d // 8] = rng.integers(0, 2, size=(n, d // 8)) * max_value  # only the two extremes
    a[:, d // 8 : d // 4] = a[0, d // 8 : d // 4]  # every node equal
    a[: n // 2 + 1, d // 4 : d // 3] = max_value  # a majority at the top
    a[:, d // 3 : d // 2] = rng.integers(0, 2, size=(n, d // 2 - d // 3)) + max_value // 2  # two close values
    return a


@pytest.mark.parametrize(
    "n,rule,f,delta,digits",
    [
        (1, "trimmed_mean", 0, 4, None),
        (2, "median", 0, 3, None),
        (3, "trimmed_mean", 1, 2, None),
        (4, "median", 0, 4, None),
        (5, "trimmed_mean", 0, 3, None),
        (5, "trimmed_mean", 2, 4, 2),
        (6, "median", 0, 5, None),
        (7, "trimmed_mean", 2, 3, 1),
        (8, "trimmed_mean", 3, 4, 4),
        (9, "trimmed_mean", 2, 4, None),
        (10, "median", 0, 2, None),
        (15, "trimmed_mean", 3, 4, None),
    ],
)
def test_emulated_hts_equals_sorted_trimmed_sum(n, rule, f, delta, digits):
    lo, hi = band(n, rule, f)
    plan = plan_hts(n, lo, hi, delta, digits=digits)
    rng = np.random.default_rng(n * 10 + delta)
    a = _inputs(rng, n, 800, plan.digits.max_value)
    got = emulate_trimmed_sum(a, plan.spec, plan.digits)
    want = reference_trimmed_sum(a - plan.spec.offset, lo, hi)
    assert got.dtype == np.int64
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n", [2, 4, 6, 10])
def test_hmed_even_n_is_mean_of_two_middle_values(n):
    lo, hi = band(n, "median", 0)
    assert (lo, hi) == (n // 2 - 1, n // 2)
    plan = plan_hts(n, lo, hi, 4)
    rng = np.random.default_rng(n)
    q = rng.integers(-7, 8, size=(n, 500))
    total = emulate_trimmed_sum(q + 7, plan.spec, plan.digits)
    assert np.array_equal(total / 2.0, np.median(q, axis=0))


@pytest.mark.parametrize("n", [1, 3, 5, 9])
def test_hmed_odd_n_is_the_middle_value(n):
    lo, hi = band(n, "median", 0)
    assert lo == hi == (n - 1) // 2
    plan = plan_hts(n, lo, hi, 3)
    q = np.random.default_rng(n).integers(-3, 4, size=(n, 300))
    assert np.array_equal(emulate_trimmed_sum(q + 3, plan.spec, plan.digits), np.median(q, axis=0).astype(np.int64))


def test_circuit_runs_the_same_on_trace_and_emulator_without_products_for_f0():
    plan = plan_hts(4, 0, 3, 4)
    assert plan.products == 0 and plan.depth == 0
    ops = TraceOps(NoiseModel(plan.slots, P), 100.0)
    trimmed_sum(ops, [[ops.input() for _ in range(plan.digits.digits)] for _ in range(4)], plan.spec)
    assert ops.products == 0


def test_quantizer_clamps_rounds_and_maps_nonfinite():
    qz = Quantizer(4, 0.5)
    assert qz.offset == 7 and qz.max_value == 14 and qz.scale == 14.0
    x = np.array([0.0, 0.5, -0.5, 10.0, -10.0, 0.26, -0.26, np.nan, np.inf, -np.inf, 0.0357, 0.0358])
    assert qz.quantize(x).tolist() == [0, 7, -7, 7, -7, 4, -4, 0, 7, -7, 0, 1]
    assert qz.shifted(x).min() >= 0 and qz.shifted(x).max() <= 14
    assert qz.dequantize(np.array([14]), 2)[0] == pytest.approx(0.5)


@pytest.mark.parametrize("radices", [(), (2,), (3,), (5,), (2, 2, 2), (4, 2)])
def test_digit_plan_round_trips_and_bounds_digits(radices):
    plan = DigitPlan(14, radices)
    a = np.arange(15)
    parts = plan.split(a)
    assert np.array_equal(plan.join(parts), a)
    for dig, dmax in zip(parts, plan.digit_max):
        assert dig.min() >= 0 and dig.max() == dmax
    with pytest.raises(ValueError):
        plan.split(np.array([15]))


def test_decode_centered():
    assert decode_centered(np.array([0, 1, P - 1, P // 2, P // 2 + 1]), P).tolist() == [0, 1, -1, P // 2, -(P // 2)]
