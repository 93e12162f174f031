"""Incremental PLD accounting (issue #25, item 6): the running privacy loss distribution, composed
one step at a time, against dp-accounting composing the same events; its cost (one composition
per new round); checkpoints that resume bit for bit; the interval the engine plans."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld
from dp_accounting.pld import pld_pmf

from fedsafe.privacy.dp import accounting
from fedsafe.privacy.dp.accounting import Accountant
from fedsafe.privacy.dp.config import DPConfig

DELTA = 1e-5
PLD_ = pld.privacy_loss_distribution


def sampled_gaussian(z: float, q: float, h: float):
    return PLD_.from_gaussian_mechanism(standard_deviation=z, value_discretization_interval=h, sampling_prob=q)


def assert_same_composition(ours, theirs) -> None:
    """``compose_pld``'s distribution is dp-accounting's ``compose``: the same probabilities at the
    same losses up to FFT rounding, which ``compose_pld`` changes by convolving both directions at
    the longer one's FFT length: the noise below the truncation budget that moves between kept and
    truncated tail points, and ε within the noise floor of an FFT convolution (dp-accounting's own
    ε moves by up to 2e-8 at δ = 1e-9, 1e-11 at δ = 1e-5, when only its FFT length changes)."""
    budget = accounting.PLD_TAIL_MASS_TRUNCATION
    for a, b in ((ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)):
        a, b = a.to_dense_pmf(), b.to_dense_pmf()
        assert a._discretization == b._discretization
        lo, hi = min(a._lower_loss, b._lower_loss), max(a._lower_loss + a.size, b._lower_loss + b.size)
        grids = np.zeros((2, hi - lo))
        for row, pmf in zip(grids, (a, b)):
            row[pmf._lower_loss - lo : pmf._lower_loss - lo + pmf.size] = pmf._probs
        np.testing.assert_allclose(grids[0], grids[1], rtol=1e-9, atol=budget)
        assert abs(a._infinity_mass - b._infinity_mass) <= budget
    for delta, rel in ((1e-9, 1e-7), (DELTA, 1e-9), (1e-2, 1e-9)):
        assert ours.get_epsilon_for_delta(delta) == pytest.approx(theirs.get_epsilon_for_delta(delta), rel=rel)


@pytest.mark.parametrize("z, q, h, times", [(1.0, 0.1, 5e-3, 40), (0.8, 0.5, 1e-2, 10), (2.0, 0.01, 1e-3, 25)])
def test_compose_pld_is_dp_accountings_composition(z: float, q: float, h: float, times: int) -> None:
    one = sampled_gaussian(z, q, h)
    ours = theirs = one
    for _ in range(times):
        ours, theirs = accounting.compose_pld(ours, one), theirs.compose(one)
        assert_same_composition(ours, theirs)


def test_pld_epsilon_for_delta_is_dp_accountings() -> None:
    cases = [sampled_gaussian(1.0, 0.1, 5e-3).self_compose(200), sampled_gaussian(0.6, 1.0, 1e-2).self_compose(3),
             sampled_gaussian(3.0, 0.02, 1e-4).self_compose(50)]
    for dist in cases:
        for delta in (1e-12, 1e-7, 1e-5, 1e-3, 0.2, 0.9):
            ref = dist.get_epsilon_for_delta(delta)
            assert accounting.pld_epsilon_for_delta(dist, delta) == pytest.approx(ref, rel=1e-12, abs=1e-12)
    inf = PLD_.PrivacyLossDistribution(pld_pmf.DensePLDPmf(1e-2, 0, np.array([0.5]), 0.5, True))
    assert accounting.pld_epsilon_for_delta(inf, 0.1) == math.inf == inf.get_epsilon_for_delta(0.1)


def test_pmf_delta_is_dp_accountings_and_skips_the_dominated_direction(monkeypatch) -> None:
    dist = sampled_gaussian(1.0, 0.1, 1e-2).self_compose(300)
    for pmf in (dist._pmf_add, dist._pmf_remove):
        for eps in (0.0, 0.37, 1.5, 4.0, 40.0):
            ref = pmf.get_delta_for_epsilon(eps)
            assert accounting._pmf_delta(pmf, eps) == pytest.approx(ref, rel=1e-9, abs=1e-15)
    # the add direction is settled by its δ at the remove direction's ε: one scan, not two
    scans = []
    real = accounting._pmf_epsilon
    monkeypatch.setattr(accounting.pld, "_pmf_epsilon", lambda pmf, d: scans.append(pmf) or real(pmf, d))
    assert accounting.pld_epsilon_for_delta(dist, 1e-5) == pytest.approx(dist.get_epsilon_for_delta(1e-5), rel=1e-12)
    assert scans == [dist._pmf_remove]


ROUNDS = [(1.0, 0.02), (1.3, 0.02), (1.0, 0.02), (1.3, 0.05), (1.0, 0.02)] * 6  # (z, q) per round


@pytest.mark.parametrize("every", [1, 4])
def test_incremental_epsilon_equals_dp_accounting_after_every_round(every: int) -> None:
    h = 2e-3
    ours = Accountant(DELTA, value_discretization_interval=h)
    assert ours.incremental
    ref = pld.PLDAccountant(value_discretization_interval=h)
    for t, (z, q) in enumerate(ROUNDS, 1):
        ours.compose_round(z, q)
        ref.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)))
        if t % every == 0:
            assert ours.epsilon() == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)
            assert ours.epsilon(1e-3) == pytest.approx(ref.get_epsilon(1e-3), rel=1e-9)


def test_each_new_round_costs_one_composition(monkeypatch) -> None:
    calls = []
    real = accounting.compose_pld
    monkeypatch.setattr(accounting.pld, "compose_pld", lambda a, b: calls.append(1) or real(a, b))
    acc = Accountant(DELTA, value_discretization_interval=5e-3)
    acc.compose_round(1.0, 0.1)
    acc.epsilon()  # the first round is the running PLD itself
    for t in range(2, 30):
        acc.compose_round(1.0 if t % 3 else 1.2, 0.1)
        before = len(calls)
        acc.epsilon()
        acc.epsilon()  # memoised: no work
        assert len(calls) - before == 1
    # rounds added between two ε: consecutive equal rounds make one self-composed step
    for _ in range(5):
        acc.compose_round(1.0, 0.1)
    before = len(calls)
    acc.epsilon()
    assert len(calls) - before == 1


def replay(rounds: list[tuple[float, float]], resume_at: int | None, every: int = 1) -> list[float]:
    """ε every ``every`` rounds of ``rounds`` ((z, q) each), the accountant saved and restored into
    a fresh one after round ``resume_at`` (None: never)."""
    acc, out = Accountant(DELTA, value_discretization_interval=2e-3), []
    for t, (z, q) in enumerate(rounds, 1):
        acc.compose_round(z, q)
        if t % every == 0:
            out.append(acc.epsilon())
        if t == resume_at:
            state = acc.state_dict()
            acc = Accountant(DELTA, value_discretization_interval=2e-3)
            acc.load_state_dict(state)
    return out


def test_checkpoint_replays_the_steps_bit_for_bit() -> None:
    # ε on "evaluation rounds" (every third), a checkpoint on round 7
    assert replay(ROUNDS, None, every=3) == replay(ROUNDS, 7, every=3)
    # at another interval the state is re-accounted from its records: an equal ε up to rounding
    acc = Accountant(DELTA, value_discretization_interval=2e-3)
    for z, q in ROUNDS:
        acc.compose_round(z, q)
    coarse = Accountant(DELTA, value_discretization_interval=4e-3)
    coarse.load_state_dict(acc.state_dict())
    ref = pld.PLDAccountant(value_discretization_interval=4e-3)
    for z, q in ROUNDS:
        ref.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)))
    assert coarse.epsilon() == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)


def converged(q: float, z: float, t: int, h: float = 1e-4) -> float:
    acc = pld.PLDAccountant(value_discretization_interval=h)
    return acc.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), t)).get_epsilon(DELTA)


@pytest.mark.parametrize("q, z, T", [(0.25, 1.3, 30), (0.02, 1.1, 300)])
def test_the_planned_interval_gives_what_epsilon_reports_at_every_round(q: float, z: float, T: int) -> None:
    plan = DPConfig(enabled=True, noise_multiplier=z).plan(sampling="poisson", rounds=T, num_clients=1000, q=q)
    acc = plan.new_accountant()
    h = acc.value_discretization_interval
    # epsilon()'s interval for the run, or twice it where epsilon() found both within 0.05 %
    tried = dict(accounting.epsilon_table(z, q, T, DELTA)["details"]["pld"].intervals)
    finer = min(tried)
    assert h == finer or (h == 2 * finer and abs(tried[h] - tried[finer]) <= 5e-4 * tried[finer])
    for t in range(1, T + 1):
        plan.compose_round(acc, plan.z)
        if t in (T // 3, T):
            ref = converged(q, z, t)
            assert ref * (1 - 1e-4) <= acc.epsilon() <= 1.01 * ref
    assert accounting.epsilon(z, q, T, DELTA) * (1 - 1e-9) <= acc.epsilon() <= accounting.epsilon(z, q, T, DELTA) * 1.0005


def test_incremental_accountant_keeps_the_guard_on_huge_epsilon() -> None:
    acc = Accountant(DELTA, value_discretization_interval=1e-2)
    acc.compose_round(0.01, 1.0, count=1000)  # z = 0.01: PLD would need gigabytes
    details = acc.epsilon_details()
    assert details.method == "rdp-bound" and details.epsilon > accounting.PLD_EPSILON_LIMIT
    assert acc._running is None  # no PLD was built
