import numpy as np
import pytest
from scipy import stats

from fedsafe.core.streams import counter_uniform, numpy_stream, torch_stream


def test_numpy_stream_is_pure_function_of_identity():
    a = numpy_stream(7, "batches", 3, 1).random(5)
    b = numpy_stream(7, "batches", 3, 1).random(5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, numpy_stream(7, "batches", 3, 2).random(5))
    assert not np.array_equal(a, numpy_stream(8, "batches", 3, 1).random(5))
    assert not np.array_equal(a, numpy_stream(7, "sampling", 3, 1).random(5))


def test_torch_stream_reproducible():
    import torch

    a = torch.randn(4, generator=torch_stream(1, "x", 2))
    b = torch.randn(4, generator=torch_stream(1, "x", 2))
    assert torch.equal(a, b)
    assert not torch.equal(a, torch.randn(4, generator=torch_stream(1, "x", 3)))


def test_negative_keys_refused():
    with pytest.raises(ValueError, match="keys must be >= 0"):
        numpy_stream(0, "x", -1)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        numpy_stream(-1, "x")
    with pytest.raises(ValueError, match="counter keys"):
        counter_uniform(0, "x", np.array([-1]))


def test_counter_uniform_is_elementwise_and_uniform():
    grid = counter_uniform(3, "b", np.arange(50)[:, None], 4, np.arange(400)[None, :])
    # An element does not depend on which other elements were requested.
    one = counter_uniform(3, "b", 17, 4, 123)
    assert one == grid[17, 123]
    u = grid.ravel()
    assert ((u >= 0) & (u < 1)).all()
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # Neighbouring keys are uncorrelated.
    assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 0.02
    assert not np.array_equal(grid, counter_uniform(4, "b", np.arange(50)[:, None], 4, np.arange(400)[None, :]))
