"""The homomorphic digit check: name the node whose upload has digits outside their range.

Every node holds the shared key, so a Byzantine node can skip the encoder and encrypt any
residue mod p in any digit plane. HTS's comparison polynomials are exact only on in-range
digits; on such an upload they return garbage, and the decrypted trimmed sum is garbage on
(nearly) every coordinate. Screening the decrypted sums (:meth:`Quantizer.screen_sums`) can
only neutralise those coordinates: one node of n then erases the round -- a veto. The check
here runs *before* HTS, per node, on the ciphertexts, and tells the nodes which uploads are
invalid; the server then runs HTS without them (as if they had dropped out).

What the server computes (slot-wise, on node i's ciphertexts; ``c_{b,k}`` is the digit-k
plane of block b, ``D_k`` the largest digit k can take)::

    C_{i,g} = sum_{b in group g} sum_k  r_{i,b,k} (.) V_k(c_{b,k})  +  u_{i,g}

* ``V_k(x) = prod_{v=0}^{D_k} (x - v) mod p`` (:func:`~fedsafe.protocols.he.polynomials.valid_poly`):
  0 exactly on the allowed digits {0..D_k} and nonzero on every other residue (p is prime).
  Degree D_k + 1, evaluated by Paterson–Stockmeyer (depth about ceil(log2(D_k + 1))).
* ``r_{i,b,k}``: one multiplier per slot, uniform in {1..p-1}, drawn by the server *after*
  the uploads arrive (a node cannot know them when it encrypts). Without them invalid
  coordinates could cancel: ``V(x_1) + V(x_2) = 0 mod p`` has solutions with both terms
  nonzero, so an unweighted sum of nonzero values can be 0 (tested). With them, the sum over
  an upload with at least one invalid digit is 0 with probability at most 1/(p-1) (condition
  on every multiplier but one: the last term is uniform over the nonzero residues) --
  1.5e-5 per node per round for p = 65537.
* ``u_{i,g}``: a mask, uniform over the slot vectors whose slots sum (over every group of
  the node) to 0 mod p, also drawn by the server. The decryptor sums the slots of the node's
  ciphertexts: ``S_i = sum_slots C_i = sum r V``, and every other function of the decrypted
  slots is independent of the data (they are uniform given S_i). No Galois keys, no rotation:
  the mask does what a homomorphic slot sum would, for free.

What the decryptor (a node) learns, per node: ``S_i``, which is 0 when every digit is in range
and otherwise a residue hidden by the server's secret multipliers: one bit, valid or not. For
a valid upload the decrypted slots equal the mask exactly, whatever the node's values (tested).
The server learns the same bit (it is told which nodes to drop). Nobody learns an honest value,
where an invalid upload's garbage is, or how many coordinates are invalid.

What it does not catch: values that are in range but malicious (that is the robust rule's job);
with a mixed-radix split, in-range digits whose value exceeds M = 2^delta - 2 (the comparisons
stay exact on them; the value is a bounded Byzantine value, at most W_top (D_top + 1) - 1); a
false accept (probability <= 1/(p-1) per node per round; the sum screen still applies
afterwards). Zero-knowledge range proofs on the ciphertexts would be the full fix.

Cost, per node and block: the products of each V_k (2-3 per digit plane for the planner's
usual splits, D_k <= 4; 6 for one digit of 0..14), i.e. n * (2-5) per block against HTS's
12..1640 (2-30% of its products for n = 3..20, f > 0; benchmarks/he_hts.py measures 2.5-25%
of its time), plus one plaintext product per digit plane; depth ``max_k ceil(log2(D_k + 1))``
(2-3) against HTS's 4-10, on inputs first switched down to the few primes it needs. The
planner's modulus covers the larger of the two (:func:`~fedsafe.protocols.he.params.plan_hts`),
which for f > 0 is HTS's: across n = 3..20 the ring and the number of primes stay those of
HTS alone, the modulus grows by 0-5 bits (the reserve for HTS over the uploads left after
exclusions). For f = 0 (the plain sum, no comparison) the check is the only nonlinear step
and sets the parameters (n = 5, delta = 4: N = 8192 and 4 binary digit planes instead of
N = 4096 and one plane). The decryptor
downloads one ciphertext (at the lowest level) per node and group of ``CHECK_GROUP_BLOCKS``
blocks. One more exchange per round: server -> a node -> server (n bits back).

The circuit is written once against the ops interface (:mod:`~fedsafe.protocols.he.ops`), so the
emulator (:func:`emulate_digit_check`) and BFV (:meth:`fedsafe.protocols.he.bfv.HEServer.digit_check`)
compute the same residues from the same randomness (:func:`draw_node_randomness`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedsafe.protocols.he.ops import EmulatorOps, NoiseModel, TraceOps
from fedsafe.protocols.he.polynomials import PowerLadder, valid_poly

# blocks summed into one check ciphertext per node (N = 16384: a million coordinates); the
# planner budgets the noise of a sum of this many blocks x digit planes
CHECK_GROUP_BLOCKS = 64


@dataclass(frozen=True)
class DigitCheck:
    """What the server needs to run the digit check (public): the plaintext prime, each digit's
    largest value, the baby-step count for each V_k and (from the planner) the noise budget the
    rest of the check needs after each stage, which BFV uses to drop primes early."""

    p: int
    digit_max: tuple[int, ...]
    ks: tuple[int, ...]
    stage_need: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    depth_weight: float = 0.0  # Paterson–Stockmeyer splits: products + depth_weight * depth

    def __post_init__(self) -> None:
        if len(self.ks) != len(self.digit_max) or not self.digit_max:
            raise ValueError("need one baby-step count per digit")

    @property
    def digits(self) -> int:
        return len(self.digit_max)

    @property
    def polys(self) -> tuple[tuple[int, ...], ...]:
        return tuple(valid_poly(d, self.p) for d in self.digit_max)

    def need(self, stage: str) -> float | None:
        return dict(self.stage_need).get(stage)


_DEPTH_FIRST_WEIGHT = 100.0


@functools.lru_cache(maxsize=None)
def _best_k(dmax: int, p: int, depth_first: bool) -> int:
    """Baby-step count minimising (products, depth) -- or (depth, products) -- for V on digits 0..dmax."""
    poly = valid_poly(dmax, p)
    deg = len(poly) - 1
    dw = _DEPTH_FIRST_WEIGHT if depth_first else 0.0
    best_key, best = None, 1
    for k in range(1, deg + 1):
        ops = TraceOps(NoiseModel(16384, p), 0.0)
        out = PowerLadder(ops, ops.input(), k).evaluate(poly, p, dw)
        key = (out.depth, ops.products) if depth_first else (ops.products, out.depth)
        if best_key is None or key < best_key:
            best_key, best = key, k
    return best


def make_check(p: int, digit_max: Sequence[int], depth_first: bool = False) -> DigitCheck:
    """The check for digits ``0..digit_max[k]`` mod p, evaluated with the fewest products (or,
    ``depth_first``, the least depth); no stage needs yet (see :func:`with_stage_need`)."""
    dmax = tuple(int(d) for d in digit_max)
    return DigitCheck(
        p, dmax, tuple(_best_k(d, p, depth_first) for d in dmax), depth_weight=_DEPTH_FIRST_WEIGHT if depth_first else 0.0
    )


def check_circuit(ops: Any, digits: Sequence[Sequence[Any]], multipliers: Sequence[Sequence[Any]], mask: Any, check: DigitCheck) -> Any:
    """``sum_b sum_k multipliers[b][k] (.) V_k(digits[b][k]) + mask`` over one group of blocks of
    one node (or, on the emulator, of every node at once: every operation is slot-wise)."""
    if not digits or any(len(blk) != check.digits for blk in digits) or len(multipliers) != len(digits):
        raise ValueError(f"expected blocks of {check.digits} digit planes, with one multiplier per plane")
    acc = None
    for blk, rblk in zip(digits, multipliers):
        for k, (c, r) in enumerate(zip(blk, rblk)):
            ops.hint("check_input", [c])  # BFV: the check needs far less modulus than HTS
            v = PowerLadder(ops, c, check.ks[k]).evaluate(check.polys[k], check.p, check.depth_weight)
            ops.hint("check_poly", [v])
            t = ops.mul_plain(v, r)
            acc = t if acc is None else ops.add(acc, t)
    finish = getattr(ops, "finish", None)
    if finish is not None:
        acc = finish(acc)
    return ops.add_plain(acc, mask)


def trace_check(check: DigitCheck, noise: NoiseModel, fresh_budget: float, blocks: int = CHECK_GROUP_BLOCKS) -> tuple[TraceOps, Any]:
    """The check over ``blocks`` blocks of one node on no data: products, depth, noise."""
    ops = TraceOps(noise, fresh_budget)
    digits = [[ops.input() for _ in range(check.digits)] for _ in range(blocks)]
    mults = [[None] * check.digits for _ in range(blocks)]
    return ops, check_circuit(ops, digits, mults, None, check)


def with_stage_need(check: DigitCheck, noise: NoiseModel, blocks: int = CHECK_GROUP_BLOCKS) -> DigitCheck:
    """``check`` with the budget the rest of the check needs at each stage, for BFV's early
    drops (the check is shallow: its inputs go down to a few primes before any product):
    from an input, the whole check (its deepest digit); after V, a plaintext product and the
    sum of ``blocks x digits`` terms; at the end, nothing (the margin)."""
    bare = replace(check, stage_need=())
    _, out = trace_check(bare, noise, 1e4, blocks)
    after = noise.mul_plain(1e4)
    tail = 1e4 - noise.lincomb([(1, after)] * (blocks * check.digits))
    return replace(check, stage_need=(("check_input", 1e4 - out.budget), ("check_poly", tail), ("final", 0.0)))


def groups(blocks: int) -> int:
    """Check ciphertexts per node for ``blocks`` blocks."""
    return max(-(-blocks // CHECK_GROUP_BLOCKS), 1)


def group_blocks(g: int, blocks: int) -> range:
    """The blocks summed into a node's check ciphertext ``g``."""
    return range(g * CHECK_GROUP_BLOCKS, min((g + 1) * CHECK_GROUP_BLOCKS, blocks))


