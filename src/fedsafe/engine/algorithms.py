"""The backpropagation client algorithms (``fedsafe.core.clients`` has the interface).

``dsgd`` (Robust-DSGD / SABLE): each client takes one minibatch gradient per round at the
global model and sends its local momentum ``m ← βm + (1−β)(g + λw)``.
``fedavg``: each client runs local SGD steps ``w ← w − η(g + λw)`` and sends ``w − w_global``;
the server's descent direction is the negated mean delta (server lr 1 = plain FedAvg). With
``local_epochs = E`` a client of ``n_i`` samples runs ``E·⌈n_i/B⌉`` steps; clients that finish
early are masked out of later steps, so all clients still move in one batched call.

Both take their gradients from ``work.gradients`` (the seeded minibatch gradient, or under
``dp.unit = "example"`` each honest client's DP-SGD gradient: ``fedsafe.privacy.dp.dpsgd``), so
example-level DP runs the same local training, one private gradient per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.clients import ClientAlgorithm, LocalResult


class DSGD(ClientAlgorithm):
    """one minibatch gradient at the global model; sends local momentum"""

    keeps_momentum = True

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        cfg = work.cfg
        if momentum is None:
            raise ValueError("dsgd needs the clients' momentum rows")
        g, losses = work.gradients(round_, 0, params, ids, poison)  # a fresh (n, d) tensor: updated in place
        if cfg.weight_decay:
            g.add_(params, alpha=cfg.weight_decay)
        if cfg.momentum:  # m = βm + (1 − β)g, one fused pass over g
            g.mul_(1 - cfg.momentum).add_(momentum, alpha=cfg.momentum)
        return LocalResult(g, losses, g)


class FedAvg(ClientAlgorithm):
    """local SGD steps; sends the model delta"""

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        cfg = work.cfg
        steps = work.steps[ids]
        local = params.expand(len(ids), -1).clone()
        losses = params.new_zeros(len(ids))
        for s in range(int(steps.max(initial=0))):
            active = np.flatnonzero(steps > s)
            rows = torch.from_numpy(active)
            w = local[rows]
            g, l = work.gradients(round_, s, params if s == 0 else w, ids[active], poison)
            if s == 0:
                losses[rows] = l
            if cfg.weight_decay:
                g = g + cfg.weight_decay * w
            local[rows] = w - cfg.lr * g
        return LocalResult(local - params, losses, None)

    def decode(self, work: Any, aggregate: Tensor, round_: int) -> Tensor:
        return -aggregate  # messages are model deltas

