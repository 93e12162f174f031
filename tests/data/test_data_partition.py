"""Partitioners: invariants, statistics against closed-form references, determinism, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedsafe.core.registry import RegistryError
from fedsafe.core.streams import numpy_stream
from fedsafe.data.partition import (
    PARTITIONERS,
    _fill_empty,
    dirichlet,
    gamma,
    iid,
    partition,
    shards,
)

ALL = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.1}),
    ("dirichlet", {"alpha": 100.0}),
    ("shards", {"shards_per_client": 2}),
    ("gamma", {"gamma": 0.0}),
    ("gamma", {"gamma": 0.3}),
    ("gamma", {"gamma": 1.0}),
]


def balanced_labels(n_per_class: int = 500, classes: int = 10, seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.arange(classes), n_per_class)
    return np.random.default_rng(seed).permutation(labels)


def histograms(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> np.ndarray:
    """Row k: client k's class fractions."""
    return np.stack([np.bincount(labels[p], minlength=classes) / p.size for p in parts])


def assert_valid(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1 and p.size > 0
        assert np.all(np.diff(p) > 0)  # sorted, no repeats
    joined = np.concatenate(parts)
    assert joined.size == n and np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize(("name", "params"), ALL)
def test_disjoint_cover_nonempty_and_labels_untouched(name: str, params: dict) -> None:
    labels = balanced_labels()
    before = labels.copy()
    parts = partition(name, labels, 20, numpy_stream(3, "data.partition"), **params)
    assert_valid(parts, labels.size, 20)
    assert np.array_equal(labels, before)


@pytest.mark.parametrize(("name", "params"), ALL)
def test_deterministic_per_seed(name: str, params: dict) -> None:
    labels = balanced_labels()
    # 7 clients, so gamma=0's label-sorted blocks straddle classes and still depend on the seed.
    a = partition(name, labels, 7, numpy_stream(7, "data.partition"), **params)
    b = partition(name, labels, 7, numpy_stream(7, "data.partition"), **params)
    c = partition(name, labels, 7, numpy_stream(8, "data.partition"), **params)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 120),
    classes=st.integers(1, 6),
    clients_frac=st.floats(0.0, 1.0),
    which=st.sampled_from(ALL + [("dirichlet", {"alpha": 0.001}), ("shards", {"shards_per_client": 1})]),
    seed=st.integers(0, 2**31),
)
def test_invariants_hold_for_any_feasible_request(n, classes, clients_frac, which, seed) -> None:
    name, params = which
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    k = params.get("shards_per_client", 1)
    assume(n >= k)
    num_clients = max(1, int(clients_frac * (n // k)))
    parts = partition(name, labels, num_clients, numpy_stream(seed, "p"), **params)
    assert_valid(parts, n, num_clients)


def test_iid_sizes_and_class_histograms_match_global() -> None:
    labels = np.random.default_rng(1).choice(10, size=10_000, p=np.linspace(1, 3, 10) / 20)
    parts = iid(labels, 10, numpy_stream(0, "data.partition"))
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    glob = np.bincount(labels, minlength=10) / labels.size
    # Client class counts are hypergeometric: sd <= sqrt(1000 * 0.25) ~ 16 samples = 0.016.
    assert np.abs(histograms(labels, parts, 10) - glob).max() < 0.06


def test_dirichlet_small_alpha_is_skewed_large_alpha_is_near_iid() -> None:
    labels = balanced_labels(500)
    skew = histograms(labels, dirichlet(labels, 10, numpy_stream(0, "d"), alpha=0.05), 10)
    flat = histograms(labels, dirichlet(labels, 10, numpy_stream(0, "d"), alpha=1000.0), 10)
    assert skew.max(axis=1).mean() > 0.6  # most of a client's data is one class
    assert np.abs(flat - 0.1).max() < 0.05  # every client close to the uniform global mix


def test_dirichlet_shares_follow_the_dirichlet_moments() -> None:
    # One class, K clients: client 0's share p_0 ~ Beta(alpha, (K-1) alpha), so
    # E = 1/K and Var = (1/K)(1 - 1/K) / (K alpha + 1).
    n, k, alpha, reps = 2000, 5, 0.5, 1500
    labels = np.zeros(n, dtype=np.int64)
    shares = np.array([
        dirichlet(labels, k, numpy_stream(r, "moments"), alpha=alpha)[0].size / n for r in range(reps)
    ])
    mean_ref = 1 / k
    var_ref = (1 / k) * (1 - 1 / k) / (k * alpha + 1)
    assert abs(shares.mean() - mean_ref) < 4 * np.sqrt(var_ref / reps)
    assert abs(shares.var() / var_ref - 1) < 0.15


def test_dirichlet_fills_empty_clients() -> None:
    labels = np.arange(60) % 3
    for seed in range(20):
        parts = dirichlet(labels, 50, numpy_stream(seed, "empty"), alpha=0.001)
        assert_valid(parts, 60, 50)


def test_fill_empty_moves_one_sample_from_the_largest_client() -> None:
    parts = [np.array([0, 1, 2, 3]), np.array([], dtype=np.int64), np.array([4, 5]),
             np.array([], dtype=np.int64)]
    fixed = _fill_empty(parts, np.random.default_rng(0))
    sizes = [p.size for p in fixed]
    assert sizes == [2, 1, 2, 1]  # client 0 (4 samples) donates to client 1, then ties -> 0
    assert np.array_equal(np.sort(np.concatenate(fixed)), np.arange(6))


def test_shards_aligned_with_classes_give_at_most_k_classes() -> None:
    labels = balanced_labels(40)  # 400 samples; 10 clients * 2 shards = 20 shards of 20
    parts = shards(labels, 10, numpy_stream(0, "s"), shards_per_client=2)
    assert_valid(parts, 400, 10)
    assert all(p.size == 40 for p in parts)
    assert all(np.unique(labels[p]).size <= 2 for p in parts)
    # Each shard is half a class, so every class appears on exactly two client-shards.
    shard_classes = sum((np.bincount(labels[p], minlength=10) // 20 for p in parts), np.zeros(10))
    assert np.array_equal(shard_classes, np.full(10, 2))


def test_shards_near_equal_when_not_divisible() -> None:
    labels = balanced_labels(37)  # 370 samples into 12 shards
    parts = shards(labels, 4, numpy_stream(0, "s"), shards_per_client=3)
    sizes = [p.size for p in parts]
    assert sum(sizes) == 370 and max(sizes) - min(sizes) <= 3


def test_gamma_zero_is_label_sorted_contiguous_blocks() -> None:
    labels = balanced_labels(100)
    parts = gamma(labels, 7, numpy_stream(0, "g"), gamma=0.0)
    assert_valid(parts, 1000, 7)
    for a, b in zip(parts, parts[1:]):
        assert labels[a].max() <= labels[b].min()
    assert [p.size for p in parts] == [143] * 6 + [142]


def test_gamma_one_is_iid_and_heterogeneity_decreases_with_gamma() -> None:
    labels = balanced_labels(500)
    skew = {}
    for g in (0.0, 0.5, 1.0):
        parts = gamma(labels, 10, numpy_stream(0, "g"), gamma=g)
        assert [p.size for p in parts] == [500] * 10
        skew[g] = histograms(labels, parts, 10).max(axis=1).mean()
    assert skew[0.0] > 0.99  # each client one class
    # gamma = 0.5: half IID (~0.1 of each class) + half one class -> max fraction ~ 0.55.
    assert abs(skew[0.5] - 0.55) < 0.05
    assert skew[1.0] < 0.16
    flat = histograms(labels, gamma(labels, 10, numpy_stream(0, "g"), gamma=1.0), 10)
    assert np.abs(flat - 0.1).max() < 0.06


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "gamma"])
def test_more_clients_than_samples_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"num_clients=11 exceeds the 10 samples.*valid: 1\.\.10"):
        partition(name, np.arange(10) % 2, 11, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda r: iid(np.arange(10), 0, r), "num_clients must be >= 1"),
        (lambda r: iid(np.zeros((2, 5), int), 2, r), "labels must be 1-D"),
        (lambda r: iid(np.linspace(0, 1, 5), 2, r), "labels must be integers"),
        (lambda r: dirichlet(np.arange(10), 2, r, alpha=0.0), "alpha must be a finite number > 0"),
        (lambda r: dirichlet(np.arange(10), 2, r, alpha=float("nan")), "alpha must be"),
        (lambda r: gamma(np.arange(10), 2, r, gamma=1.2), r"gamma must be in \[0, 1\]"),
        (lambda r: shards(np.arange(10), 2, r, shards_per_client=0), "shards_per_client must be an int >= 1"),
        (lambda r: shards(np.arange(10), 4, r, shards_per_client=3),
         r"4 \* 3 = 12 shards exceed the 10 samples; lower shards_per_client to at most 2"),
    ],
)
def test_clear_errors(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(np.random.default_rng(0))


def test_registry_rejects_unknown_names_and_parameters() -> None:
    assert PARTITIONERS.names() == ["dirichlet", "gamma", "iid", "shards"]
    with pytest.raises(RegistryError, match="valid: dirichlet, gamma, iid, shards"):
        partition("natural", np.arange(10), 2, np.random.default_rng(0))
    with pytest.raises(RegistryError, match="unknown parameter.*beta.*valid: alpha"):
        partition("dirichlet", np.arange(10), 2, np.random.default_rng(0), beta=1.0)
