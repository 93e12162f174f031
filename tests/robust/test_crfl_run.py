"""CRFL as a run option (``[crfl]``): the model stage of the round against a naive loop twin, the
vectorised radius against the scalar closed form, the certification's summary against a naive
recount of the votes, the reference's conventions (each in a test named for it), errors, resume,
and a toy backdoor run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch.func import functional_call

from fedsafe.config import ConfigError, validate
from fedsafe.core.randomness import RandomSource
from fedsafe.core.streams import torch_stream
from fedsafe.engine.federation import Federation
from fedsafe.engine.round import finish_step, resolve_plan
from fedsafe.robust.crfl import (
    CRFLPlugin,
    certified_radii,
    certified_radius,
    clip_schedule,
    contraction,
    hoeffding_bounds,
    perturb_model,
    radius_factor,
    smoothed_votes,
    top_two,
    vote_bounds,
)
from fedsafe.robust.crfl_config import CRFLConfig

RAW = {"rounds": 4, "seed": 3, "eval_every": 2, "checkpoint_every": 1, "secure_randomness": False,
       "data": {"name": "digits", "partition": "iid", "max_test": 120},
       "model": {"name": "mlp", "hidden": 16}, "clients": {"num_clients": 6, "algorithm": "fedavg", "local_steps": 4, "lr": 0.3},
       "server": {"lr": 1.0},
       "attack": {"name": "pattern_backdoor", "f": 1, "params": {"boost": 2.0, "fraction": 0.25}},
       "crfl": {"enabled": True, "rho": 4.2, "rho_start": 2.0, "rho_growth": 0.5, "sigma_train": 0.02,
                "samples": 24, "sigma_test": 0.02, "alpha": 0.01, "batch_models": 5, "radii": [0.0, 0.001, 0.01]}}


def _experiment(**over):
    from fedsafe import Experiment

    raw = {**RAW, **over}
    return Experiment(raw)


# --- the training-time stage ----------------------------------------------------------------


def _naive_stage(params: torch.Tensor, rho: float, sigma: float, seed: int, t: int, last: bool) -> torch.Tensor:
    # the reference's clip_weight_norm and dp_noise, written as plain loops over the entries
    values = params.tolist()
    total = math.sqrt(sum(v * v for v in values))
    if total > rho:
        coef = rho / (total + 1e-6)
        values = [v * coef for v in values]
    out = torch.tensor(values, dtype=params.dtype)
    if last:
        return out
    z = torch.randn(len(values), generator=torch_stream(seed, "robust.crfl", t), dtype=torch.float64)
    return (out.to(torch.float64) + sigma * z).to(params.dtype)


def test_the_stage_matches_a_naive_loop_twin_round_by_round():
    """A run with [crfl] against the same run without it whose model a plain loop clips to ρ_t
    (the reference's schedule) and perturbs after every round: the same model each round, and
    the rows' crfl_norm / crfl_rho are the norm before clipping and ρ_t."""
    crfl = _experiment(checkpoint_every=0).run().federation
    twin = Federation(validate({**RAW, "checkpoint_every": 0, "crfl": {"enabled": False}}))
    rho = [min(4.2, 2.0 + 0.5 * t) for t in range(1, 5)]
    clipped = 0
    for t in range(1, 5):
        # the twin's own step, then the naive stage on the model it produced
        twin.run_round()
        norm_before = float(torch.linalg.vector_norm(twin.state.params.double()))
        assert crfl.rows[t - 1]["crfl_norm"] == pytest.approx(norm_before, rel=1e-5)
        assert crfl.rows[t - 1]["crfl_rho"] == rho[t - 1]
        clipped += norm_before > rho[t - 1]
        twin.state.params = _naive_stage(twin.state.params, rho[t - 1], 0.02, 3, t, last=t == 4)
    torch.testing.assert_close(crfl.state.params, twin.state.params, rtol=0, atol=1e-6)
    assert clipped > 0  # the norm bound bit
    assert float(torch.linalg.vector_norm(crfl.state.params)) <= rho[-1]


def test_the_stage_is_in_the_plan_after_the_step_and_the_engine_and_strategy_run_it():
    plugin = CRFLPlugin(CRFLConfig(enabled=True, rho_start=1.0, rho_growth=0.0, rho=5.0), rounds=2,
                        source=RandomSource.seeded(0), threat=None)
    from fedsafe.core.protocol import PlainProtocol
    from fedsafe.robust.pipeline import RobustPipeline

    plan = resolve_plan(PlainProtocol(), RobustPipeline("mean", {}, [], 0, 0), [plugin], lambda v, t: -v)
    assert plan.stages == ("aggregate", "decode", "step", "transform_model", "on_round_end")
    w = torch.full((4,), 2.0)  # norm 4 > ρ = 1
    last = finish_step(plan, w, 2)  # the last round: clipped, no noise
    torch.testing.assert_close(last, w / (4.0 + 1e-6))
    mid = finish_step(plan, w, 1)
    assert not torch.equal(mid, last)
    import inspect

    from fedsafe.engine import federation
    from fedsafe.flower import strategy

    for module in (federation, strategy):  # the two callers' steps pass through the stage
        assert "finish_step(self.plan," in inspect.getsource(module)


def test_noise_is_secure_by_default_and_seeded_only_on_request():
    secure = _experiment(checkpoint_every=0, secure_randomness=True, rounds=2,
                         crfl={**RAW["crfl"], "certify": False})
    a, b = secure.run().federation.state.params, _experiment(checkpoint_every=0, secure_randomness=True, rounds=2,
                                                             crfl={**RAW["crfl"], "certify": False}).run().federation.state.params
    assert not torch.equal(a, b)  # round 1's noise from a fresh OS secret each run
    c = _experiment(checkpoint_every=0, rounds=2, crfl={**RAW["crfl"], "certify": False}).run().federation.state.params
    d = _experiment(checkpoint_every=0, rounds=2, crfl={**RAW["crfl"], "certify": False}).run().federation.state.params
    assert torch.equal(c, d)


# --- the certificate ------------------------------------------------------------------------


def test_vectorised_radii_against_the_scalar_closed_form():
    g = torch.Generator().manual_seed(0)
    p_a = torch.rand(200, generator=g, dtype=torch.float64)
    p_b = torch.rand(200, generator=g, dtype=torch.float64) * (1 - p_a)
    rho = clip_schedule(12, 15.0, 2.0, 0.1)
    kw = dict(sigma_train=0.5, sigma_test=0.7, rho=rho, attack_round=4, attackers=2, weights=[0.05, 0.05],
              local_iters=30.0, lipschitz=math.sqrt(17), scale=10.0, lr=0.01, poison_fraction=0.05)
    got = certified_radii(p_a, p_b, radius_factor(**kw))
    want = [certified_radius(float(a), float(b), **kw) for a, b in zip(p_a, p_b)]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)
    assert certified_radii(torch.tensor([0.3]), torch.tensor([0.4]), 1.0).item() == 0.0
    assert certified_radii(torch.tensor([1.0]), torch.tensor([0.0]), 1.0).item() == math.inf


