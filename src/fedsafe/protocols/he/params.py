"""Parameter selection for HTS over BFV: digits, plaintext prime, ring degree, coefficient modulus.

Given (n, rank band, delta) the planner:

1. enumerates digit plans for a in {0..2^delta - 2}: one digit (the paper's B >= 2^delta), and
   L = 2..delta digits of a uniform low radix r (top digit as wide as needed);
2. for each, picks how Neg/Zero are evaluated per digit (direct or even/odd Paterson–Stockmeyer,
   baby-step count k) and how Btw is, minimising products (or depth);
3. runs the whole circuit through :class:`~fedsafe.protocols.he.ops.TraceOps` to count products,
   relinearisations and the noise budget the circuit consumes (the :class:`NoiseModel`);
4. for each ring degree N, takes the fewest <= 60-bit primes whose product q leaves
   ``margin_bits`` of budget at the end, *if* log2(q) stays within the 128-bit-security bound for
   N (HomomorphicEncryption.org standard, ternary secret; the table SEAL enforces);
5. keeps the cheapest (plan, N, q) per slot by a time model ~ N log N x #primes per product,
   except that a plan with fewer digit planes wins when at most ``UPLOAD_TOLERANCE`` (25%)
   slower: every digit plane is one more ciphertext per node and block to upload.

The noise model is calibrated to be conservative: across the benchmark grid SEAL measured
22-28 bits left where the model predicted 12 (the margin), and every run decrypted exactly.

The plaintext prime p must satisfy p = 1 mod 2N (SIMD batching: N slots per ciphertext), be
larger than every range the circuit interpolates on (digit differences 2D+1 points, w values up
to (n-1)^2) and than twice the largest |trimmed sum| (decoded centered). 65537 = 2^16 + 1 fits
every N <= 32768 and every n*o < 32768; a bigger one is searched otherwise.

No safe parameters -> :class:`HEParameterError` saying what was needed and what would help.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from fedsafe.core.errors import FedsafeError

from fedsafe.protocols.he.circuit import (
    CircuitSpec,
    DigitStrategy,
    digit_tests,
    select,
    trimmed_sum,
)
from fedsafe.protocols.he.encoding import DigitPlan
from fedsafe.protocols.he.ops import NoiseModel, TraceOps
from fedsafe.protocols.he.polynomials import btw_poly_symmetric
from fedsafe.protocols.he.validity import CHECK_GROUP_BLOCKS, DigitCheck, make_check, trace_check, with_stage_need


class HEParameterError(FedsafeError, ValueError):
    """No BFV parameters keep 128-bit security and enough noise budget for the circuit."""


# Largest log2(q) for 128-bit classical security with a ternary secret (HomomorphicEncryption.org
# standard, Table 1; SEAL's CoeffModulus::MaxBitCount(N, sec_level_type::tc128)).
MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
RING_DEGREES = (4096, 8192, 16384, 32768)
MAX_PRIME_BITS = 60
MIN_PRIME_BITS = 30
# seconds per ciphertext product (+ relinearisation) per N log2 N per prime, measured with
# TenSEAL's SEAL on one core (AMD EPYC); only ratios matter for choosing parameters
_SECONDS_PER_PRODUCT_UNIT = 6.0e-8
_RELIN_SHARE = 0.3
# a plan with fewer digit planes (smaller upload) wins if at most this much slower
UPLOAD_TOLERANCE = 0.25


@dataclass(frozen=True)
class HEParams:
    """BFV parameters: ring degree N (= slots per ciphertext), plaintext prime p, and the bit
    sizes of the coefficient-modulus primes (data primes, then SEAL's special prime)."""

    poly_modulus_degree: int
    plain_modulus: int
    coeff_bits: tuple[int, ...]

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree

    @property
    def data_bits(self) -> int:
        return sum(self.coeff_bits[:-1]) if len(self.coeff_bits) > 1 else sum(self.coeff_bits)

    @property
    def total_bits(self) -> int:
        return sum(self.coeff_bits)

    def check_security(self) -> None:
        bound = MAX_COEFF_BITS_128.get(self.poly_modulus_degree)
        if bound is None:
            raise HEParameterError(f"poly_modulus_degree {self.poly_modulus_degree} is not one of {sorted(MAX_COEFF_BITS_128)}")
        if self.total_bits > bound:
            raise HEParameterError(
                f"log2 q = {self.total_bits} bits exceeds the 128-bit-security bound {bound} for N = {self.poly_modulus_degree}"
            )

    def describe(self) -> str:
        return (
            f"BFV N={self.poly_modulus_degree}, p={self.plain_modulus}, "
            f"q={self.total_bits} bits ({len(self.coeff_bits)} primes {list(self.coeff_bits)}), 128-bit secure"
        )


@dataclass(frozen=True)
class HEPlan:
    """A full plan: parameters, digit split, the circuit, and its predicted cost."""

    params: HEParams
    digits: DigitPlan
    spec: CircuitSpec
    delta: int
    products: int  # ciphertext x ciphertext products per block
    relins: int
    depth: int
    consumed_bits: float  # modelled noise budget the circuit consumes
    final_budget_bits: float  # modelled budget left at the output (>= margin)
    margin_bits: float
    est_seconds_per_block: float  # time model, one core
    # the digit check (fedsafe.protocols.he.validity), when planned: its circuit, its products per
    # node and block, its depth, and the budget it consumes over CHECK_GROUP_BLOCKS blocks
    check: DigitCheck | None = None
    check_products: int = 0
    check_depth: int = 0
    check_consumed_bits: float = 0.0

    @property
    def slots(self) -> int:
        return self.params.slots

    def describe(self) -> str:
        chk = "" if self.check is None else f"; digit check {self.check_products} products per node, depth {self.check_depth}"
        return (
            f"{self.params.describe()}; {self.digits.describe()}; n={self.spec.n}, ranks "
            f"{self.spec.lo}..{self.spec.hi}; {self.products} products, depth {self.depth}, "
            f"modelled budget left {self.final_budget_bits:.0f} bits{chk}"
        )


# ----------------------------------------------------------------------------- primes


def _is_prime(m: int) -> bool:
    if m < 2:
        return False
    for q in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if m % q == 0:
            return m == q
    d, s = m - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, m)
        if x in (1, m - 1):
            continue
        for _ in range(s - 1):
            x = x * x % m
            if x == m - 1:
                break
        else:
            return False
    return True


