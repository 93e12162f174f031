import numpy as np

from fedsafe.engine.clients import draw_batches


def _indices():
    rng = np.random.default_rng(0)
    perm = rng.permutation(200)
    return [perm[:50], perm[50:53], perm[53:200]]


def test_batches_come_from_own_data_without_replacement():
    ix = _indices()
    b = draw_batches(0, 1, 0, np.array([0, 1, 2]), ix, 8)
    assert b.shape == (3, 8)
    assert set(b[0]) <= set(ix[0]) and len(set(b[0])) == 8
    assert set(b[2]) <= set(ix[2]) and len(set(b[2])) == 8
    # A client with fewer samples than the batch draws with replacement from its own data.
    assert set(b[1]) <= set(ix[1])


def test_batches_independent_of_participants_and_order():
    ix = _indices()
    both = draw_batches(5, 3, 2, np.array([0, 2]), ix, 8)
    alone = draw_batches(5, 3, 2, np.array([2]), ix, 8)
    np.testing.assert_array_equal(both[1], alone[0])
    assert not np.array_equal(both, draw_batches(5, 4, 2, np.array([0, 2]), ix, 8))
    assert not np.array_equal(both, draw_batches(5, 3, 3, np.array([0, 2]), ix, 8))


def test_batches_uniform_over_client_data():
    ix = [np.arange(10)]
    counts = np.zeros(10)
    for t in range(3000):
        counts[draw_batches(0, t, 0, np.array([0]), ix, 3)[0]] += 1
    # Each sample is in a batch with probability 3/10: 900 ± 3·25.
    assert np.all(np.abs(counts - 900) < 80)


def test_kernel_equals_numpy_reference():
    # The numba kernel (one pass per client) against the numpy draw over an (n, width) key
    # matrix: clients with no data, fewer samples than the batch, exactly the batch, and more;
    # any subset and order of participants; every round and step key.
    from fedsafe.engine.clients import draw_batches_numpy, flatten_indices

    rng = np.random.default_rng(1)
    for trial in range(150):
        k, batch = int(rng.integers(1, 25)), int(rng.integers(1, 40))
        ix = [rng.permutation(1000)[: rng.integers(0, 80)] for _ in range(k)]
        ids = rng.permutation(k)[: rng.integers(1, k + 1)]
        t, s = int(rng.integers(0, 10**6)), int(rng.integers(0, 5))
        want = draw_batches_numpy(trial, t, s, ids, ix, batch)
        np.testing.assert_array_equal(draw_batches(trial, t, s, ids, ix, batch), want)
        np.testing.assert_array_equal(draw_batches(trial, t, s, ids, ix, batch, flat=flatten_indices(ix)), want)


def test_negative_keys_are_refused():
    import pytest

    with pytest.raises(ValueError, match="keys must be >= 0"):
        draw_batches(0, -1, 0, np.array([0]), _indices(), 4)
