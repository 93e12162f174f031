"""The enclave's noise: equidistant vectors, fresh every round, precomputable and sealable.

**Construction** (paper, A.2): draw ``N`` Gaussian vectors in ``R^d``, orthogonalise them (here
a Householder QR in float64, with the signs of ``diag(R)`` folded in so the rows are Haar
distributed), and scale every row to norm ``√(C/2)``. Then for ``i ≠ j``
``‖R_i − R_j‖² = ‖R_i‖² + ‖R_j‖² − 2⟨R_i, R_j⟩ = C``. Needs ``N ≤ d`` (at most ``d``
orthogonal directions); ``N > d`` is refused.

**Randomness.** The Gaussians come from AES-256-CTR keyed with ``os.urandom`` inside the
enclave (a cryptographic generator) through Box–Muller, *not* from fedsafe's named seeded
streams: an accelerator sees ``Y ≈ R`` almost in the clear when σ² ≫ Var, so noise derived
from the experiment seed, or from a statistical generator (PCG64) whose state can be rebuilt
from its outputs, would let it regenerate ``R`` and strip it. Decoding is exact, so the noise
does not change any result and runs stay reproducible up to float64 rounding of the decoded
distances (≈ 1e-13 relative).

**Exact mode.** The block also carries the fixed-point grid ``q`` and the noise Gram ``K``
(split, see ``numerics``): ``q = 2^(E−53)`` with ``2^E ≥ clip + max|R|``, ``R`` rounded to
it. ``q`` depends only on ``clip`` and the noise, so the block, ``K`` included, is computed
ahead of time, off the round's critical path (the paper's "offline phase").

**Freshness.** Every block is used for exactly one round: the pool hands out blocks in
sequence order and forgets them; sealed blocks are bound (as GCM associated data) to the pool's
random id and their sequence number and deleted once read, so a host that replays an old file
or swaps two rounds' files gets an IntegrityError rather than reused noise. Reusing noise
across rounds would leak ``Y_t − Y_t' = g_t − g_t'``.

**Sealing** (``sealed_dir``): the paper stores pre-generated noise outside the enclave,
encrypted. Files are ``noise-<pool>-<seq>.sealed``: a cleartext JSON header (shape, C, q) that
is authenticated as associated data, then AES-256-GCM of the arrays under a key derived from the
enclave's sealing key (see ``attestation``: simulated, bound to the measurement). Format
(version 2; frame head ``{"sealed_noise": 2, "chunks": k}``, blobs ``aad``, ``salt``,
``c0 … c{k−1}``):

* ``salt``: 32 fresh bytes from ``os.urandom`` per file; the file's key is
  ``K_f = HKDF-SHA256(ikm = sealing key, salt, info = "fedsafe/tee/sealed-noise/v2")``;
* the arrays are cut into ``k`` chunks of at most 1 GiB; chunk ``i`` is AES-256-GCM under
  ``K_f`` with the 96-bit nonce ``0x00000000 ‖ uint64_be(i)`` and associated data
  ``aad ‖ uint32_le(i) ‖ uint32_le(k)`` (so chunks can be neither reordered nor dropped).

Why a key per file and a counter nonce, not random nonces under the one sealing key: GCM loses
both confidentiality and integrity if a (key, nonce) pair ever repeats. Within a file the
counter never repeats; two files share a key only if they drew the same 256-bit salt (or HKDF
collides), probability ≤ q²/2²⁵⁷ after q files. The previous format drew a 32-bit random prefix
per file under the sealing key itself: a repeat was likely (≈ q²/2³³) after some 10⁵ files. A
fully random 96-bit nonce per chunk would be ≤ Q²/2⁹⁷ for Q chunks but still caps the key at
2³² messages (NIST SP 800-38D); here each derived key seals one file, ``k`` messages.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.errors import FedsafeError
from fedsafe.protocols.crypto import (
    KEY_BYTES,
    TAG_BYTES,
    IntegrityError,
    aes_ctr_keystream,
    aes_gcm_decrypt_chunks,
    aes_gcm_encrypt,
    hkdf,
)
from fedsafe.protocols.tee.numerics import split_gram
from fedsafe.protocols.tee.wire import WireError, pack, unpack

_CHUNK = 1 << 20  # normals per AES-CTR call


class NoiseError(FedsafeError, ValueError):
    """Noise that cannot be drawn (N > d) or a request the pool cannot serve."""


def secure_standard_normal(count: int, key: bytes | None = None) -> np.ndarray:
    """``count`` independent N(0, 1) float64 values from AES-256-CTR (Box–Muller on 53-bit
    uniforms in (0, 1)). ``key`` defaults to 32 fresh bytes from ``os.urandom``."""
    enc = aes_ctr_keystream(key if key is not None else os.urandom(KEY_BYTES))
    out = np.empty(count + (count & 1), dtype=np.float64)
    zeros = bytes(8 * _CHUNK)
    for s in range(0, out.size, _CHUNK):
        m = min(_CHUNK, out.size - s)
        words = np.frombuffer(enc.update(zeros[: 8 * m]), dtype="<u8")
        u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
        u1, u2 = u[0::2], u[1::2]
        r = np.sqrt(-2.0 * np.log(u1))
        out[s : s + m : 2] = r * np.cos(2 * math.pi * u2)
        out[s + 1 : s + m : 2] = r * np.sin(2 * math.pi * u2)
    return out[:count]


def orthogonal_noise(n: int, d: int, c: float, *, key: bytes | None = None) -> Tensor:
    """``(n, d)`` float64 rows, mutually orthogonal, each of norm ``√(C/2)``, so that
    ``‖R_i − R_j‖² = C`` for ``i ≠ j`` (up to float64 rounding). Refuses ``n > d``."""
    if n > d:
        raise NoiseError(
            f"tee: {n} participants but the updates have d = {d} dimensions: at most d mutually "
            "orthogonal noise vectors exist, so ‖R_i − R_j‖² = C cannot hold for all pairs "
            "(use fewer participants per round or a protocol other than 'tee')"
        )
    if n < 1 or not (c > 0 and math.isfinite(c)):
        raise NoiseError(f"need n >= 1 and a finite C > 0, got n={n}, C={c}")
    z = torch.from_numpy(secure_standard_normal(n * d, key).reshape(d, n))
    q, r = torch.linalg.qr(z)  # reduced: q is (d, n) with orthonormal columns
    q = q * torch.sign(torch.diagonal(r))  # Haar: fix the sign convention of Householder QR
    rows = q.T.contiguous()
    rows *= math.sqrt(c / 2) / torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    return rows


def fixed_point_grid(clip: float, noise: Tensor) -> float:
    """``q = 2^(E−53)`` with ``2^E ≥ clip + max|R|``: on this grid ``g_q ± R_q`` (with
    ``|g_q| ≤ clip``) is exact in float64."""
    # 1e-4 of slack: an update clipped in float32 may exceed clip by a rounding
    bound = clip * (1 + 1e-4) + float(noise.abs().max())
    return math.ldexp(1.0, math.frexp(bound)[1] - 53)


def to_grid(x: Tensor, q: float) -> Tensor:
    """``round(x / q) · q`` (exact for a power-of-two ``q``)."""
    return torch.round(x / q) * q


@dataclass
class NoiseBlock:
    """One round's noise. ``q``, ``k_hi``, ``k_lo`` are set in exact mode (``q = 0`` and
    ``k_* = None`` in float64 mode)."""

    seq: int  # position in the pool; negative for blocks drawn online
    r: Tensor  # (n, d) float64
    c: float
    clip: float
    arithmetic: str
    q: float = 0.0
    k_hi: Tensor | None = None
    k_lo: Tensor | None = None

    @property
    def n(self) -> int:
        return self.r.shape[0]

    @property
    def d(self) -> int:
        return self.r.shape[1]

    def rows(self, n: int) -> NoiseBlock:
        """The first ``n`` rows: still orthogonal, same ``C``; ``K`` restricted to them."""
        if n == self.n:
            return self
        kh = None if self.k_hi is None else self.k_hi[:n, :n]
        kl = None if self.k_lo is None else self.k_lo[:n, :n]
        return NoiseBlock(self.seq, self.r[:n], self.c, self.clip, self.arithmetic, self.q, kh, kl)


def make_block(seq: int, n: int, d: int, c: float, clip: float, arithmetic: str) -> NoiseBlock:
    """Draw a fresh block (and, in exact mode, its grid and noise Gram)."""
    r = orthogonal_noise(n, d, c)
    if arithmetic == "float64":
        return NoiseBlock(seq, r, c, clip, arithmetic)
    if arithmetic != "exact":
        raise ValueError(f"arithmetic must be 'exact' or 'float64', got {arithmetic!r}")
    q = fixed_point_grid(clip, r)
    r = to_grid(r, q)
    k_hi, k_lo = split_gram(r)
    return NoiseBlock(seq, r, c, clip, arithmetic, q, k_hi, k_lo)


_SEAL_CHUNK = 1 << 30  # bytes per GCM call (GCM takes < 2^31 bytes per call)
_SEAL_VERSION = 2
_SEAL_SALT = 32  # bytes of fresh salt per sealed file
_SEAL_INFO = b"fedsafe/tee/sealed-noise/v2"


def _seal_aad(aad: bytes, index: int, count: int) -> bytes:
    return aad + struct.pack("<II", index, count)


def _file_key(key: bytes, salt: bytes) -> bytes:
    """The sealed file's own AES-256 key: HKDF-SHA256 of the sealing key under its salt."""
    return hkdf(key, salt=salt, info=_SEAL_INFO)


