"""Randomness that protects privacy: secret by default, derived from the seed only on request.

Everything else in fedsafe draws from the named seeded streams of :mod:`fedsafe.core.streams`,
so a run is reproducible from ``seed``. That is wrong for the draws a privacy guarantee rests
on: DP noise (central, local, distributed; the inherent-noise mechanisms) and the client sample
whose secrecy amplification by sampling assumes. ``seed`` is public (it is in the config saved
beside the model), so noise regenerated from it can be subtracted from a released model.

A :class:`RandomSource` hands out one :class:`Stream` per name and keys, exactly like the seeded
streams, so every client's noise stays a pure function of ``(source, name, round, client)``
and a remote client computes its own row alone. Two kinds:

* **secure** (the default, ``secure_randomness = true``): a 256-bit secret drawn from the
  operating system (:func:`secrets.token_bytes`) when the run starts, never written anywhere.
  Stream ``(name, *keys)`` is the ChaCha20 keystream under the key
  ``BLAKE2b-256(key = secret, message = name ‖ keys)``: a cryptographically secure generator,
  as Opacus's ``secure_mode``. Gaussians are Box–Muller on 53-bit uniforms in (0, 1), in
  float64, and each returned normal is the sum of four such draws, from four distinct
  Box–Muller pairs, divided by 2 (Opacus's mitigation of the floating-point attacks on Gaussian
  samplers, Holohan and Braghin 2021: the low-order bits of a single Box–Muller output are not
  uniformly distributed); :meth:`SecretStream.normal` says which keystream words feed which
  output. A resumed run draws a fresh
  secret: its state (model, accountant, clip norm) continues exactly from the checkpoint, and
  the rounds after the checkpoint are redrawn with new noise.
* **seeded** (``secure_randomness = false``): the named stream ``(seed, name, *keys)`` of
  :mod:`fedsafe.core.streams`, bit for bit what fedsafe drew before this module existed. Runs
  are reproducible and resume byte-identically, and they are **not private**: anyone with the
  config can regenerate the noise. Summaries and saved models of such runs carry
  :data:`SEEDED_WARNING`.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from dataclasses import dataclass, field

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from torch import Tensor

from fedsafe.core.streams import numpy_stream, torch_stream

SEEDED_WARNING = "not private: noise derived from the seed"
SECRET_BYTES = 32
#: Normals per pass of :meth:`SecretStream.normal`: its 4 x 16,384 keystream words (512 KiB)
#: and float64 intermediates stay in cache (measured fastest of 2**11 .. 2**16).
_NORMAL_CHUNK = 1 << 14
_ZEROS = bytes(32 * _NORMAL_CHUNK)  # the plaintext: the keystream is ChaCha20 of zeros


class SecretStream:
    """One stream of a secure source: the ChaCha20 keystream of a key derived from the
    source's secret and the stream's identity. Successive calls continue the stream."""

    def __init__(self, key: bytes) -> None:
        self._enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    def words(self, count: int) -> np.ndarray:
        """The next ``count`` keystream words, little-endian uint64."""
        return np.frombuffer(self._enc.update(bytes(8 * count)), dtype="<u8")

    @staticmethod
    def _to_uniform(words: np.ndarray) -> np.ndarray:
        """float64 uniforms in (0, 1) of keystream words: the top 53 bits, plus half a step."""
        u = (words >> np.uint64(11)).astype(np.float64)
        u += 0.5
        u *= 2.0**-53
        return u

    def uniform(self, count: int) -> np.ndarray:
        """``count`` float64 uniforms in (0, 1): the top 53 bits of a word, plus half a step."""
        return self._to_uniform(self.words(count))

    def normal(self, shape: tuple[int, ...] | int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Standard normals of ``shape``: each the sum of four float64 Box–Muller draws, from
        four distinct pairs of uniforms, over 2; rounded to ``dtype`` at the end.

        Layout (what makes the whole noise of a step one pass per operation, in cache-sized
        chunks): the outputs are made in chunks of m ≤ ``_NORMAL_CHUNK``; with h = ⌈m/2⌉, a
        chunk takes the next 8h keystream words as uniforms ``u[2, 4, h]``: ``u[0, j, k]`` is
        the radius uniform and ``u[1, j, k]`` the angle uniform of pair (j, k), whose draws are
        ``r cos θ`` and ``r sin θ`` with ``r = sqrt(-2 ln u[0, j, k])``, ``θ = 2π u[1, j, k]``.
        Output k of the chunk is ``½ Σ_j r_jk cos θ_jk`` and output h + k is ``½ Σ_j r_jk sin
        θ_jk``; an odd m drops the last sine sum (its words are used up). The two draws of a
        pair are independent N(0, 1), so each output is exactly ½ (sum of four independent
        N(0, 1) Box–Muller draws) = N(0, 1), the construction and distribution of Opacus's
        ``secure_mode`` (and of this method before the chunked layout, which summed the same
        kind of draws, paired from adjacent words)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = math.prod(shape)
        out = torch.empty(count, dtype=dtype)
        cap = min(_NORMAL_CHUNK + 1, count + 1) // 2  # pairs per row of the largest chunk
        buf = bytearray(64 * cap)
        top = np.empty(8 * cap, dtype=np.uint64)
        u = torch.empty(8 * cap, dtype=torch.float64)
        trig = torch.empty(4 * cap, dtype=torch.float64)
        for s in range(0, count, _NORMAL_CHUNK):
            m = min(_NORMAL_CHUNK, count - s)
            h = (m + 1) // 2
            self._enc.update_into(memoryview(_ZEROS)[: 64 * h], buf)
            k = np.right_shift(np.frombuffer(buf, dtype="<u8", count=8 * h), np.uint64(11), out=top[: 8 * h])
            # fl(k + 0.5): the uniform (k + 0.5)·2⁻⁵³ before its exact power-of-two scaling, which
            # the next operation of each half folds in (bit for bit the same float64 values):
            v = u[: 8 * h].copy_(torch.from_numpy(k.view(np.int64))).add_(0.5).view(2, 4, h)  # k < 2⁵³: exact
            # ½r = ½·sqrt(-2 ln u) = sqrt(-½ ln u) (exact: power-of-two factors commute with
            # correctly rounded sqrt), so the outputs' final halving is folded in here.
            r = v[0].mul_(2.0**-53).log_().mul_(-0.5).sqrt_()
            theta = v[1].mul_(2.0 * math.pi * 2.0**-53)  # fl(fl(u)·fl(2π)): 2⁻⁵³ is exact
            c = torch.cos(theta, out=trig[: 4 * h].view(4, h))
            out[s : s + h] = c.mul_(r).sum(dim=0)
            out[s + h : s + m] = theta.sin_().mul_(r).sum(dim=0)[: m - h]
        return out.view(shape)


class SeededStream:
    """One stream of a seeded source: the named streams of :mod:`fedsafe.core.streams`
    (``torch_stream`` for normals, ``numpy_stream`` for uniforms), created on first use."""

    def __init__(self, seed: int, name: str, keys: tuple[int, ...]) -> None:
        self._id = (seed, name, keys)
        self._torch: torch.Generator | None = None
        self._numpy: np.random.Generator | None = None

    @property
    def generator(self) -> torch.Generator:
        """The stream's torch generator (what fedsafe drew its noise from before)."""
        if self._torch is None:
            seed, name, keys = self._id
            self._torch = torch_stream(seed, name, *keys)
        return self._torch

    @property
    def rng(self) -> np.random.Generator:
        if self._numpy is None:
            seed, name, keys = self._id
            self._numpy = numpy_stream(seed, name, *keys)
        return self._numpy

    def uniform(self, count: int) -> np.ndarray:
        return self.rng.random(count)

    def normal(self, shape: tuple[int, ...] | int, dtype: torch.dtype = torch.float32) -> Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return torch.randn(shape, generator=self.generator, dtype=dtype)


