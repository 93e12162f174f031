"""Leakage accounting: the paper's mutual-information bound, from the clipping bound and σ².

Hashemi et al., Corollary 1: with ``Y_i = g_i ± R_i`` and ``R_i ~ N(0, σ² I_d)``, what one
accelerator can learn about ``g_i`` in a round is

    I(g_i; Y_1..Y_N) = I(g_i; Y_i) ≤ Σ_k ½ log₂(1 + Var(g_ik) / σ²)   bits.

**From the clipping bound.** The enclave clips every update to ``‖g‖ ≤ clip``, so
``Σ_k Var(g_ik) ≤ E‖g_i‖² ≤ clip²``. The right-hand side is concave in the variances, so over
all allocations with that total it is largest when they are equal, ``Var = clip² / d``:

    bits ≤ (d / 2) · log₂(1 + 1 / ρ),   ρ = σ² / Var = σ² d / clip².

That is the number reported per round (``mi_bound_bits``; per client, per accelerator). The
noise is fresh every round and the channel memoryless, so over ``T`` rounds the bits add up
(``mi_bound_bits_total``). The two accelerators are assumed not to collude (each sees one of
``g ± R``; together they see ``g``).

**Parameters.** ``ρ`` is set directly (``noise_ratio``) or from a per-round target ``b`` bits:
``ρ = 1 / (2^{2b/d} − 1)``. Then ``σ² = ρ clip² / d`` and the noise constant
``C = ‖R_i − R_j‖² = 2 d σ² = 2 ρ clip²`` (rows of norm ``√(C/2)``).

**Caveats** (documented in ``threats`` too). The bound is the paper's, under its Gaussian
approximation of the noise. The noise actually used has rows of *fixed* norm ``√(C/2)``, drawn
as orthonormal rows (uniform directions, mutually orthogonal), not i.i.d. Gaussian: an
accelerator that knows ``C`` learns ``‖Y_i − g_i‖² = C/2`` exactly, i.e. one scalar equation in
``g_i`` (≈ its projection on ``Y_i / ‖Y_i‖``), which the Gaussian bound does not count.
"""

from __future__ import annotations

import math

# ρ = σ²/Var when neither tee.noise_ratio nor tee.target_bits is set (≈ 7.2e-7·d bits per round)
DEFAULT_NOISE_RATIO = 1e6

#: ``tee.clip = "auto"`` without DP: this many times the median L2 norm of the first round's
#: finite updates (room for momentum to grow; Byzantine updates above it are clipped)
AUTO_CLIP_FACTOR = 4.0
#: the smallest clip "auto" resolves to (all-zero first-round updates still give a valid bound)
MIN_AUTO_CLIP = 1e-30


def auto_clip(norms: list[float], growth: float = 1.0) -> float:
    """``tee.clip = "auto"`` without DP, computed inside the enclave from the L2 norms of the
    first round's finite updates: :data:`AUTO_CLIP_FACTOR` times ``growth`` (a public factor by
    which the messages may still grow, ``1 / (1 - β)`` for client momentum β) times their
    median (the mean of the two middle values for an even count). A Byzantine minority cannot move the median
    outside the honest norms. The enclave sees every update anyway; what leaves it is the
    resolved clip, one scalar per run."""
    v = sorted(float(x) for x in norms if math.isfinite(float(x)))
    if not v:
        raise ValueError("auto_clip: no finite update norm")
    m = len(v) // 2
    med = v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2.0
    if not (math.isfinite(growth) and growth >= 1.0):
        raise ValueError(f"auto_clip: growth must be a finite number >= 1, got {growth!r}")
    return max(AUTO_CLIP_FACTOR * growth * med, MIN_AUTO_CLIP)


def mi_bound_bits(d: int, noise_ratio: float) -> float:
    """``(d/2) · log₂(1 + 1/ρ)``: per-round, per-accelerator bound on what is learnt about one
    clipped update of dimension ``d`` at ``ρ = σ²/Var``."""
    _check(d, noise_ratio)
    return 0.5 * d * math.log1p(1.0 / noise_ratio) / math.log(2.0)


def noise_ratio_for_bits(d: int, bits: float) -> float:
    """The ``ρ`` at which :func:`mi_bound_bits` equals ``bits``: ``1 / (2^{2 bits / d} − 1)``."""
    if not (isinstance(d, int) and d >= 1):
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    if not (bits > 0 and math.isfinite(bits)):
        raise ValueError(f"target bits must be a finite number > 0, got {bits!r}")
    return 1.0 / math.expm1(2.0 * bits * math.log(2.0) / d)


def noise_variance(clip: float, d: int, noise_ratio: float) -> float:
    """Per-coordinate noise variance ``σ² = ρ · clip² / d``."""
    _check(d, noise_ratio)
    return noise_ratio * clip * clip / d


def noise_constant(clip: float, noise_ratio: float) -> float:
    """``C = ‖R_i − R_j‖² = 2 d σ² = 2 ρ clip²`` (independent of ``d``)."""
    if not (clip > 0 and noise_ratio > 0):
        raise ValueError(f"need clip > 0 and noise_ratio > 0, got {clip}, {noise_ratio}")
    return 2.0 * noise_ratio * clip * clip


def _check(d: int, noise_ratio: float) -> None:
    if not (isinstance(d, int) and d >= 1):
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    if not (noise_ratio > 0 and math.isfinite(noise_ratio)):
        raise ValueError(f"noise_ratio must be a finite number > 0, got {noise_ratio!r}")
