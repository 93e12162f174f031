"""FLAME against a naive twin (loops for the cosines, clipping, mean and noise; the same
HDBSCAN call for the clustering), its fallbacks, and its effect on a backdoor."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.flame import admitted

hdbscan = pytest.importorskip("hdbscan")


def _naive(x: np.ndarray, noise: float, seed: int) -> np.ndarray:
    n = x.shape[0]
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            ni, nj = np.linalg.norm(x[i]), np.linalg.norm(x[j])
            cos = 0.0 if ni == 0 or nj == 0 else float(x[i] @ x[j]) / (ni * nj)
            dist[i, j] = 0.0 if i == j else min(2.0, max(0.0, 1.0 - cos))
    labels = hdbscan.HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
                             allow_single_cluster=True).fit_predict(dist)
    sizes = {c: int((labels == c).sum()) for c in set(labels) if c >= 0}
    keep = [i for i in range(n) if labels[i] == min(sizes, key=lambda c: (-sizes[c], c))] if sizes else list(range(n))
    norms = sorted(np.linalg.norm(r) for r in x)
    s = norms[n // 2] if n % 2 else (norms[n // 2 - 1] + norms[n // 2]) / 2
    out = sum(x[i] * min(1.0, s / np.linalg.norm(x[i])) for i in keep) / len(keep)
    z = torch.randn(x.shape[1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64).numpy()
    return out + noise * s * z


def _updates(seed=0, n=15, bad=4, d=40):
    g = torch.Generator().manual_seed(seed)
    honest = torch.randn(n - bad, d, generator=g, dtype=torch.float64) * 0.3 + 1.0
    evil = -torch.ones(bad, d, dtype=torch.float64) * 3 + 0.1 * torch.randn(bad, d, generator=g, dtype=torch.float64)
    return torch.cat([honest, evil])


@pytest.mark.parametrize("noise", [0.0, 0.001, 0.05])
@pytest.mark.parametrize("seed", [0, 1])
def test_flame_against_naive(noise, seed):
    x = _updates(seed)
    got = AGGREGATORS.get("flame", {"noise": noise})(x, f=4, generator=torch.Generator().manual_seed(7))
    np.testing.assert_allclose(got.numpy(), _naive(x.numpy(), noise, 7), rtol=1e-10, atol=1e-12)


def test_flame_keeps_the_honest_cluster():
    x = _updates(2)
    keep = set(admitted(x).tolist())
    assert keep <= set(range(11)) and len(keep) >= 8  # the four opposite updates are left out
    out = AGGREGATORS.get("flame", {"noise": 0.0})(x, f=4)
    assert float(out @ x[:11].mean(0)) > 0 and float(x.mean(0) @ x[:11].mean(0)) < float(out @ x[:11].mean(0))


def test_flame_fallbacks_and_errors(monkeypatch):
    x = torch.ones(5, 3, dtype=torch.float64)
    out = AGGREGATORS.get("flame", {"noise": 0.0})(x, f=2)
    torch.testing.assert_close(out, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs a seeded generator"):
        AGGREGATORS.get("flame")(x, f=2)
    with pytest.raises(ValueError, match="noise must be >= 0"):
        AGGREGATORS.get("flame", {"noise": -1.0})(x, f=2, generator=torch.Generator())
    monkeypatch.setitem(sys.modules, "hdbscan", None)
    with pytest.raises(ValueError, match=r"pip install 'fedsafe\[robust\]'"):
        AGGREGATORS.get("flame")(x, f=2, generator=torch.Generator())


def test_flame_through_the_engine_is_seeded_and_stops_a_backdoor():
    from fedsafe import Experiment

    raw = {"rounds": 30, "seed": 0, "eval_every": 10, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20},
           "attack": {"name": "model_replacement", "f": 4}}
    a = Experiment(raw, robust={"rule": "flame"}).run()
    b = Experiment(raw, robust={"rule": "flame"}).run()
    assert torch.equal(a.federation.state.params, b.federation.state.params)  # the noise is seeded
    assert a.summary["final_attack_success_rate"] < 0.1 and a.summary["final_accuracy"] > 0.75
