"""What a round of incremental PLD accounting reads and checks (issue #25, item 6), pinned by
counting, never by timing: the ε scan reads the losses above ε (its first block sized by the last
ε, which only grows), not the whole distribution; each distinct round event is checked once; and
none of it changes a bit of ε, which stays dp-accounting's (``PrivacyLossDistribution.compose`` /
``get_epsilon_for_delta`` on the same distributions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import pld
from dp_accounting.pld import pld_pmf

from fedsafe.privacy.dp import accounting
from fedsafe.privacy.dp.accounting import Accountant
from fedsafe.privacy.dp.accounting import pld as engine

from test_accounting_incremental import assert_same_composition, replay

DELTA = 1e-5
PLD_ = pld.privacy_loss_distribution


def sampled_gaussian(z: float, q: float, h: float):
    return PLD_.from_gaussian_mechanism(standard_deviation=z, value_discretization_interval=h, sampling_prob=q)


@pytest.fixture
def scanned(monkeypatch) -> list[int]:
    """The lengths of the blocks the ε scans add up (two running sums per block)."""
    sizes: list[int] = []
    real = accounting._running_sums
    monkeypatch.setattr(accounting.pld, "_running_sums", lambda carry, values: sizes.append(len(values)) or real(carry, values))
    return sizes


def points_above(pmf, epsilon: float) -> int:
    """How many points of a dense PMF have a loss above ``epsilon``."""
    losses = (pmf._lower_loss + np.arange(len(pmf._probs))) * pmf._discretization
    return int(np.count_nonzero(losses > epsilon))


@pytest.mark.parametrize("z, q, h, rounds", [(1.0, 0.1, 1e-2, 150), (0.8, 0.05, 5e-3, 60)])
def test_the_epsilon_scan_reads_the_losses_above_epsilon(scanned: list[int], z, q, h, rounds) -> None:
    one = sampled_gaussian(z, q, h)
    ours = theirs = one
    hint = None
    for t in range(2, rounds + 1):
        ours, theirs = accounting.compose_pld(ours, one), theirs.compose(one)
        scanned.clear()
        eps = accounting.pld_epsilon_for_delta(ours, DELTA, hint)
        reads = sum(scanned) // 2  # two running sums per block: the mass and the weighted mass
        # both directions are convolved at one FFT length (the longer's), so the shorter one's
        # rounding differs from dp-accounting's own length by ~1e-12 of ε
        assert eps == pytest.approx(theirs.get_epsilon_for_delta(DELTA), rel=1e-10)
        assert eps == accounting.pld_epsilon_for_delta(ours, DELTA)  # the hint changes no bit
        pmf = ours._pmf_remove
        if hint is not None:
            assert hint <= eps  # ε only grows
            # one block, ending _EPSILON_MARGIN points past the last ε: the losses above ε and a few more
            assert points_above(pmf, eps) <= reads <= points_above(pmf, hint) + engine._EPSILON_MARGIN + 1
            assert reads < len(pmf._probs)  # not the whole distribution, as a scan from the top in one block did
        hint = eps


def test_no_hint_changes_a_bit_of_epsilon() -> None:
    dist = sampled_gaussian(1.0, 0.1, 1e-2).self_compose(400)
    for delta in (1e-9, 1e-5, 1e-2):
        exact = accounting.pld_epsilon_for_delta(dist, delta)
        assert exact == pytest.approx(dist.get_epsilon_for_delta(delta), rel=1e-12)
        for hint in (0.0, exact / 2, exact, exact + 1e-3, exact * 3, 1e6, -5.0, math.inf):
            assert accounting.pld_epsilon_for_delta(dist, delta, hint) == exact


@pytest.mark.parametrize("z, q, h", [(1.0, 0.1, 1e-2), (1.3, 0.02, 2e-3)])
def test_the_tail_truncation_reads_the_tails(monkeypatch, z, q, h) -> None:
    """Each of a composition's 4 tails (2 directions x 2 ends) is summed up to the first point
    that alone exceeds the half budget, which ends it (it summed 512 points then 2,048 at a time,
    and before that 2,048 points a tail, whatever the tail). The compositions are dp-accounting's
    up to FFT rounding (:func:`assert_same_composition`)."""
    tails: list[tuple[int, int]] = []  # per tail: (points summed, points expected)
    reads: list[int] = []
    real_sums, real_length = accounting._tail_sums, accounting._tail_length

    def length(values, end, threshold):
        reads.clear()
        index = real_length(values, end, threshold)
        tails.append((sum(reads), int(np.flatnonzero(values > threshold)[0]) + 1))
        return index

    monkeypatch.setattr(accounting.pld, "_tail_sums", lambda values: reads.append(len(values)) or real_sums(values))
    monkeypatch.setattr(accounting.pld, "_tail_length", length)
    one = sampled_gaussian(z, q, h)
    ours = theirs = sampled_gaussian(z, q, h).self_compose(50)
    for _ in range(20):
        tails.clear()
        ours, theirs = accounting.compose_pld(ours, one), theirs.compose(one)
        assert_same_composition(ours, theirs)
        assert len(tails) == 4
        assert [read for read, _ in tails] == [expected for _, expected in tails]


def test_tail_truncation_is_dp_accountings_where_the_shortcut_cannot_hold() -> None:
    """The sums stop at the first point that alone exceeds the half budget; where negative
    rounding noise before it keeps the running sum below, or no point alone exceeds it, the
    truncation reads on and is dp-accounting's ``_truncate_tails`` all the same."""
    half = accounting.PLD_TAIL_MASS_TRUNCATION / 2
    rng = np.random.default_rng(3)
    bulk = rng.random(200)
    cases = {
        "rounding noise": np.concatenate([rng.normal(0, 1e-18, 50), bulk, rng.normal(0, 1e-18, 30)]),
        "negative before the first large point": np.array([1e-17, -4e-16, 6e-16, 2e-16, 5e-16, *bulk, 3e-16, -1e-16, 7e-16]),
        "no point alone over": np.full(40, 0.3 * half),
        "first point over": np.array([2 * half, *bulk, 2 * half]),
    }
    for name, probs in cases.items():
        ours = accounting._truncate_tails(probs.copy(), 2 * half)
        theirs = pld_pmf._truncate_tails(probs.copy(), 2 * half, True)
        assert ours[0] == theirs[0], name
        np.testing.assert_array_equal(ours[1], theirs[1], err_msg=name)
        assert ours[2] == theirs[2], name


def test_each_distinct_round_event_is_checked_once() -> None:
    acc = Accountant(DELTA, value_discretization_interval=5e-3)
    checks = []
    real = acc.engine.check
    acc.engine.check = lambda event: checks.append(event) or real(event)
    for t in range(60):
        acc.compose_round(1.0 if t % 3 else 1.2, 0.1)
        acc.epsilon()
    assert len(checks) == 2 and {c.z for c in checks} == {1.0, 1.2}
    # a refused event is refused every time, and records nothing
    for _ in range(3):
        with pytest.raises(accounting.UnsupportedAccountingError):
            acc.compose_round(1.0, None, "fixed", num_clients=10, sample_size=2)
    assert len(checks) == 5 and acc.rounds == 60


def test_the_running_epsilon_is_unchanged_by_the_hint_across_a_checkpoint() -> None:
    """An accountant resumed from a checkpoint has no last ε to size its first scan from: it
    reports the same bits as the uninterrupted one, which had it."""
    rounds = [(1.0, 0.05), (1.0, 0.05), (1.3, 0.05), (1.0, 0.1)] * 10
    assert replay(rounds, None) == replay(rounds, 11) == replay(rounds, 29)
