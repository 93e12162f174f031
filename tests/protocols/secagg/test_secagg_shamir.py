import itertools
import os
import random

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsafe.protocols.secagg import shamir
from fedsafe.protocols.secagg.shamir import PRIME, combine, split


def _solve_constant_term(points, p):
    """Independent reference: Gaussian elimination on the Vandermonde system mod p."""
    t = len(points)
    rows = [[pow(x, j, p) for j in range(t)] + [y] for x, y in points]
    for col in range(t):
        piv = next(r for r in range(col, t) if rows[r][col] % p)
        rows[col], rows[piv] = rows[piv], rows[col]
        inv = pow(rows[col][col], -1, p)
        rows[col] = [v * inv % p for v in rows[col]]
        for r in range(t):
            if r != col and rows[r][col]:
                f = rows[r][col]
                rows[r] = [(a - f * b) % p for a, b in zip(rows[r], rows[col])]
    return rows[0][t]


def test_prime_is_the_smallest_above_2_256():
    assert sympy.isprime(PRIME)
    assert sympy.nextprime(2**256) == PRIME
    assert shamir.SHARE_BYTES * 8 >= PRIME.bit_length()


@settings(max_examples=40, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), n=st.integers(2, 12), data=st.data())
def test_any_t_shares_recover_the_secret(secret, n, data):
    t = data.draw(st.integers(1, n))
    xs = data.draw(st.lists(st.integers(1, 2**32), min_size=n, max_size=n, unique=True))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    shares = split(secret, xs, t, lambda k: rng.randbytes(k))
    pts = list(zip(xs, shares))
    subset = data.draw(st.permutations(pts)).copy()[:t]
    assert combine(subset, t) == secret
    assert _solve_constant_term(subset, PRIME) == int.from_bytes(secret, "big")
    if len(pts) > t:  # redundant shares are checked for consistency and accepted
        assert combine(pts, t) == secret


def test_fewer_than_t_shares_are_consistent_with_every_secret():
    # t-1 shares plus ANY candidate secret define a valid degree t-1 polynomial: no information
    secret = os.urandom(32)
    xs, t = [3, 7, 11, 20], 3
    shares = split(secret, xs, t, os.urandom)
    for candidate in (bytes(32), b"\xff" * 32, secret):
        pts = [(0, int.from_bytes(candidate, "big"))] + list(zip(xs, shares))[: t - 1]
        assert all(0 <= y < PRIME for _, y in pts)  # the interpolation through them exists
    with pytest.raises(ValueError, match="need 3 shares"):
        combine(list(zip(xs, shares))[:2], t)


def test_every_t_subset_agrees_and_a_corrupted_share_is_detected_with_redundancy():
    secret = os.urandom(32)
    xs = list(range(1, 7))
    shares = split(secret, xs, 3, os.urandom)
    pts = list(zip(xs, shares))
    for sub in itertools.combinations(pts, 3):
        assert combine(list(sub), 3) == secret
    bad = list(pts)
    bad[1] = (bad[1][0], (bad[1][1] + 1) % PRIME)
    with pytest.raises(ValueError, match="inconsistent"):
        combine(bad, 3)


@pytest.mark.parametrize(
    "points,t,msg",
    [([(1, 5), (1, 6)], 2, "repeated"), ([(0, 5), (2, 6)], 2, "outside"), ([(1, PRIME)], 1, "outside")],
)
def test_combine_rejects_malformed_points(points, t, msg):
    with pytest.raises(ValueError, match=msg):
        combine(points, t)


def test_split_rejects_bad_arguments():
    with pytest.raises(ValueError):
        split(b"short", [1, 2], 2, os.urandom)
    with pytest.raises(ValueError):
        split(bytes(32), [1, 2], 3, os.urandom)
    with pytest.raises(ValueError):
        split(bytes(32), [1, 1], 2, os.urandom)
    with pytest.raises(ValueError):
        split(bytes(32), [0, 1], 2, os.urandom)
