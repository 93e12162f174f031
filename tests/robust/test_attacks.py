"""Byzantine attacks against independent references (numpy float64, scipy, hand computations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from fedsafe.core.registry import RegistryError
from fedsafe.robust.attacks import (
    ATTACKS,
    LABEL_TRANSFORMS,
    AttackContext,
    alie_z,
    needs_own_updates,
)


def mean_agg(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=0)


def median_agg(x: torch.Tensor) -> torch.Tensor:
    # even count: mean of the two middle values (docs/architecture.md), which is what quantile(0.5) gives
    return torch.quantile(x, 0.5, dim=0)


def filter_agg(radius: float):
    """Mean of the updates within ``radius`` of the coordinate-wise median: the damage of a
    scaled attack grows with the scale until it gets filtered out (an interior maximiser)."""

    def agg(x: torch.Tensor) -> torch.Tensor:
        med = torch.quantile(x, 0.5, dim=0)
        keep = torch.linalg.vector_norm(x - med, dim=1) <= radius
        return x[keep].mean(dim=0)

    return agg


def make_ctx(f=3, n=None, n_h=7, seed=0, aggregate=mean_agg, state=None, **kw) -> AttackContext:
    return AttackContext(
        f=f,
        n=n if n is not None else n_h + f,
        round=0,
        generator=torch.Generator().manual_seed(seed),
        aggregate=aggregate,
        state={} if state is None else state,
        **kw,
    )


def honest_updates(n_h=7, d=6, seed=1, dtype=torch.float32) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_h, d)) + np.linspace(0.5, 2.0, d)
    return torch.tensor(x, dtype=dtype)


def run(name, honest, ctx, **params):
    return ATTACKS.get(name, params)(honest, ctx=ctx)


def deviation_np(x: np.ndarray, byz: np.ndarray, f: int, agg) -> float:
    rows = np.vstack([x, np.repeat(byz[None, :], f, axis=0)])
    out = agg(torch.tensor(rows)).numpy()
    return float(np.linalg.norm(out - x.mean(axis=0)))


# ---------------------------------------------------------------------------------------------
# registry and helpers

EXPECTED = {
    "none": {},
    "label_flip": {},
    "sign_flip": {},
    "foe": {"tau": 1.1},
    "ipm": {"eps": 0.1},
    "alie": {"z": None},
    "optimal_foe": {"tau_min": 1.0, "tau_max": 21.0, "grid": 21, "refine": 12},
    "optimal_alie": {"z_min": 0.0, "z_max": 10.0, "grid": 21, "refine": 12},
    "mimic": {"warmup": 1},
    "minmax": {"direction": "std", "gamma_init": 10.0, "tol": 1e-5},
    "minsum": {"direction": "std", "gamma_init": 10.0, "tol": 1e-5},
    "gaussian": {"std": 200.0},
    "inf_nan": {"value": "nan"},
    "pattern_backdoor": {"target": 0, "size": 3, "fraction": 0.5, "boost": 1.0},
    "model_replacement": {"target": 0, "size": 3, "fraction": 0.5, "boost": None, "server_lr": None},
    "constrain_and_scale": {"target": 0, "size": 3, "fraction": 0.5, "boost": None, "quantile": 0.5},
    "fang_trimmed_mean": {"b": 2.0},
    "fang_krum": {"threshold": 1e-5, "eps": 0.0},
    "he_invalid_digits": {"fraction": 1.0},
    "dba": {"target": 2, "parts": 4, "size": 4, "gap": 2, "fraction": 20 / 64, "scale": 1.0},
    "neurotoxin": {"target": 0, "size": 3, "fraction": 0.5, "ratio": 0.95, "benign": "honest_mean", "boost": 1.0},
    "edge_case_backdoor": {"source": 7, "target": 1, "angle": 90.0, "fraction": 0.5, "eps": None, "boost": 1.0},
    "adaptive_fltrust": {"cos_min": 0.1, "grid": 21, "refine": 12},
    "adaptive_flame": {"target": 0, "size": 3, "fraction": 0.5, "steps": 20},
}


def test_registry_names_and_defaults():
    assert set(ATTACKS.names()) == set(EXPECTED)
    for name, params in EXPECTED.items():
        entry = ATTACKS.entry(name)
        assert {k: p.default for k, p in entry.params.items()} == params, name
        assert entry.doc, name
    with pytest.raises(RegistryError, match="valid: eps"):
        ATTACKS.check_params("ipm", {"epsilon": 0.1})


def test_needs_own_updates_and_label_transforms():
    own = {"none", "label_flip", "pattern_backdoor", "model_replacement", "constrain_and_scale",
           "dba", "neurotoxin", "edge_case_backdoor", "adaptive_flame"}
    assert all(needs_own_updates(n) for n in own)
    assert not any(needs_own_updates(n) for n in EXPECTED if n not in own)
    y = torch.arange(10)
    assert LABEL_TRANSFORMS["label_flip"](y, 10).tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    assert LABEL_TRANSFORMS["label_flip"](torch.tensor([0, 2]), 3).tolist() == [2, 0]
    assert LABEL_TRANSFORMS["none"](y, 10).tolist() == y.tolist()


# ---------------------------------------------------------------------------------------------
# fixed attacks


@pytest.mark.parametrize(
    "name,params,scale",
    [("sign_flip", {}, -1.0), ("foe", {"tau": 3.0}, -2.0), ("foe", {}, -0.1),
     ("ipm", {"eps": 0.5}, -0.5), ("ipm", {}, -0.1), ("foe", {"tau": 0.5}, 0.5)],
)
def test_foe_family(name, params, scale):
    x = honest_updates(dtype=torch.float64)
    out = run(name, x, make_ctx(f=3), **params)
    want = scale * x.numpy().mean(axis=0)
    assert out.shape == (3, 6) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), np.tile(want, (3, 1)), rtol=1e-12, atol=1e-12)


def test_alie_given_z():
    x = honest_updates(dtype=torch.float64)
    out = run("alie", x, make_ctx(f=2), z=1.5)
    xn = x.numpy()
    want = xn.mean(axis=0) + 1.5 * xn.std(axis=0, ddof=0)  # population std
    np.testing.assert_allclose(out.numpy(), np.tile(want, (2, 1)), rtol=1e-12)


@pytest.mark.parametrize(
    "n,f,hand",
    # s = floor(n/2 + 1) - f; z = Phi^-1((n - s)/n)
    [(50, 12, 0.5828415072712162),  # s = 14, p = 36/50 = 0.72
     (20, 4, 0.38532046640756773),  # s = 7,  p = 13/20 = 0.65
     (25, 5, 0.46769879911450823),  # s = 8,  p = 17/25 = 0.68
     (10, 3, 0.5244005127080407)],  # s = 3,  p = 7/10
)
def test_alie_z_derivation(n, f, hand):
    s = (n // 2 + 1) - f
    assert norm.ppf((n - s) / n) == pytest.approx(hand, abs=1e-12)
    assert alie_z(n, f) == pytest.approx(hand, abs=1e-10)
    x = honest_updates(n_h=n - f, dtype=torch.float64)
    out = run("alie", x, make_ctx(f=f, n=n, n_h=n - f))
    xn = x.numpy()
    np.testing.assert_allclose(out[0].numpy(), xn.mean(0) + hand * xn.std(0), rtol=1e-9)


def test_alie_z_undefined_raises():
    with pytest.raises(ValueError, match="pass z explicitly"):
        alie_z(10, 6)  # s = 0: z = +inf
    with pytest.raises(ValueError, match="pass z explicitly"):
        run("alie", honest_updates(n_h=4), make_ctx(f=6, n=10, n_h=4))


# ---------------------------------------------------------------------------------------------
# optimal FOE / ALIE: the line search against a dense brute-force grid


@pytest.mark.parametrize(
    "agg", [mean_agg, median_agg, filter_agg(8.0)], ids=["mean", "median", "filter"]
)
def test_optimal_foe_beats_dense_grid(agg):
    x = honest_updates(n_h=6, d=5, dtype=torch.float64)
    f = 2
    xn = x.numpy()
    mean = xn.mean(axis=0)
    out = run("optimal_foe", x, make_ctx(f=f, n_h=6, aggregate=agg))
    assert torch.equal(out[0], out[1])
    tau = 1.0 - float(out[0].numpy() @ mean / (mean @ mean))  # out = (1 - tau) mean
    assert 1.0 - 1e-9 <= tau <= 21.0 + 1e-9
    np.testing.assert_allclose(out[0].numpy(), (1 - tau) * mean, rtol=1e-10, atol=1e-12)
    found = deviation_np(xn, (1 - tau) * mean, f, agg)
    dense = max(deviation_np(xn, (1 - t) * mean, f, agg) for t in np.linspace(1.0, 21.0, 4001))
    assert found >= dense * (1 - 1e-2) - 1e-9


def test_optimal_foe_filter_finds_interior_maximum():
    # the filter makes the objective rise then collapse: the maximiser is interior
    x = honest_updates(n_h=6, d=5, dtype=torch.float64)
    xn = x.numpy()
    mean = xn.mean(axis=0)
    agg = filter_agg(8.0)
    grid = np.linspace(1.0, 21.0, 4001)
    vals = [deviation_np(xn, (1 - t) * mean, 2, agg) for t in grid]
    t_best = grid[int(np.argmax(vals))]
    assert 1.5 < t_best < 20.0
    out = run("optimal_foe", x, make_ctx(f=2, n_h=6, aggregate=agg))
    tau = 1.0 - float(out[0].numpy() @ mean / (mean @ mean))
    assert tau == pytest.approx(t_best, abs=0.05)


@pytest.mark.parametrize(
    "agg", [mean_agg, median_agg, filter_agg(6.0)], ids=["mean", "median", "filter"]
)
def test_optimal_alie_beats_dense_grid(agg):
    x = honest_updates(n_h=6, d=5, dtype=torch.float64)
    f = 3
    xn = x.numpy()
    mean, std = xn.mean(axis=0), xn.std(axis=0)
    out = run("optimal_alie", x, make_ctx(f=f, n_h=6, aggregate=agg))
    z = float((out[0].numpy() - mean) @ std / (std @ std))
    assert -1e-9 <= z <= 10.0 + 1e-9
    np.testing.assert_allclose(out[0].numpy(), mean + z * std, rtol=1e-10)
    found = deviation_np(xn, mean + z * std, f, agg)
    dense = max(deviation_np(xn, mean + zz * std, f, agg) for zz in np.linspace(0, 10, 4001))
    assert found >= dense * (1 - 1e-2) - 1e-9


def test_optimal_search_parameters_validated():
    x = honest_updates()
    with pytest.raises(ValueError, match="grid"):
        run("optimal_foe", x, make_ctx(), grid=1)
    with pytest.raises(ValueError, match="hi > lo"):
        run("optimal_alie", x, make_ctx(), z_min=2.0, z_max=1.0)


# ---------------------------------------------------------------------------------------------
# min-max / min-sum


def perturbation_np(xn: np.ndarray, direction: str) -> np.ndarray:
    mean = xn.mean(axis=0)
    if direction == "std":
        return -xn.std(axis=0)
    if direction == "unit_vec":
        return -mean / np.linalg.norm(mean)
    return -np.sign(mean)


def constraint_np(xn: np.ndarray, mal: np.ndarray, objective: str) -> tuple[float, float]:
    """(left side, bound) with explicit loops over pairs: an independent reference."""
    m = len(xn)
    pair = np.array([[np.sum((xn[i] - xn[j]) ** 2) for j in range(m)] for i in range(m)])
    to_mal = np.array([np.sum((mal - xn[j]) ** 2) for j in range(m)])
    if objective == "minmax":
        return float(to_mal.max()), float(pair.max())
    return float(to_mal.sum()), float(pair.sum(axis=1).max())


@pytest.mark.parametrize("objective", ["minmax", "minsum"])
@pytest.mark.parametrize("direction", ["std", "unit_vec", "sign"])
def test_min_max_sum_constraint_tight(objective, direction):
    x = honest_updates(n_h=9, d=7, seed=4, dtype=torch.float64)
    xn = x.numpy()
    tol = 1e-4
    out = run(objective, x, make_ctx(f=3, n_h=9), direction=direction, tol=tol)
    assert out.shape == (3, 7) and torch.equal(out[0], out[2])
    mean = xn.mean(axis=0)
    p = perturbation_np(xn, direction)
    gamma = float((out[0].numpy() - mean) @ p / (p @ p))
    np.testing.assert_allclose(out[0].numpy(), mean + gamma * p, rtol=1e-10, atol=1e-12)
    assert gamma > 0
    lhs, bound = constraint_np(xn, mean + gamma * p, objective)
    assert lhs <= bound * (1 + 1e-9)
    lhs, bound = constraint_np(xn, mean + (gamma + tol) * p, objective)
    assert lhs > bound


def test_minmax_beyond_paper_cap():
    # a feasible gamma far above 2 * gamma_init is still found (the paper's search caps at 20)
    x = honest_updates(n_h=9, d=7, seed=4, dtype=torch.float64)
    xn = x.numpy()
    out = run("minmax", x, make_ctx(f=1, n_h=9), direction="std", gamma_init=0.01, tol=1e-6)
    p = perturbation_np(xn, "std")
    gamma = float((out[0].numpy() - xn.mean(0)) @ p / (p @ p))
    assert gamma > 0.02
    assert constraint_np(xn, xn.mean(0) + (gamma + 1e-6) * p, "minmax")[0] > \
        constraint_np(xn, xn.mean(0), "minmax")[1]


def test_minmax_identical_honest_and_bad_direction():
    x = torch.ones(5, 3)
    out = run("minmax", x, make_ctx(f=2, n_h=5))
    assert torch.equal(out, torch.ones(2, 3))
    with pytest.raises(ValueError, match="valid: std, unit_vec, sign"):
        run("minsum", x, make_ctx(f=2, n_h=5), direction="nope")


# ---------------------------------------------------------------------------------------------
# mimic


def mimic_reference(rounds: list[np.ndarray], z0: np.ndarray, warmup: int) -> list[int]:
    """The authors' online power method (numpy float64) -> row copied in each round."""
    chosen, mu, z, target = [], None, None, None
    for t, x in enumerate(rounds):
        avg = x.mean(axis=0)
        if t == 0:
            mu = avg
            u = sum(((g - mu) @ z0) * (g - mu) for g in x)
            z = u / np.linalg.norm(u)
        elif t < warmup:
            mu = t / (1 + t) * mu + avg / (1 + t)
            u = sum(((g - mu) @ z) * (g - mu) for g in x)
            z = t / (1 + t) * z + u / np.linalg.norm(u) / (1 + t)
            z = z / np.linalg.norm(z)
        if t < warmup:
            target = int(np.argmax(x @ z))
        chosen.append(target)
    return chosen


