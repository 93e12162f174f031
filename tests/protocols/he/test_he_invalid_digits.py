"""Issue #25 item 3, "one HE node erases a round": a node that encrypts residues outside the
allowed digit range is identified by the homomorphic digit check and excluded, instead of
forcing the nodes to zero the coordinates its garbage pushed out of range (a veto over the
round).

References here are computed from definitions, not from the code under test: QUA is
``round(clip(x, -C, C) * o / C)``, the trimmed mean sorts the quantized values of the nodes
that remain and averages ranks f..m-f-1, the validity polynomial is ``prod_v (x - v)`` over the
allowed digits, evaluated with Python integers.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fedsafe.core.types import Message, RoundContext
from fedsafe.protocols.he import HEProtocol, HEProtocolError
from fedsafe.robust.pipeline import RobustPipeline


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _pipe(rule="trimmed_mean", f=1):
    return RobustPipeline(rule, {}, [], f, 0)


def _ctx(n, round_=1, byz=1, seed=5):
    return RoundContext(round_, seed, tuple(range(100, 100 + n)), byz)


def _qua(x, delta, clamp):
    o = 2 ** (delta - 1) - 1
    return np.round(np.clip(x, -clamp, clamp) * o / clamp)


def _plain_rule(q, rule, f):
    """The rule over the rows of quantized values ``q`` (m, d), by sorting: trimmed mean of ranks
    f..m-f-1, or the median (mean of the two middle values for even m)."""
    m = q.shape[0]
    s = np.sort(q, axis=0)
    if rule == "median":
        lo, hi = (m - 1) // 2, m // 2
    else:
        lo, hi = f, m - 1 - f
    return s[lo : hi + 1].sum(axis=0) / (hi - lo + 1)


def _random_residue_planes(plan, shape, seed):
    """What an attacker holding the key can encrypt: uniform residues mod p in every digit plane."""
    return np.random.default_rng(seed).integers(0, plan.spec.p, size=shape)


def _messages(n, d, seed, scale=0.08):
    x = np.random.default_rng(seed).normal(0, scale, size=(n, d)).astype(np.float32).astype(np.float64)
    return [Message(100 + i, torch.from_numpy(x[i]).float()) for i in range(n)], x


def _with_invalid_uploaders(proto, bad_ids, seed=1):
    """Replace the digit planes of the nodes ``bad_ids`` by uniform residues (the seam the
    emulator's node encoding goes through)."""
    honest = proto._digit_planes

    def planes(plan, client_id, row):
        got = honest(plan, client_id, row)
        return _random_residue_planes(plan, got.shape, seed + client_id) if client_id in bad_ids else got

    proto._digit_planes = planes
    return proto


# ----------------------------------------------------------------------------- the protocol round


@pytest.mark.parametrize("n,rule,f,delta", [(20, "trimmed_mean", 4, 4), (9, "median", 2, 3), (7, "trimmed_mean", 2, 2)])
def test_a_node_of_random_residues_is_excluded_and_the_rest_aggregated(n, rule, f, delta):
    d, clamp = 400, 0.1
    msgs, x = _messages(n, d, seed=n + delta)
    bad = 100 + n - 1
    proto = _with_invalid_uploaders(HEProtocol(backend="emulator", delta=delta, clamp=clamp), {bad})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agg = proto.aggregate(msgs, _pipe(rule, f), _ctx(n))
    # one warning naming the node; none about out-of-range sums: nothing is left to screen
    assert [str(w.message) for w in caught if "he:" in str(w.message)] == [
        m for m in (str(w.message) for w in caught) if f"excluded node(s) [{bad}]" in m
    ] and len(caught) == 1
    assert agg.metrics["he_excluded_invalid"] == 1
    assert agg.included == tuple(range(100, 100 + n - 1))
    assert agg.metrics["he_out_of_range"] == 0
    assert agg.metrics["he_inputs"] == n - 1
    # the aggregate of the remaining nodes, recomputed in plaintext
    o = 2 ** (delta - 1) - 1
    want = _plain_rule(_qua(x[: n - 1], delta, clamp), rule, f) / (o / clamp)
    assert np.allclose(agg.vector.double().numpy(), want, rtol=1e-6, atol=1e-9)
    assert np.count_nonzero(want) > d // 4  # a reference with signal: the match is not one of zeros


def test_without_the_check_the_same_node_erases_the_round():
    """The behaviour the check replaces (he.check_digits = false): the nodes zero every
    coordinate the garbage pushed beyond the in-range bound -- almost all of them."""
    n, f, delta, d, clamp = 20, 4, 4, 400, 0.1
    msgs, _ = _messages(n, d, seed=3)
    proto = _with_invalid_uploaders(HEProtocol(backend="emulator", delta=delta, clamp=clamp, check_digits=False), {100 + n - 1})
    with pytest.warns(UserWarning, match="out-of-range digits"):
        agg = proto.aggregate(msgs, _pipe("trimmed_mean", f), _ctx(n))
    assert agg.metrics["he_out_of_range_fraction"] > 0.95
    assert np.count_nonzero(agg.vector.numpy()) < 0.05 * d
    assert agg.metrics["he_excluded_invalid"] == 0 and agg.metrics["he_check_digits"] == 0


def test_one_invalid_digit_in_one_coordinate_is_enough_to_be_excluded():
    n, f, delta, d = 6, 1, 4, 50
    msgs, x = _messages(n, d, seed=9)
    proto = HEProtocol(backend="emulator", delta=delta, clamp=0.1, digits=2)
    honest = proto._digit_planes

    def planes(plan, client_id, row):
        got = honest(plan, client_id, row).copy()
        if client_id == 102:  # the top digit of coordinate 17, one past its range
            got[1, 17] = plan.digits.digit_max[1] + 1
        return got

    proto._digit_planes = planes
    agg = proto.aggregate(msgs, _pipe("trimmed_mean", f), _ctx(n, byz=0))
    assert agg.metrics["he_excluded_invalid"] == 1
    assert 102 not in agg.included and len(agg.included) == n - 1


def test_a_residue_that_fools_the_screen_is_caught_by_the_check():
    """test_he_range's limit of the screen: both honest values at -C, one crafted residue makes
    HTS return +C, inside the bound. The check names and excludes that node instead."""
    from fedsafe.protocols.he.emulator import emulate_digit_planes

    n, f, delta, clamp = 3, 1, 2, 0.5
    plan = HEProtocol(backend="emulator", delta=delta).plan(n, "trimmed_mean", f)
    p = plan.spec.p
    residues = np.arange(p)
    zeros = np.zeros((1, p), dtype=np.int64)
    raw = emulate_digit_planes(np.stack([zeros, zeros, residues[None, :]]), plan.spec)
    sneaky = int(residues[raw == 1][0])  # +o: every in-range upload gives -o here

    n2 = 4  # one more honest node, so that 3 > 2f remain after the exclusion
    msgs = [Message(100 + i, torch.full((4,), -1.0)) for i in range(n2)]
    proto = HEProtocol(backend="emulator", delta=delta, clamp=clamp)
    honest = proto._digit_planes
    proto._digit_planes = lambda plan_, cid, row: np.full((1, 4), sneaky) if cid == 103 else honest(plan_, cid, row)
    agg = proto.aggregate(msgs, _pipe(), _ctx(n2))
    assert agg.metrics["he_excluded_invalid"] == 1 and 103 not in agg.included
    assert np.allclose(agg.vector.numpy(), -clamp)


def test_subsampling_draws_from_the_valid_uploads_only():
    n, f, delta, d = 20, 4, 3, 60
    msgs, x = _messages(n, d, seed=4)
    bad = {100 + 3, 100 + 11}
    proto = _with_invalid_uploaders(HEProtocol(backend="emulator", delta=delta, clamp=0.1, subsample=True), bad)
    agg = proto.aggregate(msgs, _pipe("trimmed_mean", f), _ctx(n, byz=0))
    assert agg.metrics["he_excluded_invalid"] == 2 and agg.metrics["he_inputs"] == 2 * f + 1
    assert len(agg.included) == 2 * f + 1 and not bad & set(agg.included)
    rows = [i for i, m in enumerate(msgs) if m.client_id in agg.included]
    o = 2 ** (delta - 1) - 1
    want = _plain_rule(_qua(x[rows], delta, 0.1), "trimmed_mean", f) / (o / 0.1)
    assert np.allclose(agg.vector.double().numpy(), want, rtol=1e-6, atol=1e-9)


def test_too_few_valid_uploads_skip_the_round_naming_the_excluded_nodes():
    n, f = 5, 2
    msgs, _ = _messages(n, 30, seed=2)
    proto = _with_invalid_uploaders(HEProtocol(backend="emulator", delta=2, clamp=0.1), {104})
    with pytest.raises(HEProtocolError, match=r"excluded 1 node.*\[104\].*trimmed_mean needs more than 2f=4"):
        proto.aggregate(msgs, _pipe("trimmed_mean", f), _ctx(n))


def test_honest_rounds_exclude_nobody_and_report_every_node():
    n, d = 7, 100
    msgs, x = _messages(n, d, seed=8, scale=2.0)  # mostly clipped: digits at both extremes
    agg = HEProtocol(backend="emulator", delta=3, clamp=0.5).aggregate(msgs, _pipe("trimmed_mean", 2), _ctx(n, byz=0))
    assert agg.metrics["he_excluded_invalid"] == 0 and agg.metrics["he_check_digits"] == 1
    assert agg.included == tuple(range(100, 100 + n))
    assert agg.cost["he_check_seconds"] >= 0


# ----------------------------------------------------------------------------- the engine


def _cfg(attack, f_attack=1, **over):
    from fedsafe.config import apply_overrides, validate

    raw = {
        "seed": 0, "rounds": 20, "eval_every": 20,
        "data": {"name": "digits", "max_train": 1000}, "model": {"name": "logreg"},
        "clients": {"num_clients": 20, "batch_size": 16, "algorithm": "dsgd", "momentum": 0.9},
        "server": {"lr": 0.5},
        "robust": {"rule": "trimmed_mean", "f": 4}, "attack": {"name": attack, "f": f_attack},
        "protocol": "he", "he": {"backend": "emulator", "delta": 4, "clamp": 0.05},
    }
    return validate(apply_overrides(raw, over))


def _run(cfg):
    from fedsafe.engine.federation import Federation

    fed = Federation(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fed.run()
    return fed


def test_engine_one_invalid_digit_node_of_20_is_excluded_every_round():
    """20 nodes, the rule tolerates f = 4, one node uploads random residues every round
    (attack.name = "he_invalid_digits"): it is excluded every round and accuracy stays where
    the attack-free run is; with the check off the same node neutralises almost every
    coordinate and training fails."""
    clean = _run(_cfg("none"))
    attacked = _run(_cfg("he_invalid_digits"))
    assert all(r["he_excluded_invalid"] == 1 for r in attacked.rows)
    assert all(r["he_out_of_range"] == 0 for r in attacked.rows)
    assert all(r["he_inputs"] == 19 for r in attacked.rows)
    acc_clean, acc_attacked = clean.rows[-1]["test_accuracy"], attacked.rows[-1]["test_accuracy"]
    assert acc_clean > 0.85
    assert acc_attacked >= acc_clean - 0.03, (acc_clean, acc_attacked)
    assert all(r["he_excluded_invalid"] == 0 for r in clean.rows)

    unchecked = _run(_cfg("he_invalid_digits", **{"he.check_digits": False}))
    assert np.mean([r["he_out_of_range_fraction"] for r in unchecked.rows]) > 0.95
    assert unchecked.rows[-1]["test_accuracy"] < 0.3


# ----------------------------------------------------------------------------- the check itself


def _poly_value(x, dmax, p):
    """V(x) = prod_{v=0}^{dmax} (x - v) mod p, with Python integers (the definition)."""
    out = 1
    for v in range(dmax + 1):
        out = out * (int(x) - v) % p
    return out


def test_validity_polynomial_vanishes_exactly_on_the_allowed_digits():
    from fedsafe.protocols.he.polynomials import evaluate, valid_poly

    p = 65537
    for dmax in (1, 2, 4, 14):
        coeffs = valid_poly(dmax, p)
        assert len(coeffs) == dmax + 2
        xs = np.arange(p, dtype=np.int64)
        vals = np.zeros(p, dtype=np.int64)
        for c in reversed(coeffs):  # Horner over every residue at once
            vals = (vals * xs + c) % p
        assert np.array_equal(np.flatnonzero(vals == 0), np.arange(dmax + 1))
        assert all(evaluate(coeffs, x, p) == _poly_value(x, dmax, p) for x in (0, dmax, dmax + 1, 1234, p - 1))


def _node_planes(plan_digits, values):
    return np.stack(plan_digits.split(np.asarray(values, dtype=np.int64)))


def test_random_multipliers_stop_invalid_coordinates_from_cancelling():
    """Two out-of-range residues whose V values cancel mod p: an unweighted sum over the
    coordinates would accept the node; the server's random multipliers reject it."""
    from fedsafe.protocols.he.ops import EmulatorOps
    from fedsafe.protocols.he.validity import check_circuit, emulate_digit_check, make_check, slot_sums

    p, dmax, slots = 65537, 2, 16
    v1 = _poly_value(p - 1, dmax, p)
    target = (-v1) % p
    xs = np.arange(dmax + 1, p, dtype=np.int64)
    vals = xs * (xs - 1) % p * (xs - 2) % p
    x2 = int(xs[vals == target][0])  # V(x2) = -V(p - 1) mod p, both nonzero
    assert v1 != 0 and (v1 + _poly_value(x2, dmax, p)) % p == 0
    planes = np.zeros((1, 1, slots), dtype=np.int64)
    planes[0, 0, :2] = [p - 1, x2]
    check = make_check(p, (dmax,))
    ops = EmulatorOps(p)
    ones = [[np.ones((1, slots), dtype=np.int64)]]
    unweighted = check_circuit(ops, [[planes[:, 0, :]]], ones, np.zeros((1, slots), dtype=np.int64), check)
    assert int(unweighted.sum() % p) == 0  # would pass
    for seed in range(20):
        assert slot_sums(emulate_digit_check(planes, check, slots, np.random.default_rng(seed)), p)[0] != 0


def test_false_accepts_happen_at_rate_one_over_p_minus_one():
    """With a tiny prime the bound is measurable: two invalid coordinates pass only when the
    second multiplier hits the one value that cancels the first term, probability 1/(p-1)."""
    from fedsafe.protocols.he.validity import emulate_digit_check, make_check, slot_sums

    p, dmax, slots, trials = 17, 2, 4, 4000
    check = make_check(p, (dmax,))
    planes = np.zeros((1, 1, slots), dtype=np.int64)
    planes[0, 0, :2] = [5, 11]  # both out of range
    rng = np.random.default_rng(0)
    passed = sum(int(slot_sums(emulate_digit_check(planes, check, slots, rng), p)[0] == 0) for _ in range(trials))
    expect, sd = trials / (p - 1), np.sqrt(trials / (p - 1) * (1 - 1 / (p - 1)))
    assert abs(passed - expect) < 5 * sd, (passed, expect)
    planes[0, 0, 1] = 0  # one invalid coordinate: never accepted (its multiplier is nonzero)
    assert all(slot_sums(emulate_digit_check(planes, check, slots, rng), p)[0] != 0 for _ in range(200))


def test_the_decryptor_sees_only_the_mask_of_a_valid_node():
    """For a valid upload the decrypted check slots are the server's mask, whatever the node's
    values: two different valid uploads decrypt to the same slots; the masks sum to 0."""
    from fedsafe.protocols.he.validity import draw_node_randomness, emulate_digit_check, make_check, slot_sums

    p, slots = 65537, 32
    plan = HEProtocol(backend="emulator", delta=4, digits=2).plan(5, "trimmed_mean", 1)
    check = make_check(p, plan.digits.digit_max)
    rng = np.random.default_rng(1)
    a = np.stack([_node_planes(plan.digits, rng.integers(0, 15, size=70)) for _ in range(2)])
    b = np.stack([_node_planes(plan.digits, rng.integers(0, 15, size=70)) for _ in range(2)])
    got_a = emulate_digit_check(a, check, slots, np.random.default_rng(7))
    got_b = emulate_digit_check(b, check, slots, np.random.default_rng(7))
    assert not np.array_equal(a, b) and np.array_equal(got_a, got_b)
    replay = np.random.default_rng(7)
    masks = [draw_node_randomness(replay, 3, 2, slots, p)[1] for _ in range(2)]
    assert np.array_equal(got_a, np.stack(masks))
    assert got_a.shape == (2, 1, slots) and np.all(slot_sums(got_a, p) == 0)
    assert len(np.unique(got_a)) > slots  # the slots themselves look random


def test_the_plan_covers_the_check_and_the_subsets_left_by_exclusions():
    from fedsafe.protocols.he.ops import NoiseModel
    from fedsafe.protocols.he.params import band, plan_hts, plan_subset

    for n, f, delta in [(20, 4, 4), (15, 3, 2), (5, 0, 4)]:
        subsets = tuple((m, *band(m, "trimmed_mean", f)) for m in range(n - 1, n - f - 1, -1) if m > 2 * f)
        plan = plan_hts(n, *band(n, "trimmed_mean", f), delta, check=True, subsets=subsets)
        room = NoiseModel(plan.params.poly_modulus_degree, plan.spec.p).fresh(plan.params.data_bits) - plan.margin_bits
        assert plan.check is not None and plan.check_consumed_bits <= room
        if f:
            assert plan.check_depth < plan.depth and n * plan.check_products < 0.15 * plan.products
        for m, lo, hi in subsets:
            sub = plan_subset(plan, m, lo, hi)
            assert sub.params == plan.params and sub.digits == plan.digits and sub.spec.n == m
            assert sub.final_budget_bits >= plan.margin_bits - 1e-9


# ----------------------------------------------------------------------------- real BFV


@pytest.mark.parametrize("delta,digits,groups_of", [(2, None, 64), (4, 2, 1)])
def test_bfv_check_flags_exactly_the_invalid_nodes_and_equals_the_emulator(delta, digits, groups_of, monkeypatch):
    pytest.importorskip("tenseal")
    from fedsafe.protocols.he import validity
    from fedsafe.protocols.he.bfv import HENode, HEServer, NodeKeyring
    from fedsafe.protocols.he.encoding import Quantizer
    from fedsafe.protocols.he.params import band, plan_hts

    monkeypatch.setattr(validity, "CHECK_GROUP_BLOCKS", groups_of)  # 1: one check ciphertext per block
    n, f = 4, 1
    plan = plan_hts(n, *band(n, "trimmed_mean", f), delta, digits=digits, check=True)
    keyring = NodeKeyring(plan.params)
    node = HENode(keyring, plan, Quantizer(delta, 1.0))
    N = plan.slots
    d = N + 7  # two blocks, the second padded
    rng = np.random.default_rng(delta)
    planes = np.stack([_node_planes(plan.digits, rng.integers(0, plan.digits.max_value + 1, size=d)) for _ in range(n)])
    planes[:, :, :3] = _node_planes(plan.digits, [0, plan.digits.max_value, 0])[None]  # the extremes are valid
    planes[1, -1, N + 3] = plan.digits.digit_max[-1] + 1  # one digit one past its range, in the 2nd block
    planes[2] = rng.integers(0, plan.spec.p, size=planes[2].shape)  # uniform residues
    uploads = [node.encrypt_digit_planes(100 + i, planes[i]) for i in range(n)]
    with HEServer(keyring.server_keys()) as server:
        check = server.digit_check(uploads, plan, np.random.default_rng(42))
    slots = node.check_slots(check)
    emu = validity.emulate_digit_check(planes, plan.check, N, np.random.default_rng(42))
    assert slots.shape == (n, 2 if groups_of == 1 else 1, N)
    assert np.array_equal(slots, emu)  # bit for bit
    sums = node.check_sums(check)
    assert [bool(s) for s in sums] == [False, True, True, False]
    assert check.client_ids == (100, 101, 102, 103)
    budgets = [keyring.noise_budget(c) for cts in check.nodes for c in cts]
    assert min(budgets) > 0 and min(budgets) >= check.stats["model_budget_bits"] - 1


def test_bfv_round_excludes_the_attacker_and_equals_the_emulated_round():
    """HEProtocol over real ciphertexts under the attack (the Byzantine participant's digits
    replaced by out-of-range residues): the check flags it, HTS runs over the 3 others under
    the parameters planned for 4, and the result equals the emulator's and the plaintext rule's."""
    pytest.importorskip("tenseal")
    n, f, delta, d, clamp = 4, 1, 2, 24, 0.1
    msgs, x = _messages(n, d, seed=6)
    ctx = _ctx(n, byz=1)
    bfv = HEProtocol(backend="bfv", delta=delta, clamp=clamp, invalid_digits=1.0)
    try:
        with pytest.warns(UserWarning, match=r"excluded node\(s\) \[103\]"):
            got = bfv.aggregate(msgs, _pipe("trimmed_mean", f), ctx)
    finally:
        bfv.close()
    with pytest.warns(UserWarning, match=r"excluded node\(s\) \[103\]"):
        emu = HEProtocol(backend="emulator", delta=delta, clamp=clamp, invalid_digits=1.0).aggregate(msgs, _pipe("trimmed_mean", f), ctx)
    assert got.included == emu.included == (100, 101, 102)
    assert got.metrics["he_excluded_invalid"] == emu.metrics["he_excluded_invalid"] == 1
    assert torch.equal(got.vector, emu.vector)
    o = 2 ** (delta - 1) - 1
    want = _plain_rule(_qua(x[:3], delta, clamp), "trimmed_mean", f) / (o / clamp)
    assert np.allclose(got.vector.double().numpy(), want, rtol=1e-6, atol=1e-9)
    assert got.cost["he_check_seconds"] > 0 and got.metrics["he_check_products"] > 0
    assert got.seen["server"]["excluded_invalid"] == [103]