def test_contraction_of_a_skipped_round_is_one_and_round_T_uses_sigma_test():
    rho = [1.0, 2.0, 0.5, 3.0]
    s, st = 1.0, 2.0
    f = lambda r, sg: 2 * norm.cdf(r / sg) - 1  # noqa: E731
    assert contraction(rho, sigma_train=s, sigma_test=st, attack_round=1) == pytest.approx(f(2, s) * f(0.5, s) * f(3, st))
    skipped = contraction(rho, sigma_train=s, sigma_test=st, attack_round=1, noised=[True, True, False, True])
    assert skipped == pytest.approx(f(2, s) * f(3, st))


def test_attack_at_the_last_round_claims_no_contraction_where_the_reference_keeps_round_T():
    # the reference multiplies round T's factor even for t_adv = T; fedsafe's product over
    # t_adv + 1..T is then empty (the smallest radius, the default attack_round)
    rho = [1.0, 1.0, 1.0]
    assert contraction(rho, sigma_train=1.0, sigma_test=1.0, attack_round=3) == 1.0
    assert contraction(rho, sigma_train=1.0, sigma_test=1.0, attack_round=2) == pytest.approx(2 * norm.cdf(1.0) - 1)


def test_top_two_breaks_ties_by_the_lowest_class_as_the_references_argmax():
    votes = torch.tensor([[3, 5, 5, 0], [2, 2, 2, 2], [0, 0, 7, 1]])
    top, n_a, n_b = top_two(votes)
    assert top.tolist() == [1, 0, 2] == [int(np.argmax(v)) for v in votes.numpy()]
    assert n_a.tolist() == [5, 2, 7] and n_b.tolist() == [5, 2, 1]