def test_mimic_matches_reference_and_freezes_target():
    rng = np.random.default_rng(7)
    d, n_h, warmup = 8, 6, 3
    base = rng.normal(size=(n_h, d))
    rounds = [base + 0.3 * rng.normal(size=(n_h, d)) for _ in range(6)]
    state: dict = {}
    seeds = [100 + t for t in range(len(rounds))]
    z0 = torch.randn(d, generator=torch.Generator().manual_seed(seeds[0]), dtype=torch.float64)
    want = mimic_reference(rounds, z0.numpy(), warmup)
    for t, x in enumerate(rounds):
        ctx = make_ctx(f=2, n_h=n_h, seed=seeds[t], state=state)
        out = run("mimic", torch.tensor(x, dtype=torch.float32), ctx, warmup=warmup)
        assert out.shape == (2, d) and out.dtype == torch.float32
        np.testing.assert_allclose(out.numpy(), np.tile(x[want[t]], (2, 1)), rtol=1e-6)
        assert all(isinstance(v, (torch.Tensor, int, float, list)) for v in state.values())
        assert set(state) == {"t", "mu", "z", "target"} and state["t"] == t + 1
    # after warm-up the target is fixed even if another client now maximises <x, z>
    x = np.array(rounds[-1])
    target = want[-1]
    other = (target + 1) % n_h
    x[other] += 50.0 * state["z"].numpy()
    out = run("mimic", torch.tensor(x), make_ctx(f=1, n_h=n_h, state=state), warmup=warmup)
    np.testing.assert_allclose(out[0].numpy(), x[target])


