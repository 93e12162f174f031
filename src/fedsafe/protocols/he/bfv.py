"""BFV backend on TenSEAL's SEAL bindings (``tenseal.sealapi``): keys, nodes, server, wire format.

Parties and keys (see the package docstring for the threat model):

* :class:`NodeKeyring` -- held by the nodes, who all share it: the secret key (decrypt, and the
  cheaper *symmetric* encryption whose serialized form stores a 32-byte seed instead of the
  second polynomial, halving the upload), plus the public material it derives.
* :class:`ServerKeys` -- the only thing the server ever receives: the parameters, the public key
  (to re-randomise duplicated ciphertexts) and the relinearisation keys. No Galois keys: the
  circuit never rotates slots. :class:`HEServer` is built from it alone and cannot decrypt.

Wire format: an :class:`EncryptedUpload` per node holds, for each block of N coordinates
(N = ring degree = SIMD slots) and each digit plane, one serialized ciphertext; the server
checks every field against its own parameters and names the node on any mismatch.

Server arithmetic (:class:`SealOps`) implements the circuit interface of
:mod:`fedsafe.protocols.he.ops` with: lazy relinearisation (a product is relinearised once, when
it is itself multiplied or at the end, so products only summed -- comparisons into ranks, the
selected terms into the result -- skip it), modulus switching at stage boundaries driven by the
:class:`~fedsafe.protocols.he.ops.NoiseModel` (drop primes the rest of the circuit does not need;
cheaper products, and a small result to download), and cached scalar plaintexts.
Independent blocks run in a pool of worker processes (``workers``).
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedsafe.core.errors import FedsafeError
from fedsafe.protocols.he.circuit import CircuitSpec, trimmed_sum
from fedsafe.protocols.he.encoding import DigitPlan, Quantizer
from fedsafe.protocols.he.ops import NoiseModel
from fedsafe.protocols.he.params import HEParameterError, HEParams, HEPlan
from fedsafe.protocols.he.validity import DigitCheck, check_circuit, draw_node_randomness, group_blocks, groups, slot_sums

try:  # optional dependency (pip install fedsafe[he]); the emulator works without it
    import tenseal.sealapi as seal
except ImportError:  # pragma: no cover - exercised only where tenseal is absent
    seal = None


class MalformedUploadError(FedsafeError, ValueError):
    """A node's upload cannot be used; ``client_id`` names the node."""

    def __init__(self, client_id: int, reason: str) -> None:
        self.client_id = client_id
        self.reason = reason
        super().__init__(f"client {client_id}: {reason}")


def require_seal() -> None:
    if seal is None:
        raise HEParameterError("the BFV backend needs TenSEAL (pip install 'fedsafe[he]'); backend='emulator' does not")


# ----------------------------------------------------------------------------- serialization
# The bindings (de)serialize through file paths only; a private directory in RAM-backed
# /dev/shm where available keeps that a memory copy.

_TMP_LOCK = threading.Lock()
_TMP_DIR: str | None = None
_COUNTER = itertools.count()


