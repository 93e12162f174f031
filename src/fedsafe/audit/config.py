"""``[audit]``: canary clients for empirical privacy estimation (a light module: the config
imports it without loading the estimators)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class AuditConfig(BaseModel):
    """Canary clients for empirical privacy estimation (needs dp.enabled and fedavg)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    canaries: int = Field(0, ge=0, description="observed canaries inserted into training (0: off, else >= 2)")
    unobserved: int = Field(0, ge=0, description="canaries tracked but never inserted (0, or >= 2 for ε-all)")
    repetitions: int = Field(1, ge=1, description="presentations of each canary, spread over rounds")
    delta: float | None = Field(None, gt=0, lt=1, description="δ of the estimates (default num_clients^-1.1)")
    alpha: float = Field(
        0.05, gt=0, lt=1, description="1 − confidence of the lower bound eps_lo_valid_* (and of the paper's eps_lo_*)"
    )
    chunk_size: int = Field(256, ge=1, description="canaries per chunk when computing cosines")
    cache_mb: int = Field(256, ge=0, description="keep canaries in memory up to this size")
    final: Literal["model", "delta"] = Field(
        "model", description="statistic's final vector: the final model θ_T, or θ_T − θ_0"
    )

    @property
    def enabled(self) -> bool:
        return self.canaries > 0


def make_plugin(setup: Any) -> Any:
    """The round plugin for ``[audit]`` (``fedsafe.core.plugins.ROUND_PLUGINS``): None unless
    canaries are configured. Canaries are clients of DP-FedAvg, scaled to its clip norm, so the
    DP plugin must have been made first (the config refuses an audit without ``dp.enabled``)."""
    cfg = setup.cfg
    if not cfg.audit.enabled:
        return None
    from fedsafe.audit.plugin import AuditPlugin

    dp = setup.plugins.get("dp")
    if dp is None:
        raise ValueError("audit.canaries needs the DP plugin (dp.enabled = true)")
    return AuditPlugin(
        cfg.audit, seed=setup.seed, rounds=cfg.rounds, num_clients=cfg.clients.num_clients, dp=dp,
        initial=setup.initial,
    )