Stream = SecretStream | SeededStream


@dataclass(frozen=True)
class RandomSource:
    """Where privacy-protecting draws come from: ``secret`` None means seeded (reproducible,
    not private). The secret never appears in ``repr``, a plugin's ``state_dict``, a checkpoint
    or a summary; it travels only where the clients' own computation goes (a Ray task that
    computes a client's noised release)."""

    seed: int
    secret: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.secret is not None and len(self.secret) != SECRET_BYTES:
            raise ValueError(f"a secret has {SECRET_BYTES} bytes, got {len(self.secret)}")

    @classmethod
    def secure(cls, seed: int = 0) -> RandomSource:
        """A source keyed by 256 fresh bits from the operating system."""
        return cls(seed, secrets.token_bytes(SECRET_BYTES))

    @classmethod
    def seeded(cls, seed: int) -> RandomSource:
        """A source derived from ``seed``: reproducible and not private."""
        return cls(seed, None)

    @classmethod
    def for_run(cls, seed: int, secure: bool) -> RandomSource:
        return cls.secure(seed) if secure else cls.seeded(seed)

    @property
    def is_secure(self) -> bool:
        return self.secret is not None

    def stream(self, name: str, *keys: int) -> Stream:
        """The stream ``(name, *keys)``; keys are integers >= 0."""
        for k in keys:
            if int(k) < 0:
                raise ValueError(f"stream keys must be >= 0, got {keys} for stream {name!r}")
        if self.secret is None:
            return SeededStream(self.seed, name, tuple(int(k) for k in keys))
        msg = name.encode() + b"\x00" + b"".join(struct.pack("<Q", int(k)) for k in keys)
        return SecretStream(hashlib.blake2b(msg, key=self.secret, digest_size=32).digest())



