"""Edge-case backdoor (Wang et al. NeurIPS 2020): the rotation against plain-loop twins (exact
quarter turns, bilinear otherwise), the poisoned batches, the success rate on held-out edge
cases, the projected variant, and a toy run."""

from __future__ import annotations

import math

import pytest
import torch

from fedsafe.robust.attacks import ATTACKS, AttackContext, needs_own_updates
from fedsafe.robust.backdoor import EdgeCasePoison, attack_success_rate, make_poison, rotate


def _naive_rot90(img: list[list[float]]) -> list[list[float]]:
    """One counter-clockwise quarter turn: out[i][j] = in[j][W - 1 - i]."""
    h, w = len(img), len(img[0])
    return [[img[j][w - 1 - i] for j in range(h)] for i in range(w)]


def _naive_bilinear(img: list[list[float]], degrees: float) -> list[list[float]]:
    """Counter-clockwise on screen (rows grow downwards) about the centre; pixel centres at
    (i + 0.5, j + 0.5); source coordinates outside the image clamp to the border pixel."""
    n = len(img)
    a = math.radians(degrees)
    out = [[0.0] * n for _ in range(n)]
    for r in range(n):
        for c in range(n):
            x = (2 * c + 1) / n - 1  # normalised, align_corners=False
            y = (2 * r + 1) / n - 1
            xs = math.cos(a) * x - math.sin(a) * y
            ys = math.sin(a) * x + math.cos(a) * y
            col = min(max(((xs + 1) * n - 1) / 2, 0.0), n - 1.0)
            row = min(max(((ys + 1) * n - 1) / 2, 0.0), n - 1.0)
            c0, r0 = int(math.floor(col)), int(math.floor(row))
            c1, r1 = min(c0 + 1, n - 1), min(r0 + 1, n - 1)
            fc, fr = col - c0, row - r0
            out[r][c] = ((1 - fr) * ((1 - fc) * img[r0][c0] + fc * img[r0][c1])
                         + fr * ((1 - fc) * img[r1][c0] + fc * img[r1][c1]))
    return out


def test_quarter_turns_are_exact_and_counter_clockwise():
    x = torch.randn(2, 3, 5, 5)
    for turns in range(-2, 6):
        got = rotate(x, 90.0 * turns)
        for i in range(2):
            for ch in range(3):
                want = x[i, ch].tolist()
                for _ in range(turns % 4):
                    want = _naive_rot90(want)
                assert got[i, ch].tolist() == want
    # the bilinear path agrees with the exact one next to a quarter turn (same direction)
    torch.testing.assert_close(rotate(x, 89.9999), rotate(x, 90.0), atol=1e-3, rtol=0)


@pytest.mark.parametrize("degrees", [30.0, -45.0, 137.0])
def test_other_angles_against_a_plain_bilinear_loop(degrees):
    x = torch.randn(1, 1, 9, 9, dtype=torch.float64)
    got = rotate(x, degrees)[0, 0]
    want = torch.tensor(_naive_bilinear(x[0, 0].tolist(), degrees), dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=0)


def _data(n=60):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 6, 6, generator=g)
    y = torch.arange(n) % 10
    return x, y


def test_poisoned_batches_mix_edge_cases_with_clean_samples():
    x_train, y_train = _data()
    p = make_poison("edge_case_backdoor", {"source": 3, "target": 8, "fraction": 0.3}, x_train, 10, y_train=y_train)
    assert isinstance(p, EdgeCasePoison)
    pool = torch.stack([torch.rot90(x_train[i], 1, dims=(-2, -1)) for i in range(len(y_train)) if y_train[i] == 3])
    assert torch.equal(p.pool, pool)  # the attacker's edge cases: every class-3 image, rotated
    x = torch.randn(4, 10, 1, 6, 6)
    y = torch.randint(0, 10, (4, 10))
    px, py = p(x, y, 10)
    k = math.ceil(0.3 * 10)
    for c in range(4):
        for s in range(10):
            if s < k:
                assert any(torch.equal(px[c, s], e) for e in pool) and int(py[c, s]) == 8
            else:
                assert torch.equal(px[c, s], x[c, s]) and int(py[c, s]) == int(y[c, s])
    again, _ = p(x, y, 10)
    assert torch.equal(again, px)  # reproducible: the pick is seeded by the (seeded) batch


