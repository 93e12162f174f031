"""Canary bank (regeneration, ids, schedule) and the chunked cosine tracker."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from fedsafe.audit import CanaryBank, CanaryTracker
from fedsafe.core.streams import torch_stream


def test_canary_regenerated_from_seed_and_id():
    a, b = CanaryBank(7, 300, 4, 3), CanaryBank(7, 300, 4, 3)
    for cid in range(7):
        ca = a.canary(cid)
        assert ca.dtype == torch.float32 and ca.shape == (300,)
        assert torch.equal(ca, b.canary(cid))
        assert float(ca.double().norm()) == pytest.approx(1.0, abs=1e-6)
    # It is the named stream (seed, "audit.canary", id), normalized.
    raw = torch.randn(300, generator=torch_stream(7, "audit.canary", 5))
    torch.testing.assert_close(a.canary(5), raw / raw.norm())
    assert not torch.equal(a.canary(0), CanaryBank(8, 300, 4, 3).canary(0))


def test_observed_and_unobserved_are_disjoint_and_distinct():
    bank = CanaryBank(0, 2000, 50, 30)
    obs, unobs = set(bank.observed_ids), set(bank.unobserved_ids)
    assert len(obs) == 50 and len(unobs) == 30 and not obs & unobs
    assert obs | unobs == set(range(bank.size))
    vecs = torch.stack([bank.canary(i) for i in range(bank.size)])
    gram = vecs @ vecs.T
    off = gram[~torch.eye(bank.size, dtype=torch.bool)]
    assert float(off.abs().max()) < 6 / math.sqrt(2000)  # nearly orthogonal, no repeats
    with pytest.raises(ValueError, match="out of range"):
        bank.canary(80)


@pytest.mark.parametrize("cache", [0, 10**9])
def test_chunks_match_single_canaries(cache):
    bank = CanaryBank(3, 128, 7, 4, cache_bytes=cache)
    ids = [9, 0, 4, 10, 2]
    seen = []
    for block_ids, block in bank.chunks(ids, chunk_size=2):
        assert block.shape == (len(block_ids), 128) and len(block_ids) <= 2
        for cid, row in zip(block_ids.tolist(), block):
            seen.append(cid)
            torch.testing.assert_close(row, CanaryBank(3, 128, 7, 4).canary(cid), rtol=0, atol=0)
    assert seen == ids
    assert [int(i) for ids_, _ in bank.chunks(chunk_size=5) for i in ids_] == list(range(11))
    upd = bank.updates([1, 3], clip_norm=0.5)
    torch.testing.assert_close(upd, 0.5 * torch.stack([bank.canary(1), bank.canary(3)]))


@pytest.mark.parametrize(("rounds", "k", "reps"), [(20, 50, 1), (20, 50, 3), (100, 7, 2), (10, 10, 10)])
def test_schedule_once_per_epoch_balanced_deterministic(rounds, k, reps):
    bank = CanaryBank(11, 16, k, 5)
    sched = bank.presentations(rounds, reps)
    assert sched == CanaryBank(11, 16, k, 5).presentations(rounds, reps)
    assert all(1 <= t <= rounds for t in sched)
    counts = Counter(cid for ids in sched.values() for cid in ids)
    assert set(counts) == set(range(k))  # only observed canaries, every one of them
    assert set(counts.values()) == {reps}
    epochs = np.array_split(np.arange(1, rounds + 1), reps)
    for ep in epochs:
        in_epoch = [cid for t in ep.tolist() for cid in sched.get(t, [])]
        assert sorted(in_epoch) == list(range(k))  # exactly once per epoch
        per_round = [len(sched.get(t, [])) for t in ep.tolist()]
        if k >= len(ep):
            assert max(per_round) - min(per_round) <= 1
        else:
            assert max(per_round) == 1
    if reps < rounds:  # with one round per epoch there is nothing to shuffle
        assert sched != CanaryBank(12, 16, k, 5).presentations(rounds, reps)


def test_schedule_rejects_bad_repetitions():
    with pytest.raises(ValueError, match="repetitions"):
        CanaryBank(0, 8, 3).presentations(5, 6)


def _naive(bank, vectors, final):
    c = torch.stack([bank.canary(i) for i in range(bank.size)]).double()
    cos = [c @ v.double() / v.double().norm() for v in vectors]
    return torch.stack(cos).max(dim=0).values, c @ final.double() / final.double().norm()


@pytest.mark.parametrize("cache", [0, 10**9])
def test_tracker_chunked_equals_naive(cache):
    gen = torch.Generator().manual_seed(0)
    bank = CanaryBank(5, 1000, 13, 9, cache_bytes=cache)
    tracker = CanaryTracker(bank, chunk_size=4)
    deltas = [torch.randn(1000, generator=gen) for _ in range(6)]
    deltas[2] = deltas[2] + 3 * bank.canary(4)
    for d in deltas:
        tracker.update(d)
    final = sum(deltas)
    naive_max, naive_final = _naive(bank, deltas, final)
    torch.testing.assert_close(tracker.max_cos, naive_max, rtol=0, atol=1e-6)
    torch.testing.assert_close(tracker.final(final), naive_final, rtol=0, atol=1e-6)
    assert tracker.rounds == 6
    obs, unobs = tracker.split(tracker.max_cos)
    assert obs.shape == (13,) and unobs.shape == (9,)
    assert int(np.argmax(obs)) == 4


def test_tracker_skips_empty_rounds_and_checks_shape():
    bank = CanaryBank(0, 50, 3, 2)
    tr = CanaryTracker(bank)
    tr.update(torch.zeros(50))
    tr.update(torch.full((50,), float("nan")))
    assert tr.rounds == 0 and torch.isinf(tr.max_cos).all()
    with pytest.raises(ValueError, match="entries"):
        tr.update(torch.ones(49))


def test_tracker_state_dict_roundtrip(tmp_path):
    bank = CanaryBank(2, 64, 4, 4)
    tr = CanaryTracker(bank)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        tr.update(torch.randn(64, generator=gen))
    path = tmp_path / "ck.pt"
    torch.save({"audit": tr.state_dict()}, path)
    state = torch.load(path, weights_only=True)["audit"]  # plain tensors only
    again = CanaryTracker(CanaryBank(2, 64, 4, 4))
    again.load_state_dict(state)
    assert torch.equal(again.max_cos, tr.max_cos) and again.rounds == 3
    with pytest.raises(ValueError, match="checkpoint"):
        CanaryTracker(CanaryBank(3, 64, 4, 4)).load_state_dict(state)
