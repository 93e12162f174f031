"""fedsafe's rules against Flower's own robust strategies (flwr.serverapp.strategy) on identical
inputs, and each convention difference pinned by name. Flower aggregates whole models with
FedAvg-style weights (``num-examples``); every reply here has weight 1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsafe.robust.aggregators import AGGREGATORS

from .fakegrid import FakeGrid


def _replies(rows: np.ndarray):
    """Flower train replies, one per row of ``rows`` (split into two arrays, as layers)."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    FakeGrid(None, 0)  # sets the task identity messages need outside a Flower runtime
    out = []
    for i, row in enumerate(rows):
        sent = Message(RecordDict(), dst_node_id=100 + i, message_type="train")
        sent.metadata.__dict__["_message_id"] = f"m{i}"
        arrays = ArrayRecord({"w": Array(row[:3].copy()), "b": Array(row[3:].copy())})
        out.append(Message(RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})}), reply_to=sent))
    return out


def _flower(strategy, rows: np.ndarray) -> np.ndarray:
    arrays, _ = strategy.aggregate_train(1, _replies(rows))
    return np.concatenate([arrays["w"].numpy(), arrays["b"].numpy()])


def _fedsafe(rule: str, rows: np.ndarray, f: int, **params) -> np.ndarray:
    return AGGREGATORS.get(rule, params)(torch.from_numpy(rows), f=f).numpy()


@pytest.fixture
def rows() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 5))
    x[:2] += 50.0  # two outliers
    return x


def test_median_agrees(rows: np.ndarray) -> None:
    from flwr.serverapp.strategy import FedMedian

    np.testing.assert_allclose(_flower(FedMedian(), rows), _fedsafe("median", rows, 2), rtol=0, atol=1e-12)
    even = rows[:10]  # both average the two middle values
    np.testing.assert_allclose(_flower(FedMedian(), even), _fedsafe("median", even, 2), rtol=0, atol=1e-12)


def test_trimmed_mean_beta_f_over_n_trims_f_minus_1_where_it_rounds_down() -> None:
    """Flower's FedTrimmedAvg(beta) trims int(beta·n) per side; fedsafe's trimmed_mean trims f.
    With beta = f/n the float product rounds below f for many (n, f), and Flower then trims f−1
    (e.g. n = 100, f = 29: int(0.29·100) = 28). beta = (f + ½)/n trims f in both."""
    from flwr.serverapp.strategy import FedTrimmedAvg

    n, f = 100, 29
    assert int((f / n) * n) == f - 1
    rows = np.random.default_rng(1).normal(size=(n, 5))
    rows[:f] += 1000.0
    ours = _fedsafe("trimmed_mean", rows, f)
    assert not np.allclose(_flower(FedTrimmedAvg(beta=f / n), rows), ours)  # one outlier kept per side
    np.testing.assert_allclose(_flower(FedTrimmedAvg(beta=(f + 0.5) / n), rows), ours, rtol=0, atol=1e-9)
    rounding = [(n, f) for n in range(4, 101) for f in range(1, (n + 1) // 2) if int((f / n) * n) != f]
    assert len(rounding) == 63  # of the (n, f) with n <= 100, e.g. (47, 3) and (100, 29)


def test_krum_and_multi_krum_agree(rows: np.ndarray) -> None:
    """Both score with squared distances to the n − f − 2 nearest others and keep the lowest
    scores; Flower's MultiKrum then takes the num-examples-weighted mean (here: the mean)."""
    from flwr.serverapp.strategy import Krum, MultiKrum

    np.testing.assert_allclose(_flower(Krum(num_malicious_nodes=2), rows), _fedsafe("krum", rows, 2), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        _flower(MultiKrum(num_malicious_nodes=2, num_nodes_to_select=5), rows),
        _fedsafe("multi_krum", rows, 2, m=5), rtol=0, atol=1e-12,
    )


def _krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    k = max(1, len(x) - f - 2)
    return np.array([np.sort(np.delete(d[i], i))[:k].sum() for i in range(len(x))])


def _closest_to_median(selected: np.ndarray, beta: int) -> np.ndarray:
    med = np.median(selected, 0)
    idx = np.argsort(np.abs(selected - med), 0, kind="stable")[:beta]
    return np.take_along_axis(selected, idx, 0).mean(0)


def test_bulyan_selects_by_one_shot_multi_krum_and_empties_its_input(rows: np.ndarray) -> None:
    """Both average, per coordinate, the β = θ − 2f selected values closest to the median of the
    θ = n − 2f selected models. Flower selects them by one-shot Multi-Krum scores; El Mhamdi et
    al. (and fedsafe) re-run Krum on the remaining set θ times, so the selections differ once the
    remaining set is small (here the iterative one takes outlier 0 last). Flower also pops the
    arrays out of the replies it selected (``to_numpy_ndarrays(keep_input=False)``)."""
    from flwr.serverapp.strategy import Bulyan

    n, f = len(rows), 2
    theta, beta = n - 2 * f, n - 4 * f
    one_shot = np.argsort(_krum_scores(rows, f), kind="stable")[:theta]
    remaining, iterative = list(range(n)), []
    for _ in range(theta):
        j = remaining[int(np.argmin(_krum_scores(rows[remaining], f)))]
        iterative.append(j)
        remaining.remove(j)
    assert 0 in iterative and 0 not in one_shot

    replies = _replies(rows)
    arrays, _ = Bulyan(num_malicious_nodes=f).aggregate_train(1, replies)
    flower = np.concatenate([arrays["w"].numpy(), arrays["b"].numpy()])
    np.testing.assert_allclose(flower, _closest_to_median(rows[one_shot], beta), rtol=0, atol=1e-12)
    ours = _fedsafe("bulyan", rows, f)
    np.testing.assert_allclose(ours, _closest_to_median(rows[sorted(iterative)], beta), rtol=0, atol=1e-12)
    assert not np.allclose(flower, ours)
    assert sum(len(r.content["arrays"]) == 0 for r in replies) == theta  # Flower emptied its input
    before = torch.from_numpy(rows.copy())
    AGGREGATORS.get("bulyan", {})(before, f=f)
    assert torch.equal(before, torch.from_numpy(rows))  # fedsafe leaves its input alone


def test_secagg_masks_flower_folds_the_seed_to_32_bits_fedsafe_does_not() -> None:
    """Flower's SecAgg+ expands each pairwise mask with numpy's Mersenne Twister seeded by the
    XOR of the 32-byte secret's 4-byte words: two secrets with the same fold give the same mask,
    so a mask has at most 2^32 values. fedsafe expands the whole secret (AES-CTR keyed by it)."""
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    from fedsafe.protocols.secagg.crypto import expand_mask

    a = bytes(np.random.default_rng(2).integers(0, 256, 32, dtype=np.uint8))
    flip = bytes([1, 2, 3, 4])
    b = bytes(x ^ flip[i % 4] for i, x in enumerate(a[:8])) + a[8:]  # same 32-bit fold, other secret
    assert a != b
    np.testing.assert_array_equal(pseudo_rand_gen(a, 1 << 30, [(1000,)])[0], pseudo_rand_gen(b, 1 << 30, [(1000,)])[0])
    assert not np.array_equal(expand_mask(a, 1000, np.dtype(np.uint32)), expand_mask(b, 1000, np.dtype(np.uint32)))
