"""Arithmetic backends for the one SABLE circuit: exact emulation, cost/noise tracing, (BFV).

The circuit (:mod:`fedsafe.protocols.he.circuit`) is written once against a tiny interface:

* ``sub(a, b)``, ``add(a, b)``       slot-wise, mod p
* ``mul(a, b)``, ``square(a)``        ciphertext x ciphertext products (the expensive operation)
* ``lincomb([(c, x), ...], c0)``      sum of scalar multiples plus a constant (no product)
* ``hint(stage, values)``              a stage boundary: BFV may drop primes here
* ``mul_plain(a, r)``, ``add_plain(a, u)``  slot-wise product with / sum with a plaintext slot
  vector (the digit check's random multipliers and masks; no ciphertext product)

Three backends implement it: :class:`EmulatorOps` (numpy integers mod p: bit-exact with BFV,
used for long accuracy runs), :class:`TraceOps` (no data: counts products, depth and a noise
budget estimate; the parameter planner runs the circuit through it) and the SEAL backend in
:mod:`fedsafe.protocols.he.bfv`. Because all three run the same Python circuit, the emulator is
the BFV computation minus the encryption, not a re-implementation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedsafe.protocols.he.polynomials import centered


class EmulatorOps:
    """Slot vectors as int64 numpy arrays holding residues mod p (p < 2^31, so products fit)."""

    def __init__(self, p: int) -> None:
        if p >= 1 << 31:
            raise ValueError("emulator needs p < 2^31")
        self.p = p

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a - b) % self.p

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a + b) % self.p

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b) % self.p

    def square(self, a: np.ndarray) -> np.ndarray:
        return (a * a) % self.p

    def lincomb(self, terms: Sequence[tuple[int, np.ndarray]], const: int) -> np.ndarray:
        p = self.p
        acc = None
        for i, (c, x) in enumerate(terms):
            t = x * (c % p)
            acc = t if acc is None else acc + t
            if i % 64 == 63:  # 64 terms of < 2^33 each stay below 2^39; keep well inside int64
                acc %= p
        if acc is None:
            raise ValueError("lincomb of no terms is a constant; the circuit keeps constants as ints")
        return (acc + const % p) % p

    def mul_plain(self, a: np.ndarray, r: np.ndarray) -> np.ndarray:
        return (a * (np.asarray(r, dtype=np.int64) % self.p)) % self.p

    def add_plain(self, a: np.ndarray, u: np.ndarray) -> np.ndarray:
        return (a + np.asarray(u, dtype=np.int64) % self.p) % self.p

    def hint(self, stage: str, values: Sequence[np.ndarray]) -> None:
        return None


# ----------------------------------------------------------------------------- noise model


@dataclass(frozen=True)
class NoiseModel:
    """Heuristic BFV invariant-noise-budget arithmetic (bits, SEAL's ``invariant_noise_budget``).

    Calibrated on SEAL 4 (TenSEAL 0.3.18) with p = 65537 and measured to be conservative by a
    few bits per level (the tests decrypt and compare): a fresh symmetric encryption leaves
    ``log2 q - log2 p - 4``; a product costs ``log2 p + log2 N`` bits below the weaker operand
    (measured 28-31); a scalar c costs ``log2 |c|`` (c centered); a sum of terms adds noises;
    switching to a smaller modulus q' leaves ``min(b, log2 q' - log2 p - log2(N)/2 - 2)``.
    """

    poly_modulus_degree: int
    plain_modulus: int
    fresh_slack: float = 5.0
    mult_slack: float = 1.0
    switch_slack: float = 2.0

    @property
    def log_p(self) -> float:
        return math.log2(self.plain_modulus)

    @property
    def log_n(self) -> float:
        return math.log2(self.poly_modulus_degree)

    def fresh(self, log_q: float) -> float:
        return log_q - self.log_p - self.fresh_slack

    def mul(self, b1: float, b2: float) -> float:
        return min(b1, b2) - self.log_p - self.log_n - self.mult_slack

    def mul_plain(self, b: float) -> float:
        """Budget after a product with a plaintext of arbitrary slot values (its polynomial's
        coefficients are as large as p): costed like a ciphertext product, ``log2 p + log2 N``."""
        return b - self.log_p - self.log_n - self.mult_slack

    def lincomb(self, terms: Sequence[tuple[int, float]]) -> float:
        """Budget of sum c_i x_i: noises (2^-b) scale by |c| and add (summed in the log domain)."""
        logs = []
        for c, b in terms:
            c = abs(centered(c, self.plain_modulus))
            if c:
                logs.append(math.log2(c) - b)
        if not logs:
            return math.inf
        top = max(logs)
        return -(top + math.log2(sum(2.0 ** (x - top) for x in logs)))

    def switch(self, b: float, log_q_new: float) -> float:
        return min(b, log_q_new - self.log_p - self.log_n / 2 - self.switch_slack)


# ----------------------------------------------------------------------------- tracing


@dataclass
class TraceValue:
    budget: float
    depth: int
    size: int = 2  # ciphertext polynomials: 3 after an unrelinearised product
    used_in_product: bool = False


@dataclass
class TraceOps:
    """Runs the circuit on no data: counts ciphertext products, relinearisations (lazy: a
    product is relinearised once, when it is itself multiplied, or at the end), scalar ops and
    depth, and tracks the :class:`NoiseModel` budget from fresh inputs of ``fresh_budget`` bits.
    ``stage_budget`` records the weakest budget at each ``hint`` stage."""

    noise: NoiseModel
    fresh_budget: float
    products: int = 0
    relins: int = 0
    scalar_ops: int = 0
    additions: int = 0
    plain_products: int = 0
    stage_budget: dict[str, float] = field(default_factory=dict)
    stage_products: dict[str, int] = field(default_factory=dict)

    def input(self) -> TraceValue:
        return TraceValue(self.fresh_budget, 0)

    def _relin(self, a: TraceValue) -> None:
        if a.size > 2:
            a.size = 2
            self.relins += 1

    def sub(self, a: TraceValue, b: TraceValue) -> TraceValue:
        return self.add(a, b)

    def add(self, a: TraceValue, b: TraceValue) -> TraceValue:
        self.additions += 1
        return TraceValue(self.noise.lincomb([(1, a.budget), (1, b.budget)]), max(a.depth, b.depth), max(a.size, b.size))

    def mul(self, a: TraceValue, b: TraceValue) -> TraceValue:
        self._relin(a)
        self._relin(b)
        self.products += 1
        return TraceValue(self.noise.mul(a.budget, b.budget), max(a.depth, b.depth) + 1, 3)

    def square(self, a: TraceValue) -> TraceValue:
        return self.mul(a, a)

    def mul_plain(self, a: TraceValue, r: object = None) -> TraceValue:
        self.plain_products += 1
        return TraceValue(self.noise.mul_plain(a.budget), a.depth, a.size)

    def add_plain(self, a: TraceValue, u: object = None) -> TraceValue:
        self.additions += 1
        return TraceValue(a.budget, a.depth, a.size)

    def lincomb(self, terms: Sequence[tuple[int, TraceValue]], const: int) -> TraceValue:
        self.scalar_ops += sum(1 for c, _ in terms if centered(c, self.noise.plain_modulus) not in (1, -1))
        self.additions += max(len(terms) - 1, 0)
        return TraceValue(
            self.noise.lincomb([(c, x.budget) for c, x in terms]),
            max(x.depth for _, x in terms),
            max(x.size for _, x in terms),
        )

    def hint(self, stage: str, values: Sequence[TraceValue]) -> None:
        vals = [v for v in values if isinstance(v, TraceValue)]
        if vals:
            self.stage_budget[stage] = min(v.budget for v in vals)
            self.stage_products[stage] = self.products

    def finish(self, v: TraceValue) -> TraceValue:
        self._relin(v)
        return v
