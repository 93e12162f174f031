"""Node-side encoding: clamp, quantize, shift, split into digits (and back).

SABLE's QUA(m, delta, C) (Choffrut et al., Sec. 3.1): clamp every coordinate to [-C, C],
multiply by ``Q = (2^(delta-1) - 1) / C`` and round to the nearest integer, so each value
``q`` lies in ``{-o..o}`` with ``o = 2^(delta-1) - 1`` (delta bits, 2^delta - 1 levels).

The circuit works on non-negative integers: ``a = q + o`` in ``{0..M}``, ``M = 2^delta - 2``,
written in a mixed radix (least significant digit first)::

    a = sum_k c_k W_k,   W_0 = 1, W_{k+1} = W_k r_k,   0 <= c_k < r_k  (k < L-1),
    0 <= c_{L-1} <= floor(M / W_{L-1})

so the top digit's range is only as wide as M needs. One digit (L = 1) is the paper's
"B >= 2^delta" case.

**Range assumption.** The comparison polynomials are exact only on digit differences in
``{-D_k..D_k}`` (D_k the largest value of digit k). The encoder guarantees it for every input:
non-finite values are mapped first (NaN -> 0, +-inf -> +-C), then clamped. A node that
bypasses the encoder (every node holds the shared secret key, so it can encrypt any residue
mod p in any digit plane) makes the comparison polynomials return arbitrary residues on the
coordinates it touches; the decrypted trimmed sum there is then an arbitrary residue too.
The paper's threat model (Remark 1: nodes follow the encryption step) excludes this; the digit
check (:mod:`fedsafe.protocols.he.validity`) identifies such a node before HTS and the round goes
on without it, and the nodes still screen the decrypted sums (:meth:`Quantizer.sum_bound`,
:meth:`Quantizer.screen_sums`) so that a node the check misses cannot blow the aggregate up.

**Quantization loss.** ``C`` trades clipping (``|x| > C`` loses magnitude) against erasure
(``0 < |x| < C / (2o)`` rounds to q = 0); :meth:`Quantizer.loss_fractions` measures both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Quantizer:
    """QUA with bit precision ``delta`` and clamp ``clamp`` (C)."""

    delta: int
    clamp: float

    def __post_init__(self) -> None:
        if not 2 <= self.delta <= 16:
            raise ValueError(f"delta must be in 2..16 bits, got {self.delta}")
        if not (self.clamp > 0 and np.isfinite(self.clamp)):
            raise ValueError(f"clamp must be a positive finite number, got {self.clamp}")

    @property
    def offset(self) -> int:
        """o = 2^(delta-1) - 1: the largest |q|."""
        return (1 << (self.delta - 1)) - 1

    @property
    def max_value(self) -> int:
        """M = 2o = 2^delta - 2: the largest shifted value a."""
        return 2 * self.offset

    @property
    def scale(self) -> float:
        """Q = (2^(delta-1) - 1) / C."""
        return self.offset / self.clamp

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Signed integers q = round(clamp(x) * Q) in {-o..o} (int64); NaN -> 0, inf -> +-o."""
        x = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0, posinf=self.clamp, neginf=-self.clamp)
        q = np.rint(np.clip(x, -self.clamp, self.clamp) * self.scale)
        return np.clip(q, -self.offset, self.offset).astype(np.int64)

    def shifted(self, x: np.ndarray) -> np.ndarray:
        """a = q + o in {0..M}."""
        return self.quantize(x) + self.offset

    def dequantize(self, total: np.ndarray, count: int) -> np.ndarray:
        """Float64 mean of ``count`` quantized values whose integer sum is ``total``."""
        return np.asarray(total, dtype=np.float64) / (count * self.scale)

    def sum_bound(self, count: int) -> int:
        """Largest |sum| of ``count`` encoder outputs: ``count * o``.

        The HTS circuit returns ``T = sum_{i selected} a_i - S*o`` with ``S = count`` the number
        of selected ranks and ``a_i = sum_k W_k c_{i,k}`` a node's shifted value. When every
        upload's digits are in range (``0 <= c_{i,k} <= D_k`` and ``a_i <= M``), the comparisons
        are exact, the ranks are a permutation of 0..n-1, ``Btw`` is 1 on exactly S of them, and
        ``T = sum_{selected} q_i`` with every ``q_i`` in ``{-o..o}``, so ``|T| <= S*o``; the
        decoded value is exact because ``p > 2*n*o >= 2*S*o``. For HTS (trimmed mean, f
        trimmed each side) ``S = n - 2f``; for HMED ``S = 1`` (odd n) or ``S = 2`` (even n, the
        two middle values); with subsampling n is the 2f+1 aggregated uploads. In float units
        the aggregate ``T / (S*Q)`` lies in ``[-o/Q, o/Q] = [-C, C]``. The bound is attained
        (every selected value at +-o), so it never flags an honest round."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        return int(count) * self.offset

    def screen_sums(self, total: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(sums with every coordinate outside ``+-sum_bound(count)`` set to 0, that mask).

        A coordinate outside the bound cannot come from in-range uploads (see
        :meth:`sum_bound`): some node encrypted out-of-range digits. It is set to 0 rather than
        clamped to the bound: the aggregate is a descent direction, and 0 (no step on that
        coordinate) is the one value that moves the model in no direction an attacker chose,
        while clamping would hand it a full +-C step of the sign it forced.

        What this guarantees: every coordinate of the aggregate lies in ``[-C, C]``, the range
        of an honest trimmed mean. What it does not: an out-of-range upload can also make the
        comparisons wrong in a way whose result still lands inside the bound (e.g. a sum of
        the wrong values, or the opposite sign of every honest value); those coordinates pass
        unflagged with any value in ``[-C, C]``, not necessarily between the honest order
        statistics (the trimmed mean's robustness guarantee). Residues that look random land
        inside with probability about ``(2*S*o + 1) / p``. And one such node zeroes nearly every
        coordinate: a veto over the round. Hence the digit check before HTS
        (:mod:`fedsafe.protocols.he.validity`), which excludes the node instead; this screen is
        what its false accepts (probability <= 1/(p-1)) meet. Only zero-knowledge range proofs
        on the ciphertexts (each digit proven in ``0..D_k`` before aggregation) would restore
        the full guarantee."""
        t = np.asarray(total, dtype=np.int64)
        bad = np.abs(t) > self.sum_bound(count)
        return np.where(bad, 0, t), bad

    def loss_fractions(self, x: np.ndarray) -> tuple[float, float]:
        """(clipped, zeroed) fractions of the nonzero coordinates of ``x`` (any shape) under QUA.

        Of the coordinates that carry a value (not exactly 0, not NaN; +-inf included):
        clipped: ``|x| > C`` (magnitude lost); zeroed: finite and quantized to ``q = 0``
        (``|x| * Q`` rounds to 0, i.e. ``|x| <= C / (2o)``: the value is erased). The rest,
        ``C / (2o) < |x| <= C``, keep a nonzero, unclipped level. Exact zeros are left out of
        the denominator: quantizing them loses nothing, and models have many (inputs that are
        always 0, inactive ReLUs), which would cap the zeroed fraction of a run whose every
        nonzero coordinate is erased. NaN, NaN when no coordinate carries a value."""
        x = np.asarray(x, dtype=np.float64)
        carries = ~np.isnan(x) & (x != 0)
        total = int(carries.sum())
        if total == 0:
            return float("nan"), float("nan")
        with np.errstate(invalid="ignore"):
            clipped = np.abs(x) > self.clamp
        zeroed = carries & np.isfinite(x) & (self.quantize(x) == 0)
        return float(clipped.sum()) / total, float(zeroed.sum()) / total


