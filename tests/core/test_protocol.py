import math

import torch

from fedsafe.core.protocol import PlainProtocol, finite_rows
from fedsafe.core.types import Message, RoundContext
from fedsafe.robust.pipeline import RobustPipeline


def test_finite_rows_matches_elementwise_check():
    x = torch.randn(6, 50)
    x[1, 3] = math.nan
    x[2, 0] = math.inf
    x[3, 49] = -math.inf
    x[4] = 3e38  # huge but finite
    assert finite_rows(x).tolist() == torch.isfinite(x).all(dim=1).tolist() == [True, False, False, False, True, True]


def test_plain_excludes_nonfinite_and_counts_them():
    vecs = [torch.ones(4), torch.full((4,), math.nan), 3 * torch.ones(4), torch.full((4,), math.inf)]
    msgs = [Message(i, v) for i, v in enumerate(vecs)]
    pipe = RobustPipeline("mean", {}, [], 0, 0)
    agg = PlainProtocol().aggregate(msgs, pipe, RoundContext(1, 0, (0, 1, 2, 3), 0))
    assert torch.equal(agg.vector, 2 * torch.ones(4))
    assert agg.metrics["excluded_nonfinite"] == 2
    assert agg.cost["bytes_up"] == 4 * 4 * 4


def test_finite_rows_keeps_finite_rows_whose_sum_overflows():
    # the one-pass check looks again at rows whose sum is not finite: finite entries whose sum
    # overflows float32 are kept, a NaN hidden among them is not
    x = torch.zeros(4, 8)
    x[0] = 3e38
    x[1] = -3e38
    x[2] = 3e38
    x[2, 5] = math.nan
    x[3, 0], x[3, 1] = math.inf, -math.inf
    assert finite_rows(x).tolist() == torch.isfinite(x).all(dim=1).tolist() == [True, True, False, False]


def test_messages_are_rows_of_one_matrix_without_copies():
    from fedsafe.core.types import Messages, client_ids, stack_messages

    m = torch.arange(12.0).reshape(4, 3)
    msgs = Messages([5, 6, 7, 8], m)
    assert stack_messages(msgs) is m  # the round's updates reach the rule uncopied
    assert len(msgs) == 4 and msgs[1].client_id == 6 and torch.equal(msgs[1].vector, m[1])
    assert msgs[1].vector.data_ptr() == m[1].data_ptr() and msgs[1].weight == 1.0
    assert [x.client_id for x in msgs] == [5, 6, 7, 8] and client_ids(msgs) == (5, 6, 7, 8)
    more = msgs + [Message(9, torch.ones(3), 2.0)]
    assert client_ids(more) == (5, 6, 7, 8, 9) and more[4].weight == 2.0 and more[0].weight == 1.0
    assert torch.equal(stack_messages(more), torch.cat([m, torch.ones(1, 3)]))
    assert (msgs + []) is msgs and client_ids(msgs[1:3]) == (6, 7)
    # the plain protocol aggregates a Messages exactly as the list of its messages
    pipe = RobustPipeline("mean", {}, [], 0, 0)
    ctx = RoundContext(1, 0, (5, 6, 7, 8), 0)
    a, b = PlainProtocol().aggregate(msgs, pipe, ctx), PlainProtocol().aggregate(list(msgs), pipe, ctx)
    assert torch.equal(a.vector, b.vector) and a.included == b.included == (5, 6, 7, 8)
    assert a.cost["bytes_up"] == b.cost["bytes_up"] == 4 * 3 * 4
