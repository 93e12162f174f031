"""BAFFLE's forward-only client algorithms (``clients.gradient = "zeroth_order"``), registered
as ``dsgd:zeroth_order`` and ``fedavg:zeroth_order`` in ``fedsafe.core.clients``.

FedSGD (``dsgd``): a client uploads M loss differences at the round's shared perturbations; the
server decodes their aggregate ĝ = (1/K) Σ δ_k s_k / σ², rescales it to ∞-norm ``zo.clip_inf``
(BAFFLE's guideline) and applies the clients' ``momentum`` and ``weight_decay`` to the decoded
direction (:class:`~fedsafe.zo.fedsgd.DecodedMomentum`), the only place they can act.
FedAvg (``fedavg``): the usual local steps with the zeroth-order estimate, each rescaled to
∞-norm ``zo.clip_inf`` before λw is added; the message is the model delta.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.clients import ClientAlgorithm, LocalResult
from fedsafe.core.types import RoundContext
from fedsafe.zo.clip import clip_inf
from fedsafe.zo.fedsgd import DecodedMomentum, ZODecoder, ZOSettings, client_messages
from fedsafe.zo.local import zo_local_steps_many


class _ZerothOrder(ClientAlgorithm):
    """What both BAFFLE algorithms set up: the ``[zo]`` settings, as :class:`~fedsafe.zo.ZOSettings`."""

    settings: ZOSettings

    def setup(self, work: Any) -> None:
        zo = work.zo
        if zo is None:
            raise ValueError("clients.gradient = 'zeroth_order' needs the [zo] settings")
        self.settings = ZOSettings(zo.k, zo.sigma, zo.scheme, zo.chunk, zo.decode_chunk)


class ZOFedSGD(_ZerothOrder):
    """BAFFLE FedSGD: K loss differences at shared perturbations"""

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        x, y = work.batch(round_, 0, ids, poison)
        msgs, losses = client_messages(work.loss_fn(), params, x, y, self.settings, work.seed, round_)
        return LocalResult(msgs, losses, None)

    def message_dim(self, work: Any, dim: int) -> int:
        return self.settings.message_dim

    def decode(self, work: Any, aggregate: Tensor, round_: int) -> Tensor:
        dim = work.backend.layout.dim
        g = ZODecoder(dim, self.settings)(aggregate, RoundContext(round_, work.seed, (), 0)).to(torch.float32)
        return g if work.zo.clip_inf is None else clip_inf(g, work.zo.clip_inf)

    def server_optimizer(self, work: Any, inner: Any) -> Any:
        cfg = work.cfg
        if cfg.momentum == 0 and cfg.weight_decay == 0:
            return inner
        return DecodedMomentum(inner, cfg.momentum, cfg.weight_decay)


class ZOFedAvg(_ZerothOrder):
    """BAFFLE FedAvg: local zeroth-order SGD steps"""

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        cfg, zo = work.cfg, work.zo
        res = zo_local_steps_many(
            work.loss_fn(), params, lambda s, active: work.batch(round_, s, ids[active], poison),
            clients=ids, steps=work.steps[ids], lr=cfg.lr, k=zo.k, sigma=zo.sigma,
            seed=work.seed, round=round_, scheme=zo.scheme, chunk=zo.chunk,
            weight_decay=cfg.weight_decay, clip=zo.clip_inf,
        )
        return LocalResult(res.delta, res.losses, None)

    def decode(self, work: Any, aggregate: Tensor, round_: int) -> Tensor:
        return -aggregate  # messages are model deltas
