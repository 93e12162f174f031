import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fedsafe.core.protocol import ProtocolError
from fedsafe.protocols.secagg import SecAggConfig, SecAggError, default_k
from fedsafe.protocols.secagg.fixedpoint import decode_mean, encode, word_dtype


@settings(max_examples=200, deadline=None)
@given(bits=st.integers(16, 62), n=st.integers(2, 5000))
def test_auto_quant_bits_is_the_largest_that_cannot_overflow(bits, n):
    q = SecAggConfig(bits=bits).effective_quant_bits(n)
    assert n * (2**q - 1) < 2**bits
    assert q == 52 or n * (2 ** (q + 1) - 1) >= 2**bits


def test_check_capacity_raises_with_the_numbers():
    cfg = SecAggConfig(bits=16, quant_bits=12)
    assert cfg.check_capacity(16) == 12  # 16 * 4095 = 65520 < 65536
    with pytest.raises(SecAggError, match=r"17 x 4095 = 69615 >= 2\^bits = 2\^16 = 65536.*quant_bits <= 11") as e:
        cfg.check_capacity(17)
    assert isinstance(e.value, ProtocolError)


def test_sum_of_extreme_encodings_is_exact():
    cfg = SecAggConfig(bits=16)
    n = 100
    q = cfg.effective_quant_bits(n)
    assert cfg.clip == "auto" and cfg.fixed_clip == 1.0  # without DP, "auto" is [-1, 1]
    top = encode(np.full(5, 1e9), cfg.fixed_clip, q, cfg.bits)  # clipped to +clip: the top level
    assert int(top[0]) == 2**q - 1
    total = sum(top.astype(np.int64) for _ in range(n))
    assert (total < 2**16).all()
    assert np.allclose(decode_mean(total, n, cfg.fixed_clip, q), cfg.fixed_clip)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 300),
    bits=st.integers(16, 62),
    clip=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**31),
)
def test_decoded_mean_within_the_documented_bound(n, bits, clip, seed):
    cfg = SecAggConfig(bits=bits, clip=clip)
    q = cfg.effective_quant_bits(n)
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=clip, size=(n, 7))
    enc = np.stack([encode(r, clip, q, bits) for r in x])
    assert enc.dtype == word_dtype(bits)
    assert int(enc.max()) < 2**q
    total = enc.astype(object).sum(0)  # exact integers, independent of word arithmetic
    assert max(total) < 2**bits
    mean = decode_mean(np.array(total, dtype=np.float64), n, clip, q)
    err = np.abs(mean - np.clip(x, -clip, clip).mean(0)).max()
    bound = cfg.quantization_error_bound(n)
    assert err <= bound * (1 + 1e-6) + 1e-12 * clip


def test_encode_refuses_non_finite():
    with pytest.raises(ValueError):
        encode(np.array([0.0, np.nan]), 1.0, 8, 16)


@pytest.mark.parametrize(
    "threshold,n,k,t",
    [(0.5, 10, None, 6), (0.5, 9, None, 5), (2 / 3, 10, None, 7), (2 / 3, 3, None, 3), (6, 10, None, 6),
     (0.5, 100, 10, 6), (0.5, 100, None, 8)],
)
def test_share_threshold(threshold, n, k, t):
    graph = "complete" if k is None and n <= 10 else "k_regular"
    cfg = SecAggConfig(threshold=threshold, graph=graph, k=k)
    g = cfg.num_neighbors(n) + 1
    assert cfg.share_threshold(n) == t
    assert t > threshold * g if isinstance(threshold, float) else t == threshold


def test_threshold_larger_than_group_is_refused():
    with pytest.raises(SecAggError, match="exceeds the share group size 5"):
        SecAggConfig(threshold=6).share_threshold(5)


def test_default_k_is_logarithmic_and_even():
    assert [default_k(n) for n in (2, 10, 32, 50, 100, 1000)] == [2, 8, 10, 12, 14, 20]
    for n in range(2, 3000, 37):
        assert default_k(n) % 2 == 0 and default_k(n) <= 2 * math.log2(n) + 2
    cfg = SecAggConfig(graph="k_regular")
    assert cfg.num_neighbors(100) == 14
    assert cfg.num_neighbors(6) == 5 and cfg.is_complete(6)  # k >= n - 1: complete


@pytest.mark.parametrize(
    "raw,msg",
    [
        ({"bits": 8}, "greater than or equal to 16"),
        ({"bits": 63}, "less than or equal to 62"),
        ({"clip": 0}, "greater than 0"),
        ({"clip": float("inf")}, "finite"),
        ({"threshold": 1}, "count must be >= 2"),
        ({"threshold": 1.0}, r"fraction must be in \[0.5, 1\)"),
        ({"threshold": True}, "boolean"),
        ({"k": 4}, "only used with graph = 'k_regular'"),
        ({"graph": "k_regular", "k": 5}, "even"),
        ({"graph": "star"}, "complete"),
        ({"dropout": 1.0}, "less than 1"),
        ({"dropout_stages": ["mask", "mask"]}, "repeats"),
        ({"dropout_stages": ["later"]}, "advertise"),
        ({"bogus": 1}, "Extra inputs are not permitted"),
    ],
)
def test_config_validation_names_the_problem(raw, msg):
    with pytest.raises(ValidationError, match=msg):
        SecAggConfig.model_validate(raw)


def test_too_few_participants():
    with pytest.raises(SecAggError, match="at least 2 participants"):
        SecAggConfig().check_capacity(1)
