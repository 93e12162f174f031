"""FreqFed (Fereidooni et al., NDSS 2024) against a naive twin (the DCT from its definition,
loops for the cosines and the mean; the same HDBSCAN call), the choices where the paper is
ambiguous for flat updates, and its effect on attackers at toy size."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import scipy.fft
import torch

from fedsafe.core.errors import RequirementError
from fedsafe.robust import freqfed as freqfed_module
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.flame import admitted
from fedsafe.robust.freqfed import low_frequencies

pytest.importorskip("hdbscan")

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive


def _smooth(n: int, d: int, g: torch.Generator, sign: float = 1.0, noise: float = 0.3) -> torch.Tensor:
    t = torch.linspace(0, 1, d, dtype=torch.float64)
    base = sign * torch.sin(2 * math.pi * t) + 0.5 * t
    return base + noise * torch.randn(n, d, generator=g, dtype=torch.float64)


def _updates(seed=0, n=13, bad=4, d=48):
    g = torch.Generator().manual_seed(seed)
    honest = _smooth(n - bad, d, g)
    evil = 3 * _smooth(bad, d, g, sign=-1.0)
    return torch.cat([honest, evil])


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_freqfed_against_naive(fraction, seed):
    x = _updates(seed)
    got = AGGREGATORS.get("freqfed", {"fraction": fraction})(x, f=4)
    np.testing.assert_allclose(got.numpy(), naive.freqfed(x, 4, fraction), rtol=1e-10, atol=1e-12)


def test_dct_is_scipys_orthonormal_type_ii_and_matches_its_definition():
    x = _updates(3, d=20)
    low = low_frequencies(x, 0.5)
    assert low.shape == (13, 10)
    np.testing.assert_allclose(low, scipy.fft.dct(x.numpy(), type=2, norm="ortho", axis=1)[:, :10], rtol=0, atol=1e-12)
    np.testing.assert_allclose(low[0], naive.dct2_ortho(x[0].numpy())[:10], rtol=1e-10, atol=1e-12)


def test_flattened_update_not_per_layer_and_coefficients_rounded_up(monkeypatch):
    # the paper's 2-D DCT per layer is unavailable to a rule on flat rows: one 1-D DCT of the
    # flattened update; K = ⌈fraction·d⌉ (at least one coefficient)
    x = _updates(4, d=30)
    assert low_frequencies(x, 0.25).shape == (13, 8)
    assert low_frequencies(x, 1e-6).shape == (13, 1)
    monkeypatch.setattr(freqfed_module, "_BLOCK_ELEMENTS", 61)  # two rows per block, a ragged last one
    np.testing.assert_allclose(low_frequencies(x, 0.25), scipy.fft.dct(x.numpy(), norm="ortho", axis=1)[:, :8], atol=1e-12)


def test_fraction_one_clusters_as_flame_on_the_updates():
    # the orthonormal DCT keeps inner products: with every coefficient kept the cosines, and so
    # the clusters, are FLAME's on the raw updates
    x = _updates(5)
    assert admitted(torch.from_numpy(low_frequencies(x, 1.0))).tolist() == admitted(x).tolist()


def test_majority_cluster_mean_without_clipping_or_noise():
    g = torch.Generator().manual_seed(6)
    x = torch.cat([_smooth(9, 48, g, noise=0.05), 3 * _smooth(4, 48, g, sign=-1.0, noise=0.05)])
    keep = admitted(torch.from_numpy(low_frequencies(x, 0.25)))
    assert set(keep.tolist()) <= set(range(9)) and len(keep) >= 7  # honest only, a majority
    torch.testing.assert_close(AGGREGATORS.get("freqfed")(x, f=4), x[torch.from_numpy(keep)].mean(0))


def test_high_frequency_differences_are_ignored():
    # loud high frequencies added to 6 of 10 updates change nothing FreqFed sees, while FLAME's
    # cosines on the raw updates change
    g = torch.Generator().manual_seed(7)
    d = 64
    coeffs = torch.zeros(10, d, dtype=torch.float64)
    coeffs[:, :8] = 1.0 + 0.3 * torch.randn(10, 8, generator=g, dtype=torch.float64)
    quiet = torch.from_numpy(scipy.fft.idct(coeffs.numpy(), type=2, norm="ortho", axis=1))
    coeffs[4:, 32:] = 5.0 * torch.randn(6, 32, generator=g, dtype=torch.float64)
    loud = torch.from_numpy(scipy.fft.idct(coeffs.numpy(), type=2, norm="ortho", axis=1))
    np.testing.assert_allclose(low_frequencies(loud, 0.25), low_frequencies(quiet, 0.25), atol=1e-12)
    keep = admitted(torch.from_numpy(low_frequencies(loud, 0.25)))
    assert keep.tolist() == admitted(torch.from_numpy(low_frequencies(quiet, 0.25))).tolist()
    assert admitted(loud).tolist() != admitted(quiet).tolist()
    torch.testing.assert_close(AGGREGATORS.get("freqfed")(loud, f=2), loud[torch.from_numpy(keep)].mean(0))


def test_freqfed_stops_sign_flipped_and_scaled_attackers():
    g = torch.Generator().manual_seed(8)
    honest = _smooth(16, 200, g)
    x = torch.cat([honest, -honest[:4] * 10])  # 4 sign-flipped and scaled copies
    keep = admitted(torch.from_numpy(low_frequencies(x, 0.25)))
    assert set(keep.tolist()) <= set(range(16)) and len(keep) >= 11  # no attacker, a majority
    out = AGGREGATORS.get("freqfed")(x, f=4)
    assert float(out @ honest.mean(0)) > 0.9 * float(honest.mean(0) @ honest.mean(0))
    assert float(x.mean(0) @ honest.mean(0)) < 0  # the mean follows the attackers


def test_freqfed_errors(monkeypatch):
    x = torch.ones(5, 4, dtype=torch.float64)
    with pytest.raises(RequirementError, match=r"freqfed requires n > 2f, got n=5, f=3"):
        AGGREGATORS.get("freqfed")(x, f=3)
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match=r"freqfed: fraction must be a number in \(0, 1\]"):
            AGGREGATORS.get("freqfed", {"fraction": bad})(x, f=1)
    torch.testing.assert_close(AGGREGATORS.get("freqfed")(x, f=2), torch.ones(4, dtype=torch.float64))
    monkeypatch.setitem(sys.modules, "hdbscan", None)
    with pytest.raises(ValueError, match=r"freqfed: needs the hdbscan package: pip install 'fedsafe\[robust\]'"):
        AGGREGATORS.get("freqfed")(x, f=1)


def test_freqfed_through_the_engine():
    from fedsafe import Experiment

    raw = {"rounds": 3, "seed": 0, "eval_every": 3, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 16}, "clients": {"num_clients": 10},
           "attack": {"name": "sign_flip", "f": 2}}
    a = Experiment(raw, robust={"rule": "freqfed"}).run()
    b = Experiment(raw, robust={"rule": "freqfed"}).run()
    assert a.summary["final_accuracy"] == b.summary["final_accuracy"] and a.summary["final_accuracy"] > 0.1


def test_float32_updates_are_transformed_in_float32():
    x = _updates(9).to(torch.float32)
    low = low_frequencies(x, 0.25)
    assert low.dtype == np.float32
    np.testing.assert_allclose(low, low_frequencies(x.to(torch.float64), 0.25), rtol=1e-4, atol=1e-5)
    got = AGGREGATORS.get("freqfed")(x, f=4)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), naive.freqfed(x, 4, 0.25), rtol=1e-5, atol=1e-6)
