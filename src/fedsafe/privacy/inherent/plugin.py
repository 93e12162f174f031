"""The paper's FedSGD experiment inside the engine: ``clients.algorithm = "inherent"``.

Each round every sampled user computes the clipped per-example gradients of ALL its records
(``per_example_grads``) and releases one row of Table 1 (``inherent.row``, e.g. ``gsgd+wf_na``:
Gaussian sampling weights plus water-filling noise); the server sees only the sum (ideal secure
aggregation — numerically the plain mean, or ``protocol = "secagg"``) and steps. ε per round
comes from the row's data-independent bound (:func:`epsilon_schedule`) for the smallest user
dataset D (the conservative choice for unequal partitions), composed by RDP summation or KOV.
``inherent.target_epsilon`` calibrates σ² for the run instead of giving it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.plugins import ClientTransform, Observer, RoundHost
from fedsafe.core.randomness import RandomSource
from fedsafe.privacy.inherent.bounds import TABLE1_ROWS
from fedsafe.privacy.inherent.composition import calibrate_sigma2, epsilon_schedule
from fedsafe.privacy.inherent.config import InherentConfig, Row
from fedsafe.privacy.inherent.gradients import per_example_grads
from fedsafe.privacy.inherent.mechanisms import client_update

assert set(Row.__args__) == set(TABLE1_ROWS)  # type: ignore[attr-defined]




def inherent_updates(
    model: torch.nn.Module, params: Tensor, data, ids: np.ndarray, cfg: InherentConfig, sigma2: float,
    source: RandomSource, round_: int, loss_fn=None,
) -> tuple[Tensor, Tensor]:
    """Each user's released vector and its mean per-example loss proxy (the clipped grad norm);
    ``loss_fn(logits, y)``: the training loss (default: cross-entropy). User c's sampling and
    noise come from ``source``'s stream ``("inherent", round, c)`` (secret unless the run is
    seeded)."""
    mechanism, noise = cfg.row.split("+")
    out, norms = [], []
    for c in ids:
        idx = torch.from_numpy(data.client_indices[c][: cfg.max_records])
        grads = per_example_grads(
            model, params, data.x_train[idx], data.y_train[idx], clip=cfg.example_clip, loss_fn=loss_fn
        )
        x = client_update(
            grads, mechanism=mechanism, batch_size=min(cfg.batch_size, grads.shape[0]), noise=noise,
            sigma=math.sqrt(sigma2), generator=source.stream("inherent", round_, int(c)),
            wf_method=cfg.wf_method, wf_blocks=cfg.wf_blocks,
        )
        out.append(x.to(params.dtype))
        norms.append(grads.norm(dim=1).mean())
    return torch.stack(out), torch.stack(norms)


class InherentPlugin(ClientTransform, Observer):
    """Reports the row's cumulative ε per round (and σ², calibrated or given)."""

    name = "inherent"

    def __init__(
        self, cfg: InherentConfig, *, rounds: int, num_users: int, dataset_size: int, source: RandomSource
    ) -> None:
        self.cfg = cfg
        self.source = source
        kw = dict(num_users=num_users, clip=cfg.example_clip, dataset_size=dataset_size, batch_size=cfg.batch_size,
                  composition=cfg.composition)
        self.sigma2 = cfg.sigma2 if cfg.sigma2 is not None else calibrate_sigma2(
            cfg.target_epsilon, cfg.row, rounds, cfg.delta, **kw
        )
        self.schedule = epsilon_schedule(cfg.row, rounds, cfg.delta, sigma2=self.sigma2, **kw)

    def configure_clients(self, work: Any) -> None:
        # the clients release the row with this σ², noised from this source (algorithm = "inherent")
        configure = getattr(work.algorithm, "configure", None)
        if configure is not None:
            configure(self.cfg, self.sigma2, self.source)

    def on_round_end(self, fed: RoundHost, row: dict[str, Any]) -> dict[str, Any]:
        eps = float(self.schedule[row["round"] - 1])
        return {"epsilon": eps, "delta": self.cfg.delta, "sigma2": self.sigma2}

    def summary(self, fed: RoundHost) -> dict[str, Any]:
        return {"inherent_row": self.cfg.row, "sigma2": self.sigma2}