@dataclass(frozen=True)
class DigitPlan:
    """Mixed-radix split of a in {0..max_value}: ``radices`` are the L-1 low radices."""

    max_value: int
    radices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_value < 1:
            raise ValueError("max_value must be >= 1")
        if any(r < 2 for r in self.radices):
            raise ValueError(f"radices must be >= 2, got {self.radices}")
        if self.max_value // self.weights[-1] < 1:
            raise ValueError(f"radices {self.radices} leave an empty top digit for values 0..{self.max_value}")

    @property
    def digits(self) -> int:
        return len(self.radices) + 1

    @property
    def weights(self) -> tuple[int, ...]:
        w = [1]
        for r in self.radices:
            w.append(w[-1] * r)
        return tuple(w)

    @property
    def digit_max(self) -> tuple[int, ...]:
        """Largest value of each digit over 0..max_value (least significant first)."""
        top = self.max_value // self.weights[-1]
        return tuple(r - 1 for r in self.radices) + (top,)

    def split(self, a: np.ndarray) -> list[np.ndarray]:
        """Digits c_0..c_{L-1} of a (int64 arrays)."""
        a = np.asarray(a, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() > self.max_value):
            raise ValueError(f"values outside 0..{self.max_value}")
        out = []
        for r in self.radices:
            out.append(a % r)
            a = a // r
        out.append(a)
        return out

    def join(self, digits: list[np.ndarray]) -> np.ndarray:
        return sum(np.asarray(d, dtype=np.int64) * w for d, w in zip(digits, self.weights))

    def describe(self) -> str:
        if not self.radices:
            return f"1 digit (0..{self.max_value})"
        return f"{self.digits} digits, radices {list(self.radices)} + top 0..{self.digit_max[-1]}"