def _remove_tmp_dir(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _tmp_path() -> str:
    global _TMP_DIR
    with _TMP_LOCK:
        if _TMP_DIR is None or not os.path.isdir(_TMP_DIR):
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            _TMP_DIR = tempfile.mkdtemp(prefix="fedsafe-he-", dir=base)
            atexit.register(_remove_tmp_dir, _TMP_DIR)
        return os.path.join(_TMP_DIR, f"{os.getpid()}-{threading.get_ident()}-{next(_COUNTER)}.bin")


def to_bytes(obj: Any) -> bytes:
    """SEAL object (ciphertext, key, serializable) -> bytes."""
    path = _tmp_path()
    try:
        obj.save(path)
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        if os.path.exists(path):
            os.unlink(path)


def from_bytes(obj: Any, context: Any, data: bytes) -> Any:
    """Load ``data`` into the empty SEAL object ``obj`` (validated against ``context``)."""
    path = _tmp_path()
    try:
        with open(path, "wb") as fh:
            fh.write(data)
        obj.load(context, path)
        return obj
    finally:
        if os.path.exists(path):
            os.unlink(path)


# ----------------------------------------------------------------------------- context


class BFVContext:
    """SEAL context for :class:`HEParams` (128-bit security enforced by SEAL) and its
    modulus chain (level 0 = fresh ciphertexts, then one prime fewer per level)."""

    def __init__(self, params: HEParams) -> None:
        require_seal()
        params.check_security()
        parms = seal.EncryptionParameters(seal.SCHEME_TYPE.BFV)
        parms.set_poly_modulus_degree(params.poly_modulus_degree)
        try:
            parms.set_coeff_modulus(seal.CoeffModulus.Create(params.poly_modulus_degree, list(params.coeff_bits)))
        except Exception as exc:  # SEAL: not enough NTT-friendly primes of a size
            raise HEParameterError(f"cannot build coefficient modulus {params.coeff_bits}: {exc}") from exc
        parms.set_plain_modulus(params.plain_modulus)
        ctx = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
        if not ctx.parameters_set():
            raise HEParameterError(f"SEAL rejects {params.describe()}: {ctx.parameters_error_message()}")
        if not ctx.first_context_data().qualifiers().using_batching:
            raise HEParameterError(f"p={params.plain_modulus} does not allow batching for N={params.poly_modulus_degree}")
        self.params = params
        self.context = ctx
        self.encoder = seal.BatchEncoder(ctx)
        self.levels: list[tuple[Any, float]] = []
        cd = ctx.first_context_data()
        while cd is not None:
            bits = sum(float(np.log2(float(m.value()))) for m in cd.parms().coeff_modulus())
            self.levels.append((cd.parms_id(), bits))
            cd = cd.next_context_data()
        self.fingerprint = hashlib.sha256(
            repr((params.poly_modulus_degree, params.plain_modulus, [m.value() for m in parms.coeff_modulus()])).encode()
        ).hexdigest()[:16]

    @property
    def slots(self) -> int:
        return self.params.poly_modulus_degree


def plan_fingerprint(ctx: BFVContext, digits: DigitPlan, spec: CircuitSpec) -> str:
    """What a node and the server must agree on: parameters, digit split, n."""
    return hashlib.sha256(repr((ctx.fingerprint, digits.max_value, digits.radices, spec.n, spec.p)).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class ServerKeys:
    """Public key material only: what the server receives at setup."""

    params: HEParams
    public_key: bytes
    relin_keys: bytes

    @property
    def nbytes(self) -> int:
        return len(self.public_key) + len(self.relin_keys)


class NodeKeyring:
    """The key shared by all nodes (one BFV key; the nodes run key generation among themselves).
    Holds the secret key: never hand this object to the server; give it :meth:`server_keys`."""

    def __init__(self, params: HEParams) -> None:
        self.ctx = BFVContext(params)
        kg = seal.KeyGenerator(self.ctx.context)
        self._secret_key = kg.secret_key()
        pk = seal.PublicKey()
        kg.create_public_key(pk)
        rk = seal.RelinKeys()
        kg.create_relin_keys(rk)
        self._server_keys = ServerKeys(params, to_bytes(pk), to_bytes(rk))
        self._encryptor = seal.Encryptor(self.ctx.context, self._secret_key)
        self._decryptor = seal.Decryptor(self.ctx.context, self._secret_key)

    @property
    def params(self) -> HEParams:
        return self.ctx.params

    def server_keys(self) -> ServerKeys:
        return self._server_keys

    def encrypt(self, slots: np.ndarray) -> bytes:
        """Symmetric (seeded) encryption of up to N residues, serialized."""
        if slots.shape[0] > self.ctx.slots:
            raise ValueError(f"{slots.shape[0]} values do not fit {self.ctx.slots} slots")
        pt = seal.Plaintext()
        self.ctx.encoder.encode(np.asarray(slots, dtype=np.int64).tolist(), pt)
        return to_bytes(self._encryptor.encrypt_symmetric(pt))

    def _load(self, data: bytes) -> Any:
        return from_bytes(seal.Ciphertext(), self.ctx.context, data)

    def decrypt(self, data: bytes) -> np.ndarray:
        """Residues mod p in every slot (int64)."""
        pt = seal.Plaintext()
        self._decryptor.decrypt(self._load(data), pt)
        return np.asarray(self.ctx.encoder.decode_uint64(pt), dtype=np.int64)

    def noise_budget(self, data: bytes) -> int:
        """SEAL's invariant noise budget (bits) left in a ciphertext: 0 means undecryptable."""
        return self._decryptor.invariant_noise_budget(self._load(data))


# ----------------------------------------------------------------------------- wire format


@dataclass(frozen=True)
class EncryptedUpload:
    """One node's encrypted message: ``ciphertexts[block][digit]``."""

    client_id: int
    fingerprint: str
    length: int  # coordinates encoded
    ciphertexts: tuple[tuple[bytes, ...], ...]

    @property
    def nbytes(self) -> int:
        return sum(len(c) for blk in self.ciphertexts for c in blk)


@dataclass(frozen=True)
class EncryptedResult:
    """The server's answer: one ciphertext per block holding the trimmed sums."""

    fingerprint: str
    length: int
    blocks: tuple[bytes, ...]
    seconds: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.blocks)


@dataclass(frozen=True)
class EncryptedCheck:
    """The server's digit check (:mod:`fedsafe.protocols.he.validity`): for each node, in upload
    order, one ciphertext per group of blocks holding its masked check slots."""

    fingerprint: str
    client_ids: tuple[int, ...]
    nodes: tuple[tuple[bytes, ...], ...]
    seconds: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(len(c) for node in self.nodes for c in node)


class HENode:
    """A node's side of SABLE: quantize its own vector (clamp), split into digits, encrypt per
    block; and decrypt the server's result into signed integer trimmed sums."""

    def __init__(self, keyring: NodeKeyring, plan: HEPlan, quantizer: Quantizer) -> None:
        if keyring.params != plan.params:
            raise HEParameterError("keyring and plan have different BFV parameters")
        if quantizer.max_value != plan.digits.max_value:
            raise HEParameterError(f"quantizer (delta={quantizer.delta}) does not match the plan (delta={plan.delta})")
        self.keyring = keyring
        self.plan = plan
        self.quantizer = quantizer
        self.fingerprint = plan_fingerprint(keyring.ctx, plan.digits, plan.spec)

    def encrypt_shifted(self, client_id: int, shifted: np.ndarray) -> EncryptedUpload:
        """Encrypt already-shifted integers a in {0..M} (tests; :meth:`encrypt` clamps first)."""
        a = np.asarray(shifted, dtype=np.int64)
        return self.encrypt_digit_planes(client_id, np.stack(self.plan.digits.split(a)).reshape(self.plan.digits.digits, -1))

    def encrypt_digit_planes(self, client_id: int, planes: np.ndarray) -> EncryptedUpload:
        """Encrypt ``planes[k, j]`` (digit k of coordinate j) as they are: residues mod p, in
        range or not. An honest node passes its encoder's digits; every node holds the key and
        *can* pass anything -- which the digit check (:meth:`HEServer.digit_check`) detects."""
        c = np.asarray(planes, dtype=np.int64)
        if c.ndim != 2 or c.shape[0] != self.plan.digits.digits:
            raise ValueError(f"expected ({self.plan.digits.digits}, d) digit planes, got {c.shape}")
        c = c % self.plan.params.plain_modulus
        slots = self.keyring.ctx.slots
        blocks = []
        for b0 in range(0, max(c.shape[1], 1), slots):
            blocks.append(tuple(self.keyring.encrypt(c[k, b0 : b0 + slots]) for k in range(c.shape[0])))
        return EncryptedUpload(client_id, self.fingerprint, int(c.shape[1]), tuple(blocks))

    def encrypt(self, client_id: int, vector: np.ndarray) -> EncryptedUpload:
        return self.encrypt_shifted(client_id, self.quantizer.shifted(vector))

    def decrypt(self, result: EncryptedResult) -> np.ndarray:
        """Signed trimmed sums (int64, ``result.length`` of them)."""
        if result.fingerprint != self.fingerprint:
            raise HEParameterError("result was computed under different parameters")
        p = self.plan.params.plain_modulus
        parts = [self.keyring.decrypt(b) for b in result.blocks]
        r = np.concatenate(parts)[: result.length] if parts else np.zeros(0, dtype=np.int64)
        return np.where(r > p // 2, r - p, r)

    def check_slots(self, check: EncryptedCheck) -> np.ndarray:
        """The decrypted check slots, ``(nodes, groups, N)`` residues: what the decryptor sees
        (masked: only each node's slot sum carries information)."""
        if check.fingerprint != self.fingerprint:
            raise HEParameterError("digit check was computed under different parameters")
        return np.stack([np.stack([self.keyring.decrypt(c) for c in node]) for node in check.nodes])

    def check_sums(self, check: EncryptedCheck) -> np.ndarray:
        """Per node, the sum of its check slots mod p: 0 iff its digits are all in range."""
        return slot_sums(self.check_slots(check), self.plan.params.plain_modulus)


# ----------------------------------------------------------------------------- server arithmetic


class SealValue:
    __slots__ = ("ct", "budget", "depth", "level", "size")

    def __init__(self, ct: Any, budget: float, depth: int, level: int, size: int = 2) -> None:
        self.ct = ct
        self.budget = budget
        self.depth = depth
        self.level = level
        self.size = size


class SealOps:
    """The circuit interface over SEAL ciphertexts (see module docstring)."""

    def __init__(self, ctx: BFVContext, relin_keys: Any, spec: CircuitSpec | DigitCheck, margin_bits: float) -> None:
        self.ctx = ctx
        self.ev = seal.Evaluator(ctx.context)
        self.rk = relin_keys
        self.spec = spec
        self.margin = margin_bits
        self.p = ctx.params.plain_modulus
        self.noise = NoiseModel(ctx.params.poly_modulus_degree, self.p)
        self._plain: dict[int, Any] = {}
        self.products = 0
        self.plain_products = 0
        self.relins = 0
        self.switches = 0

    # -- helpers
    def input(self, ct: Any) -> SealValue:
        return SealValue(ct, self.noise.fresh(self.ctx.levels[0][1]), 0, 0)

    def _scalar(self, c: int) -> Any:
        pt = self._plain.get(c)
        if pt is None:
            pt = seal.Plaintext(f"{c:X}")
            self._plain[c] = pt
        return pt

    def _at(self, v: SealValue, level: int) -> SealValue:
        """v at a lower level (a new ciphertext; v itself may still be used at its level)."""
        if v.level == level:
            return v
        out = seal.Ciphertext()
        self.ev.mod_switch_to(v.ct, self.ctx.levels[level][0], out)
        self.switches += 1
        return SealValue(out, self.noise.switch(v.budget, self.ctx.levels[level][1]), v.depth, level, v.size)

    def _relin(self, v: SealValue) -> None:
        if v.size > 2:
            self.ev.relinearize_inplace(v.ct, self.rk)
            v.size = 2
            self.relins += 1

    # -- circuit interface
    def add(self, a: SealValue, b: SealValue) -> SealValue:
        lvl = max(a.level, b.level)
        a, b = self._at(a, lvl), self._at(b, lvl)
        out = seal.Ciphertext()
        self.ev.add(a.ct, b.ct, out)
        return SealValue(out, self.noise.lincomb([(1, a.budget), (1, b.budget)]), max(a.depth, b.depth), lvl, max(a.size, b.size))

    def sub(self, a: SealValue, b: SealValue) -> SealValue:
        lvl = max(a.level, b.level)
        a, b = self._at(a, lvl), self._at(b, lvl)
        out = seal.Ciphertext()
        self.ev.sub(a.ct, b.ct, out)
        return SealValue(out, self.noise.lincomb([(1, a.budget), (1, b.budget)]), max(a.depth, b.depth), lvl, max(a.size, b.size))

    def mul(self, a: SealValue, b: SealValue) -> SealValue:
        if a is b:
            return self.square(a)
        self._relin(a)
        self._relin(b)
        lvl = max(a.level, b.level)
        a, b = self._at(a, lvl), self._at(b, lvl)
        out = seal.Ciphertext()
        self.ev.multiply(a.ct, b.ct, out)
        self.products += 1
        return SealValue(out, self.noise.mul(a.budget, b.budget), max(a.depth, b.depth) + 1, lvl, 3)

    def square(self, a: SealValue) -> SealValue:
        self._relin(a)
        out = seal.Ciphertext()
        self.ev.square(a.ct, out)
        self.products += 1
        return SealValue(out, self.noise.mul(a.budget, a.budget), a.depth + 1, a.level, 3)

    def _encode(self, values: np.ndarray) -> Any:
        pt = seal.Plaintext()
        self.ctx.encoder.encode((np.asarray(values, dtype=np.int64) % self.p).tolist(), pt)
        return pt

    def mul_plain(self, a: SealValue, values: np.ndarray) -> SealValue:
        out = seal.Ciphertext()
        self.ev.multiply_plain(a.ct, self._encode(values), out)
        self.plain_products += 1
        return SealValue(out, self.noise.mul_plain(a.budget), a.depth, a.level, a.size)

    def add_plain(self, a: SealValue, values: np.ndarray) -> SealValue:
        out = seal.Ciphertext()
        self.ev.add_plain(a.ct, self._encode(values), out)
        return SealValue(out, a.budget, a.depth, a.level, a.size)

    def lincomb(self, terms: Sequence[tuple[int, SealValue]], const: int) -> SealValue:
        p = self.p
        lvl = max(x.level for _, x in terms)
        acc = None
        for c, x in terms:
            c %= p
            if c == 0:
                continue
            x = self._at(x, lvl)
            if c == 1:
                t = x.ct
            elif c == p - 1:
                t = seal.Ciphertext()
                self.ev.negate(x.ct, t)
            else:
                t = seal.Ciphertext()
                self.ev.multiply_plain(x.ct, self._scalar(c), t)
            if acc is None:
                if t is x.ct:  # never alias an input: values are mutated in place (relin, hint)
                    t = seal.Ciphertext()
                    self.ev.mod_switch_to(x.ct, x.ct.parms_id(), t)  # same level: a copy
                acc = t
            else:
                self.ev.add_inplace(acc, t)
        if acc is None:
            raise ValueError("lincomb with all-zero coefficients")
        c0 = const % p
        if c0:
            self.ev.add_plain_inplace(acc, self._scalar(c0))
        return SealValue(
            acc,
            self.noise.lincomb([(c, x.budget) for c, x in terms]),
            max(x.depth for _, x in terms),
            lvl,
            max(x.size for _, x in terms),
        )

    def _lowest_level(self, v: SealValue, need: float) -> int:
        """Deepest level at which v still has ``need`` + margin bits of modelled budget."""
        best = v.level
        for lvl in range(v.level + 1, len(self.ctx.levels)):
            if self.noise.switch(v.budget, self.ctx.levels[lvl][1]) - need >= self.margin:
                best = lvl
            else:
                break
        return best

    def hint(self, stage: str, values: Sequence[Any]) -> None:
        need = self.spec.need(stage)
        if need is None:
            return
        for v in values:
            if isinstance(v, SealValue):
                lvl = self._lowest_level(v, need)
                if lvl != v.level:
                    w = self._at(v, lvl)
                    v.ct, v.budget, v.level = w.ct, w.budget, w.level

    def finish(self, v: SealValue) -> SealValue:
        self._relin(v)
        need = self.spec.need("final")
        if need is not None:
            v = self._at(v, self._lowest_level(v, need))
        return v


# ----------------------------------------------------------------------------- server


class _EvalState:
    """What one process needs to evaluate blocks: the context and the relinearisation keys."""

    def __init__(self, keys: ServerKeys) -> None:
        self.ctx = BFVContext(keys.params)
        self.relin = from_bytes(seal.RelinKeys(), self.ctx.context, keys.relin_keys)
        self.public = from_bytes(seal.PublicKey(), self.ctx.context, keys.public_key)
        self.encryptor = seal.Encryptor(self.ctx.context, self.public)
        self.evaluator = seal.Evaluator(self.ctx.context)


_WORKER: _EvalState | None = None


def _worker_init(keys: ServerKeys) -> None:
    global _WORKER
    _WORKER = _EvalState(keys)


def _evaluate_block(state: _EvalState, block: list[list[bytes]], spec: CircuitSpec, margin: float) -> tuple[bytes, dict[str, float]]:
    t0 = time.perf_counter()
    ops = SealOps(state.ctx, state.relin, spec, margin)
    seen: set[bytes] = set()
    digits = []
    for node in block:
        row = []
        for data in node:
            ct = from_bytes(seal.Ciphertext(), state.ctx.context, data)
            key = hashlib.sha256(data).digest()
            if key in seen:
                # a byte-identical copy (a replayed upload): differences of equal ciphertexts are
                # "transparent" (SEAL refuses them), so re-randomise with a fresh encryption of 0
                zero = seal.Ciphertext()
                state.encryptor.encrypt_zero(zero)
                state.evaluator.add_inplace(ct, zero)
            seen.add(key)
            row.append(ops.input(ct))
        digits.append(row)
    out = trimmed_sum(ops, digits, spec)
    stats = {
        "products": float(ops.products),
        "relins": float(ops.relins),
        "switches": float(ops.switches),
        "model_budget_bits": float(out.budget),
        "level": float(out.level),
        "seconds": time.perf_counter() - t0,
    }
    return to_bytes(out.ct), stats


def _evaluate_block_in_worker(block: list[list[bytes]], spec: CircuitSpec, margin: float) -> tuple[bytes, dict[str, float]]:
    assert _WORKER is not None, "worker not initialised"
    return _evaluate_block(_WORKER, block, spec, margin)


def _check_group(
    state: _EvalState, blocks: list[list[bytes]], mults: np.ndarray, mask: np.ndarray, check: DigitCheck, margin: float
) -> tuple[bytes, dict[str, float]]:
    """The digit check over one group of one node's blocks (``blocks[b][k]``), with the server's
    multipliers ``mults[b, k]`` and mask: one ciphertext of masked check slots."""
    t0 = time.perf_counter()
    ops = SealOps(state.ctx, state.relin, check, margin)
    digits = [[ops.input(from_bytes(seal.Ciphertext(), state.ctx.context, data)) for data in blk] for blk in blocks]
    out = check_circuit(ops, digits, [[mults[b, k] for k in range(check.digits)] for b in range(len(blocks))], mask, check)
    stats = {
        "products": float(ops.products),
        "plain_products": float(ops.plain_products),
        "relins": float(ops.relins),
        "switches": float(ops.switches),
        "model_budget_bits": float(out.budget),
        "level": float(out.level),
        "seconds": time.perf_counter() - t0,
    }
    return to_bytes(out.ct), stats


def _check_group_in_worker(
    blocks: list[list[bytes]], mults: np.ndarray, mask: np.ndarray, check: DigitCheck, margin: float
) -> tuple[bytes, dict[str, float]]:
    assert _WORKER is not None, "worker not initialised"
    return _check_group(_WORKER, blocks, mults, mask, check, margin)


def _merge_stats(results: Sequence[tuple[bytes, dict[str, float]]]) -> dict[str, float]:
    stats: dict[str, float] = {}
    for _, st in results:
        for key, val in st.items():
            stats[key] = stats.get(key, 0.0) + val if key != "model_budget_bits" else min(stats.get(key, val), val)
    return stats


class HEServer:
    """The honest-but-curious server: public key, relinearisation keys, ciphertexts. Runs HTS per
    block, in ``workers`` processes when > 1. It has no secret key and no way to decrypt."""

    def __init__(self, keys: ServerKeys, workers: int = 1) -> None:
        if not isinstance(keys, ServerKeys):
            raise TypeError("the server takes ServerKeys (public material), not a keyring")
        self.keys = keys
        self.workers = max(1, int(workers))
        self._state = _EvalState(keys)
        self._pool: ProcessPoolExecutor | None = None

    @property
    def params(self) -> HEParams:
        return self.keys.params

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing as mp

            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=mp.get_context("spawn"), initializer=_worker_init, initargs=(self.keys,)
            )
        return self._pool

    def warm(self) -> None:
        """Start the worker processes (and load the keys in each) now, not in the first round."""
        if self.workers > 1:
            ex = self._executor()
            for fut in [ex.submit(os.getpid) for _ in range(self.workers * 2)]:
                fut.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> HEServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def validate(self, uploads: Sequence[EncryptedUpload], plan: HEPlan) -> int:
        """Check every upload against the plan (parameters, digit split, sizes, and that each
        ciphertext deserializes under the server's context as a fresh, non-transparent
        encryption); return the common length. Raises :class:`MalformedUploadError` naming the
        first offending node."""
        if plan.params != self.params:
            raise HEParameterError("plan and server keys have different BFV parameters")
        fp = plan_fingerprint(self._state.ctx, plan.digits, plan.spec)
        ctx = self._state.ctx
        first_parms = ctx.context.first_parms_id()
        length = None
        for up in uploads:
            cid = getattr(up, "client_id", "?")
            if not isinstance(up, EncryptedUpload):
                raise MalformedUploadError(cid, f"expected an EncryptedUpload, got {type(up).__name__}")
            if up.fingerprint != fp:
                raise MalformedUploadError(
                    cid, f"ciphertexts were made under other parameters (fingerprint {up.fingerprint!r}, expected {fp!r})"
                )
            if length is None:
                length = up.length
            if up.length != length or up.length < 0:
                raise MalformedUploadError(cid, f"encodes {up.length} coordinates, the others {length}")
            blocks = max(-(-up.length // ctx.slots), 1)
            if len(up.ciphertexts) != blocks:
                raise MalformedUploadError(cid, f"has {len(up.ciphertexts)} ciphertext blocks, expected {blocks} for {up.length} coordinates")
            for b, blk in enumerate(up.ciphertexts):
                if len(blk) != plan.digits.digits:
                    raise MalformedUploadError(cid, f"block {b} has {len(blk)} digit ciphertexts, expected {plan.digits.digits}")
                for k, data in enumerate(blk):
                    if not isinstance(data, (bytes, bytearray)):
                        raise MalformedUploadError(cid, f"block {b} digit {k} is not bytes")
                    try:
                        ct = from_bytes(seal.Ciphertext(), ctx.context, bytes(data))
                    except Exception as exc:
                        raise MalformedUploadError(cid, f"block {b} digit {k} is not a valid ciphertext for these parameters ({exc})") from None
                    if ct.size() != 2 or ct.parms_id() != first_parms:
                        raise MalformedUploadError(cid, f"block {b} digit {k} is not a fresh ciphertext (size {ct.size()})")
                    if ct.is_transparent():
                        raise MalformedUploadError(cid, f"block {b} digit {k} is transparent (not an encryption)")
        return int(length or 0)

    def trimmed_sum(self, uploads: Sequence[EncryptedUpload], plan: HEPlan, *, validated: bool = False) -> EncryptedResult:
        """HTS over the uploads (in the plan's node order), block by block (``validated``: the
        caller already ran :meth:`validate` on them)."""
        t0 = time.perf_counter()
        if len(uploads) != plan.spec.n:
            raise HEParameterError(f"plan is for {plan.spec.n} inputs, got {len(uploads)}")
        length = uploads[0].length if validated else self.validate(uploads, plan)
        nblocks = len(uploads[0].ciphertexts)
        tasks = [[list(up.ciphertexts[b]) for up in uploads] for b in range(nblocks)]
        if self.workers > 1 and nblocks > 1:
            ex = self._executor()
            futs = [ex.submit(_evaluate_block_in_worker, t, plan.spec, plan.margin_bits) for t in tasks]
            results = [f.result() for f in futs]
        else:
            results = [_evaluate_block(self._state, t, plan.spec, plan.margin_bits) for t in tasks]
        stats = _merge_stats(results)
        fp = plan_fingerprint(self._state.ctx, plan.digits, plan.spec)
        return EncryptedResult(fp, length, tuple(r for r, _ in results), time.perf_counter() - t0, stats)

    def digit_check(
        self, uploads: Sequence[EncryptedUpload], plan: HEPlan, rng: np.random.Generator, *, validated: bool = False
    ) -> EncryptedCheck:
        """The digit check (:mod:`fedsafe.protocols.he.validity`) on every upload: per node and
        group of blocks, ``sum r (.) V(c) + u`` with multipliers and masks drawn from ``rng``
        -- the server's own secret randomness, drawn after the uploads arrived (node after
        node, in upload order, as :func:`~fedsafe.protocols.he.validity.emulate_digit_check`)."""
        t0 = time.perf_counter()
        if plan.check is None:
            raise HEParameterError("the plan has no digit check (plan it with plan_hts(..., check=True))")
        if not validated:
            self.validate(uploads, plan)
        p, slots, digits = plan.params.plain_modulus, self.params.slots, plan.digits.digits
        tasks, owner = [], []
        for i, up in enumerate(uploads):
            nblocks = len(up.ciphertexts)
            r, u = draw_node_randomness(rng, nblocks, digits, slots, p)
            for g in range(groups(nblocks)):
                bs = group_blocks(g, nblocks)
                tasks.append(([list(up.ciphertexts[b]) for b in bs], r[bs.start : bs.stop], u[g]))
                owner.append(i)
        if self.workers > 1 and len(tasks) > 1:
            ex = self._executor()
            futs = [ex.submit(_check_group_in_worker, blk, r, u, plan.check, plan.margin_bits) for blk, r, u in tasks]
            results = [f.result() for f in futs]
        else:
            results = [_check_group(self._state, blk, r, u, plan.check, plan.margin_bits) for blk, r, u in tasks]
        nodes: list[list[bytes]] = [[] for _ in uploads]
        for i, (ct, _) in zip(owner, results):
            nodes[i].append(ct)
        fp = plan_fingerprint(self._state.ctx, plan.digits, plan.spec)
        return EncryptedCheck(
            fp, tuple(int(up.client_id) for up in uploads), tuple(tuple(n) for n in nodes), time.perf_counter() - t0, _merge_stats(results)
        )
