"""``clients.algorithm = "inherent"`` (registered in ``fedsafe.core.clients``): Zhang et al.'s
FedSGD, each user releasing one Table 1 row over its records with the σ² the inherent plugin
calibrated (``work.inherent``, set by ``InherentPlugin.configure_clients``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from fedsafe.core.clients import ClientAlgorithm, LocalResult
from fedsafe.privacy.inherent.plugin import inherent_updates


class InherentClients(ClientAlgorithm):
    """FedSGD releasing a Table 1 row (Zhang et al.)"""

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        if work.inherent is None:
            raise ValueError("clients.algorithm = 'inherent' needs the inherent plugin's sigma^2 ([inherent])")
        icfg, sigma2, source = work.inherent
        updates, norms = inherent_updates(
            work.backend.model, params, work.data, ids, icfg, sigma2, source, round_, loss_fn=work.backend.loss_fn
        )
        return LocalResult(updates, norms, None)