def test_success_rate_is_measured_on_held_out_edge_cases_only():
    x_train, y_train = _data()
    p = make_poison("edge_case_backdoor", {"source": 3, "target": 8}, x_train, 10, y_train=y_train)
    x_test = torch.randn(40, 1, 6, 6)
    y_test = torch.arange(40) % 10
    # a "model" that answers 8 when the top-left pixel is positive, 0 otherwise
    predict = lambda x: torch.stack([(x[:, 0, 0, 0] <= 0).float()] + [torch.zeros(len(x))] * 7  # noqa: E731
                                    + [(x[:, 0, 0, 0] > 0).float(), torch.zeros(len(x))], dim=1)
    edge = [torch.rot90(x_test[i], 1, dims=(-2, -1)) for i in range(40) if y_test[i] == 3]
    want = sum(float(e[0, 0, 0]) > 0 for e in edge) / len(edge)
    assert attack_success_rate(predict, x_test, y_test, p) == want


def test_parameters_are_checked_naming_the_field():
    x, y = _data()
    with pytest.raises(ValueError, match="attack.params.source and target must differ, both are 4"):
        make_poison("edge_case_backdoor", {"source": 4, "target": 4}, x, 10, y_train=y)
    with pytest.raises(ValueError, match=r"attack.params.source = 12 must be a class in \[0, 10\)"):
        make_poison("edge_case_backdoor", {"source": 12}, x, 10, y_train=y)
    with pytest.raises(ValueError, match="attack.params.angle = inf must be a finite number"):
        make_poison("edge_case_backdoor", {"angle": math.inf}, x, 10, y_train=y)
    with pytest.raises(ValueError, match=r"rotates images \(n, C, H, W\)"):
        make_poison("edge_case_backdoor", {}, torch.randn(5, 36), 10, y_train=y[:5])
    with pytest.raises(ValueError, match="no image of that class"):
        make_poison("edge_case_backdoor", {"source": 7}, x, 10, y_train=torch.zeros(60, dtype=torch.long))
    unlabelled = make_poison("edge_case_backdoor", {}, x, 10)  # fedsafe check: parameters only
    with pytest.raises(ValueError, match="without the training labels"):
        unlabelled(torch.randn(1, 4, 1, 6, 6), torch.zeros(1, 4, dtype=torch.long), 10)


def test_projected_and_boosted_updates_against_a_naive_twin():
    assert needs_own_updates("edge_case_backdoor")
    g = torch.Generator().manual_seed(3)
    own = torch.randn(3, 50, generator=g) * torch.tensor([[0.1], [1.0], [5.0]])
    ctx = AttackContext(f=3, n=10, round=0, generator=g, aggregate=lambda u: u.mean(0), own_updates=own)
    honest = torch.randn(7, 50, generator=g)
    assert torch.equal(ATTACKS.get("edge_case_backdoor", {})(honest, ctx=ctx), own)
    out = ATTACKS.get("edge_case_backdoor", {"eps": 2.0, "boost": 3.0})(honest, ctx=ctx)
    for o, u in zip(out, own):
        norm = math.sqrt(sum(v * v for v in u.tolist()))
        want = [3.0 * v * (min(1.0, 2.0 / norm)) for v in u.tolist()]
        assert o.tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert float(torch.linalg.vector_norm(out[2])) == pytest.approx(6.0, rel=1e-6)  # boost · eps
    with pytest.raises(ValueError, match=r"'edge_case_backdoor': eps must be a number in \(0.0, inf\)"):
        ATTACKS.get("edge_case_backdoor", {"eps": -1.0})(honest, ctx=ctx)


def test_toy_run_backdoors_the_rare_inputs_only():
    """Digits, 4 of 20 clients, 20 rounds: rotated 7s are classified 1 (the paper's 7 → 1) while
    main accuracy stays within 10 points; without attackers the rotated 7s are almost never called 1."""
    from fedsafe import Experiment

    raw = {"rounds": 20, "seed": 0, "eval_every": 20, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20}}
    res = Experiment(raw, attack={"name": "edge_case_backdoor", "f": 4}).run()
    clean = Experiment(raw, attack={"name": "edge_case_backdoor", "f": 0}).run()
    assert res.summary["final_attack_success_rate"] > 0.9
    assert clean.summary["final_attack_success_rate"] < 0.2
    assert res.summary["final_accuracy"] > 0.8
    # seed 0: 0.836 against 0.903 clean; half of each poisoned batch is edge cases, which on 8x8
    # digits costs main accuracy more than the paper's 28x28 ARDIS digits do
    assert res.summary["final_accuracy"] > clean.summary["final_accuracy"] - 0.1
