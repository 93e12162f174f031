"""``"auto"`` coordinate ranges and norm bounds for the protocols that quantize or clip messages
(``he.range``, ``tee.clip``; ``secagg.range`` has its own DP derivation in
:mod:`fedsafe.protocols.secagg.ranges`).

A fixed range cannot fit every message kind: a gradient or model-delta coordinate of a small MLP
is ~1e-3..1e-1, a zeroth-order message (``clients.gradient = "zeroth_order"``: K loss
differences along random directions, ``σ ⟨g, u⟩``) is ~1e-5..1e-3, and a local-DP message is
dominated by its noise (std ``z C``). SABLE's quantizer keeps a coordinate only when
``C / (2^bits - 2) < |x| <= C``, so the former default ``he.range = 0.05`` erased 100% of the
zeroth-order scalars and clipped 96% of the local-DP coordinates. ``"auto"`` resolves the range
in one of two ways, per round:

* **From DP, when a plugin declares what the messages hold** (``message_ranges``: the DP update
  clipped to L2 norm ``C``, plus each client's Gaussian noise of std ``σ``). The root mean square
  of such a message's coordinates is at most ``sqrt(C²/d + σ²)`` (a vector of L2 norm ``C`` over
  ``d`` coordinates has mean square ``C²/d``; independent noise adds ``σ²``), and the range is
  :data:`HE_RANGE_FACTOR` times that (:func:`dp_rms_bound`). It depends only on the config:
  it reveals nothing.
* **Otherwise, calibrated from the messages themselves**: every client computes one number
  from its own message, the root mean square of its coordinates (:func:`client_scales`), and
  the protocol releases one robust aggregate of those numbers, the same way it releases the
  aggregate of the messages: the coordinate-wise *median* over the nodes for HE (what HMED
  computes over one extra coordinate; a Byzantine minority cannot move it outside the honest
  nodes' scales), and :data:`fedsafe.protocols.tee.leakage.AUTO_CLIP_FACTOR` times the median
  of the first round's L2 norms, inside the enclave, for the TEE (which sees every update
  anyway; :func:`fedsafe.protocols.tee.leakage.auto_clip`). What is revealed beyond the protocol's output: that one scalar per
  round (HE), or once per run (TEE: the resolved clip). The range is then the factor times that
  scale (:func:`calibrated_range`). In this simulation the nodes' median is computed in the
  clear from their statistics, as the one-coordinate HMED would return it.

Why per round for HE: a client's momentum starts at 0 and grows over ~1/(1 - β) rounds, and
gradients shrink as training converges, so a range fixed at round 1 would clip later. Why once
per run for the TEE: its noise scale is ``ρ clip² / d`` and is precomputed (``precompute_rounds``),
so it is resolved at the first round and then fixed.

Why the factors: with ``bits`` = 4 (15 levels) a range of 3 RMS clips under 1% of Gaussian
coordinates and rounds fewer than a fifth of them to 0 (``|x| < 3/14 RMS``); measured on digits
(MLP, 8 clients, 10 rounds, emulator): zeroth-order + HE 12.8% -> see the README table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: ``he.range = "auto"``: this many times the messages' root-mean-square coordinate.
HE_RANGE_FACTOR = 3.0
#: ``tee.clip = "auto"`` with local DP: the noise's norm is below ``σ (√d + TEE_NOISE_TAIL)``
#: except with probability ``exp(-TEE_NOISE_TAIL² / 2)`` (< 1e-15) per message.
TEE_NOISE_TAIL = 8.5
#: the smallest scale "auto" resolves to, so that all-zero messages still give a valid range
MIN_SCALE = 1e-30


def client_scales(x: np.ndarray) -> np.ndarray:
    """Each row's root-mean-square coordinate over its finite coordinates (0 for a row with
    none): what each client computes from its own message."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"client_scales needs an (n, d) matrix, got shape {x.shape}")
    finite = np.isfinite(x)
    sq = np.where(finite, x, 0.0) ** 2
    counts = finite.sum(axis=1)
    out = np.zeros(x.shape[0])
    has = counts > 0
    out[has] = np.sqrt(sq[has].sum(axis=1) / counts[has])
    return out


def median_scale(scales: Sequence[float] | np.ndarray) -> float:
    """The median of the clients' scales (the mean of the two middle values for an even
    count, fedsafe's median), never below :data:`MIN_SCALE`."""
    s = np.asarray(scales, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return MIN_SCALE
    v = np.sort(s)
    m = v.size // 2
    med = float(v[m]) if v.size % 2 else float((v[m - 1] + v[m]) / 2.0)
    return max(med, MIN_SCALE)


def calibrated_range(x: np.ndarray, factor: float = HE_RANGE_FACTOR) -> tuple[float, float]:
    """(range, median scale) calibrated from the round's messages ``x`` (n, d)."""
    scale = median_scale(client_scales(x))
    return factor * scale, scale


def dp_rms_bound(runs: Sequence[tuple[int, float, float, float]] | Sequence[object]) -> float:
    """The largest root-mean-square coordinate of an honest DP message, from the runs a DP
    plugin declares (``(length, lo, hi, noise std)``; :meth:`message_ranges`): the longest run
    (the update) gives ``sqrt(max(|lo|, |hi|)² / length + σ²)``."""
    best = None
    for r in runs:
        length, lo, hi, std = (r.length, r.lo, r.hi, r.noise_std) if hasattr(r, "length") else r  # type: ignore[union-attr]
        if best is None or length > best[0]:
            best = (int(length), float(lo), float(hi), float(std))
    if best is None:
        raise ValueError("dp_rms_bound: no run declared")
    length, lo, hi, std = best
    bound = max(abs(lo), abs(hi))
    return max(math.sqrt(bound * bound / length + std * std), MIN_SCALE)


def dp_norm_bound(runs: Sequence[tuple[int, float, float, float]] | Sequence[object]) -> float:
    """A bound on an honest DP message's L2 norm: the clip ``C`` (the update's norm) plus the
    norm of its noise, below ``σ (√d + TEE_NOISE_TAIL)`` except with probability
    ``exp(-TEE_NOISE_TAIL²/2)`` (Gaussian norm concentration, Lipschitz tail)."""
    total = 0.0
    noise_sq = 0.0
    for r in runs:
        length, lo, hi, std = (r.length, r.lo, r.hi, r.noise_std) if hasattr(r, "length") else r  # type: ignore[union-attr]
        total = max(total, max(abs(float(lo)), abs(float(hi))))
        noise_sq += float(std) ** 2 * int(length)
    std_max = max(float((r.noise_std if hasattr(r, "noise_std") else r[3])) for r in runs)  # type: ignore[index,union-attr]
    return max(total + math.sqrt(noise_sq) + std_max * TEE_NOISE_TAIL, MIN_SCALE)
