"""``[zo]``: the settings of BAFFLE's zeroth-order clients (a light module: the config imports
it without loading the estimator)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ZOConfig(BaseModel):
    """``[zo]``: BAFFLE's zeroth-order clients (used when clients.gradient = "zeroth_order").

    With dsgd (FedSGD) a client uploads K loss differences (4K bytes) at perturbations shared by
    all clients through the round seed; the server regenerates them and decodes the gradient
    estimate. With fedavg a client runs local zeroth-order steps and uploads its model delta.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)

    k: int = Field(100, ge=1, le=1_000_000, description="perturbed forward passes per client per round")
    sigma: float = Field(1e-4, gt=0, description="perturbation std")
    scheme: Literal["forward", "central"] = Field(
        "forward", description="forward: L(W+δ)−L(W), K directions; central: L(W+δ)−L(W−δ), K/2 directions"
    )
    chunk: int = Field(16, ge=1, description="perturbed models per batched forward call (1: plain loop)")
    decode_chunk: int = Field(64, ge=1, description="perturbations regenerated per server step")
    clip_inf: float | None = Field(
        0.3, gt=0, description="rescale each zeroth-order gradient estimate to this ∞-norm: the decoded aggregate "
        "(dsgd), every local step's (fedavg) (None: off)"
    )

    @model_validator(mode="after")
    def _even(self) -> ZOConfig:
        if self.scheme == "central" and self.k % 2:
            raise ValueError(f"zo.k = {self.k} must be even with zo.scheme = 'central' (K/2 pairs)")
        return self
