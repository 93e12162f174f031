"""The ``[model]`` section of an experiment config."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# lenet's two convolutions have 16 and 64 channels; GroupNorm needs groups to divide both.
LENET_CHANNELS = (16, 64)


class ModelConfig(BaseModel):
    """Which architecture to build and its few knobs.

    ``name``: a built-in model (below), one registered with :func:`fedsafe.register_model`, or
    ``"package.module:Factory"``: your factory ``(cfg, input_shape, num_classes) -> nn.Module``,
    imported by module path when the config is validated (and wherever the model is built).

    ``hidden`` and ``activation`` are used by ``mlp``; ``activation``, ``norm`` and ``groups``
    by ``lenet``. The SABLE CNNs are fixed (ReLU, no normalisation) as in the paper, and
    ``logreg`` has no knobs; settings that an architecture does not use are ignored.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(
        "logreg", description="a built-in or registered model (fedsafe list models; fedsafe.register_model), or "
        "your own factory (cfg, input_shape, num_classes) -> nn.Module as 'package.module:Factory'"
    )
    hidden: int = Field(100, ge=1, description="mlp hidden width")
    activation: Literal["relu", "hardswish"] = "relu"
    norm: Literal["none", "group"] = "none"
    groups: int = Field(4, ge=1, description="GroupNorm groups for lenet")

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        from fedsafe.models.build import model_builder

        model_builder(name)  # a ValueError naming model.name: no such model, or a factory that cannot be imported
        return name

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
