"""A node holding the shared key encrypts out-of-range digits: the decrypted aggregate is screened
against the bound in-range uploads obey; and the quantization loss (clipped / zeroed honest
coordinates) is reported and warned about.

The screen is the second line of defence: by default the digit check excludes such a node before
HTS (test_he_invalid_digits.py). The screen tests here turn the check off (``check_digits=False``)
to see what the screen alone guarantees -- what a false accept of the check (probability
<= 1/(p-1) per node and round) would meet.

Bounds and fractions are recomputed here from their definitions (the trimmed sum of S values in
{-o..o}, o = 2^(delta-1) - 1; numpy rounding of the clamped, scaled coordinates), not taken from
the code under test.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch

from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.he import HEProtocol
from fedsafe.protocols.he.emulator import emulate_digit_planes, emulate_trimmed_sum
from fedsafe.protocols.he.params import band, plan_hts
from fedsafe.robust.pipeline import RobustPipeline


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _pipe(rule="trimmed_mean", f=1):
    return RobustPipeline(rule, {}, [], f, 0)


def _ctx(n, round_=1, byz=1):
    return RoundContext(round_, 5, tuple(range(100, 100 + n)), byz)


def _selected(n, rule, f):
    """How many ranks the rule keeps: n - 2f (trimmed mean), 1 or 2 (median, odd or even n)."""
    if rule == "median":
        return 1 if n % 2 else 2
    return n - 2 * f


def _bound(n, rule, f, delta):
    """Largest |trimmed sum| of in-range uploads: S values of at most o = 2^(delta-1) - 1 each."""
    return _selected(n, rule, f) * (2 ** (delta - 1) - 1)


def _qua(x, delta, clamp):
    """QUA by its definition: clamp to [-C, C], times (2^(delta-1) - 1)/C, round to nearest."""
    o = 2 ** (delta - 1) - 1
    return np.round(np.clip(x, -clamp, clamp) * o / clamp)


def _honest_trimmed_mean(x, n_rows, rule, f, delta, clamp):
    q = np.sort(_qua(x[:n_rows], delta, clamp), axis=0)
    lo, hi = band(n_rows, rule, f)
    o = 2 ** (delta - 1) - 1
    return q[lo : hi + 1].sum(axis=0) / (hi - lo + 1) / (o / clamp)


def _encoded_planes(plan, x, delta, clamp):
    """Digit planes of honest rows ``x``, encoded from the definition of QUA."""
    return [np.stack(plan.digits.split(_qua(row, delta, clamp).astype(np.int64) + plan.spec.offset)) for row in x]


def _attacker_planes(plan, d, touched, seed):
    """Digit planes of a node that encrypts uniform residues mod p on ``touched`` coordinates
    (digits far beyond the base) and valid digits of the value 0 elsewhere."""
    rng = np.random.default_rng(seed)
    planes = np.stack(plan.digits.split(np.full(d, plan.spec.offset)))
    planes[:, :touched] = rng.integers(0, plan.spec.p, size=(plan.digits.digits, touched))
    return planes


# ----------------------------------------------------------------------------- the bound


@pytest.mark.parametrize("n,rule,f,delta", [(5, "trimmed_mean", 1, 4), (6, "trimmed_mean", 2, 3), (4, "median", 1, 4), (5, "median", 1, 2)])
def test_bound_is_attained_by_in_range_uploads_and_never_exceeded(n, rule, f, delta):
    lo, hi = band(n, rule, f)
    plan = plan_hts(n, lo, hi, delta)
    m = plan.digits.max_value
    # every combination of extremes and the middle: the trimmed sum reaches +-bound, never beyond
    grid = np.array(list(itertools.product([0, m // 2, m], repeat=n))).T
    got = emulate_trimmed_sum(grid, plan.spec, plan.digits)
    bound = _bound(n, rule, f, delta)
    assert got.max() == bound and got.min() == -bound
    proto = HEProtocol(backend="emulator", delta=delta, range=0.05)
    assert proto.quantizer.sum_bound(_selected(n, rule, f)) == bound


def test_screen_zeroes_exactly_the_coordinates_beyond_the_bound():
    proto = HEProtocol(backend="emulator", delta=3, range=0.05)  # o = 3
    sums = np.array([-7, -6, 0, 5, 6, 7, 30000])
    screened, bad = proto.quantizer.screen_sums(sums, 2)  # bound 2 * 3 = 6
    assert bad.tolist() == [True, False, False, False, False, True, True]
    assert screened.tolist() == [0, -6, 0, 5, 6, 0, 0]


# ----------------------------------------------------------------------------- the attack


@pytest.mark.parametrize("n,rule,f,delta", [(5, "trimmed_mean", 1, 4), (4, "median", 1, 4), (5, "median", 2, 3)])
def test_out_of_range_digits_cannot_blow_up_the_emulated_aggregate(n, rule, f, delta, monkeypatch):
    d, touched, clamp = 120, 40, 0.5
    rng = np.random.default_rng(n + delta)
    x = rng.uniform(-0.6, 0.6, size=(n, d)).astype(np.float32).astype(np.float64)  # what messages carry
    msgs = [Message(100 + i, torch.from_numpy(x[i]).float()) for i in range(n)]
    proto = HEProtocol(backend="emulator", delta=delta, clamp=clamp, check_digits=False)
    plan = proto.plan(n, rule, f)
    evil = _attacker_planes(plan, d, touched, seed=1)
    honest_planes = proto._digit_planes

    def byzantine(plan_, client_id, row):
        return evil if client_id == 100 + n - 1 else honest_planes(plan_, client_id, row)

    monkeypatch.setattr(proto, "_digit_planes", byzantine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agg = proto.aggregate(msgs, _pipe(rule, f), _ctx(n))
    vec = agg.vector.double().numpy()
    assert np.abs(vec).max() <= clamp * (1 + 1e-6)
    assert any("out-of-range digits" in str(w.message) for w in caught)

    # what the circuit decrypts without the screen, recomputed on the same planes
    raw = emulate_digit_planes(np.stack(_encoded_planes(plan, x[: n - 1], delta, clamp) + [evil]), plan.spec)
    bound = _bound(n, rule, f, delta)
    beyond = np.abs(raw) > bound
    assert beyond[:touched].sum() >= touched // 2 and not beyond[touched:].any()
    assert np.abs(raw).max() / bound > 100  # unscreened: hundreds of times the clamp
    assert np.all(vec[beyond] == 0)
    assert agg.metrics["he_out_of_range"] == beyond.sum()
    assert agg.metrics["he_out_of_range_fraction"] == pytest.approx(beyond.sum() / d)
    # coordinates the attacker left in range: the rule over all n quantized values
    q_all = np.vstack([_qua(x[: n - 1], delta, clamp), np.zeros((1, d))])
    lo, hi = band(n, rule, f)
    want = np.sort(q_all, axis=0)[lo : hi + 1].sum(axis=0) / (hi - lo + 1) / ((2 ** (delta - 1) - 1) / clamp)
    assert np.allclose(vec[touched:], want[touched:], rtol=1e-6, atol=1e-7)


def test_out_of_range_digits_cannot_blow_up_the_bfv_aggregate(monkeypatch):
    pytest.importorskip("tenseal")
    from fedsafe.protocols.he.bfv import EncryptedUpload

    n, f, delta, d, touched, clamp = 3, 1, 2, 24, 12, 0.4
    rng = np.random.default_rng(3)
    x = rng.uniform(-0.5, 0.5, size=(n, d)).astype(np.float32).astype(np.float64)
    msgs = [Message(100 + i, torch.from_numpy(x[i]).float()) for i in range(n)]
    proto = HEProtocol(backend="bfv", delta=delta, clamp=clamp, check_digits=False)
    plan = proto.plan(n, "trimmed_mean", f)
    evil = _attacker_planes(plan, d, touched, seed=2)
    honest_encrypt = proto._encrypt

    def byzantine(node, client_id, row):
        if client_id != 100 + n - 1:
            return honest_encrypt(node, client_id, row)
        # the node holds the key: it encrypts whatever residues it likes, digit plane by plane
        cts = tuple(node.keyring.encrypt(plane) for plane in evil)
        return EncryptedUpload(client_id, node.fingerprint, d, (cts,))

    monkeypatch.setattr(proto, "_encrypt", byzantine)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            agg = proto.aggregate(msgs, _pipe("trimmed_mean", f), _ctx(n))
    finally:
        proto.close()
    vec = agg.vector.double().numpy()
    assert np.abs(vec).max() <= clamp * (1 + 1e-6), f"aggregate reached {np.abs(vec).max() / clamp:.0f}x the clamp"
    assert any("out-of-range digits" in str(w.message) for w in caught)
    raw = emulate_digit_planes(np.stack(_encoded_planes(plan, x[: n - 1], delta, clamp) + [evil]), plan.spec)
    beyond = np.abs(raw) > _bound(n, "trimmed_mean", f, delta)
    assert beyond.sum() >= touched // 2 and not beyond[touched:].any()
    assert np.all(vec[beyond] == 0)
    assert agg.metrics["he_out_of_range"] == beyond.sum()
    # BFV decrypts exactly what the emulator computes, attack included
    inside = ~beyond
    q_scale = (2 ** (delta - 1) - 1) / clamp  # n - 2f = 1 value selected
    assert np.allclose(vec[inside], raw[inside] / q_scale, rtol=1e-6)


def test_an_out_of_range_value_that_lands_inside_the_bound_passes_unflagged():
    """The documented limit of the screen: with both honest values at -C, some out-of-range
    residue makes HTS return +C -- inside the bound, yet a value no in-range upload produces.
    (The digit check excludes that node: test_he_invalid_digits.py.)"""
    n, f, delta, clamp = 3, 1, 2, 0.5
    plan = HEProtocol(backend="emulator", delta=delta, check_digits=False).plan(n, "trimmed_mean", f)
    p, lo, hi = plan.spec.p, *band(n, "trimmed_mean", f)
    residues = np.arange(p)
    planes = np.stack([np.zeros((1, p), dtype=np.int64), np.zeros((1, p), dtype=np.int64), residues[None, :]])
    raw = emulate_digit_planes(planes, plan.spec)
    o = 2 ** (delta - 1) - 1
    legit = {int(np.sort(np.array([-o, -o, a - o]))[lo : hi + 1].sum()) for a in range(2 * o + 1)}
    assert legit == {-o}
    # inside the bound, yet +o: the opposite sign of every honest value
    sneaky = residues[raw == o]
    assert sneaky.size > 0 and _bound(n, "trimmed_mean", f, delta) >= o

    msgs = [Message(100 + i, torch.full((4,), -1.0)) for i in range(n)]
    proto = HEProtocol(backend="emulator", delta=delta, clamp=clamp, check_digits=False)  # the check catches it
    honest_planes = proto._digit_planes
    proto._digit_planes = lambda plan_, cid, row: np.full((1, 4), sneaky[0]) if cid == 102 else honest_planes(plan_, cid, row)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no out-of-range warning either
        agg = proto.aggregate(msgs, _pipe(), _ctx(n))
    assert agg.metrics["he_out_of_range"] == 0
    assert np.allclose(agg.vector.numpy(), clamp)  # every in-range upload would give -C here


def test_honest_rounds_are_never_flagged():
    n, d = 5, 200
    x = np.random.default_rng(0).normal(0, 2.0, size=(n, d))  # most coordinates clipped: extremes
    msgs = [Message(100 + i, torch.from_numpy(x[i]).float()) for i in range(n)]
    for rule, f in [("trimmed_mean", 1), ("trimmed_mean", 0), ("median", 1)]:
        agg = HEProtocol(backend="emulator", delta=3, clamp=0.5).aggregate(msgs, _pipe(rule, f), _ctx(n, byz=0))
        assert agg.metrics["he_out_of_range"] == 0
        assert np.array_equal(agg.vector.numpy(), _honest_trimmed_mean(x, n, rule, f, 3, 0.5).astype(np.float32))


# ----------------------------------------------------------------------------- quantization loss


def test_clipped_and_zeroed_fractions_match_numpy_on_honest_rows_only():
    n, d, delta, clamp = 6, 500, 4, 0.1
    rng = np.random.default_rng(7)
    x = rng.normal(0, 0.08, size=(n, d))
    x[0, :50] = 0.0  # exact zeros are not "zeroed"
    x[1, :3] = [np.inf, -np.inf, np.nan]
    x[-1] = 50.0  # the Byzantine row is all clipped: it must not count
    msgs = [Message(100 + i, torch.from_numpy(x[i]).float()) for i in range(n)]
    agg = HEProtocol(backend="emulator", delta=delta, clamp=clamp).aggregate(msgs, _pipe(), _ctx(n, byz=1))
    h = x[: n - 1].astype(np.float32).astype(np.float64)  # what the messages carry
    values = h[~np.isnan(h) & (h != 0)]  # the coordinates that carry a value
    assert values.size == h.size - 51
    clipped = np.abs(values) > clamp
    zeroed = np.isfinite(values) & (_qua(values, delta, clamp) == 0)
    assert agg.metrics["he_clipped_fraction"] == pytest.approx(clipped.sum() / values.size)
    assert agg.metrics["he_zeroed_fraction"] == pytest.approx(zeroed.sum() / values.size)
    assert 0 < agg.metrics["he_clipped_fraction"] < 0.5 and 0 < agg.metrics["he_zeroed_fraction"] < 0.9
    assert agg.metrics["he_quantization_warning"] == 0


def test_messages_without_a_nonzero_coordinate_report_nan_and_never_flag():
    from fedsafe.protocols.he.protocol import quantization_destroys_signal

    clipped, zeroed = HEProtocol(backend="emulator", range=0.05).quantizer.loss_fractions(np.array([[0.0, np.nan], [0.0, 0.0]]))
    assert np.isnan(clipped) and np.isnan(zeroed)
    assert not quantization_destroys_signal(clipped, zeroed)


def _rounds(proto, scale, rounds, n=5, d=300, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(1, rounds + 1):
        x = rng.normal(0, scale, size=(n, d))
        msgs = [Message(100 + i, torch.from_numpy(x[i]).float()) for i in range(n)]
        rows.append(proto.aggregate(msgs, _pipe(), _ctx(n, round_=t, byz=1)).metrics)
    return rows


def test_warns_once_when_the_clamp_erases_the_messages():
    from fedsafe.protocols.he.protocol import QUANTIZATION_PATIENCE

    proto = HEProtocol(backend="emulator", delta=4, clamp=1.0)  # |x| ~ 1e-3 << C/14
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = _rounds(proto, 1e-3, QUANTIZATION_PATIENCE - 1)
        assert not caught  # early rounds of a momentum run may look like this: patience
        rows += _rounds(proto, 1e-3, 3, seed=1)
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "he.clamp = 1 rounds 100.0%" in msg and "he.delta = 4" in msg and "set he.clamp = 'auto'" in msg
    assert "or raise he.delta" in msg
    assert all(r["he_quantization_warning"] == 1.0 and r["he_zeroed_fraction"] > 0.99 for r in rows)


def test_warns_once_when_the_clamp_clips_the_messages():
    from fedsafe.protocols.he.protocol import QUANTIZATION_PATIENCE

    proto = HEProtocol(backend="emulator", delta=4, clamp=1e-4)
    with pytest.warns(UserWarning, match=r"he.clamp = 0.0001 clips 9\d.\d% .* set he.clamp = 'auto' \(here about 0.03\d*\), or >= 0.03") as caught:
        rows = _rounds(proto, 1e-2, QUANTIZATION_PATIENCE + 2)
    assert len([w for w in caught if "he.clamp" in str(w.message)]) == 1
    assert all(r["he_clipped_fraction"] > 0.9 for r in rows)


def test_no_warning_for_a_clamp_that_fits_the_messages():
    from fedsafe.protocols.he.protocol import QUANTIZATION_PATIENCE

    proto = HEProtocol(backend="emulator", delta=4, clamp=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = _rounds(proto, 1e-2, QUANTIZATION_PATIENCE + 2)
    assert all(r["he_quantization_warning"] == 0.0 for r in rows)


def test_a_streak_broken_by_one_good_round_does_not_warn():
    from fedsafe.protocols.he.protocol import QUANTIZATION_PATIENCE

    proto = HEProtocol(backend="emulator", delta=4, clamp=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _rounds(proto, 1e-3, QUANTIZATION_PATIENCE - 1)
        assert _rounds(proto, 0.5, 1)[0]["he_quantization_warning"] == 0.0
        _rounds(proto, 1e-3, QUANTIZATION_PATIENCE - 1)


def test_engine_rows_carry_the_new_fields_and_a_bad_clamp_warns():
    from fedsafe.config import apply_overrides, validate
    from fedsafe.engine.federation import Federation
    from fedsafe.protocols.he.protocol import QUANTIZATION_PATIENCE

    def run(clamp):
        raw = {
            "seed": 0, "rounds": QUANTIZATION_PATIENCE + 1, "eval_every": 100,
            "data": {"name": "digits", "max_train": 300}, "model": {"name": "mlp", "hidden": 32},
            "clients": {"num_clients": 4, "batch_size": 16, "algorithm": "dsgd"},
            "robust": {"rule": "trimmed_mean"}, "attack": {"name": "sign_flip", "f": 1},
            "protocol": "he", "he": {"backend": "emulator", "delta": 4, "clamp": clamp},
        }
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fed = Federation(validate(apply_overrides(raw, {})))
            fed.run()
        return fed.rows, [str(w.message) for w in caught if "he.clamp" in str(w.message)]

    rows, warned = run(10.0)  # zero unless |x| > 10/14: every momentum coordinate is erased
    assert len(warned) == 1 and all(r["he_zeroed_fraction"] > 0.99 for r in rows)
    for key in ("he_out_of_range", "he_out_of_range_fraction", "he_clipped_fraction", "he_zeroed_fraction", "he_quantization_warning"):
        assert all(key in r for r in rows)
    assert all(r["he_out_of_range"] == 0 for r in rows)
    rows, warned = run(0.05)
    assert not warned and sum(r["he_quantization_warning"] for r in rows) < QUANTIZATION_PATIENCE