def test_mimic_follows_client_id_under_sampling():
    rng = np.random.default_rng(3)
    d, warmup = 5, 2
    ids = (10, 11, 12, 13)
    state: dict = {}
    for t in range(warmup):
        x = torch.tensor(rng.normal(size=(4, d)))
        run("mimic", x, make_ctx(f=1, n_h=4, seed=t, state=state, honest_ids=ids), warmup=warmup)
    target = state["target"]
    assert target in ids
    # next round: other participants and order; the target client sits at row 0
    x = torch.tensor(rng.normal(size=(3, d)))
    ctx = make_ctx(f=2, n_h=3, state=state, honest_ids=(target, 20, 21))
    out = run("mimic", x, ctx, warmup=warmup)
    assert torch.equal(out, x[0].repeat(2, 1))
    # a round without the target falls back to argmax <x, z> with the frozen z
    ctx = make_ctx(f=1, n_h=3, state=state, honest_ids=(30, 31, 32))
    out = run("mimic", x, ctx, warmup=warmup)
    assert torch.equal(out[0], x[int(torch.argmax(x @ state["z"]))])
    assert state["target"] == target


def test_mimic_deterministic_per_seed():
    x = honest_updates(n_h=6, d=9)
    a = run("mimic", x, make_ctx(f=2, n_h=6, seed=5))
    b = run("mimic", x, make_ctx(f=2, n_h=6, seed=5))
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# random, non-finite, data poisoning


