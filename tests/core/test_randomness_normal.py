"""The secret stream's normals (``SecretStream.normal``) against an independent reference of
their documented construction: the ChaCha20 keystream of zeros, 53-bit uniforms, float64
Box–Muller, four draws from four distinct pairs summed and halved, in the documented chunk
layout; their distribution; and the seeded stream's normals, pinned to torch.randn."""

import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from fedsafe.core import randomness
from fedsafe.core.randomness import RandomSource, SecretStream
from fedsafe.core.streams import torch_stream

KEY = bytes(range(32))


def reference_normals(key: bytes, count: int) -> np.ndarray:
    """float64 normals as the docstring of SecretStream.normal describes them, in numpy."""
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    out = []
    for s in range(0, count, randomness._NORMAL_CHUNK):
        m = min(randomness._NORMAL_CHUNK, count - s)
        h = (m + 1) // 2
        w = np.frombuffer(enc.update(bytes(64 * h)), dtype="<u8")
        u = (((w >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53).reshape(2, 4, h)
        r, theta = np.sqrt(-2.0 * np.log(u[0])), 2.0 * math.pi * u[1]
        out += [(r * np.cos(theta)).sum(axis=0) / 2, ((r * np.sin(theta)).sum(axis=0) / 2)[: m - h]]
    return np.concatenate(out) if out else np.zeros(0)


@pytest.mark.parametrize("count", [0, 1, 2, 3, 8, 9, randomness._NORMAL_CHUNK, randomness._NORMAL_CHUNK + 1, 40_001])
def test_secret_normals_follow_the_documented_construction(count):
    got = SecretStream(KEY).normal(count, torch.float64).numpy()
    ref = reference_normals(KEY, count)
    assert got.shape == (count,)
    # numpy's and torch's float64 log / cos / sin differ by an ulp at most
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-14)
    got32 = SecretStream(KEY).normal(count).numpy()
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref.astype(np.float32), rtol=0, atol=1e-6)


def test_secret_normals_consume_four_words_per_output_pair_and_continue_the_stream():
    s = SecretStream(KEY)
    s.normal(5)  # an odd count uses the words of 6 outputs: 24
    enc = Cipher(algorithms.ChaCha20(KEY, bytes(16)), mode=None).encryptor()
    words = np.frombuffer(enc.update(bytes(8 * 30)), dtype="<u8")
    assert np.array_equal(s.words(6), words[24:30])
    a = SecretStream(KEY)
    first = a.normal((2, 3))
    assert first.shape == (2, 3)
    assert torch.equal(first.reshape(-1), SecretStream(KEY).normal(6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secret_normals_are_standard_normal(dtype):
    z = RandomSource.secure().stream("test", 2).normal(300_001, dtype).double().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert z.var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / z.size))
    assert stats.skew(z) == pytest.approx(0.0, abs=0.03)
    assert stats.kurtosis(z) == pytest.approx(0.0, abs=0.05)
    # the two outputs a chunk makes from the same four pairs (cosine and sine sums) are uncorrelated
    h = randomness._NORMAL_CHUNK // 2
    assert abs(np.corrcoef(z[:h], z[h : 2 * h])[0, 1]) < 5 / math.sqrt(h)


def test_seeded_normals_are_bit_identical_to_torch_randn():
    for shape in (7, (3, 5), 100_003):
        src = RandomSource.seeded(11)
        g = torch_stream(11, "dp.example_noise", 1, 2, 3)
        ref = torch.randn((shape,) if isinstance(shape, int) else shape, generator=g)
        assert torch.equal(src.stream("dp.example_noise", 1, 2, 3).normal(shape), ref)
