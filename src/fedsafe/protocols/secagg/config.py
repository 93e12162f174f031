"""Configuration of secure aggregation, and the numbers derived from it for a round of n clients.

Choices (documented here once, used everywhere):

* **Fixed point.** Each coordinate is clipped to its range ``[lo, hi]``, shifted to
  ``[0, hi - lo]`` and rounded to the nearest of ``2^q`` levels, i.e. an integer in ``[0, 2^q)``.
  The sum of ``n`` such integers is below ``n (2^q - 1)``; requiring ``n (2^q - 1) < 2^bits``
  makes the sum exact in ``Z_{2^bits}`` — overflow is impossible by construction, not by luck,
  whatever the ranges. ``q`` is ``quant_bits`` when given, else the largest value meeting that
  inequality (capped at 52, the resolution of a float64).
* **Ranges** (``range``; ``clip`` before, a deprecated alias for one release: these are
  coordinate ranges, not L2 norms). A number ``c``: every coordinate in ``[-c, c]``, as the user asked.
  ``"auto"`` (the default): without DP, ``[-1, 1]``: the server never holds the updates to
  calibrate on (over Flower they stay on the nodes), and with ``q >= 16`` bits the step
  ``2 / (2^q - 1)`` is fine enough for every message kind (``7.5e-9`` at 32 bits and 8 clients,
  against zeroth-order scalars of ``1e-5..1e-3``); a round that clips more than 10% of the
  coordinates, or whose step exceeds the released mean's RMS coordinate, warns once naming
  ``secagg.range`` (``SecAggProtocol._warn_destroyed``); with DP (``dp.placement`` ``local`` or
  ``distributed``; ``central`` cannot run under secagg), a range per kind of message coordinate,
  derived each round from what the DP plugin declares (:mod:`.ranges`): the update's
  coordinates lie in ``[-C, C]`` (an update clipped to L2 norm ``C``, the current clip norm),
  the adaptive-clipping bit in ``[0, 1]``, and each client adds Gaussian noise of std ``σ`` to
  them (``z C / sqrt(n_s)`` and ``σ_b / sqrt(n_s)`` for distributed shares, ``z C`` for local
  noise). Each range is widened by ``k σ``, with ``k`` the smallest factor such that, by a union
  bound over the round's ``n`` clients and ``d`` coordinates, ``P(any coordinate clipped) <=
  n d 2 Φ(-k) = range_probability`` (default ``1e-15``; ``k`` is about 9–11 for any realistic
  ``n d``). The encoder counts the coordinates it clips, and every client adds two more masked
  words — whether it clipped and how many coordinates — so the server learns only their sums,
  like the rest of the input (``secagg_clipped_clients``, ``secagg_clipped_coordinates``).
* **Threshold.** Every client Shamir-shares its secrets among its *share group*: itself and its
  neighbours (all other participants for the complete graph, Bonawitz et al. 2017; ``k``
  neighbours for SecAgg+, Bell et al. 2020), so the group has ``g = n`` or ``g = k + 1``
  members. A fractional ``threshold`` ``f`` gives ``t = floor(f g) + 1`` (strictly more than a
  fraction ``f`` of the group); an integer gives ``t`` directly. Either way ``t`` must be a
  strict majority of the group, ``floor(g/2) + 1 <= t <= g`` (:func:`min_threshold`), so a
  fraction must be in ``[1/2, 1)``: each honest holder reveals one of a client's two secrets,
  never both, so a server that asks different holders for different secrets of one client
  (telling some it survived and others it dropped) collects ``t`` shares of both only if two
  disjoint sets of ``t`` holders exist, i.e. ``2 t <= g``. Every client checks the ``t`` the
  server announces against its own group, so a server cannot lower it. With ``c`` clients of a
  group colluding with the server (each reveals both shares) the condition is
  ``t > (g + c) / 2``; Bonawitz et al.'s active-adversary analysis takes ``c < n/3`` and
  ``t > 2n/3``: set ``threshold = 0.67`` for that. Up to ``g - t`` of a group may drop out.
  A round also aborts when fewer than ``t`` clients send masked inputs, so the server never
  learns a sum of fewer than ``t >= 2`` inputs.
* **Neighbours (SecAgg+).** A random Harary graph (Bell et al.): participants are placed on a
  ring in a random order and joined to the ``k/2`` nearest on each side, so ``k`` is even. The
  default is ``k = 2 ceil(log2 n)`` (``O(log n)``); when ``k >= n - 1`` the graph is complete.
  With small ``k`` a share group tolerates only ``g - t`` dropouts, so high dropout rates need a
  larger ``k`` (the round aborts otherwise, with the client whose secrets could not be rebuilt).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from fedsafe.core.renames import Rename, RenamingSection, deprecated_alias
from fedsafe.protocols.settings import number_or_auto
from fedsafe.protocols.secagg.errors import SecAggError

if TYPE_CHECKING:
    from fedsafe.protocols.secagg.fixedpoint import Ranges

STAGES = ("advertise", "share", "mask", "unmask")  # semi-honest protocol
ACTIVE_STAGES = ("advertise", "share", "mask", "consistency", "unmask")  # adversary = "active"
Stage = Literal["advertise", "share", "mask", "consistency", "unmask"]
Adversary = Literal["semi_honest", "active"]

MAX_QUANT_BITS = 52  # float64 resolution: finer levels than this cannot be told apart

_RENAMES = (
    Rename("clip", "range"),
    Rename("clip_probability", "range_probability"),
    Rename("placement", "execution", {"local": "serial"}),
)


class SecAggConfig(RenamingSection):
    """Secure aggregation parameters (config section ``[secagg]``).

    Renamed (the old keys are deprecated aliases for one release): ``secagg.clip`` ->
    ``secagg.range`` and ``secagg.clip_probability`` -> ``secagg.range_probability`` (coordinate
    ranges [-r, r], not L2 norms); ``secagg.placement`` ('local' | 'ray') -> ``secagg.execution``
    ('serial' | 'ray')."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    section: ClassVar[str] = "secagg"
    renames: ClassVar[tuple[Rename, ...]] = _RENAMES

    bits: int = Field(32, ge=16, le=62, description="arithmetic is in Z_{2^bits}")
    quant_bits: int | None = Field(
        None, ge=1, le=MAX_QUANT_BITS,
        description="levels 2^quant_bits per coordinate; default: the most that cannot overflow",
    )
    range: float | Literal["auto"] = Field(
        "auto",
        description="coordinates clipped to [-range, range]; 'auto': [-1, 1] without DP (2^q levels: fine for gradients "
        "and zeroth-order scalars alike; a run that clips >10% or rounds its mean away warns), with DP a range per kind "
        "of coordinate from the DP clip norm and noise, widened so that clipping noise has probability <= "
        "range_probability",
    )
    range_probability: float = Field(
        1e-15, gt=0, lt=1, allow_inf_nan=False,
        description="with DP: the tail bound of 'auto' ranges, P(any client's noisy coordinate clipped in a round); "
        "an explicit range that exceeds it is warned about, and its clipped shares are not credited",
    )
    threshold: int | float = Field(
        0.5, description="fraction f in [0.5, 1) of each share group (t = floor(f g) + 1), or a count t "
        "with g/2 < t <= g",
    )
    adversary: Adversary = Field(
        "semi_honest",
        description="semi_honest: the server follows the protocol (Bonawitz et al. Fig. 4 without "
        "signatures); active: a malicious server (signed keys from a PKI and the consistency check)",
    )
    graph: Literal["complete", "k_regular"] = "complete"
    k: int | None = Field(None, ge=2, description="neighbours per client for k_regular (even)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="simulated dropout probability per client per stage")
    dropout_stages: tuple[Stage, ...] | None = Field(
        None, min_length=1, description="stages at which simulated dropouts happen; default: every stage"
    )
    execution: Literal["serial", "ray"] = Field(
        "serial", description="where client parties run: serial: in this process, one after another; ray: one "
        "Ray actor each"
    )

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold_not_bool(cls, v: object) -> object:
        if isinstance(v, bool):
            raise ValueError("threshold must be a fraction in (0, 1) or a count >= 2, not a boolean")
        return v

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, v: int | float) -> int | float:
        if isinstance(v, int):
            if v < 2:
                raise ValueError(f"threshold as a count must be >= 2 (one share would be the secret), got {v}")
        elif not math.isfinite(v) or not 0.0 < v < 1.0:
            raise ValueError(f"secagg.threshold as a fraction must be in [0.5, 1), got {v}; give a count as an integer")
        elif v < 0.5:
            raise ValueError(
                f"secagg.threshold = {v} is at most half of most share groups (t = floor({v} g) + 1 <= g/2), "
                "which lets a server rebuild both secrets of a client from two halves of its group; "
                "valid: a fraction in [0.5, 1), or a count t with g/2 < t <= g"
            )
        return v

    @field_validator("range", mode="before")
    @classmethod
    def _range(cls, v: object) -> object:
        return number_or_auto(cls._key_being_validated("range"), v)

    @field_validator("dropout_stages")
    @classmethod
    def _stages(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"dropout_stages repeats a stage: {list(v)}")
        return v

    @model_validator(mode="after")
    def _graph(self) -> SecAggConfig:
        if self.dropout_stages is not None and "consistency" in self.dropout_stages and self.adversary != "active":
            raise ValueError("dropout_stages: the 'consistency' stage exists only with secagg.adversary = 'active'")
        if self.k is not None:
            if self.graph != "k_regular":
                raise ValueError("k is only used with graph = 'k_regular'")
            if self.k % 2:
                raise ValueError(f"k must be even (random Harary graph: k/2 ring neighbours each side), got {self.k}")
        return self

    @property
    def stages(self) -> tuple[str, ...]:
        """The protocol's stages: ``STAGES``, or ``ACTIVE_STAGES`` with the consistency check."""
        return ACTIVE_STAGES if self.adversary == "active" else STAGES

    @property
    def drop_stages(self) -> tuple[str, ...]:
        """The stages at which simulated dropouts happen (``dropout_stages``, default all)."""
        return self.dropout_stages if self.dropout_stages is not None else self.stages

    # --- numbers for a round of n participants ------------------------------------------------

    def num_neighbors(self, n: int) -> int:
        """Neighbours per client among ``n`` participants (``n - 1`` for the complete graph)."""
        _check_n(n)
        if self.graph == "complete":
            return n - 1
        k = self.k if self.k is not None else default_k(n)
        return min(k, n - 1)

    def is_complete(self, n: int) -> bool:
        return self.num_neighbors(n) >= n - 1

    def share_threshold(self, n: int) -> int:
        """Shares ``t`` needed to rebuild a secret, for share groups of ``k + 1`` (or ``n``)."""
        k = self.num_neighbors(n)
        g = k + 1
        if isinstance(self.threshold, int):
            t = self.threshold
        else:
            t = math.floor(self.threshold * g) + 1
        t = max(t, 2)
        group = f"all n = {n} participants" if self.is_complete(n) else f"its k = {k} neighbours and itself, n = {n}"
        if t > g:
            raise SecAggError(
                f"threshold t = {t} exceeds the share group size {g} "
                f"({group}); lower secagg.threshold"
                + ("" if self.is_complete(n) else " or raise secagg.k")
            )
        if t < min_threshold(g):
            raise SecAggError(
                f"secagg.threshold = {self.threshold} gives t = {t}, at most half of the share group of "
                f"g = {g} ({group}): a server could rebuild both secrets of a client from two halves of its "
                f"group; valid: {min_threshold(g)} <= t <= {g} (or a fraction in [0.5, 1))"
            )
        return t

    def effective_quant_bits(self, n: int) -> int:
        """``q``: levels ``2^q`` per coordinate such that ``n (2^q - 1) < 2^bits``."""
        _check_n(n)
        limit = 1 << self.bits
        q_max = min(MAX_QUANT_BITS, ((limit - 1) // n + 1).bit_length() - 1)
        if q_max < 1:
            raise SecAggError(f"bits = {self.bits} cannot hold a sum of {n} clients; raise secagg.bits")
        if self.quant_bits is None:
            return q_max
        q = self.quant_bits
        if n * ((1 << q) - 1) >= limit:
            raise SecAggError(
                f"overflow possible: n (2^q - 1) = {n} x {(1 << q) - 1} = {n * ((1 << q) - 1)} >= 2^bits = "
                f"2^{self.bits} = {limit}; with {n} clients use secagg.quant_bits <= {q_max} "
                f"or secagg.bits >= {(n * ((1 << q) - 1)).bit_length()}"
            )
        return q

    def check_capacity(self, num_clients: int) -> int:
        """Raise (with the numbers) unless ``num_clients`` quantized inputs sum without overflow
        and the threshold fits the share groups; return ``q``. Call at config time with the
        largest possible number of participants."""
        q = self.effective_quant_bits(num_clients)
        self.share_threshold(num_clients)
        return q

    @property
    def fixed_range(self) -> float:
        """The range half-width without DP: ``range``, or 1.0 for ``"auto"``."""
        return 1.0 if self.range == "auto" else float(self.range)

    @property
    def fixed_clip(self) -> float:
        """``fixed_range`` (its name before ``secagg.clip`` became ``secagg.range``)."""
        return self.fixed_range

    clip = deprecated_alias(_RENAMES[0], "secagg")
    clip_probability = deprecated_alias(_RENAMES[1], "secagg")
    placement = deprecated_alias(_RENAMES[2], "secagg")

    def quantization_step(self, n: int, ranges: Ranges | None = None) -> float:
        """Largest distance between quantization levels: ``(hi - lo) / (2^q - 1)`` of the widest
        range (``2 r / (2^q - 1)`` for ``[-r, r]``; ``ranges`` default: that one)."""
        q = self.effective_quant_bits(n)
        if ranges is None:
            return 2.0 * self.fixed_range / ((1 << q) - 1)
        return max(ranges.steps(q))

    def quantization_error_bound(self, n: int, ranges: Ranges | None = None) -> float:
        """Per-coordinate bound on |decoded mean - mean of the clipped inputs| in a round of ``n``
        participants: half a step, ``(hi - lo) / (2 (2^q - 1))`` (each input is rounded to the
        nearest level, and a mean of such errors is bounded the same way), plus ``4 eps m`` for
        the float64 arithmetic of encoding and decoding (``eps = 2^-52``, ``m`` the largest
        ``|lo|``, ``|hi|``; it matters only for ``q`` near 52). Clipping error comes on top and
        depends on the data."""
        m = self.fixed_range if ranges is None else ranges.max_abs()
        return self.quantization_step(n, ranges) / 2.0 + 4.0 * 2.0**-52 * m


def min_threshold(g: int) -> int:
    """The smallest safe threshold for a share group of ``g``: ``floor(g/2) + 1``, the least
    ``t`` with ``2 t > g`` (no two disjoint sets of ``t`` holders)."""
    return g // 2 + 1


def default_k(n: int) -> int:
    """SecAgg+ default neighbours: ``2 ceil(log2 n)`` — O(log n) as in Bell et al., even."""
    return 2 * max(1, math.ceil(math.log2(max(n, 2))))


def _check_n(n: int) -> None:
    if n < 2:
        raise SecAggError(f"secure aggregation needs at least 2 participants, got {n}")
