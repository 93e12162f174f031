"""Random canary clients (Andrew et al., §4): a bank, a presentation schedule, a cosine tracker.

A canary is a uniformly random unit direction ``c_j ∈ R^d``. It is never stored: canary ``j``
is regenerated from the named stream ``(seed, "audit.canary", j)`` whenever it is needed, so a
bank of k canaries costs O(1) memory, is identical across processes and resumes, and the
tracker can stream canaries through in chunks of ``chunk_size × d`` (k × d never has to sit in
memory; an optional cache materializes them when that is cheap).

Ids ``0 … observed−1`` are *observed* canaries (inserted into training); ids ``observed …
observed+unobserved−1`` are *unobserved* ones (tracked, never inserted) that give the
all-iterates threat model its empirical null (Algorithm 2). The two ranges are disjoint by
construction and come from one stream family, so they are identically distributed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.streams import numpy_stream, torch_stream

__all__ = ["CanaryBank", "CanaryTracker"]


class CanaryBank:
    """``observed + unobserved`` random unit canaries in ``R^dim``, regenerated from ``seed``.

    ``cache_bytes``: if the whole bank (float32) fits in this many bytes it is materialized on
    first use and reused (rounds then skip regeneration); 0 (the default) always regenerates.
    """

    STREAM = "audit.canary"

    def __init__(self, seed: int, dim: int, observed: int, unobserved: int = 0, *, cache_bytes: int = 0) -> None:
        if dim < 2:
            raise ValueError(f"dim must be >= 2, got {dim}")
        if observed < 0 or unobserved < 0:
            raise ValueError(f"canary counts must be >= 0, got observed={observed}, unobserved={unobserved}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.seed = int(seed)
        self.dim = int(dim)
        self.observed = int(observed)
        self.unobserved = int(unobserved)
        self.cache_bytes = int(cache_bytes)
        self._cache: Tensor | None = None

    # --- ids --------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.observed + self.unobserved

    @property
    def observed_ids(self) -> range:
        return range(0, self.observed)

    @property
    def unobserved_ids(self) -> range:
        return range(self.observed, self.size)

    def _check_id(self, cid: int) -> int:
        cid = int(cid)
        if not 0 <= cid < self.size:
            raise ValueError(f"canary id {cid} out of range [0, {self.size})")
        return cid

    # --- vectors ----------------------------------------------------------------------------

    def _generate(self, cid: int, out: Tensor) -> Tensor:
        torch.randn(self.dim, generator=torch_stream(self.seed, self.STREAM, cid), out=out)
        # The norm in float64: a unit vector to float32 precision even for d in the millions.
        out.div_(out.double().norm().to(out.dtype))
        return out

    def _cached(self) -> Tensor | None:
        if self._cache is None and self.size and self.size * self.dim * 4 <= self.cache_bytes:
            cache = torch.empty(self.size, self.dim)
            for cid in range(self.size):
                self._generate(cid, cache[cid])
            self._cache = cache
        return self._cache

    def canary(self, cid: int) -> Tensor:
        """Canary ``cid`` as a float32 unit vector of length ``dim`` (a fresh tensor)."""
        cid = self._check_id(cid)
        cache = self._cached()
        if cache is not None:
            return cache[cid].clone()
        return self._generate(cid, torch.empty(self.dim))

    def chunks(self, ids: Iterable[int] | None = None, chunk_size: int = 256) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield ``(ids, canaries)`` with ``canaries`` a ``(len(ids), dim)`` float32 block, at
        most ``chunk_size`` rows at a time, in the order of ``ids`` (default: every canary).
        The yielded block may be reused for the next chunk: copy what you keep."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        wanted = range(self.size) if ids is None else [self._check_id(i) for i in ids]
        ids_t = torch.as_tensor(list(wanted), dtype=torch.int64)
        cache = self._cached()
        buf = None if cache is not None else torch.empty(min(chunk_size, max(len(ids_t), 1)), self.dim)
        for start in range(0, len(ids_t), chunk_size):
            block_ids = ids_t[start : start + chunk_size]
            if cache is not None:
                yield block_ids, cache[block_ids]
                continue
            block = buf[: len(block_ids)]
            for row, cid in enumerate(block_ids.tolist()):
                self._generate(cid, block[row])
            yield block_ids, block

    def updates(self, ids: Sequence[int], clip_norm: float) -> Tensor:
        """The canary clients' messages: ``Proj(c_j; S) = S · c_j`` for each id (Algorithm 1
        line 7: a canary's update always has exactly the round's clip norm)."""
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        out = torch.empty(len(ids), self.dim)
        row = 0
        for block_ids, block in self.chunks(ids):
            out[row : row + len(block_ids)] = block * clip_norm
            row += len(block_ids)
        return out

    # --- schedule ---------------------------------------------------------------------------

    def presentations(self, num_rounds: int, repetitions: int = 1) -> dict[int, list[int]]:
        """Which observed canaries take part in which round: ``{round: [ids]}`` (rounds 1-based,
        only rounds that have canaries).

        As in Andrew et al. §5.1, the rounds are cut into ``repetitions`` contiguous epochs and
        every observed canary appears exactly once per epoch. Within an epoch the canaries are
        shuffled (stream ``(seed, "audit.schedule", epoch)``) and dealt out evenly: each round
        carries ⌊k/L⌋ or ⌈k/L⌉ of them, or, when k < L, they sit in evenly spaced rounds with a
        random offset.
        """
        if num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
        if not 1 <= repetitions <= num_rounds:
            raise ValueError(f"repetitions must be in [1, num_rounds={num_rounds}], got {repetitions}")
        k = self.observed
        schedule: dict[int, list[int]] = {}
        if k == 0:
            return schedule
        for epoch, rounds in enumerate(np.array_split(np.arange(1, num_rounds + 1), repetitions)):
            rng = numpy_stream(self.seed, "audit.schedule", epoch)
            perm = rng.permutation(k)
            offset = rng.random()
            slots = np.floor((np.arange(k) + offset) * len(rounds) / k).astype(np.int64)
            for cid, slot in zip(perm.tolist(), slots.tolist()):
                schedule.setdefault(int(rounds[slot]), []).append(int(cid))
        return {t: sorted(ids) for t, ids in sorted(schedule.items())}


class CanaryTracker:
    """Cosines of every canary in ``bank`` (observed and unobserved) with the model.

    ``update(round_delta)`` keeps, per canary, the running maximum over rounds of
    ``cos(c_j, ρ̄_t)`` with the round's (noised) aggregate: the all-iterates statistic of
    Algorithm 2. ``final(vector)`` gives ``cos(c_j, θ_T)``: the final-model statistic of
    Algorithm 1. Canaries stream through ``chunk_size`` at a time.
    """

    def __init__(self, bank: CanaryBank, chunk_size: int = 256) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.bank = bank
        self.chunk_size = int(chunk_size)
        self.max_cos = torch.full((bank.size,), -math.inf, dtype=torch.float64)
        self.rounds = 0  # rounds folded into max_cos

    def cosines(self, vector: Tensor) -> Tensor:
        """``cos(c_j, vector)`` for every canary, float64 of length ``bank.size`` (NaN for a
        zero or non-finite vector)."""
        v = vector.detach().reshape(-1)
        if v.numel() != self.bank.dim:
            raise ValueError(f"vector has {v.numel()} entries, the canaries {self.bank.dim}")
        out = torch.full((self.bank.size,), math.nan, dtype=torch.float64)
        norm = float(v.double().norm())
        if not (norm > 0 and math.isfinite(norm)):
            return out
        v32 = v.to(torch.float32)
        for ids, block in self.bank.chunks(chunk_size=self.chunk_size):
            out[ids] = (block @ v32).double() / norm
        return out

    def update(self, round_delta: Tensor) -> Tensor:
        """Fold one round's aggregate into the running max; returns this round's cosines. A
        zero or non-finite aggregate (a skipped round) leaves the maxima unchanged."""
        cos = self.cosines(round_delta)
        if not bool(torch.isnan(cos).any()):
            torch.maximum(self.max_cos, cos, out=self.max_cos)
            self.rounds += 1
        return cos

    def final(self, model_or_delta: Tensor) -> Tensor:
        """``cos(c_j, θ_T)`` for every canary (Algorithm 1 line 11)."""
        return self.cosines(model_or_delta)

    def split(self, values: Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``(observed, unobserved)`` parts of a per-canary array, as float64 numpy arrays."""
        v = values.detach().to(torch.float64).numpy()
        return v[: self.bank.observed].copy(), v[self.bank.observed :].copy()

    # --- checkpoints (plain tensors: loads with torch.load(weights_only=True)) --------------

    def _identity(self) -> Tensor:
        b = self.bank
        return torch.tensor([b.seed, b.dim, b.observed, b.unobserved], dtype=torch.int64)

    def state_dict(self) -> dict[str, Tensor]:
        return {"max_cos": self.max_cos.clone(), "rounds": torch.tensor(self.rounds), "identity": self._identity()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        ident = state["identity"]
        if not torch.equal(ident, self._identity()):
            raise ValueError(
                "canary tracker checkpoint is for (seed, dim, observed, unobserved) = "
                f"{tuple(ident.tolist())}, this bank is {tuple(self._identity().tolist())}"
            )
        self.max_cos = state["max_cos"].to(torch.float64).clone()
        self.rounds = int(state["rounds"])
