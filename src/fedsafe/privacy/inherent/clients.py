"""``clients.algorithm = "inherent"`` (registered in ``fedsafe.core.clients``): Zhang et al.'s
FedSGD, each user releasing one Table 1 row over its records with the σ² the inherent plugin
calibrated (:meth:`InherentClients.configure`, called by ``InherentPlugin.configure_clients``):
the algorithm holds that release, ships it to Ray tasks (``shared_state``) and sends σ² to
Flower nodes (``remote_settings``), which rebuild it with their own noise source."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from fedsafe.core.clients import ClientAlgorithm, LocalResult
from fedsafe.privacy.inherent.plugin import inherent_updates


class InherentClients(ClientAlgorithm):
    """FedSGD releasing a Table 1 row (Zhang et al.)"""

    def __init__(self) -> None:
        self.release: tuple[Any, float, Any] | None = None  # (InherentConfig, σ², RandomSource)

    def configure(self, cfg: Any, sigma2: float, source: Any) -> None:
        """The row's settings, its σ² (given or calibrated by the plugin) and the noise source."""
        self.release = (cfg, float(sigma2), source)

    def shared_state(self) -> tuple[Any, float, Any] | None:
        return self.release

    def load_shared_state(self, state: Any) -> None:
        self.release = state

    def remote_settings(self) -> dict[str, float]:
        return {} if self.release is None else {"inherent_sigma2": float(self.release[1])}

    def load_remote_settings(self, settings: Any, *, experiment: Any, source: Any) -> None:
        if "inherent_sigma2" in settings:
            self.configure(experiment.inherent, float(settings["inherent_sigma2"]), source)

    def run(self, work: Any, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None,
            poison: Any) -> LocalResult:
        if self.release is None:
            raise ValueError("clients.algorithm = 'inherent' needs the inherent plugin's sigma^2 ([inherent])")
        icfg, sigma2, source = self.release
        updates, norms = inherent_updates(
            work.backend.model, params, work.data, ids, icfg, sigma2, source, round_, loss_fn=work.backend.loss_fn
        )
        return LocalResult(updates, norms, None)
