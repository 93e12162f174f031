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