def draw_node_randomness(rng: np.random.Generator, blocks: int, digits: int, slots: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """One node's multipliers ``(blocks, digits, slots)`` uniform in 1..p-1, and masks
    ``(groups, slots)`` uniform among the vectors whose entries sum to 0 mod p. Both backends
    draw node after node, in upload order, from the server's generator."""
    r = rng.integers(1, p, size=(blocks, digits, slots), dtype=np.int64)
    u = rng.integers(0, p, size=(groups(blocks), slots), dtype=np.int64)
    u[-1, -1] = (u[-1, -1] - int(u.sum() % p)) % p
    return r, u


def slot_sums(slots: np.ndarray, p: int) -> np.ndarray:
    """``S_i``: the decrypted check slots of each node (``(n, groups, N)``) summed mod p; 0 iff
    node i's digits are all in range (up to the 1/(p-1) false accept)."""
    s = np.asarray(slots, dtype=np.int64) % p
    return s.reshape(s.shape[0], -1).sum(axis=1) % p


def emulate_digit_check(planes: np.ndarray, check: DigitCheck, slots: int, rng: np.random.Generator) -> np.ndarray:
    """What the decryptor would decrypt: ``(n, groups, slots)`` masked check slots for the
    digit planes ``planes[i, k, j]`` (node i, digit k, coordinate j; residues, in range or not),
    laid out in blocks of ``slots`` coordinates as BFV encrypts them.

    BFV pads the last block with the digit 0 (in range: ``V(0) = 0``, so those slots add
    ``r * 0 = 0``). Every step is slot-wise, so the circuit runs here on the real coordinates
    only: on the slots the last block fills, over every block of the group; on the slots after
    them, over the full blocks (or not at all: the mask alone). Same residues as BFV (tested)."""
    c = np.asarray(planes)
    if c.ndim != 3 or c.shape[1] != check.digits:
        raise ValueError(f"expected (n, {check.digits}, d) digit planes, got {c.shape}")
    n, digits, d = c.shape
    p = check.p
    blocks = max(-(-d // slots), 1)
    draws = [draw_node_randomness(rng, blocks, digits, slots, p) for _ in range(n)]
    r = np.stack([dr[0] for dr in draws])  # (n, blocks, digits, slots)
    out = np.stack([dr[1] for dr in draws])  # (n, groups, slots): the masks, then the sums
    tail = d - (blocks - 1) * slots  # real coordinates in the last block (slots if it is full)
    ops = EmulatorOps(p)

    def run(bs: Sequence[int], sl: slice, g: int) -> None:
        if not bs:
            return  # no block covers these slots: the mask alone
        out[:, g, sl] = check_circuit(
            ops,
            [[c[:, k, b * slots + sl.start : b * slots + sl.stop].astype(np.int64) % p for k in range(digits)] for b in bs],
            [[r[:, b, k, sl] for k in range(digits)] for b in bs],
            out[:, g, sl],
            check,
        )

    for g in range(groups(blocks)):
        bs = list(group_blocks(g, blocks))
        if bs[-1] == blocks - 1 and tail < slots:
            run(bs, slice(0, tail), g)
            run(bs[:-1], slice(tail, slots), g)
        else:
            run(bs, slice(0, slots), g)
    return out
