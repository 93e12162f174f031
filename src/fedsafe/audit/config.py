"""``[audit]``: canary clients for empirical privacy estimation (a light module: the config
imports it without loading the estimators)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator


class AuditConfig(BaseModel):
    """Canary clients for empirical privacy estimation (needs dp.enabled and fedavg)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    enabled: bool = Field(
        False, description="insert canaries and estimate ε (the switch; true when canaries > 0 and it is not set)"
    )
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

    @model_validator(mode="before")
    @classmethod
    def _count_switches_on(cls, data: Any) -> Any:
        # canaries are what the audit inserts: a count without `enabled` switches it on, as it
        # always has; `enabled = false` with a count keeps it off
        if isinstance(data, dict) and "enabled" not in data:
            count = data.get("canaries", 0)
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                return {**data, "enabled": True}
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # `enabled` is written only where it differs from what the count says (enabled = false
        # with canaries), so a saved config or a variant that later sets canaries = 0 is off,
        # as before the key existed, instead of contradicting a stored enabled = true
        out = handler(self)
        if out.get("enabled") == (self.canaries > 0):
            out.pop("enabled", None)
        return out

    @model_validator(mode="after")
    def _needs_canaries(self) -> AuditConfig:
        if self.enabled and self.canaries == 0:
            raise ValueError("audit.enabled = true needs audit.canaries >= 2 (the canaries the audit inserts)")
        return self


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
