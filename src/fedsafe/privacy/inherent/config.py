"""``[inherent]``: the Table 1 row each user releases and how its ε is composed (a light
module: the config imports it without loading torch.func or scipy)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from fedsafe.core.renames import Rename, RenamingSection, deprecated_alias

Row = Literal["sgd_iid+isotropic", "sgd_iid+wf_na", "gd+isotropic", "gd+wf_na", "gsgd+isotropic", "gsgd+wf_na"]


_RENAMES = (Rename("clip", "example_clip"),)


class InherentConfig(RenamingSection):
    """``[inherent]``: the Table 1 row each user releases and how its ε is composed.

    Renamed: ``inherent.clip`` is now ``inherent.example_clip`` (a per-example L2 clip norm;
    the old key stays accepted as a deprecated alias for one release)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    section: ClassVar[str] = "inherent"
    renames: ClassVar[tuple[Rename, ...]] = _RENAMES
    row: Row = "gsgd+wf_na"
    example_clip: float = Field(10.0, gt=0, description="per-example L2 clip norm C")
    batch_size: int = Field(32, ge=1, description="B: minibatch size (sgd_iid) / variance scale (gsgd)")
    sigma2: float | None = Field(None, gt=0, description="σ²: isotropic noise variance or WF-NA floor")
    target_epsilon: float | None = Field(None, gt=0, description="calibrate σ² to reach this ε")
    delta: float = Field(1e-4, gt=0, lt=1)
    composition: Literal["rdp", "kov"] = "rdp"
    wf_method: Literal["exact", "block"] = "exact"
    wf_blocks: int = Field(1, ge=1)
    max_records: int | None = Field(None, ge=1, description="records per user used each round (default: all)")

    @model_validator(mode="after")
    def _one_sigma(self) -> InherentConfig:
        if (self.sigma2 is None) == (self.target_epsilon is None):
            raise ValueError("set exactly one of inherent.sigma2 and inherent.target_epsilon")
        return self

    clip = deprecated_alias(_RENAMES[0], "inherent")

    @property
    def enabled(self) -> bool:
        """The section's switch: present is on (it comes with ``clients.algorithm = "inherent"``)."""
        return True


def make_plugin(setup: Any) -> Any:
    """The round plugin for ``[inherent]`` (``fedsafe.core.plugins.ROUND_PLUGINS``): None without
    the section. σ² is calibrated for the smallest user (its records, capped by ``max_records``)."""
    cfg = setup.cfg
    if cfg.inherent is None:
        return None
    from fedsafe.privacy.inherent.plugin import InherentPlugin

    icfg = cfg.inherent
    d_min = min(setup.client_sizes) if icfg.max_records is None else min(min(setup.client_sizes), icfg.max_records)
    return InherentPlugin(
        icfg, rounds=cfg.rounds, num_users=cfg.clients.num_clients, dataset_size=d_min, source=setup.source
    )
