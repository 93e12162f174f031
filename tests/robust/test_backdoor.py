"""Targeted backdoors: the trigger, the poisoned batches, the three attacks and the attack
success rate, each against a naive twin; then through the engine, the report and a sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.core.errors import ConfigError
from fedsafe.robust.attacks import (
    ATTACKS,
    BACKDOOR_ATTACKS,
    LABEL_TRANSFORMS,
    AttackContext,
)
from fedsafe.robust.backdoor import (
    Poison,
    attack_success_rate,
    backdoor_settings,
    make_poison,
    make_trigger,
)


def _naive_trigger_images(x: torch.Tensor, size: int) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    mask = np.zeros((c, h, w), bool)
    values = np.zeros((c, h, w), np.float32)
    for ch in range(c):
        hi, lo = float(x[:, ch].max()), float(x[:, ch].min())
        for i in range(size):
            for j in range(size):
                r, col = h - 1 - i, w - 1 - j  # counted from the bottom-right corner, which is white
                mask[ch, r, col] = True
                values[ch, r, col] = hi if (i + j) % 2 == 0 else lo
    return mask, values


@pytest.mark.parametrize("shape, size", [((7, 1, 8, 8), 3), ((5, 3, 6, 9), 2), ((4, 2, 4, 4), 4)])
def test_image_trigger_is_a_checkerboard_in_the_corner(shape, size):
    x = torch.randn(shape)
    t = make_trigger(x, size)
    mask, values = _naive_trigger_images(x, size)
    assert np.array_equal(t.mask.numpy(), mask)
    assert np.array_equal(t.values.numpy()[mask], values[mask])
    stamped = t.apply(x)
    assert torch.equal(stamped[:, ~t.mask], x[:, ~t.mask])  # nothing else changes
    assert torch.equal(stamped[:, t.mask], t.values[t.mask].expand(shape[0], -1))


def test_flat_trigger_uses_the_last_features():
    x = torch.randn(10, 20)
    t = make_trigger(x, 2)
    assert t.mask.tolist() == [False] * 16 + [True] * 4
    cells = [True, False, False, True]  # the flipped 2x2 checkerboard, read row by row
    want = [float(x[:, 16 + k].max() if white else x[:, 16 + k].min()) for k, white in enumerate(cells)]
    assert t.values[16:].tolist() == pytest.approx(want)


def test_trigger_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit 8x8"):
        make_trigger(torch.zeros(2, 1, 8, 8), 9)
    with pytest.raises(ValueError, match="needs 9 input features"):
        make_trigger(torch.zeros(2, 5), 3)
    with pytest.raises(ValueError, match="integer >= 1"):
        make_trigger(torch.zeros(2, 5), 0)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 1.0])
def test_poison_stamps_the_first_fraction_of_each_batch(fraction):
    x = torch.randn(3, 10, 1, 8, 8)
    y = torch.randint(0, 10, (3, 10))
    trig = make_trigger(x.reshape(-1, 1, 8, 8), 3)
    p = Poison(trigger=trig, target=7, fraction=fraction)
    px, py = p(x, y, 10)
    k = math.ceil(fraction * 10)
    for c in range(3):
        for b in range(10):
            if b < k:
                assert py[c, b] == 7 and torch.equal(px[c, b], trig.apply(x[c, b]))
            else:
                assert py[c, b] == y[c, b] and torch.equal(px[c, b], x[c, b])
    assert not torch.equal(px, x) and y.max() < 10  # inputs not modified in place
    labels_only = Poison(labels="label_flip")
    fx, fy = labels_only(x, y, 10)
    assert fx is x and torch.equal(fy, LABEL_TRANSFORMS["label_flip"](y, 10))


def test_attack_success_rate_against_a_naive_count():
    x = torch.randn(200, 1, 8, 8)
    y = torch.arange(200) % 10
    p = make_poison("pattern_backdoor", {"target": 3}, x, 10)

    def predicts_target_when_triggered(inp):  # logits: the target iff the corner is white
        fired = inp[:, 0, 7, 7] == p.trigger.values[0, 7, 7]
        logits = torch.zeros(inp.shape[0], 10)
        logits[fired, 3] = 1
        logits[~fired, 0] = 1
        return logits

    assert attack_success_rate(predicts_target_when_triggered, x, y, p) == 1.0

    def fixed(inp):  # ignores the trigger: class = first pixel's sign -> 3 or 5
        logits = torch.zeros(inp.shape[0], 10)
        logits[torch.arange(inp.shape[0]), torch.where(inp[:, 0, 0, 0] > 0, 3, 5)] = 1
        return logits

    others = y != 3
    naive = sum(int(x[i, 0, 0, 0] > 0) for i in range(200) if others[i]) / int(others.sum())
    assert attack_success_rate(fixed, x, y, p) == pytest.approx(naive)
    assert attack_success_rate(fixed, x, y, Poison(labels="label_flip")) is None


def test_make_poison_checks_its_parameters():
    x = torch.randn(5, 1, 8, 8)
    assert make_poison("alie", {}, x, 10) is None
    assert make_poison("none", {}, x, 10) == Poison()  # honest training on the clients' own data
    px, py = Poison()(x[None], torch.arange(5)[None], 10)
    assert torch.equal(px, x[None]) and torch.equal(py, torch.arange(5)[None])
    assert make_poison("label_flip", {}, x, 10) == Poison(labels="label_flip")
    assert backdoor_settings("model_replacement", {"fraction": 1.0}) == (0, 3, 1.0)
    with pytest.raises(ValueError, match=r"attack.params.target = 10 must be a class in \[0, 10\)"):
        make_poison("pattern_backdoor", {"target": 10}, x, 10)
    with pytest.raises(ValueError, match="attack.params.fraction"):
        make_poison("pattern_backdoor", {"fraction": 0.0}, x, 10)
    with pytest.raises(ValueError, match="attack.params.size"):
        make_poison("pattern_backdoor", {"size": 12}, x, 10)


def _ctx(n: int, f: int, own: torch.Tensor) -> AttackContext:
    return AttackContext(f=f, n=n, round=1, generator=torch.Generator(), aggregate=lambda u: u.mean(0), own_updates=own)


def test_backdoor_attacks_against_naive_twins():
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(8, 50, generator=g)
    own = 3 * torch.randn(2, 50, generator=g)
    ctx = _ctx(10, 2, own)
    assert torch.equal(ATTACKS.get("pattern_backdoor", {})(honest, ctx=ctx), own)
    assert torch.equal(ATTACKS.get("pattern_backdoor", {"boost": 2.5})(honest, ctx=ctx), own * 2.5)
    assert torch.equal(ATTACKS.get("model_replacement", {})(honest, ctx=ctx), own * 5.0)  # n / f = 10 / 2
    assert torch.equal(ATTACKS.get("model_replacement", {"boost": 3.0})(honest, ctx=ctx), own * 3.0)
    out = ATTACKS.get("constrain_and_scale", {})(honest, ctx=ctx)
    median = float(np.median([float(torch.linalg.vector_norm(h)) for h in honest]))
    for o, b in zip(out, own * 5.0):
        norm_b = float(torch.linalg.vector_norm(b))
        want = b * min(1.0, median / norm_b)
        torch.testing.assert_close(o, want, rtol=1e-6, atol=1e-6)
        assert float(torch.linalg.vector_norm(o)) <= median * (1 + 1e-6)
    loose = ATTACKS.get("constrain_and_scale", {"quantile": 1.0, "boost": 1.0})(honest, ctx=_ctx(10, 2, 0.01 * own))
    torch.testing.assert_close(loose, 0.01 * own)  # already inside the bound: unchanged
    with pytest.raises(ValueError, match="fraction must lie in"):
        ATTACKS.get("pattern_backdoor", {"fraction": 1.5})(honest, ctx=ctx)
    with pytest.raises(ValueError, match="own updates"):
        ATTACKS.get("model_replacement", {})(honest, ctx=_ctx(10, 2, None))
    assert BACKDOOR_ATTACKS == {"pattern_backdoor", "model_replacement", "constrain_and_scale",
                                "dba", "neurotoxin", "edge_case_backdoor", "adaptive_flame"}


# --- through the engine --------------------------------------------------------------------------

RAW = {
    "rounds": 30, "seed": 0, "eval_every": 10, "checkpoint_every": 0,
    "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
    "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20},
}


def _run(**sections):
    from fedsafe import Experiment

    return Experiment(RAW, **sections).run()


def test_model_replacement_implants_the_backdoor_and_a_robust_rule_resists():
    attack = {"name": "model_replacement", "f": 4, "params": {"target": 0}}
    plain = _run(attack=attack)
    assert plain.summary["final_accuracy"] > 0.85 and plain.summary["final_attack_success_rate"] > 0.9
    robust = _run(attack=attack, robust={"rule": "trimmed_mean"})
    assert robust.summary["final_attack_success_rate"] < 0.6
    clean = _run(attack={**attack, "f": 0})  # nobody poisons: what the trigger alone does
    assert clean.summary["final_attack_success_rate"] < 0.2
    evals = [r for r in plain.rows if r["test_accuracy"] is not None]
    assert all(r["attack_success_rate"] is not None for r in evals)
    assert all("attack_success_rate" not in r for r in plain.rows if r["test_accuracy"] is None)
    # the rate reported is the evaluated model's, recomputed independently here
    fed = plain.federation
    assert fed.attack_success_rate() == plain.rows[-1]["attack_success_rate"]


def test_backdoor_parameters_are_checked_at_set_up():
    with pytest.raises(ConfigError, match="attack.params.target = 12"):
        _run(attack={"name": "pattern_backdoor", "f": 2, "params": {"target": 12}})
    with pytest.raises(ConfigError, match="attack.params.size"):
        _run(attack={"name": "pattern_backdoor", "f": 2, "params": {"size": 9}})


def test_report_table_and_sweep_carry_the_success_rate(tmp_path):
    from fedsafe import Experiment, sweep
    from fedsafe.report import find_runs, summary_table
    from fedsafe.report.heatmap import figure_sweep

    Experiment(RAW, rounds=2, attack={"name": "pattern_backdoor", "f": 2}).run(tmp_path / "run")
    table = summary_table(find_runs([tmp_path / "run"]))
    assert "ASR (%)" in [c.header for c in table.columns]
    from fedsafe.report.write import write_report

    report = write_report([tmp_path / "run"], tmp_path / "report")
    assert tmp_path / "report" / "attack_success_rate.png" in report["figures"]
    assert "asr_pct" in (tmp_path / "report" / "summary.csv").read_text().splitlines()[0]
    records = sweep(RAW, {"robust.rule": ["mean", "median"], "attack.name": ["pattern_backdoor", "alie"]},
                    tmp_path / "sweep", rounds=2, overrides={"attack.f": 2})
    by = {(r["robust.rule"], r["attack.name"]): r for r in records}
    assert by[("mean", "pattern_backdoor")]["final_attack_success_rate"] is not None
    assert by[("mean", "alie")]["final_attack_success_rate"] is None
    header = (tmp_path / "sweep" / "sweep.csv").read_text().splitlines()[0]
    assert "final_attack_success_rate" in header
    fig = figure_sweep(records, ["robust.rule", "attack.name"], "robust.rule", "attack.name",
                       metric="final_attack_success_rate", worst_case=False)
    assert fig.axes[-1].get_ylabel() == "backdoor attack success rate (%)"
    # only the backdoor's column: ALIE measures no success rate
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["pattern_backdoor"]


def test_attack_none_byzantine_clients_train_honestly():
    # attack.name = "none" with f > 0: the Byzantine clients send their honest updates, so the
    # run is the run without attackers, up to the order in which the mean adds the rows
    from fedsafe import Experiment

    raw = {**RAW, "rounds": 3}
    with_none = Experiment(raw, attack={"name": "none", "f": 4}).run()
    honest = Experiment(raw, attack={"name": "none", "f": 0}).run()
    torch.testing.assert_close(with_none.federation.state.params, honest.federation.state.params,
                               rtol=1e-5, atol=1e-6)
    assert "attack_success_rate" not in with_none.rows[-1]
