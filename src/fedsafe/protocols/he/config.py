"""``[he]``: the settings of SABLE's homomorphic aggregation (a light module: the config
imports it without loading the HE machinery)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from fedsafe.core.renames import Rename, RenamingSection, deprecated_alias
from fedsafe.protocols.settings import number_or_auto

_RENAMES = (Rename("delta", "bits"), Rename("clamp", "range"))


class HEConfig(RenamingSection):
    """``[he]``: SABLE's homomorphic aggregation.

    Renamed (the old keys are deprecated aliases for one release): ``he.delta`` -> ``he.bits``
    (a bit precision, SABLE's δ, not a privacy δ), ``he.clamp`` -> ``he.range`` (a coordinate
    range [-r, r], not an L2 norm)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    section: ClassVar[str] = "he"
    renames: ClassVar[tuple[Rename, ...]] = _RENAMES

    bits: int = Field(4, ge=2, le=8, description="bit precision of the quantized messages (SABLE's δ)")
    # "auto" (was 0.05, before that 1.0): a fixed C cannot fit every message kind; with bits = 4 a
    # coordinate survives only when |x| > C/14, and zeroth-order scalars (~1e-5..1e-3) are erased
    # by C = 0.05 (100% zeroed, 12.8% on digits) while local-DP messages (noise std z C) are 96%
    # clipped by it; "auto" is 3x the messages' RMS coordinate (fedsafe.protocols.autorange)
    range: float | Literal["auto"] = Field(
        "auto",
        description="coordinate range C: coordinates are clipped to [-C, C] before quantizing; those with "
        "|x| <= C/(2^bits - 2) round to 0. 'auto': each round, 3x the root-mean-square coordinate of the messages: "
        "from the DP clip and noise when DP is on (sqrt(C^2/d + sigma^2)), otherwise the median over the nodes of "
        "each node's own RMS (one extra scalar per round is revealed)",
    )
    subsample: bool = Field(False, description="the server aggregates a uniformly random 2f+1 of the n uploads each round")
    backend: Literal["bfv", "emulator"] = Field("bfv", description="bfv: TenSEAL/SEAL ciphertexts; emulator: same circuit mod p, no encryption")
    workers: int = Field(1, ge=1, le=1024, description="processes evaluating independent ciphertext blocks")
    digits: int | None = Field(None, ge=1, le=8, description="force this many digit planes (default: cheapest plan)")
    poly_modulus_degree: Literal[4096, 8192, 16384, 32768] | None = Field(
        None, description="force the BFV ring degree (= slots per ciphertext); default: cheapest safe one"
    )
    noise_margin_bits: float = Field(12.0, ge=1, le=200, description="modelled noise budget kept at the output")
    check_digits: bool = Field(
        True,
        description="before HTS, check homomorphically that every node's digits are in range and exclude the nodes "
        "whose are not (fedsafe.protocols.he.validity; reveals one valid/invalid bit per node); false: only screen "
        "the decrypted sums, so one such node neutralises the round",
    )

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, v: object) -> object:
        return number_or_auto(cls._key_being_validated("range"), v)

    @model_validator(mode="after")
    def _digits_fit(self) -> HEConfig:
        if self.digits is not None and self.digits > self.bits:
            bits = type(self)._key_being_validated("bits")
            raise ValueError(f"he.digits={self.digits} exceeds {bits}={self.bits} (at most one digit per bit)")
        return self

    delta = deprecated_alias(_RENAMES[0], "he")
    clamp = deprecated_alias(_RENAMES[1], "he")