def _naive_certification(fed, plugin, t):
    """The votes of M noisy models, one model and one input at a time, and every number of the
    certificate from them with the scalar functions."""
    cfg = plugin.cfg
    x, y = fed.data.x_test, fed.data.y_test
    poison = fed.poison
    xs = poison.trigger.apply(poison.success_inputs(x, y))
    preds, ppreds = [], []
    for k in range(cfg.samples):
        w = perturb_model(fed.state.params, cfg.sigma_test, RandomSource.seeded(fed.cfg.seed).stream("robust.crfl.certify", t, k))
        weights = fed.layout.unflatten(w)
        with torch.no_grad():
            preds.append([int(functional_call(fed.model, weights, (x[i : i + 1],)).argmax()) for i in range(len(y))])
            ppreds.append(functional_call(fed.model, weights, (xs,)).argmax(1).tolist())
    th = plugin.threat
    rows = []
    for i in range(len(y)):
        counts = [0] * fed.data.num_classes
        for k in range(cfg.samples):
            counts[preds[k][i]] += 1
        k_a = max(range(len(counts)), key=lambda c: (counts[c], -c))
        rest = counts.copy()
        rest[k_a] = -1
        pa, pb = vote_bounds(counts[k_a] / cfg.samples, max(rest) / cfg.samples, cfg.samples, cfg.alpha)
        r = certified_radius(pa, pb, sigma_train=cfg.sigma_train, sigma_test=cfg.sigma_test, rho=plugin.schedule[:t],
                             attack_round=t if th.attack_round is None else th.attack_round, attackers=th.attackers,
                             weights=[th.weight] * th.attackers, local_iters=th.local_iters, lipschitz=th.lipschitz,
                             scale=th.scale, lr=th.lr, poison_fraction=th.poison_fraction)
        rows.append((int(y[i]), k_a, r))
    poisoned = []
    for j in range(len(xs)):
        counts = [0] * fed.data.num_classes
        for k in range(cfg.samples):
            counts[ppreds[k][j]] += 1
        poisoned.append(max(range(len(counts)), key=lambda c: (counts[c], -c)) == poison.target)
    return rows, poisoned


def test_summary_against_a_naive_recount_of_the_votes(tmp_path):
    res = _experiment(crfl={**RAW["crfl"], "attack_round": 2}).run(tmp_path / "run")
    fed = res.federation
    plugin = next(p for p in fed.plugins if p.name == "crfl")
    assert plugin.threat.attackers == 1 and plugin.threat.weight == pytest.approx(1.0 / 6)
    assert plugin.threat.local_iters == 4 and plugin.threat.lr == 0.3 and plugin.threat.scale == 2.0
    assert plugin.threat.poison_fraction == 0.25 and plugin.threat.attack_round == 2
    rows, poisoned = _naive_certification(fed, plugin, 4)
    s = res.summary
    correct = [y == k for y, k, _ in rows]
    assert s["crfl_clean_accuracy"] == pytest.approx(np.mean(correct))
    assert s["crfl_certified_rate"] == pytest.approx(np.mean([r > 0 for *_, r in rows]))
    assert s["crfl_mean_radius"] == pytest.approx(np.mean([r if c else 0.0 for (*_, r), c in zip(rows, correct)]), rel=1e-9)
    for rad in (0.0, 0.001, 0.01):
        want = np.mean([c and r > 0 and r >= rad for (*_, r), c in zip(rows, correct)])
        assert s[f"crfl_certified_accuracy@{rad:g}"] == pytest.approx(want)
    assert s["crfl_attack_success_rate"] == pytest.approx(np.mean(poisoned))
    assert s["crfl_clean_accuracy"] > 0.5 and s["crfl_mean_radius"] > 0  # the numbers mean something
    cert = plugin.last_certificate
    torch.testing.assert_close(cert.radius, torch.tensor([r for *_, r in rows], dtype=torch.float64), rtol=1e-9, atol=0)
    lines = (tmp_path / "run" / "crfl_certificate.csv").read_text().splitlines()
    assert lines[0] == "index,label,prediction,p_a,p_b,radius" and len(lines) == 1 + len(rows)
    i, label, pred, _, _, radius = lines[5].split(",")
    assert (int(label), int(pred)) == rows[4][:2] and float(radius) == pytest.approx(rows[4][2], rel=1e-12)