@functools.lru_cache(maxsize=None)
def batching_prime(min_value: int, ring_degree: int = 32768) -> int:
    """Smallest prime p > min_value with p = 1 mod 2N (so BFV batching gives N slots)."""
    step = 2 * ring_degree
    c = (min_value // step + 1) * step + 1
    while not _is_prime(c):
        c += step
    return c


# ----------------------------------------------------------------------------- circuit choices


def band(n: int, rule: str, f: int) -> tuple[int, int]:
    """Selected ranks (lo, hi) and the divisor for ``rule`` over n inputs.

    trimmed_mean: ranks f..n-f-1 (needs n > 2f). median: f_med = floor((n-1)/2), i.e. the middle
    rank for odd n and the two middle ranks for even n (their mean is the median)."""
    if rule == "median":
        fm = (n - 1) // 2
        return fm, n - 1 - fm
    if rule == "trimmed_mean":
        if not 0 <= 2 * f < n:
            raise HEParameterError(f"trimmed mean needs n > 2f, got n={n}, f={f}")
        return f, n - 1 - f
    raise HEParameterError(f"unknown rule {rule!r}; HE supports trimmed_mean, median")


def _digit_cost(dmax: int, need_zero: bool, strat: DigitStrategy, p: int) -> tuple[int, int]:
    ops = TraceOps(NoiseModel(16384, p), 0.0)
    e = ops.input()
    n_val, z_val = digit_tests(ops, e, dmax, need_zero, strat, p)
    depth = max(v.depth for v in (n_val, z_val) if v is not None and not isinstance(v, int))
    return ops.products, depth


@functools.lru_cache(maxsize=None)
def best_digit_strategy(dmax: int, need_zero: bool, p: int, depth_first: bool) -> DigitStrategy:
    """Cheapest evaluation of Neg (and Zero) on differences in {-dmax..dmax}."""
    deg = 2 * dmax
    best_key, best = None, DigitStrategy()
    for mode in ("direct", "evenodd"):
        top = deg if mode == "direct" else max(dmax, 1)
        for k in range(1, min(top, 2 * math.isqrt(top) + 2) + 1):
            for dw in (0.0, 0.5, 100.0):
                strat = DigitStrategy(mode, k, dw)
                prods, depth = _digit_cost(dmax, need_zero, strat, p)
                key = (depth, prods) if depth_first else (prods, depth)
                if best_key is None or key < best_key:
                    best_key, best = key, strat
    return best


@functools.lru_cache(maxsize=None)
def best_btw(n: int, lo: int, hi: int, p: int, depth_first: bool) -> tuple[int, float]:
    """Baby-step count and depth weight for Btw as a polynomial in w."""
    deg = max(len(btw_poly_symmetric(n, lo, hi, p)) - 1, 1)
    best_key, best = None, (1, 0.0)
    for k in range(1, min(deg, 2 * math.isqrt(deg) + 2) + 1):
        for dw in (0.0, 0.5, 100.0):
            spec = CircuitSpec(n, lo, hi, p, (1,), (1,), 0, (DigitStrategy(),), btw_k=k, btw_depth_weight=dw)
            ops = TraceOps(NoiseModel(16384, p), 0.0)
            s = select(ops, [ops.input()], spec)[0]
            depth = 0 if isinstance(s, int) else s.depth
            key = (depth, ops.products) if depth_first else (ops.products, depth)
            if best_key is None or key < best_key:
                best_key, best = key, (k, dw)
    return best


# digit ranges wider than this give Neg/Zero polynomials of degree > 64: never the cheapest
MAX_DIGIT_VALUE = 32


def digit_plans(max_value: int, digits: int | None = None) -> list[DigitPlan]:
    """One digit, and for L = 2.. the uniform low radices r near the balanced one (the smallest
    r with r^L > max_value, +-2) with a non-empty top digit. Digits wider than
    MAX_DIGIT_VALUE are skipped unless ``digits`` forces the split."""
    plans = [] if digits not in (None, 1) else [DigitPlan(max_value)]
    max_l = max(1, max_value.bit_length())
    for L in range(2, max_l + 1):
        if digits is not None and L != digits:
            continue
        balanced = 2
        while balanced**L <= max_value:
            balanced += 1
        for r in range(max(2, balanced - 2), balanced + 3):
            if r ** (L - 1) <= max_value:
                plans.append(DigitPlan(max_value, (r,) * (L - 1)))
    if digits is None:
        plans = [pl for pl in plans if max(pl.digit_max) <= MAX_DIGIT_VALUE]
    return plans


def _spec_for(n: int, lo: int, hi: int, p: int, plan: DigitPlan, offset: int, depth_first: bool) -> CircuitSpec:
    strategies = tuple(best_digit_strategy(dmax, k > 0, p, depth_first) for k, dmax in enumerate(plan.digit_max))
    btw_k, btw_dw = best_btw(n, lo, hi, p, depth_first)
    return CircuitSpec(n, lo, hi, p, plan.digit_max, plan.weights, offset, strategies, btw_k, btw_dw)


def trace(spec: CircuitSpec, noise: NoiseModel, fresh_budget: float) -> tuple[TraceOps, object]:
    ops = TraceOps(noise, fresh_budget)
    digits = [[ops.input() for _ in range(spec.digits)] for _ in range(spec.n)]
    out = trimmed_sum(ops, digits, spec)
    return ops, out


def _primes_for(ring: int, data_bits_needed: float) -> tuple[int, ...] | None:
    """Fewest equal-ish primes (each MIN..MAX_PRIME_BITS) giving >= data_bits_needed of data
    modulus plus a special prime as large as the largest, within the security bound."""
    bound = MAX_COEFF_BITS_128[ring]
    need = max(math.ceil(data_bits_needed), MIN_PRIME_BITS)
    for k in range(1, 40):
        b = math.ceil(need / k)
        if b > MAX_PRIME_BITS:
            continue
        b = max(b, MIN_PRIME_BITS)
        sizes = [b] * k
        excess = b * k - need  # trim the surplus from the last primes (keeps q tight)
        i = k - 1
        while excess > 0 and i >= 0:
            cut = min(excess, sizes[i] - MIN_PRIME_BITS)
            sizes[i] -= cut
            excess -= cut
            i -= 1
        special = max(sizes)
        if sum(sizes) + special <= bound:
            return tuple(sizes) + (special,)
        return None
    return None


def seconds_per_product(ring: int, primes: int) -> float:
    return _SECONDS_PER_PRODUCT_UNIT * ring * math.log2(ring) * primes


def plan_hts(
    n: int,
    lo: int,
    hi: int,
    delta: int,
    *,
    digits: int | None = None,
    poly_modulus_degree: int | None = None,
    margin_bits: float = 12.0,
    max_poly_modulus_degree: int = 32768,
    check: bool = False,
    subsets: tuple[tuple[int, int, int], ...] = (),
) -> HEPlan:
    """The cheapest safe plan for HTS over n inputs keeping ranks lo..hi of delta-bit values;
    with ``check``, the modulus also covers the digit check (:mod:`~fedsafe.protocols.he.validity`)
    on the same fresh uploads, and its products count in the time model (n nodes per block).

    ``subsets``: ``(m, lo_m, hi_m)`` circuits the same parameters must also run (HTS over the m
    uploads left when the check excludes nodes, :func:`plan_subset`). Their noise differs from
    the full circuit's by a few bits either way (the rank polynomials' coefficients); when one
    needs more, the plan is redone with that much more modulus reserved."""
    reserve = 0.0
    for _ in range(4):
        plan = _plan_once(n, lo, hi, delta, digits, poly_modulus_degree, margin_bits, max_poly_modulus_degree, check, reserve)
        excess = _subset_excess(plan, subsets)
        if excess <= 1e-9:
            return plan
        reserve += excess + 0.25
    raise HEParameterError(f"no parameters found for HTS over n={n} that also cover the subsets {list(subsets)}")


def _subset_excess(plan: HEPlan, subsets: tuple[tuple[int, int, int], ...]) -> float:
    """Bits of budget the cheapest circuit of each subset lacks under ``plan`` (max; 0 if none)."""
    if not subsets:
        return 0.0
    prm = plan.params
    noise = NoiseModel(prm.poly_modulus_degree, plan.spec.p)
    room = noise.fresh(prm.data_bits) - plan.margin_bits
    worst = 0.0
    for m, lo_m, hi_m in subsets:
        consumed = min(_consumed(_spec_for(m, lo_m, hi_m, plan.spec.p, plan.digits, plan.spec.offset, df), noise) for df in (False, True))
        worst = max(worst, consumed - room)
    return worst


@dataclass(frozen=True)
class _Traced:
    """What the planner uses of a trace (from a fresh budget of 1e4 bits)."""

    products: int
    relins: int
    consumed: float
    depth: int
    stage_budget: tuple[tuple[str, float], ...]


@functools.lru_cache(maxsize=4096)
def _traced(spec: CircuitSpec, noise: NoiseModel) -> _Traced:
    """:func:`trace` of ``spec``, summarised and cached: a plan redone with a reserve, and the
    subsets of a plan, trace the same circuits again."""
    ops, out = trace(spec, noise, 1e4)
    if isinstance(out, int):
        return _Traced(ops.products, ops.relins, 0.0, 0, tuple(ops.stage_budget.items()))
    return _Traced(ops.products, ops.relins, 1e4 - out.budget, out.depth, tuple(ops.stage_budget.items()))


def _consumed(spec: CircuitSpec, noise: NoiseModel) -> float:
    return _traced(spec, noise).consumed


def _plan_once(
    n: int,
    lo: int,
    hi: int,
    delta: int,
    digits: int | None,
    poly_modulus_degree: int | None,
    margin_bits: float,
    max_poly_modulus_degree: int,
    check: bool,
    reserve_bits: float,
) -> HEPlan:
    if n < 1:
        raise HEParameterError("need at least one input")
    if not 2 <= delta <= 8:
        raise HEParameterError(f"delta must be in 2..8 bits, got {delta}")
    offset = (1 << (delta - 1)) - 1
    max_value = 2 * offset
    rings = [r for r in RING_DEGREES if r <= max_poly_modulus_degree]
    if poly_modulus_degree is not None:
        if poly_modulus_degree not in MAX_COEFF_BITS_128:
            raise HEParameterError(f"poly_modulus_degree must be one of {RING_DEGREES}, got {poly_modulus_degree}")
        rings = [poly_modulus_degree]
    # interpolation points: digit differences (<= 2M+1), w values (<= (n-1)^2), ranks (< n);
    # centered decoding of |sum| <= n*o needs p > 2*n*o
    p = batching_prime(max(2 * max_value + 1, (n - 1) ** 2, 2 * n * offset + 1, 3), max(rings))

    plans = digit_plans(max_value, digits)
    if not plans:
        raise HEParameterError(f"no split of 0..{max_value} into {digits} digits")
    candidates: list[HEPlan] = []
    tried: list[str] = []
    for dplan in plans:
        for depth_first in (False, True):
            spec = _spec_for(n, lo, hi, p, dplan, offset, depth_first)
            chk = make_check(p, dplan.digit_max, depth_first) if check else None
            for ring in rings:
                noise = NoiseModel(ring, p)
                ops = _traced(spec, noise)
                consumed, depth = ops.consumed, ops.depth
                chk_products, chk_depth, chk_consumed = _check_cost(chk, noise)
                need_bits = max(consumed + reserve_bits, chk_consumed) + margin_bits + noise.log_p + noise.fresh_slack
                primes = _primes_for(ring, need_bits)
                if primes is None:
                    tried.append(f"N={ring}: {dplan.describe()} needs ~{need_bits:.0f} data bits")
                    continue
                params = HEParams(ring, p, primes)
                params.check_security()
                sec = seconds_per_product(ring, len(primes))
                est = ops.products * sec * (1 - _RELIN_SHARE) + ops.relins * sec * _RELIN_SHARE
                est += n * chk_products * sec  # the check's products (relinearised once each)
                fresh = noise.fresh(params.data_bits)
                stage_need = tuple(
                    (stage, b - (1e4 - consumed)) for stage, b in ops.stage_budget
                ) + (("final", 0.0),)
                plan = HEPlan(
                    params=params,
                    digits=dplan,
                    spec=replace(spec, stage_need=stage_need),
                    delta=delta,
                    products=ops.products,
                    relins=ops.relins,
                    depth=depth,
                    consumed_bits=consumed,
                    final_budget_bits=fresh - consumed,
                    margin_bits=margin_bits,
                    est_seconds_per_block=est,
                    check=None if chk is None else with_stage_need(chk, noise),
                    check_products=chk_products,
                    check_depth=chk_depth,
                    check_consumed_bits=chk_consumed,
                )
                candidates.append(plan)
                break  # a larger ring for the same spec is never cheaper per slot here
    if not candidates:
        biggest = max(rings)
        raise HEParameterError(
            f"no 128-bit-secure BFV parameters for HTS with n={n}, ranks {lo}..{hi}, delta={delta}: "
            f"the circuit's noise needs more modulus than N={biggest} allows "
            f"({MAX_COEFF_BITS_128[biggest]} bits). Tried: " + "; ".join(tried[:6])
            + ". Lower delta (he.bits), use fewer inputs (he.subsample), or allow a larger ring."
        )
    # fastest per slot; among plans within UPLOAD_TOLERANCE of it, the fewest digit planes
    # (each digit is one more ciphertext per node per block to upload)
    per_slot = [c.est_seconds_per_block / c.slots for c in candidates]
    fastest = min(per_slot)
    near = [c for c, t in zip(candidates, per_slot) if t <= fastest * (1 + UPLOAD_TOLERANCE)]
    return min(near, key=lambda c: (c.digits.digits, c.est_seconds_per_block / c.slots))



@functools.lru_cache(maxsize=1024)
def _check_cost(chk: DigitCheck | None, noise: NoiseModel) -> tuple[int, int, float]:
    """(products per node and block, depth, budget consumed over CHECK_GROUP_BLOCKS blocks)."""
    if chk is None:
        return 0, 0, 0.0
    one, _ = trace_check(chk, noise, 1e4, blocks=1)
    _, out = trace_check(chk, noise, 1e4, blocks=CHECK_GROUP_BLOCKS)
    return one.products, out.depth, 1e4 - out.budget


@functools.lru_cache(maxsize=256)
def plan_subset(plan: HEPlan, n: int, lo: int, hi: int) -> HEPlan:
    """HTS over ``n`` of the uploads encrypted under ``plan`` (nodes excluded after they
    uploaded, by the digit check): the same BFV parameters, digit split and plaintext prime, the
    circuit for n inputs keeping ranks lo..hi. Fewer inputs never need more budget in practice
    (smaller rank polynomials); it is checked, and refused with :class:`HEParameterError` if not."""
    if n == plan.spec.n and (lo, hi) == (plan.spec.lo, plan.spec.hi):
        return plan
    if not 1 <= n <= plan.spec.n:
        raise HEParameterError(f"a subset of {plan.spec.n} uploads has 1..{plan.spec.n} of them, not {n}")
    p, prm = plan.spec.p, plan.params
    noise = NoiseModel(prm.poly_modulus_degree, p)
    fresh = noise.fresh(prm.data_bits)
    best: HEPlan | None = None
    for depth_first in (False, True):
        spec = _spec_for(n, lo, hi, p, plan.digits, plan.spec.offset, depth_first)
        ops = _traced(spec, noise)
        consumed = ops.consumed
        if fresh - consumed < plan.margin_bits - 1e-9:
            continue
        sec = seconds_per_product(prm.poly_modulus_degree, len(prm.coeff_bits))
        est = ops.products * sec * (1 - _RELIN_SHARE) + ops.relins * sec * _RELIN_SHARE
        stage_need = tuple((stage, b - (1e4 - consumed)) for stage, b in ops.stage_budget) + (("final", 0.0),)
        cand = replace(
            plan,
            spec=replace(spec, stage_need=stage_need),
            products=ops.products,
            relins=ops.relins,
            depth=ops.depth,
            consumed_bits=consumed,
            final_budget_bits=fresh - consumed,
            est_seconds_per_block=est + n * plan.check_products * sec,
        )
        if best is None or cand.est_seconds_per_block < best.est_seconds_per_block:
            best = cand
    if best is None:
        raise HEParameterError(
            f"the parameters planned for {plan.spec.n} inputs ({prm.describe()}) leave too little noise "
            f"budget for HTS over {n} of them (ranks {lo}..{hi})"
        )
    return best
