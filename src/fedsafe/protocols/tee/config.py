"""``[tee]``: the settings of the enclave-encoded offload (a light module: the config imports
it without loading the enclave, its processes or its crypto)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from fedsafe.core.renames import Rename, RenamingSection, deprecated_alias
from fedsafe.protocols.settings import number_or_auto
from fedsafe.protocols.tee.leakage import DEFAULT_NOISE_RATIO, noise_ratio_for_bits


_RENAMES = (Rename("accelerators", "execution", {"same": "serial"}),)


class TEEConfig(RenamingSection):
    """``[tee]``: the TEE offload (used when ``protocol = "tee"``).

    Noise: set ``noise_ratio`` (ρ = σ²/Var, with Var = clip²/d the per-coordinate variance the
    clipping allows) or ``target_bits`` (the per-round mutual-information bound per client and
    accelerator; ρ = 1/(2^{2b/d} − 1)), not both. With neither, ρ = 1e6
    (≈ 7.2e-7·d bits per round: 0.07 bits at d = 1e5).

    Where the parties run: ``execution = "serial"`` keeps the accelerators placed like the
    enclave, and ``processes`` then decides whether the enclave and the accelerators run in
    their own OS processes (true) or in this one (false); ``execution = "ray"`` puts each
    accelerator on a Ray actor (any node of a cluster). Renamed: ``tee.accelerators`` ('same' |
    'ray') is now ``tee.execution`` ('serial' | 'ray'); the old key (and 'same') stays accepted
    as a deprecated alias for one release.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    section: ClassVar[str] = "tee"
    renames: ClassVar[tuple[Rename, ...]] = _RENAMES

    noise_ratio: float | None = Field(
        None, gt=0, le=1e16, allow_inf_nan=False,
        description="σ²/Var (default 1e6 when target_bits is unset); larger hides more and cancels more",
    )
    target_bits: float | None = Field(
        None, gt=0, le=1e15, allow_inf_nan=False,
        description="per-round mutual-information bound (bits, per client and accelerator) to meet instead",
    )
    clip: float | Literal["auto"] = Field(
        "auto",
        description="L2 bound on updates: the enclave clips to it; Var = clip²/d in the leakage bound. 'auto': with "
        "DP, the DP clip plus a tail bound on the local noise's norm; otherwise, resolved once in the first round, "
        "4x the median L2 norm of that round's updates (computed inside the enclave; the resolved clip is reported)",
    )
    arithmetic: Literal["exact", "float64"] = Field(
        "exact",
        description="exact: fixed-point encoding + split Gram (3 GEMMs), error ≈ u·2^-β·ρ; "
        "float64: the paper's single Gram, error ≈ u·ρ (warned above 1e-9)",
    )
    processes: bool = Field(
        True, description="with execution = 'serial': enclave and accelerators in their own OS processes (spawn), "
        "or all in this process (false)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="accelerators' device (auto: CUDA if present)")
    execution: Literal["serial", "ray"] = Field(
        "serial", description="where the accelerators run: serial: placed like the enclave (tee.processes decides "
        "whether in their own OS processes); ray: each on a Ray actor (any node of a cluster)"
    )
    accelerator_gpus: float = Field(0.0, ge=0, description="GPUs reserved per Ray accelerator actor")
    precompute_rounds: int = Field(0, ge=0, le=100_000, description="noise blocks drawn ahead (offline phase)")
    sealed_dir: str | None = Field(None, description="keep precomputed noise sealed (AES-GCM) in this folder")
    timeout_s: float = Field(600.0, gt=0, le=86_400, description="longest wait for any party's reply")

    @field_validator("clip", mode="before")
    @classmethod
    def _clip(cls, v: object) -> object:
        return number_or_auto("tee.clip", v, upper=1e15)

    @model_validator(mode="after")
    def _one_noise_setting(self) -> TEEConfig:
        if self.noise_ratio is not None and self.target_bits is not None:
            raise ValueError("set tee.noise_ratio or tee.target_bits, not both")
        return self

    accelerators = deprecated_alias(_RENAMES[0], "tee")

    def resolved_noise_ratio(self, d: int) -> float:
        """ρ for updates of dimension ``d``."""
        if self.target_bits is not None:
            return noise_ratio_for_bits(d, self.target_bits)
        return DEFAULT_NOISE_RATIO if self.noise_ratio is None else self.noise_ratio

    def enclave_settings(self) -> dict[str, Any]:
        return {"clip": self.clip, "noise_ratio": self.noise_ratio, "target_bits": self.target_bits,
                "arithmetic": self.arithmetic, "sealed_dir": self.sealed_dir}