def test_votes_do_not_depend_on_how_the_models_and_inputs_are_batched():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    w0 = torch.cat([lin.weight.detach().reshape(-1), lin.bias.detach()])

    def predict(ws, x):
        return torch.einsum("mcd,bd->mbc", ws[:, :15].reshape(-1, 3, 5), x) + ws[:, None, 15:]

    x = torch.randn(37, 5)
    src = RandomSource.seeded(1)
    kw = dict(samples=11, sigma=0.3, noise=lambda k: src.stream("robust.crfl.certify", 1, k), num_classes=3)
    a = smoothed_votes(predict, w0, [x], batch_models=4, batch_inputs=10, **kw)[0]
    b = smoothed_votes(predict, w0, [x], batch_models=11, batch_inputs=100, **kw)[0]
    assert torch.equal(a, b) and a.sum(1).tolist() == [11] * 37
    lo, hi = hoeffding_bounds(torch.tensor([0.9]), torch.tensor([0.05]), 1000, 0.001)
    assert (lo.item(), hi.item()) == pytest.approx(vote_bounds(0.9, 0.05, 1000, 0.001))


# --- runs: resume, errors, a toy backdoor -------------------------------------------------------


def test_resume_is_exact(tmp_path, interrupted_then_resumed):
    from fedsafe import Experiment

    whole = Experiment(RAW).run(tmp_path / "whole")
    resumed = interrupted_then_resumed(lambda: Experiment(RAW), tmp_path / "cut")
    assert torch.equal(resumed.federation.state.params, whole.federation.state.params)
    keys = [k for k in whole.summary if k.startswith("crfl_")]
    assert keys and {k: resumed.summary[k] for k in keys} == {k: whole.summary[k] for k in keys}


@pytest.mark.parametrize("over,match", [
    ({"samples": 0}, r"crfl.samples"),
    ({"alpha": 1.0}, r"crfl.alpha"),
    ({"sigma_train": 0.0}, r"crfl.sigma_train"),
    ({"rho": -1.0}, r"crfl.rho"),
    ({"radii": [-0.1]}, r"crfl.radii must all be >= 0"),
    ({"attack_round": 9}, r"crfl.attack_round = 9 must be in \[1, rounds\] = \[1, 4\]"),
    ({"unknown": 1}, r"crfl.unknown"),
])
def test_bad_values_are_refused_naming_the_field(over, match):
    with pytest.raises(ConfigError, match=match):
        _experiment(crfl={**RAW["crfl"], **over})


def test_a_certificate_without_a_backdoor_needs_its_attacker_named():
    with pytest.raises(ConfigError) as e:
        _experiment(attack={"name": "none", "f": 0})
    text = str(e.value)
    assert "crfl.attackers" in text and "crfl.poison_fraction" in text
    # named, it certifies a clean run; without certify it needs nothing
    _experiment(attack={"name": "none", "f": 0}, crfl={**RAW["crfl"], "attackers": 1, "poison_fraction": 0.1})
    _experiment(attack={"name": "none", "f": 0}, crfl={**RAW["crfl"], "certify": False})


def test_off_by_default_and_rows_untouched():
    res = _experiment(checkpoint_every=0, rounds=2, crfl={}).run()
    assert not any(k.startswith("crfl") for r in res.federation.rows for k in r)
    assert not any(p.name == "crfl" for p in res.federation.plugins)