def _chunk_nonce(index: int) -> bytes:
    """96-bit GCM nonce of chunk ``index``: 4 zero bytes, then the index as a big-endian uint64."""
    return bytes(4) + struct.pack(">Q", index)


def seal_block(block: NoiseBlock, key: bytes, pool_id: str) -> bytes:
    """Sealed bytes of ``block`` in the format of the module doc: cleartext header
    (authenticated), a fresh salt, and AES-GCM of its arrays in chunks of at most 1 GiB under
    the file's derived key, each bound to its index and the chunk count."""
    arrays = {"r": block.r.numpy()}
    if block.k_hi is not None:
        arrays["k_hi"], arrays["k_lo"] = block.k_hi.numpy(), block.k_lo.numpy()
    meta = {"pool": pool_id, "seq": block.seq, "n": block.n, "d": block.d, "c": block.c,
            "clip": block.clip, "arithmetic": block.arithmetic, "q": block.q}
    aad = pack(meta)
    plain = memoryview(pack({}, arrays))
    salt = os.urandom(_SEAL_SALT)
    count = max(1, -(-plain.nbytes // _SEAL_CHUNK))
    file_key = _file_key(key, salt)
    chunks = {f"c{i}": aes_gcm_encrypt(file_key, _chunk_nonce(i), plain[i * _SEAL_CHUNK : (i + 1) * _SEAL_CHUNK],
                                       _seal_aad(aad, i, count)) for i in range(count)}
    return pack({"sealed_noise": _SEAL_VERSION, "chunks": count}, blobs={"aad": aad, "salt": salt, **chunks})


def unseal_block(data: bytes | memoryview, key: bytes, pool_id: str, seq: int) -> NoiseBlock:
    """Inverse of :func:`seal_block`; the block must belong to ``pool_id`` and be number
    ``seq``, and nothing may have been changed (else IntegrityError)."""
    try:
        head, _, outer = unpack(data)
        if head.get("sealed_noise") != _SEAL_VERSION:
            raise ValueError(f"format version {head.get('sealed_noise')!r}, expected {_SEAL_VERSION}")
        aad, salt, count = outer["aad"], bytes(outer["salt"]), int(head["chunks"])
        chunks = [outer[f"c{i}"] for i in range(count)]
        meta, _, _ = unpack(aad)
    except (WireError, KeyError, TypeError, ValueError) as e:
        raise IntegrityError(f"sealed noise block is malformed: {e}") from None
    if meta.get("pool") != pool_id or meta.get("seq") != seq:
        raise IntegrityError(
            f"sealed noise block is ({meta.get('pool')}, {meta.get('seq')}), expected ({pool_id}, {seq}): "
            "replayed or swapped"
        )
    if len(salt) != _SEAL_SALT or any(c.nbytes < TAG_BYTES for c in chunks):
        raise IntegrityError(f"sealed noise block {seq} is truncated")
    try:  # decrypted in place into one buffer: the arrays unpacked below are views of it
        inner = aes_gcm_decrypt_chunks(_file_key(key, salt), chunks, [_chunk_nonce(i) for i in range(count)],
                                       [_seal_aad(bytes(aad), i, count) for i in range(count)])
    except IntegrityError:
        raise IntegrityError(f"sealed noise block {seq} failed authentication (tampered or wrong key)") from None
    _, arrays, _ = unpack(inner)
    r = torch.from_numpy(arrays["r"])
    if tuple(r.shape) != (meta["n"], meta["d"]):
        raise IntegrityError("sealed noise block: array shape differs from its header")
    kh = torch.from_numpy(arrays["k_hi"]) if "k_hi" in arrays else None
    kl = torch.from_numpy(arrays["k_lo"]) if "k_lo" in arrays else None
    return NoiseBlock(seq, r, float(meta["c"]), float(meta["clip"]), str(meta["arithmetic"]), float(meta["q"]), kh, kl)


class NoisePool:
    """Blocks for the rounds ahead, in sequence; each handed out once.

    With ``sealed_dir`` the precomputed blocks live on disk, sealed with ``sealing_key``;
    without it, in enclave memory. :meth:`take` returns the next precomputed block if it fits
    the round (same ``d``, ``C``, ``clip``, arithmetic and at least ``n`` rows) and otherwise
    discards it and draws a fresh one on the spot.
    """

    def __init__(self, sealing_key: bytes | None = None, sealed_dir: str | os.PathLike | None = None) -> None:
        if sealed_dir is not None and sealing_key is None:
            raise ValueError("a sealed_dir needs a sealing key")
        self.key = sealing_key
        self.dir = None if sealed_dir is None else Path(sealed_dir)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.pool_id = os.urandom(8).hex()
        self._next = 0  # sequence number of the next block handed out
        self._end = 0  # one past the last precomputed block
        self._memory: dict[int, NoiseBlock] = {}
        self.generated_online = 0

    def _path(self, seq: int) -> Path:
        return self.dir / f"noise-{self.pool_id}-{seq:08d}.sealed"

    @property
    def ahead(self) -> int:
        """Precomputed blocks not yet handed out."""
        return self._end - self._next

    def precompute(self, count: int, n: int, d: int, c: float, clip: float, arithmetic: str) -> None:
        for _ in range(count):
            seq = self._end
            block = make_block(seq, n, d, c, clip, arithmetic)
            if self.dir is None:
                self._memory[seq] = block
            else:
                tmp = self._path(seq).with_suffix(".tmp")
                tmp.write_bytes(seal_block(block, self.key, self.pool_id))
                tmp.replace(self._path(seq))
            self._end += 1

    def _load(self, seq: int) -> NoiseBlock:
        if self.dir is None:
            return self._memory.pop(seq)
        path = self._path(seq)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise IntegrityError(f"sealed noise block {seq} is missing: {e.strerror}") from None
        path.unlink()  # read once: a copy left by the host is useless without the pool's state
        return unseal_block(data, self.key, self.pool_id, seq)

    def take(self, n: int, d: int, c: float, clip: float, arithmetic: str) -> NoiseBlock:
        """The noise for the next round: ``n`` rows of dimension ``d``; never one used before."""
        if n > d:
            orthogonal_noise(n, d, c)  # raises the explanatory NoiseError
        if self.ahead > 0:
            seq = self._next
            self._next += 1
            block = self._load(seq)
            if (block.d, block.c, block.clip, block.arithmetic) == (d, c, clip, arithmetic) and block.n >= n:
                return block.rows(n)
            # planned for another round shape (more participants, another d): dropped unused
        self.generated_online += 1
        return make_block(-self.generated_online, n, d, c, clip, arithmetic)  # seq < 0: online

    def discard(self) -> None:
        """Delete every precomputed block (sealed files included)."""
        for seq in range(self._next, self._end):
            if self.dir is None:
                self._memory.pop(seq, None)
            else:
                self._path(seq).unlink(missing_ok=True)
        self._next = self._end
