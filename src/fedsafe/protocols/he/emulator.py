"""Exact emulation of the HTS circuit: the same circuit over integers mod p, no encryption.

BFV decrypts to exactly the circuit's value mod p whenever the noise budget holds, so running
:func:`fedsafe.protocols.he.circuit.trimmed_sum` on numpy residues gives bit for bit what the
nodes would decrypt -- at a tiny fraction of the cost, for long accuracy runs. The tests check
emulator == BFV == :func:`reference_trimmed_sum` (a numpy sort) on inputs with ties and
extreme values.
"""

from __future__ import annotations

import numpy as np

from fedsafe.protocols.he.circuit import CircuitSpec, trimmed_sum
from fedsafe.protocols.he.encoding import DigitPlan
from fedsafe.protocols.he.ops import EmulatorOps

# columns per emulated chunk: keeps the ~10 live int64 temporaries per node in cache-sized pieces
_CHUNK = 1 << 15


def decode_centered(residues: np.ndarray, p: int) -> np.ndarray:
    """Residues mod p -> signed integers in (-p/2, p/2]."""
    r = np.asarray(residues, dtype=np.int64) % p
    return np.where(r > p // 2, r - p, r)


def emulate_trimmed_sum(shifted: np.ndarray, spec: CircuitSpec, digits: DigitPlan) -> np.ndarray:
    """The signed trimmed sums (int64, one per column) of ``shifted`` (n, d) values in
    {0..M} (quantized + offset), computed by the HTS circuit mod p."""
    a = np.asarray(shifted, dtype=np.int64)
    if a.ndim != 2 or a.shape[0] != spec.n:
        raise ValueError(f"expected ({spec.n}, d) values, got {a.shape}")
    out = np.empty(a.shape[1], dtype=np.int64)
    for c0 in range(0, a.shape[1], _CHUNK):
        block = a[:, c0 : c0 + _CHUNK]
        out[c0 : c0 + block.shape[1]] = emulate_digit_planes(np.stack([np.stack(digits.split(row)) for row in block]), spec)
    return out


def emulate_digit_planes(planes: np.ndarray, spec: CircuitSpec) -> np.ndarray:
    """The signed trimmed sums (int64, one per column) of ``planes[i, k, j]``: node i's digit k
    of coordinate j, as residues mod p -- what the nodes would encrypt, in range or not (a
    node holding the key can encrypt any residue; the circuit then computes garbage there)."""
    c = np.asarray(planes)
    if c.ndim != 3 or c.shape[:2] != (spec.n, spec.digits):
        raise ValueError(f"expected ({spec.n}, {spec.digits}, d) digit planes, got {c.shape}")
    ops = EmulatorOps(spec.p)
    out = np.empty(c.shape[2], dtype=np.int64)
    for c0 in range(0, c.shape[2], _CHUNK):
        block = c[:, :, c0 : c0 + _CHUNK].astype(np.int64) % spec.p
        res = trimmed_sum(ops, [list(node) for node in block], spec)
        out[c0 : c0 + block.shape[2]] = decode_centered(res, spec.p)
    return out


def reference_trimmed_sum(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Sum of the order statistics lo..hi of each column (numpy sort), int64."""
    s = np.sort(np.asarray(values, dtype=np.int64), axis=0)
    return s[lo : hi + 1].sum(axis=0)
