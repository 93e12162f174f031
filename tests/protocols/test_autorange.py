"""``"auto"`` ranges (issue #29 item 2): the findings reproduced at the former defaults, and what
``he.range = "auto"`` and ``tee.clip = "auto"`` resolve to, against numpy and closed forms."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.autorange import (
    HE_RANGE_FACTOR,
    calibrated_range,
    client_scales,
    dp_norm_bound,
    dp_rms_bound,
    median_scale,
)
from fedsafe.protocols.he import HEProtocol
from fedsafe.protocols.he.config import HEConfig
from fedsafe.protocols.tee.config import TEEConfig
from fedsafe.protocols.tee.leakage import AUTO_CLIP_FACTOR, auto_clip
from fedsafe.robust.pipeline import RobustPipeline


def _pipe(rule="trimmed_mean", f=1):
    return RobustPipeline(rule, {}, [], f, 0)


def _ctx(n, round_=1, byz=0):
    return RoundContext(round_, 5, tuple(range(100, 100 + n)), byz)


def _msgs(x):
    return [Message(100 + i, torch.from_numpy(np.ascontiguousarray(x[i])).float()) for i in range(len(x))]


# --- the statistics, against numpy -------------------------------------------------------------


def test_client_scales_are_each_rows_rms_over_its_finite_coordinates():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1e-3, size=(5, 40))
    x[1, 3] = np.nan
    x[2, :] = np.inf
    got = client_scales(x)
    for i in range(5):
        row = x[i][np.isfinite(x[i])]
        want = 0.0 if row.size == 0 else math.sqrt(float(np.mean(row**2)))
        assert got[i] == pytest.approx(want, rel=1e-12)


def test_median_scale_is_numpys_median_of_the_finite_scales():
    for s in ([3.0, 1.0, 2.0], [4.0, 1.0, 3.0, 2.0], [1.0, np.nan, 5.0]):
        finite = [v for v in s if np.isfinite(v)]
        assert median_scale(s) == pytest.approx(float(np.median(finite)))
    assert median_scale([]) > 0 and median_scale([0.0, 0.0]) > 0  # never a zero range


def test_a_byzantine_minority_cannot_move_the_calibration_outside_the_honest_scales():
    rng = np.random.default_rng(1)
    honest = rng.normal(0, 1e-4, size=(7, 200))
    byz = np.full((3, 200), 1e6)  # f = 3 < n/2 nodes lying about their scale
    r, scale = calibrated_range(np.vstack([honest, byz]))
    s = client_scales(honest)
    assert s.min() <= scale <= s.max() and r == HE_RANGE_FACTOR * scale


def test_dp_bounds_match_their_closed_forms():
    d, c, sigma = 1000, 2.0, 0.3
    assert dp_rms_bound([(d, -c, c, sigma)]) == pytest.approx(math.sqrt(c * c / d + sigma * sigma))
    # a vector at the clip: its RMS is exactly c / sqrt(d), the bound without noise
    v = np.ones(d) * c / math.sqrt(d)
    assert float(np.sqrt(np.mean(v**2))) == pytest.approx(dp_rms_bound([(d, -c, c, 0.0)]))
    # the norm bound holds for noisy messages with a margin, and is tight to within the tail term
    rng = np.random.default_rng(2)
    bound = dp_norm_bound([(d, -c, c, sigma)])
    noisy = v + rng.normal(0, sigma, size=(2000, d))
    norms = np.linalg.norm(noisy, axis=1)
    assert norms.max() < bound < c + sigma * math.sqrt(d) + 10 * sigma


def test_tee_auto_clip_is_the_factor_times_the_median_norm():
    norms = [0.5, 2.0, 1.0, float("nan"), 4.0]
    assert auto_clip(norms) == pytest.approx(AUTO_CLIP_FACTOR * float(np.median([0.5, 2.0, 1.0, 4.0])))
    assert auto_clip([1.0, 3.0], growth=10.0) == pytest.approx(AUTO_CLIP_FACTOR * 10.0 * 2.0)
    with pytest.raises(ValueError, match="growth"):
        auto_clip([1.0], growth=0.5)


# --- config -------------------------------------------------------------------------------------


def test_auto_is_the_default_and_numbers_still_work():
    assert HEConfig().range == "auto" and TEEConfig().clip == "auto"
    assert HEConfig(range=0.05).range == 0.05 and TEEConfig(clip=10).clip == 10.0
    for bad in ("automatic", -1, 0, float("inf"), True):
        with pytest.raises(ValueError, match="he.range must be"):
            HEConfig(range=bad)
        with pytest.raises(ValueError, match="tee.clip must be"):
            TEEConfig(clip=bad)


# --- the findings: zeroth-order scalars and local-DP messages under he.range = 0.05 ------------


def _zo_like(n=6, k=100, seed=0):
    """K loss differences sigma <g, u> with sigma = 1e-4, |g| ~ 1: scalars ~ 1e-4."""
    return np.random.default_rng(seed).normal(0, 1e-4, size=(n, k))


def test_the_former_default_erases_every_zeroth_order_scalar_and_auto_keeps_them():
    x = _zo_like()
    old = HEProtocol(backend="emulator", range=0.05).aggregate(_msgs(x), _pipe(), _ctx(len(x)))
    assert old.metrics["he_zeroed_fraction"] == 1.0 and not old.vector.any()
    new = HEProtocol(backend="emulator").aggregate(_msgs(x), _pipe(), _ctx(len(x)))
    want = HE_RANGE_FACTOR * float(np.median(np.sqrt(np.mean(x**2, axis=1))))
    assert new.metrics["he_range"] == pytest.approx(want, rel=1e-9)
    assert new.metrics["he_zeroed_fraction"] < 0.25 and new.metrics["he_clipped_fraction"] < 0.02
    # the aggregate now follows the plaintext trimmed mean to within a quantization step
    ref = np.sort(x, axis=0)[1:-1].mean(axis=0)
    step = want / 7
    assert np.abs(new.vector.numpy() - ref).max() < step


class _LocalDP:
    """What the DP plugin declares under local placement: updates clipped to C, noise z C."""

    name = "dp"

    def __init__(self, clip, z):
        self.clip, self.z = clip, z

    def message_ranges(self, dim):
        return [(dim, -self.clip, self.clip, self.z * self.clip)]


def test_local_dp_messages_are_clipped_by_the_former_default_and_auto_derives_from_dp():
    d, c, z = 500, 1.0, 1.0
    rng = np.random.default_rng(3)
    g = rng.normal(0, 1, size=(6, d))
    g = g / np.linalg.norm(g, axis=1, keepdims=True) * c  # clipped to C
    x = g + rng.normal(0, z * c, size=g.shape)  # local noise
    old = HEProtocol(backend="emulator", range=0.05).aggregate(_msgs(x), _pipe(), _ctx(6))
    assert old.metrics["he_clipped_fraction"] > 0.9
    proto = HEProtocol(backend="emulator")
    proto.bind_plugins([_LocalDP(c, z)])
    new = proto.aggregate(_msgs(x), _pipe(), _ctx(6))
    assert new.metrics["he_range"] == pytest.approx(HE_RANGE_FACTOR * math.sqrt(c * c / d + (z * c) ** 2))
    assert proto.range_source == "dp" and new.metrics["he_clipped_fraction"] < 0.01


def test_auto_follows_the_messages_round_by_round():
    proto = HEProtocol(backend="emulator")
    ranges = []
    for t, scale in enumerate((1e-3, 1e-2, 1e-1), 1):
        x = np.random.default_rng(t).normal(0, scale, size=(5, 300))
        ranges.append(proto.aggregate(_msgs(x), _pipe(), _ctx(5, round_=t)).metrics["he_range"])
    assert ranges[0] < ranges[1] < ranges[2]
    assert [r / s for r, s in zip(ranges, (1e-3, 1e-2, 1e-1))] == pytest.approx([HE_RANGE_FACTOR] * 3, rel=0.1)


def test_a_destroying_range_warns_naming_the_setting_and_the_auto_value():
    from fedsafe.protocols.he.protocol import QUANTIZATION_PATIENCE

    proto = HEProtocol(backend="emulator", range=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, QUANTIZATION_PATIENCE + 1):
            proto.aggregate(_msgs(_zo_like(seed=t)), _pipe(), _ctx(6, round_=t))
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1
    assert "he.range = 0.05 rounds 100.0%" in msgs[0] and "set he.range = 'auto' (here about 0.0003" in msgs[0]


# --- TEE --------------------------------------------------------------------------------------


def test_tee_auto_clip_is_resolved_in_the_first_round_inside_the_enclave():
    from fedsafe.protocols.tee.protocol import TEEProtocol

    rng = np.random.default_rng(4)
    x1 = rng.normal(0, 1e-3, size=(5, 64))
    with TEEProtocol(TEEConfig(processes=False), growth=2.0) as proto:
        a1 = proto.aggregate(_msgs(x1), _pipe("multi_krum", 1), _ctx(5))
        want = AUTO_CLIP_FACTOR * 2.0 * float(np.median(np.linalg.norm(x1.astype(np.float32), axis=1)))
        assert a1.metrics["tee_clip"] == pytest.approx(want, rel=1e-5) and a1.metrics["clipped"] == 0
        x2 = rng.normal(0, 1.0, size=(5, 64))  # far above: clipped to the clip fixed in round 1
        a2 = proto.aggregate(_msgs(x2), _pipe("multi_krum", 1), _ctx(5, round_=2))
        assert a2.metrics["tee_clip"] == a1.metrics["tee_clip"] and a2.metrics["clipped"] == 5


def test_tee_auto_clip_with_dp_is_the_dp_norm_bound():
    from fedsafe.protocols.tee.protocol import TEEProtocol

    x = np.random.default_rng(5).normal(0, 0.01, size=(5, 64))
    with TEEProtocol(TEEConfig(processes=False)) as proto:
        proto.bind_plugins([_LocalDP(1.0, 0.5)])
        agg = proto.aggregate(_msgs(x), _pipe("multi_krum", 1), _ctx(5))
    assert agg.metrics["tee_clip"] == pytest.approx(dp_norm_bound([(64, -1.0, 1.0, 0.5)]))
    assert proto.clip_source == "dp"


def test_tee_momentum_growth_comes_from_the_config():
    from fedsafe.config import validate
    from fedsafe.protocols.tee.protocol import from_config

    base = {"protocol": "tee", "robust": {"rule": "multi_krum"}, "attack": {"name": "alie", "f": 1}}
    assert from_config(validate({**base, "clients": {"momentum": 0.9}})).growth == pytest.approx(10.0)
    assert from_config(validate({**base, "clients": {"momentum": 0.0}})).growth == 1.0
    assert from_config(validate({**base, "clients": {"momentum": 0.9, "algorithm": "fedavg"}})).growth == 1.0


def test_a_run_shorter_than_the_patience_warns_when_it_ends_if_every_round_was_destroyed():
    proto = HEProtocol(backend="emulator", range=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in (1, 2, 3):
            proto.aggregate(_msgs(_zo_like(seed=t)), _pipe(), _ctx(6, round_=t))
        assert not caught
        proto.close()
        proto.close()
    assert len(caught) == 1 and "for 3 rounds up to round 3" in str(caught[0].message)
    assert "set he.range = 'auto'" in str(caught[0].message)
    # one usable round in between: nothing to say at the end
    proto = HEProtocol(backend="emulator", range=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proto.aggregate(_msgs(_zo_like(seed=1)), _pipe(), _ctx(6, round_=1))
        proto.aggregate(_msgs(_zo_like(seed=2) * 300), _pipe(), _ctx(6, round_=2))
        proto.aggregate(_msgs(_zo_like(seed=3)), _pipe(), _ctx(6, round_=3))
        proto.close()


# --- secure aggregation without DP: [-1, 1], and warnings when the encoding destroys the messages


def _secagg_round(cfg, x, round_=1):
    from fedsafe.protocols.secagg.protocol import SecAggProtocol

    proto = SecAggProtocol(cfg, key_seed=0)
    return proto, proto.aggregate(_msgs(x), _pipe("mean", 0), _ctx(len(x), round_=round_))


def test_secagg_auto_without_dp_is_one_and_fine_enough_for_zeroth_order_scalars():
    from fedsafe.protocols.secagg.config import SecAggConfig

    x = _zo_like(n=4, k=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, agg = _secagg_round(SecAggConfig(), x)
    assert agg.metrics["secagg_range"] == 1.0 and agg.metrics["secagg_clipped_fraction"] == 0
    # 2^q levels over [-1, 1]: the mean is exact to half a step, far below the scalars' 1e-4
    assert np.abs(agg.vector.numpy() - x.mean(axis=0)).max() <= agg.metrics["secagg_quant_error_bound"] < 1e-6


def test_secagg_warns_once_naming_the_range_when_it_clips_or_rounds_the_messages_away():
    from fedsafe.protocols.secagg.config import SecAggConfig

    x = _zo_like(n=4, k=50)
    with pytest.warns(UserWarning, match=r"secagg.range = 1e-05 .* clips 9\d.\d% of the coordinates") as caught:
        _, agg = _secagg_round(SecAggConfig(range=1e-5), x)
    assert agg.metrics["secagg_clipped_fraction"] > 0.9 and len(caught) == 1
    # 16-bit words, 4 clients: q = 14 (4 (2^14 - 1) < 2^16), a step of 200 / (2^14 - 1) = 0.0122
    # over [-100, 100] against scalars of 1e-4
    assert f"{200 / (2**14 - 1):.3g}" == "0.0122"
    with pytest.warns(UserWarning, match=r"quantization step 0.0122 of secagg.range = 100.0 at 14 bits exceeds"):
        _secagg_round(SecAggConfig(range=100.0, bits=16), x)


def test_tee_precomputes_noise_once_the_auto_clip_is_resolved():
    from fedsafe.protocols.tee.protocol import TEEProtocol

    rng = np.random.default_rng(6)
    online = []
    with TEEProtocol(TEEConfig(processes=False, precompute_rounds=2)) as proto:
        for t in (1, 2, 3):
            x = rng.normal(0, 1e-2, size=(5, 64))
            online.append(proto.aggregate(_msgs(x), _pipe("multi_krum", 1), _ctx(5, round_=t)).metrics["noise_online"])
    # round 1 resolves the clip (its noise is drawn online); the blocks drawn after it serve rounds 2 and 3
    assert online == [1.0, 0.0, 0.0]


def test_number_or_auto_is_the_one_validator_of_the_three_ranges():
    import math

    import pytest

    from fedsafe.protocols.he.config import HEConfig
    from fedsafe.protocols.secagg.config import SecAggConfig
    from fedsafe.protocols.settings import number_or_auto
    from fedsafe.protocols.tee.config import TEEConfig

    assert number_or_auto("k", "auto") == "auto" and number_or_auto("k", 2) == 2.0
    for bad in ("Auto", True, None, [1.0], 0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^k must be a"):
            number_or_auto("k", bad)
    with pytest.raises(ValueError, match=r"k must be a finite number in \(0, 10\] \(or 'auto'\), got 11"):
        number_or_auto("k", 11, upper=10)
    assert HEConfig(range=0.5).range == 0.5 and SecAggConfig(range="auto").range == "auto"
    for section, key in ((HEConfig, "range"), (SecAggConfig, "range"), (TEEConfig, "clip")):
        with pytest.raises(ValueError, match=f"{key} must be a number > 0 or 'auto'"):
            section(**{key: "big"})
