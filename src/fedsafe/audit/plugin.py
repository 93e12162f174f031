"""``[audit]``: one-shot empirical privacy estimation during a DP-FedAvg run (Andrew et al. 2023).

Canary clients join rounds as extra participants (``extra_messages``): each sends a fixed random
unit direction scaled to the round's clip norm, so clipping leaves it unchanged and it is noised
with everyone else. After DP noise is added, the released aggregate is folded into the
max-over-rounds cosines (``transform_aggregate``, after the DP plugin). At the end the cosines
with the final model (and the max-over-rounds ones) give ε_est (equal-variance, and the paper's
fitted-σ̂ one), the paper's optimistic ε_lo and a valid held-out 95% lower bound, written to
``summary.json`` and as histograms of canary cosines against the null.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedsafe.audit.config import AuditConfig
from fedsafe.audit.observer import CanaryAudit
from fedsafe.core.plugins import Observer, RoundHost, ServerTransform
from fedsafe.core.types import Aggregate, Message, RoundContext


class AuditPlugin(ServerTransform, Observer):
    name = "audit"

    def __init__(self, cfg: AuditConfig, *, seed: int, rounds: int, num_clients: int, dp: Any,
                 initial: Tensor) -> None:
        """``dp`` is the run's DP plugin: canaries are scaled to its current clip norm
        (``dp.clip``, which adaptive clipping moves) and the analytic ε uses its ``plan.z``."""
        self.cfg = cfg
        self.audit = CanaryAudit(
            seed, initial.numel(), rounds, canaries=cfg.canaries, unobserved=cfg.unobserved,
            repetitions=cfg.repetitions, chunk_size=cfg.chunk_size, cache_bytes=cfg.cache_mb * 2**20,
        )
        self.num_clients = num_clients
        self.dp = dp
        self.noise_multiplier = dp.plan.z
        self.delta = cfg.delta if cfg.delta is not None else num_clients ** -1.1
        self.initial = initial.clone()
        self._round_metrics: dict[str, float] = {}

    def extra_messages(self, ctx: RoundContext, dim: int) -> list[Message]:
        ids, rows = self.audit.round_updates(ctx.round, self.dp.clip)
        if rows.shape[1] != dim:  # adaptive clipping appends the bit: a canary's bit is 1
            import torch

            rows = torch.cat([rows, rows.new_ones(rows.shape[0], dim - rows.shape[1])], dim=1)
        return [Message(self.num_clients + cid, rows[i]) for i, cid in enumerate(ids)]

    def transform_aggregate(self, vector: Tensor, ctx: RoundContext, agg: Aggregate | None) -> Tensor:
        self._round_metrics = self.audit.observe_round(vector[: self.audit.bank.dim], ctx.round)
        return vector

    def on_round_end(self, fed: RoundHost, row: dict[str, Any]) -> dict[str, Any]:
        out, self._round_metrics = self._round_metrics, {}
        out["canaries"] = len(self.audit.participants(row["round"]))
        return out

    def summary(self, fed: RoundHost) -> dict[str, Any]:
        final = fed.state.params if self.cfg.final == "model" else fed.state.params - self.initial
        result = self.audit.finish(final, self.delta, noise_multiplier=self.noise_multiplier, alpha=self.cfg.alpha)
        if fed.out_dir is not None:
            CanaryAudit.write(fed.out_dir, result)
        keys = ("eps_est_final", "eps_est_all", "eps_est_final_fitted", "eps_est_all_fitted", "eps_lo_final",
                "eps_lo_all", "eps_lo_valid_final", "eps_lo_valid_all", "eps_analytical")
        return {**{k: result.summary.get(k) for k in keys}, "audit": result.summary}

    def state_dict(self) -> dict[str, Any]:
        return self.audit.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.audit.load_state_dict(state)
