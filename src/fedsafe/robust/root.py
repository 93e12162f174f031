"""The server's own update on a small root dataset, for rules that take ``server_update``
(FLTrust: Cao, Fang, Liu, Gong, NDSS 2021).

FLTrust's server holds a small, clean "root" dataset and computes, every round, the update an
honest client would send from it; the rule then trusts each client's update by its direction
relative to that one. fedsafe draws the root dataset once, uniformly without replacement, from
the training set (stream ``"robust.root"``; ``root_size`` samples, FLTrust's default 100). It is
the same distribution the clients' data comes from, not a separate collection, and it may
overlap clients' data: the paper's server collects its own small dataset, which a simulation
can only imitate. The server's update runs the configured client algorithm on it (the client
work the caller makes with ``make_work(root dataset, batch seed)``), with its own batch stream
and, for dsgd, its own momentum row (checkpointed with the run).

The :class:`~fedsafe.robust.pipeline.RobustPipeline` of such a rule owns its ``RootUpdate``
(:meth:`~fedsafe.robust.pipeline.RobustPipeline.attach_server_data`) and computes the round's
``server_update`` from it (:meth:`~fedsafe.robust.pipeline.RobustPipeline.begin_round`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.streams import numpy_stream
from fedsafe.data import FederatedDataset

MakeWork = Callable[[FederatedDataset, int], Any]


class RootUpdate:
    """``update(round, params)``: the server's message from its root dataset this round."""

    def __init__(self, data: FederatedDataset, seed: int, root_size: int, make_work: MakeWork) -> None:
        n = data.x_train.shape[0]
        if isinstance(root_size, bool) or not isinstance(root_size, int) or not 1 <= root_size <= n:
            raise ValueError(f"robust.params.root_size must be an integer in [1, {n}] (the training samples), got {root_size!r}")
        idx = torch.from_numpy(np.sort(numpy_stream(seed, "robust.root").choice(n, root_size, replace=False)))
        root = FederatedDataset(
            name=f"{data.name}:root", x_train=data.x_train[idx], y_train=data.y_train[idx],
            x_test=data.x_test[:0], y_test=data.y_test[:0], client_indices=[np.arange(root_size, dtype=np.int64)],
            num_classes=data.num_classes, input_shape=data.input_shape,
        )
        # its own batch keys: the root is no client, so it must not reuse client 0's stream
        root_seed = int(numpy_stream(seed, "robust.root.batches").integers(0, 2**62))
        self.work = make_work(root, root_seed)
        self.momentum: Tensor | None = None

    def update(self, round_: int, params: Tensor) -> Tensor:
        mom = None
        if self.work.keeps_momentum:
            if self.momentum is None:
                self.momentum = params.new_zeros((1, params.numel()))
            mom = self.momentum
        res = self.work.run(round_, params, np.zeros(1, dtype=np.int64), mom)
        if res.momentum is not None:
            self.momentum = res.momentum
        return res.updates[0]

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum = state.get("momentum")
