"""The ``[model]`` section of an experiment config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# lenet's two convolutions have 16 and 64 channels; GroupNorm needs groups to divide both.
LENET_CHANNELS = (16, 64)


class ModelConfig(BaseModel):
    """Which architecture to build and its few knobs.

    ``hidden`` and ``activation`` are used by ``mlp``; ``activation``, ``norm`` and ``groups``
    by ``lenet``. The SABLE CNNs are fixed (ReLU, no normalisation) as in the paper, and
    ``logreg`` has no knobs; settings that an architecture does not use are ignored.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: Literal["logreg", "mlp", "cnn_fmnist", "cnn_cifar", "lenet"] = "logreg"
    hidden: int = Field(100, ge=1, description="mlp hidden width")
    activation: Literal["relu", "hardswish"] = "relu"
    norm: Literal["none", "group"] = "none"
    groups: int = Field(4, ge=1, description="GroupNorm groups for lenet")

    @field_validator("groups")
    @classmethod
    def _groups_divide_channels(cls, groups: int) -> int:
        bad = [c for c in LENET_CHANNELS if c % groups]
        if bad:
            valid = [g for g in range(1, min(LENET_CHANNELS) + 1)
                     if all(c % g == 0 for c in LENET_CHANNELS)]
            raise ValueError(
                f"model.groups = {groups} must divide lenet's channel counts "
                f"{' and '.join(map(str, LENET_CHANNELS))}; valid: {', '.join(map(str, valid))}"
            )
        return groups
