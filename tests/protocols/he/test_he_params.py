"""Parameter selection: 128-bit security, enough modelled noise budget, clear refusals."""

from __future__ import annotations

import pytest

from fedsafe.protocols.he.params import (
    MAX_COEFF_BITS_128,
    HEParameterError,
    HEParams,
    band,
    batching_prime,
    digit_plans,
    plan_hts,
)


@pytest.mark.parametrize("n,f,delta", [(3, 1, 2), (5, 1, 4), (9, 2, 4), (15, 3, 4), (7, 3, 3), (4, 1, 6)])
def test_plans_are_secure_batched_and_keep_a_margin(n, f, delta):
    lo, hi = band(n, "trimmed_mean", f)
    plan = plan_hts(n, lo, hi, delta)
    prm = plan.params
    assert prm.total_bits <= MAX_COEFF_BITS_128[prm.poly_modulus_degree]
    assert max(prm.coeff_bits) <= 60 and prm.coeff_bits[-1] == max(prm.coeff_bits)  # special prime largest
    assert (prm.plain_modulus - 1) % (2 * prm.poly_modulus_degree) == 0
    assert prm.plain_modulus > 2 * n * (2 ** (delta - 1) - 1)
    assert plan.final_budget_bits >= plan.margin_bits
    assert plan.spec.n == n and plan.spec.selected == n - 2 * f


def test_batching_prime_is_fermat_prime_for_small_ranges():
    assert batching_prime(100) == 65537
    p = batching_prime(70000)
    assert p > 70000 and (p - 1) % 65536 == 0


def test_refuses_when_no_ring_is_large_enough():
    with pytest.raises(HEParameterError, match="no 128-bit-secure BFV parameters.*n=15"):
        plan_hts(15, 3, 11, 4, max_poly_modulus_degree=8192)
    with pytest.raises(HEParameterError, match="Lower delta"):
        plan_hts(9, 2, 6, 4, poly_modulus_degree=4096)


def test_plain_sum_fits_the_smallest_ring():
    plan = plan_hts(5, 0, 4, 4)  # f = 0: no comparison, depth 0
    assert plan.params.poly_modulus_degree == 4096 and plan.products == 0


def test_refuses_bad_requests():
    with pytest.raises(HEParameterError, match="n > 2f"):
        band(4, "trimmed_mean", 2)
    with pytest.raises(HEParameterError, match="unknown rule"):
        band(4, "krum", 1)
    with pytest.raises(HEParameterError, match="delta"):
        plan_hts(3, 1, 1, 9)
    with pytest.raises(HEParameterError, match="security bound"):
        HEParams(8192, 65537, (60, 60, 60, 60)).check_security()


def test_forced_digit_count_is_respected():
    for digits in (1, 2, 4):
        plan = plan_hts(5, 1, 3, 4, digits=digits)
        assert plan.digits.digits == digits
    assert all(p.digits == 3 for p in digit_plans(14, 3))