def privacy_stamp(private: bool, source: RandomSource) -> dict[str, str]:
    """What a run's summary and saved model say of its noise: nothing without a privacy
    mechanism; else ``randomness`` (secure or seeded) and, when seeded, ``privacy_warning``."""
    if not private:
        return {}
    if source.is_secure:
        return {"randomness": "secure"}
    return {"randomness": "seeded", "privacy_warning": SEEDED_WARNING}


Generator = torch.Generator | SecretStream | SeededStream


def standard_normal(shape: tuple[int, ...] | int, generator: Generator | None, dtype: torch.dtype) -> Tensor:
    """N(0, 1) values of ``shape`` from a torch generator (None: torch's global one) or a
    :class:`RandomSource` stream."""
    if generator is None or isinstance(generator, torch.Generator):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return torch.randn(shape, generator=generator, dtype=dtype)
    return generator.normal(shape, dtype)


def permutation(n: int, generator: Generator | None) -> Tensor:
    """A uniformly random permutation of ``range(n)`` (int64): ``torch.randperm`` for a torch
    generator or a seeded stream (its generator), the order of uniform 64-bit keys for a
    secret stream."""
    if isinstance(generator, SecretStream):
        return torch.from_numpy(np.argsort(generator.words(n), kind="stable"))
    if isinstance(generator, SeededStream):
        generator = generator.generator
    return torch.randperm(n, generator=generator)


def sample_subset(stream: Stream, population: int, size: int) -> np.ndarray:
    """A uniformly random subset of ``size`` of ``range(population)``, sorted: the ``size``
    smallest of one uniform 64-bit key per element (ties, probability < population²/2⁶⁵, by
    lowest index)."""
    if isinstance(stream, SeededStream):
        return np.sort(stream.rng.choice(population, size=size, replace=False))
    keys = stream.words(population)
    return np.sort(np.argsort(keys, kind="stable")[:size])
