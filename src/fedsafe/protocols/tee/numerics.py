"""Float64 arithmetic that decodes distances exactly enough, and when it cannot.

**The cancellation.** An accelerator sees ``Y_i = g_i + R_i`` with ``‖R_i‖² = C/2`` and
``C = 2ρ clip²``; its Gram entries are ``≈ C/2`` while what the enclave wants back,
``⟨g_i, g_j⟩``, is ``≈ clip²``, a factor ``ρ = σ²/Var`` smaller. A float64 number of size ``C``
is only known to ``u·C`` (``u = 2⁻⁵³``), so decoding the paper's scheme as written (each
accelerator returns one float64 matrix, the enclave subtracts ``C``) has relative error
at least ``≈ u·ρ`` *whatever the accelerator does*, and the Gram's own rounding adds a factor
growing like ``√d``: measured 7e-8 to 1.4e-6 at ρ = 1e8 for d = 1e3 … 1e5
(``arithmetic = "float64"``; :func:`estimated_relative_error` predicts it, the protocol warns).

**Exact mode** (``arithmetic = "exact"``, the default) removes the cancellation in three steps,
all in float64 and all GEMM-shaped, so they run on an accelerator:

1. *Fixed-point encoding.* The enclave rounds the noise and the updates to one grid
   ``q = 2^(E−53)`` with ``2^E ≥ clip + max|R|``; then ``Y = g_q ± R_q`` are computed exactly
   (every value is an integer multiple of ``q`` below ``2⁵³ q``). ``g_q`` differs from ``g`` by
   at most ``q/2 ≈ u·(clip + max|R|)`` per coordinate: the distances decoded are those of
   ``g_q``, which differ from ``g``'s by ≈ ``q/‖g_i − g_j‖`` relatively (≈ 1e-14 at ρ = 1e8).
2. *Error-free Gram* (:func:`split_gram`, after Ozaki et al. 2012). Each row is split
   ``Y = Y_hi + Y_lo`` where ``Y_hi`` keeps ``β = ⌊(53 − ⌈log₂ d⌉)/2⌋`` bits below the row's
   power-of-two scale. Every product of two ``Y_hi`` entries is an integer multiple of the two
   rows' units below ``2^{2β}`` of them, and ``d`` of them sum below ``2⁵³`` units, so
   ``Y_hi Y_hiᵀ`` is exact in float64 whatever the summation order (BLAS, cuBLAS, FMA). The
   remainder ``Y_hi Y_loᵀ + Y_lo Y_hiᵀ + Y_lo Y_loᵀ`` is ``2^-β`` smaller, so its rounding is
   too. The accelerator returns both parts (3 GEMMs instead of 1).
3. *Error-free decoding* (:func:`exact_sum`). The enclave holds the noise Gram ``K = R_q R_qᵀ``
   (same split, computed when the noise is drawn, offline) and adds
   ``G¹ + G² − 2K = 2 g_q g_qᵀ`` term by term with compensated (Neumaier) summation; the
   distances ``D_ij = S_ii + S_jj − 2 S_ij`` are summed the same way. Because ``K`` is measured
   rather than assumed, the decoding does not rely on ``R`` being exactly orthogonal.

Remaining error ≈ ``u · 2^-β · C`` absolute, i.e. ≈ ``2^-β u ρ`` relative: measured ≤ 2e-13 at
ρ = 1e8 for d ≤ 1e5 (float64 mode: 1e-7 to 1e-6). Tests: ``tests/protocols/tee/test_tee_numerics.py``.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

U = 2.0**-53  # unit roundoff of float64
_BLOCK = 1 << 16  # columns per GEMM block: bounds temporaries to n × 65536 values
# Constants of the error estimates, fitted with margin (>= 2x) to the sweep in the tests and
# in the benchmark's calibration (ρ ∈ {1e2 … 1e10}, d ∈ {1e3 … 1e5}, n ≤ 48): float64 mode
# measured ≈ 0.45 √d u ρ (Gram rounding grows like √d), exact mode ≤ 7 u 2^-β ρ, both above
# a floor of ≈ 4u (the final rounding of D itself).
_K_FLOAT64 = 2.0  # × √d
_K_EXACT = 16.0
_FLOOR = 8.0 * U
# Relative error above which decoded distances are called unreliable (a TEEPrecisionWarning):
# beyond it, selections can differ from plaintext on near-ties.
RELIABLE = 1e-9


class TEEPrecisionWarning(UserWarning):
    """Decoded distances may differ from plaintext ones by more than ``RELIABLE``."""


def split_bits(d: int) -> int:
    """``β = ⌊(53 − ⌈log₂ d⌉)/2⌋``: the largest β with ``d · 2^{2β} ≤ 2⁵³``."""
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    return (53 - max(1, math.ceil(math.log2(d)))) // 2


def _row_units(y: Tensor, beta: int) -> Tensor:
    amax = torch.linalg.vector_norm(y, ord=math.inf, dim=1)  # max |y_ij| per row, no temporary
    _, e = torch.frexp(amax)  # amax = m 2^e with m in [0.5, 1): |y| < 2^e
    return torch.pow(2.0, (e - beta).to(torch.float64))


def split_gram(y: Tensor) -> tuple[Tensor, Tensor]:
    """``(hi, lo)`` with ``hi`` exactly ``Y_hi Y_hiᵀ`` and ``hi + lo ≈ Y Yᵀ`` to
    ``≈ u · 2^-β · max|Y|² d`` (see module doc). ``y`` is float64 ``(n, d)`` on any device;
    the columns are processed in blocks."""
    if y.dtype != torch.float64 or y.ndim != 2:
        raise ValueError(f"split_gram needs a float64 (n, d) matrix, got {y.dtype} {tuple(y.shape)}")
    n, d = y.shape
    beta = split_bits(d)
    unit = _row_units(y, beta)[:, None]
    hi = torch.zeros(n, n, dtype=torch.float64, device=y.device)
    cross = torch.zeros_like(hi)
    lolo = torch.zeros_like(hi)
    width = min(d, _BLOCK)
    yh_buf = torch.empty(n, width, dtype=torch.float64, device=y.device)
    yl_buf = torch.empty_like(yh_buf)
    for s in range(0, d, _BLOCK):
        blk = y[:, s : s + _BLOCK]
        yh, yl = yh_buf[:, : blk.shape[1]], yl_buf[:, : blk.shape[1]]
        torch.div(blk, unit, out=yh).round_().mul_(unit)  # exact: power-of-two scaling, integer rounding
        torch.sub(blk, yh, out=yl)  # exact: yh is blk rounded to a coarser grid
        hi.addmm_(yh, yh.T)  # exact: integers of < 2^53 units (see module doc)
        cross.addmm_(yh, yl.T)
        lolo.addmm_(yl, yl.T)
    return hi, cross + cross.T + lolo


def plain_gram(y: Tensor) -> Tensor:
    """``Y Yᵀ`` in float64, one GEMM per column block (the paper's accelerator work)."""
    n, d = y.shape
    g = torch.zeros(n, n, dtype=torch.float64, device=y.device)
    for s in range(0, d, _BLOCK):
        blk = y[:, s : s + _BLOCK]
        g.addmm_(blk, blk.T)
    return g


def exact_sum(terms: list[Tensor]) -> Tensor:
    """Elementwise ``Σ terms`` by Neumaier's compensated summation: error ≤ 2u|Σ| +
    O(m u²) Σ|terms|, so large terms that cancel (``C``-sized Gram entries) cost nothing."""
    s = terms[0].clone()
    c = torch.zeros_like(s)
    for x in terms[1:]:
        t = s + x
        c += torch.where(s.abs() >= x.abs(), (s - t) + x, (x - t) + s)
        s = t
    return s + c


def _distance_terms(t: Tensor) -> list[Tensor]:
    diag = torch.diagonal(t)
    return [diag[:, None].expand_as(t), diag[None, :].expand_as(t), -2.0 * t]


def _tidy(d2: Tensor) -> Tensor:
    d2 = d2.clamp_min(0)
    d2 = (d2 + d2.T) / 2
    d2.fill_diagonal_(0)
    return d2


def decode_exact(
    acc1: tuple[Tensor, Tensor], acc2: tuple[Tensor, Tensor], noise_gram: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """``(G, D)``: the Gram matrix ``g_q g_qᵀ`` and squared distances of the encoded updates
    from the two accelerators' split Grams and the noise's, summed error-free."""
    terms = [acc1[0], acc1[1], acc2[0], acc2[1], -2.0 * noise_gram[0], -2.0 * noise_gram[1]]
    gram = exact_sum(terms) / 2
    dist = exact_sum([x for t in terms for x in _distance_terms(t)]) / 2
    return (gram + gram.T) / 2, _tidy(dist)


def decode_float64(g1: Tensor, g2: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """The paper's decoding: ``G = (G¹ + G² − C·I)/2``, ``D_ij = G_ii + G_jj − 2G_ij`` (the
    diagonal of ``G¹ + G²`` carries ``2‖R_i‖² = C``, off-diagonal entries ``2⟨R_i,R_j⟩ = 0``)."""
    n = g1.shape[0]
    gram = (g1 + g2 - c * torch.eye(n, dtype=torch.float64)) / 2
    diag = torch.diagonal(gram)
    return (gram + gram.T) / 2, _tidy(diag[:, None] + diag[None, :] - 2 * gram)


def estimated_abs_error(c: float, d: int, arithmetic: str) -> float:
    """Estimated absolute error of a decoded squared distance from the cancellation against
    the noise constant ``C``: ``2√d u C`` (float64) or ``16 u 2^-β C`` (exact). Constants
    fitted with margin to measurements (see ``_K_*``)."""
    if arithmetic == "float64":
        return _K_FLOAT64 * math.sqrt(d) * U * c
    if arithmetic == "exact":
        return _K_EXACT * U * 2.0 ** -split_bits(d) * c
    raise ValueError(f"arithmetic must be 'exact' or 'float64', got {arithmetic!r}")


def estimated_relative_error(noise_ratio: float, d: int, arithmetic: str, scale: float = 2.0) -> float:
    """Estimated relative error of decoded squared distances of size ``scale · clip²``
    (default 2: two independent updates of norm ``clip``), with ``C = 2ρ clip²``:
    ``2√d u ρ`` (float64) or ``16 u 2^-β ρ`` (exact), plus the ``8u`` floor. Updates closer
    together than ``scale`` have proportionally larger relative errors; the enclave reports the
    estimate against each round's median decoded distance (``decode_error_estimate``)."""
    return estimated_abs_error(2.0 * noise_ratio, d, arithmetic) / scale + _FLOOR


def relative_to(abs_error: float, distance: float) -> float:
    """``abs_error / distance`` plus the rounding floor (1.0 when ``distance`` is 0)."""
    return abs_error / distance + _FLOOR if distance > 0 else 1.0


def warn_if_unreliable(relative_error: float, where: str) -> bool:
    """Emit a TEEPrecisionWarning when ``relative_error > RELIABLE``; returns whether it did."""
    if relative_error > RELIABLE:
        warnings.warn(
            f"tee: {where}: decoded distances have an estimated relative error of "
            f"{relative_error:.1e} (> {RELIABLE:.0e}) from float64 cancellation against the noise; "
            "selections may differ from plaintext on near-ties. Use arithmetic='exact', a smaller "
            "noise_ratio, or a clip closer to the updates' norms.",
            TEEPrecisionWarning,
            stacklevel=3,
        )
        return True
    return False