@pytest.mark.slow
def test_toy_backdoor_run_certifies_most_inputs_at_a_small_accuracy_cost():
    """Digits, 20 clients of which 4 run a boosted pattern backdoor, 20 rounds of FedAvg: with
    CRFL (the reference's schedule min(2 + 0.1 t, 15), σ = 0.01) the smoothed model keeps its
    clean accuracy within 5 points of the plain run's and certifies more than half of the test
    inputs correct at radius 0.001. It does not lower the attack success rate here (the 3 × 3
    trigger is 9 of the 64 pixels of a digits image; on MNIST it does, recipes/mnist_crfl.toml)."""
    raw = {"rounds": 20, "seed": 0, "eval_every": 20, "checkpoint_every": 0, "secure_randomness": False,
           "data": {"name": "digits", "partition": "iid"}, "model": {"name": "mlp", "hidden": 32},
           "clients": {"num_clients": 20, "algorithm": "fedavg", "local_steps": 5, "lr": 0.05},
           "server": {"lr": 1.0}, "attack": {"name": "pattern_backdoor", "f": 4, "params": {"boost": 2.0}}}
    from fedsafe import Experiment

    plain = Experiment(raw).run().summary
    crfl = Experiment({**raw, "crfl": {"enabled": True, "samples": 100}}).run().summary
    assert plain["final_attack_success_rate"] > 0.9  # the attack works
    assert crfl["crfl_clean_accuracy"] > plain["final_accuracy"] - 0.05, (crfl, plain)
    assert crfl["crfl_certified_accuracy@0.001"] > 0.5 and crfl["crfl_mean_radius"] > 0.001


# --- conventions against the reference code, one test each ------------------------------------


def test_last_round_is_clipped_only_as_the_reference_saves_before_its_noise():
    plugin = CRFLPlugin(CRFLConfig(enabled=True, rho_start=1.0, rho_growth=0.0, rho=5.0, sigma_train=0.1), rounds=3,
                        source=RandomSource.seeded(0), threat=None)
    w = torch.full((4,), 2.0)
    torch.testing.assert_close(plugin.transform_model(w, 3), w / (4.0 + 1e-6))
    noisy = plugin.transform_model(w, 2)
    torch.testing.assert_close(noisy, _naive_stage(w, 1.0, 0.1, 0, 2, last=False))


def test_rows_before_the_last_evaluate_the_perturbed_model_where_the_reference_evaluates_before_noise():
    fed = Federation(validate({**RAW, "checkpoint_every": 0, "eval_every": 1,
                               "crfl": {**RAW["crfl"], "sigma_train": 0.5, "certify": False}}))
    row = fed.run_round()
    noise = 0.5 * torch.randn(fed.state.params.numel(), generator=torch_stream(3, "robust.crfl", 1), dtype=torch.float64)
    before_noise = (fed.state.params.double() - noise).float()
    assert row["test_loss"] == pytest.approx(fed.evaluate(fed.state.params)[0])
    assert row["test_loss"] != pytest.approx(fed.evaluate(before_noise)[0])


def test_threat_defaults_from_the_run_where_the_reference_uses_1_over_N_and_one_local_epoch():
    from fedsafe.robust.crfl import threat_from_config

    cfg = validate({**RAW, "clients": {"num_clients": 8, "sampling": "fixed", "sample_size": 4, "algorithm": "fedavg",
                                       "local_epochs": 2, "batch_size": 10, "lr": 0.2},
                    "server": {"lr": 0.5}, "attack": {"name": "model_replacement", "f": 2}})
    th = threat_from_config(cfg, [25, 35])  # mean client size 30: 3 batches of 10, twice
    assert (th.attackers, th.weight, th.local_iters, th.lr) == (2, 0.5 / 4, 6.0, 0.2)
    assert th.scale == 4 / 2 and th.poison_fraction == 0.5 and th.attack_round is None  # γ = n/f; the default fraction
    dsgd = validate({**RAW, "clients": {"num_clients": 6}, "crfl": {**RAW["crfl"], "lipschitz": 2.0, "weight": 0.3}})
    th = threat_from_config(dsgd, [10] * 6)
    assert (th.local_iters, th.lr, th.weight, th.lipschitz, th.scale) == (1.0, 1.0, 0.3, 2.0, 2.0)


def test_certify_every_certifies_those_rounds_too_and_the_summary_keeps_the_last():
    res = _experiment(checkpoint_every=0, crfl={**RAW["crfl"], "certify_every": 3, "samples": 6}).run()
    rows = res.federation.rows
    assert ["crfl_clean_accuracy" in r for r in rows] == [False, False, True, True]
    assert res.summary["crfl_clean_accuracy"] == rows[3]["crfl_clean_accuracy"]
    assert all("crfl_rho" in r for r in rows)