def test_gaussian_independent_seeded_draws():
    x = honest_updates(n_h=3, d=20000)
    a = run("gaussian", x, make_ctx(f=4, n_h=3, seed=11))
    b = run("gaussian", x, make_ctx(f=4, n_h=3, seed=11))
    c = run("gaussian", x, make_ctx(f=4, n_h=3, seed=12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (4, 20000) and a.dtype == torch.float32
    an = a.numpy().astype(np.float64)
    assert np.abs(an.mean(axis=1)).max() < 5 * 200 / np.sqrt(20000)
    np.testing.assert_allclose(an.std(axis=1), 200.0, rtol=0.03)
    assert abs(np.corrcoef(an[0], an[1])[0, 1]) < 0.05  # rows are independent draws
    s = run("gaussian", x, make_ctx(f=1, n_h=3, seed=11), std=2.0)
    np.testing.assert_allclose(s.numpy(), a[:1].numpy() / 100.0, rtol=1e-6)


@pytest.mark.parametrize("value,check", [("nan", np.isnan), ("inf", np.isposinf),
                                         ("-inf", np.isneginf)])
def test_inf_nan(value, check):
    out = run("inf_nan", honest_updates(), make_ctx(f=2), value=value)
    assert out.shape == (2, 6) and check(out.numpy()).all()


def test_inf_nan_bad_value():
    with pytest.raises(ValueError, match="valid: nan, inf, -inf"):
        run("inf_nan", honest_updates(), make_ctx(), value="big")


@pytest.mark.parametrize("name", ["none", "label_flip"])
def test_own_updates_attacks(name):
    own = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    keep = own.clone()
    out = run(name, honest_updates(), make_ctx(f=3, own_updates=own))
    assert torch.equal(out, keep) and out.data_ptr() != own.data_ptr()
    with pytest.raises(ValueError, match="own updates"):
        run(name, honest_updates(), make_ctx(f=3))
    with pytest.raises(ValueError, match="shape"):
        run(name, honest_updates(), make_ctx(f=2, own_updates=own))


@pytest.mark.parametrize("eta", [1.0, 0.5, 0.1])
def test_model_replacement_with_the_servers_rate_replaces_the_global_model(eta):
    # Bagdasaryan et al.: G' = G + (eta/n) sum_i (L_i - G) and the attacker's gamma = n/eta make
    # G' = L when the honest deltas cancel. fedsafe's server steps by eta times the mean of the
    # n updates; f attackers each send the backdoored delta L - G.
    n_h, f = 7, 3
    n = n_h + f
    g = torch.Generator().manual_seed(4)
    global_model = torch.randn(6, generator=g, dtype=torch.float64)
    backdoored = global_model + torch.randn(6, generator=g, dtype=torch.float64)
    honest = torch.randn(n_h, 6, generator=g, dtype=torch.float64)
    honest -= honest.mean(0)  # the honest deltas cancel (near convergence)
    own = (backdoored - global_model).expand(f, -1).clone()

    def step(**params):
        byz = run("model_replacement", honest, make_ctx(f=f, n_h=n_h, own_updates=own), **params)
        return global_model + eta * torch.cat([honest, byz]).mean(0)

    torch.testing.assert_close(step(server_lr=eta), backdoored, rtol=1e-12, atol=1e-12)  # replaced
    # the default gamma = n/f moves the model eta of the way: replacement only when eta = 1
    torch.testing.assert_close(step(), global_model + eta * (backdoored - global_model), rtol=1e-12, atol=1e-12)
    assert torch.equal(run("model_replacement", honest, make_ctx(f=f, n_h=n_h, own_updates=own), server_lr=eta),
                       own * (n / (f * eta)))
    with pytest.raises(ValueError, match="not both"):
        step(server_lr=eta, boost=2.0)
    with pytest.raises(ValueError, match="server_lr must be > 0"):
        step(server_lr=0.0)


# ---------------------------------------------------------------------------------------------
# attacks below the message level (he_invalid_digits)


def test_he_invalid_digits_sends_the_honest_mean_and_checks_its_fraction():
    x = honest_updates(n_h=5, d=6, dtype=torch.float64)
    out = run("he_invalid_digits", x, make_ctx(f=2, n_h=5))
    # the message the Byzantine nodes encode on the coordinates whose digits they keep valid
    np.testing.assert_allclose(out.numpy(), np.repeat(x.numpy().mean(axis=0)[None], 2, axis=0), rtol=1e-12)
    assert run("he_invalid_digits", x, make_ctx(f=1, n_h=5), fraction=0.25).shape == (1, 6)
    for bad in (0.0, 1.5, -0.1, True, "all"):
        with pytest.raises(ValueError, match="fraction must be a number in \\(0, 1\\]"):
            run("he_invalid_digits", x, make_ctx(f=1, n_h=5), fraction=bad)


def test_he_invalid_digits_is_refused_outside_protocol_he():
    from fedsafe.robust.attacks import PROTOCOL_ATTACKS, check_attack_protocol

    assert PROTOCOL_ATTACKS == {"he_invalid_digits": frozenset({"he"})}
    check_attack_protocol("he_invalid_digits", "he")
    for other in ("plain", "secagg", "tee"):
        with pytest.raises(ValueError, match=f"attack.name = 'he_invalid_digits' needs protocol = 'he'.*protocol = '{other}'"):
            check_attack_protocol("he_invalid_digits", other)
    check_attack_protocol("alie", "plain")  # message-level attacks run under any protocol


def test_he_invalid_digits_refused_at_config_time_by_the_engine():
    from fedsafe.config import apply_overrides, validate
    from fedsafe.core.errors import ConfigError
    from fedsafe.engine.federation import Federation

    raw = {
        "rounds": 1, "data": {"name": "digits", "max_train": 200}, "model": {"name": "logreg"},
        "clients": {"num_clients": 4, "batch_size": 8}, "robust": {"rule": "trimmed_mean"},
        "attack": {"name": "he_invalid_digits", "f": 1},
    }
    with pytest.raises(ConfigError, match="attack.name = 'he_invalid_digits' needs protocol = 'he'.*protocol = 'plain'"):
        Federation(validate(apply_overrides(raw, {})))


def test_he_invalid_digits_is_listed_with_its_summary():
    from fedsafe.catalog import items

    (item,) = [i for i in items("attacks") if i.name == "he_invalid_digits"]
    assert item.params == "fraction=1.0"
    assert "HE only" in item.description and "outside their allowed range" in item.description


# ---------------------------------------------------------------------------------------------
# conventions for every attack

PARAMS = {"mimic": {"warmup": 2}, "alie": {}}


def ctx_for(name: str, f: int, n_h: int, d: int) -> AttackContext:
    own = None
    if needs_own_updates(name):
        own = torch.randn(f, d, generator=torch.Generator().manual_seed(9))
    return make_ctx(f=f, n_h=n_h, seed=2, own_updates=own, aggregate=median_agg)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_f_zero_gives_empty(name):
    x = honest_updates()
    ctx = make_ctx(f=0, n_h=7, aggregate=median_agg)
    out = run(name, x, ctx, **PARAMS.get(name, {}))
    assert out.shape == (0, 6) and out.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inputs_unmodified_shape_dtype_deterministic(name, dtype):
    x = honest_updates(n_h=8, d=6, dtype=dtype)
    keep = x.clone()
    a = run(name, x, ctx_for(name, 3, 8, 6), **PARAMS.get(name, {}))
    assert torch.equal(x, keep)
    assert a.shape == (3, 6) and a.dtype == dtype
    b = run(name, x, ctx_for(name, 3, 8, 6), **PARAMS.get(name, {}))
    assert torch.equal(a, b) or (name == "inf_nan" and torch.isnan(a).all())
    a[0] = 123.0  # the result is a fresh tensor, not a view of the input
    assert torch.equal(x, keep) and not torch.equal(a[0], a[1])
