"""Attacks that know the rule: adaptive_fltrust (norm- and cosine-constrained, Cao et al. NDSS
2021's adaptive setting) against a plain-loop FLTrust, and adaptive_flame (cosine- and
norm-constrained backdoor, Nguyen et al. USENIX Security 2022's adaptive setting) against FLAME's
clustering; toy runs through the engine behind the slow mark."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.attacks import ATTACKS, AttackContext, needs_own_updates
from fedsafe.robust.flame import admitted


def _naive_fltrust(rows: np.ndarray, g0: np.ndarray) -> tuple[list[float], np.ndarray]:
    """Cao et al. Algorithm 1 in plain loops: trust scores ReLU(cos) and the aggregate."""
    n0 = math.sqrt(sum(v * v for v in g0))
    scores, total = [], np.zeros_like(g0)
    for r in rows:
        nr = math.sqrt(sum(v * v for v in r))
        cos = sum(a * b for a, b in zip(r, g0)) / (nr * n0) if nr > 0 else 0.0
        scores.append(max(0.0, cos))
        if nr > 0:
            total = total + scores[-1] * (n0 / nr) * r
    s = sum(scores)
    return scores, (total / s if s > 0 else np.zeros_like(g0))


def _fltrust_setting(seed=0, n_h=8, f=3, d=40):
    g = torch.Generator().manual_seed(seed)
    g0 = torch.randn(d, generator=g, dtype=torch.float64)
    honest = g0 + 0.8 * torch.randn(n_h, d, generator=g, dtype=torch.float64)
    agg = lambda u: AGGREGATORS.get("fltrust", {})(u, f=f, server_update=g0)  # noqa: E731
    ctx = AttackContext(f=f, n=n_h + f, round=0, generator=g, aggregate=agg, server_update=g0)
    return honest, g0, ctx


def test_adaptive_fltrust_keeps_a_positive_trust_score_where_sign_flip_gets_zero():
    honest, g0, ctx = _fltrust_setting()
    assert not needs_own_updates("adaptive_fltrust")
    naive = ATTACKS.get("sign_flip", {})(honest, ctx=ctx)
    adaptive = ATTACKS.get("adaptive_fltrust", {})(honest, ctx=ctx)
    assert adaptive.shape == (3, 40) and torch.equal(adaptive[0], adaptive[2])
    x, g0n = honest.numpy(), g0.numpy()
    scores_naive, agg_naive = _naive_fltrust(np.vstack([x, naive.numpy()]), g0n)
    scores_adapt, agg_adapt = _naive_fltrust(np.vstack([x, adaptive.numpy()]), g0n)
    _, agg_clean = _naive_fltrust(x, g0n)
    assert scores_naive[-3:] == [0.0, 0.0, 0.0]  # FLTrust ignores the sign flip entirely
    assert np.allclose(agg_naive, agg_clean)
    c = scores_adapt[-1]
    assert 0.1 <= c < 1.0  # trust score = cosine to g0, at least cos_min
    # norm equal to the root update's, so FLTrust's rescaling leaves it as it is
    assert float(torch.linalg.vector_norm(adaptive[0])) == pytest.approx(float(torch.linalg.vector_norm(g0)), rel=1e-9)
    # it moves the server's aggregate (recomputed in plain loops) where the naive attack cannot
    shift = float(np.linalg.norm(agg_adapt - agg_clean))
    assert shift > 0.3 * float(np.linalg.norm(agg_clean))
    # and its part orthogonal to g0 points along the sign flip's
    mean = x.mean(0)
    e0 = g0n / np.linalg.norm(g0n)
    perp_a = adaptive[0].numpy() - (adaptive[0].numpy() @ e0) * e0
    perp_s = -mean - (-mean @ e0) * e0
    assert perp_a @ perp_s / (np.linalg.norm(perp_a) * np.linalg.norm(perp_s)) == pytest.approx(1.0, abs=1e-9)


def test_adaptive_fltrust_angle_is_the_best_on_a_fine_grid():
    """The line search's c is within a small tolerance of the best of 401 equally spaced cosines
    in [cos_min, 1], each scored by the plain-loop FLTrust (an independent search)."""
    honest, g0, ctx = _fltrust_setting(seed=4)
    adaptive = ATTACKS.get("adaptive_fltrust", {"cos_min": 0.05})(honest, ctx=ctx)
    x, g0n = honest.numpy(), g0.numpy()
    _, agg_clean = _naive_fltrust(x, g0n)
    norm0 = np.linalg.norm(g0n)
    e0 = g0n / norm0
    a = -x.mean(0)
    ep = a - (a @ e0) * e0
    ep /= np.linalg.norm(ep)

    def shift(c):
        u = norm0 * (c * e0 + math.sqrt(1 - c * c) * ep)
        return np.linalg.norm(_naive_fltrust(np.vstack([x] + [u] * 3), g0n)[1] - agg_clean)

    best = max(shift(c) for c in np.linspace(0.05, 1.0, 401))
    _, got = _naive_fltrust(np.vstack([x, adaptive.numpy()]), g0n)
    assert np.linalg.norm(got - agg_clean) >= best * (1 - 1e-3)


def test_adaptive_fltrust_without_the_root_update_uses_the_honest_mean_and_checks_parameters():
    honest, _, ctx = _fltrust_setting(seed=1)
    blind = AttackContext(f=2, n=10, round=0, generator=torch.Generator(), aggregate=lambda u: u.mean(0))
    out = ATTACKS.get("adaptive_fltrust", {})(honest, ctx=blind)
    mean = honest.mean(0)
    cos = float(out[0] @ mean / (torch.linalg.vector_norm(out[0]) * torch.linalg.vector_norm(mean)))
    assert 0.1 - 1e-9 <= cos <= 1 and float(torch.linalg.vector_norm(out[0])) == pytest.approx(float(torch.linalg.vector_norm(mean)))
    with pytest.raises(ValueError, match=r"'adaptive_fltrust': cos_min must be a number in \(0.0, 1.0\), got 0"):
        ATTACKS.get("adaptive_fltrust", {"cos_min": 0})(honest, ctx=ctx)
    with pytest.raises(ValueError, match="grid must be an integer >= 2"):
        ATTACKS.get("adaptive_fltrust", {"grid": 1})(honest, ctx=ctx)


def _flame_setting(seed=0, n_h=9, f=3, d=60):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    honest = mu + 0.4 * torch.randn(n_h, d, generator=g, dtype=torch.float64)
    b = torch.randn(d, generator=g, dtype=torch.float64)
    own = (b - (b @ mu) / (mu @ mu) * mu).expand(f, -1) * 0.5 + 0.05 * torch.randn(f, d, generator=g, dtype=torch.float64)
    ctx = AttackContext(f=f, n=n_h + f, round=0, generator=g, aggregate=lambda u: u.mean(0), own_updates=own)
    return honest, own, ctx


def _naive_flame_no_noise(rows: np.ndarray, keep: list[int]) -> np.ndarray:
    norms = [math.sqrt(sum(v * v for v in r)) for r in rows]
    s = sorted(norms)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    out = np.zeros(rows.shape[1])
    for i in keep:
        out += rows[i] * min(1.0, med / norms[i])
    return out / len(keep)


def test_adaptive_flame_is_admitted_where_the_naive_backdoor_is_not():
    honest, own, ctx = _flame_setting()
    assert needs_own_updates("adaptive_flame")
    naive = ATTACKS.get("model_replacement", {})(honest, ctx=ctx)
    adaptive = ATTACKS.get("adaptive_flame", {})(honest, ctx=ctx)
    n_h, f = honest.shape[0], 3
    kept_naive = admitted(torch.cat([honest, naive]))
    kept_adapt = admitted(torch.cat([honest, adaptive]))
    assert not any(i >= n_h for i in kept_naive)
    assert sorted(i for i in kept_adapt if i >= n_h) == [n_h, n_h + 1, n_h + 2]
    # FLAME's aggregate (noise off) is the plain-loop mean over every clipped row: all admitted
    rows = torch.cat([honest, adaptive])
    got = AGGREGATORS.get("flame", {"noise": 0.0})(rows, f=f)
    np.testing.assert_allclose(got.numpy(), _naive_flame_no_noise(rows.numpy(), list(range(n_h + f))), rtol=1e-9, atol=1e-12)
    # norm: the median honest norm (FLAME's clipping leaves it whole); direction: bent towards the
    # backdoor, between the honest mean and the backdoored update
    med = float(np.median([float(torch.linalg.vector_norm(h)) for h in honest]))
    assert float(torch.linalg.vector_norm(adaptive[0])) == pytest.approx(med, rel=1e-9)
    m, b = honest.mean(0), own.mean(0)
    cos = lambda u, v: float(u @ v / (torch.linalg.vector_norm(u) * torch.linalg.vector_norm(v)))  # noqa: E731
    assert cos(adaptive[0], b) > cos(m, b) + 0.05
    assert torch.equal(adaptive[0], adaptive[1])


def test_adaptive_flame_sends_the_backdoor_itself_when_it_already_passes():
    g = torch.Generator().manual_seed(5)
    honest = torch.randn(40, generator=g, dtype=torch.float64) + 0.3 * torch.randn(9, 40, generator=g, dtype=torch.float64)
    own = honest[:3] * 1.0  # indistinguishable from honest updates
    ctx = AttackContext(f=3, n=12, round=0, generator=g, aggregate=lambda u: u.mean(0), own_updates=own)
    out = ATTACKS.get("adaptive_flame", {})(honest, ctx=ctx)
    b = own.mean(0)
    med = float(torch.quantile(torch.linalg.vector_norm(honest, dim=1), 0.5))
    torch.testing.assert_close(out[0], med * b / torch.linalg.vector_norm(b))
    with pytest.raises(ValueError, match="adaptive_flame: steps must be an integer >= 1"):
        ATTACKS.get("adaptive_flame", {"steps": 0})(honest, ctx=ctx)


RAW = {"rounds": 30, "seed": 0, "eval_every": 30, "checkpoint_every": 0,
       "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
       "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20}}


@pytest.mark.slow
def test_toy_run_adaptive_flame_backdoors_where_the_naive_one_is_filtered():
    """Digits, 4 of 20, FLAME, 30 rounds (seed 0: naive ASR 0.0, adaptive 0.53)."""
    from fedsafe import Experiment

    naive = Experiment(RAW, attack={"name": "model_replacement", "f": 4}, robust={"rule": "flame"}).run()
    adaptive = Experiment(RAW, attack={"name": "adaptive_flame", "f": 4}, robust={"rule": "flame"}).run()
    assert naive.summary["final_attack_success_rate"] < 0.1
    assert adaptive.summary["final_attack_success_rate"] > 0.3


@pytest.mark.slow
def test_toy_run_adaptive_fltrust_hurts_where_sign_flip_does_not():
    """Digits, 6 of 20, FLTrust, 30 rounds (seed 0: accuracy 0.916 without attack, 0.911 under
    sign flip, 0.758 under the adaptive attack)."""
    from fedsafe import Experiment

    clean = Experiment(RAW, attack={"name": "none", "f": 6}, robust={"rule": "fltrust"}).run()
    naive = Experiment(RAW, attack={"name": "sign_flip", "f": 6}, robust={"rule": "fltrust"}).run()
    adaptive = Experiment(RAW, attack={"name": "adaptive_fltrust", "f": 6}, robust={"rule": "fltrust"}).run()
    assert naive.summary["final_accuracy"] > clean.summary["final_accuracy"] - 0.03
    assert adaptive.summary["final_accuracy"] < naive.summary["final_accuracy"] - 0.08


@pytest.mark.parametrize("name, params, message", [
    ("dba", {"scale": 0}, r"'dba': scale must be a number in \(0.0, inf\), got 0"),
    ("neurotoxin", {"ratio": 1.5}, r"'neurotoxin': ratio must be a number in \(0.0, 1.0\], got 1.5"),
    ("neurotoxin", {"benign": "previous"}, r"benign 'previous' unknown; valid: honest_mean, previous_aggregate"),
    ("edge_case_backdoor", {"eps": -2.0}, r"'edge_case_backdoor': eps must be a number in \(0.0, inf\), got -2.0"),
    ("adaptive_fltrust", {"cos_min": 1.0}, r"'adaptive_fltrust': cos_min must be a number in \(0.0, 1.0\), got 1.0"),
    ("adaptive_flame", {"steps": 0}, r"adaptive_flame: steps must be an integer >= 1, got 0"),
])
def test_set_up_refuses_bad_numbers_before_round_one(name, params, message):
    """make_poison (run by the engine's set-up and by ``fedsafe check``) checks the new attacks'
    numbers, so a bad value fails before round 1, naming the field and its valid range."""
    from fedsafe.robust.backdoor import make_poison

    x, y = torch.randn(30, 1, 8, 8), torch.arange(30) % 10
    base = {"dba": {"size": 3, "gap": 1}}.get(name, {})
    with pytest.raises(ValueError, match=message):
        make_poison(name, {**base, **params}, x, 10, y_train=y)
    make_poison(name, base, x, 10, y_train=y)  # the defaults pass
