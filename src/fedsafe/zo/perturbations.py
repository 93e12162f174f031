"""Shared Gaussian perturbations δ_k ~ N(0, σ²I), regenerated from a seed in any process.

BAFFLE's server never sends the K perturbations: it sends a seed, every client regenerates
δ_1..δ_K from it, and the server regenerates them again to decode the uploaded scalars. So a
perturbation must be a pure function of its identity ``(seed, name, *key, k)``:

    δ_k = σ · z_k,    z_k = torch.randn(d, generator=torch_stream(seed, name, *key, k))

Each k has its own stream, so ``z_k`` does not depend on which other perturbations are drawn
with it, in what order, or in what chunks; a client computing K=500 in chunks of 16 and a
server decoding in chunks of 256 see the same vectors.

Keys used by fedsafe:
- FedSGD (message = scalars, δ shared by all clients): name ``"zo.delta"``, key ``(round,)``.
- FedAvg local steps (δ private to a client): name ``"zo.local"``, key ``(round, client, step)``.

Reproducibility scope: identical bits in any process of the same torch build on the same kind
of CPU (torch's float32 normal sampler is vectorised; a different instruction set may differ in
the last ulp, which moves the estimate by ~1e-7 relative and is harmless for training, but a
cross-ISA deployment that needs bitwise agreement should pin ``ATEN_CPU_CAPABILITY``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedsafe.core.streams import torch_stream

SCHEMES = ("forward", "central")

# Bytes of one uploaded scalar (float32), as in the paper's "4 x K" remark.
SCALAR_BYTES = 4


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown zeroth-order scheme {scheme!r}; valid: {', '.join(SCHEMES)}")
    return scheme


def num_directions(k: int, scheme: str = "forward") -> int:
    """Perturbation directions M, and scalars uploaded, for a budget of ``k`` perturbed forwards.

    ``k`` counts perturbed forward passes per client per round (the paper's cost unit):
    - ``forward`` (twice-FD, default): M = K directions, ΔL_k = L(W+δ_k) − L(W)
      (K perturbed forwards plus one unperturbed forward shared by all k);
    - ``central``: M = K/2 directions, ΔL_m = L(W+δ_m) − L(W−δ_m) (K forwards); K must be even.
    The central scheme uses δ_0..δ_{M−1}, the same vectors as the first M forward directions.
    """
    check_scheme(scheme)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (perturbed forwards per round) must be a positive integer, got {k!r}")
    if scheme == "central":
        if k % 2:
            raise ValueError(
                f"k = {k} with scheme = 'central': k counts forward passes and central uses them "
                f"in ± pairs, so k must be even (k = {k + 1} gives {(k + 1) // 2} directions)"
            )
        return k // 2
    return k


def upload_bytes(k: int, scheme: str = "forward") -> int:
    """Bytes one client uploads per round in FedSGD mode: 4 bytes per loss difference.

    ``forward``: 4K; ``central``: 4·(K/2) = 2K. (Backprop FedSGD uploads 4d.)
    """
    return SCALAR_BYTES * num_directions(k, scheme)


def _key(key: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(key, (int,)) and not isinstance(key, bool):
        return (int(key),)
    out = tuple(int(v) for v in key)
    if not out:
        raise ValueError("a perturbation key needs at least one integer (the round)")
    return out


@dataclass(frozen=True)
class PerturbationSource:
    """Perturbations δ_k = σ z_k of a ``dim``-parameter model, keyed by (seed, key, k).

    ``key`` is the round (an int) or a tuple of ints such as ``(round, client, step)``.
    Vectors are generated in float32 (the generator's native type) and cast on request, so a
    float64 caller sees the same values.
    """

    seed: int
    dim: int
    sigma: float
    name: str = "zo.delta"

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    def unit(self, key: int | Sequence[int], k: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """z_k ~ N(0, I_d), drawn in float32, returned in ``dtype``."""
        z = torch.randn(self.dim, generator=torch_stream(self.seed, self.name, *_key(key), int(k)))
        return z if dtype == torch.float32 else z.to(dtype)

    def unit_chunk(self, key: int | Sequence[int], ks: Iterable[int], dtype: torch.dtype = torch.float32) -> Tensor:
        """Rows z_k for k in ``ks``, shape (len(ks), d); row i does not depend on the others."""
        kt = _key(key)
        ks = [int(k) for k in ks]
        out = torch.empty(len(ks), self.dim, dtype=torch.float32)
        for i, k in enumerate(ks):
            torch.randn(self.dim, generator=torch_stream(self.seed, self.name, *kt, k), out=out[i])
        return out if dtype == torch.float32 else out.to(dtype)

    def delta(self, key: int | Sequence[int], k: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """δ_k = σ z_k ~ N(0, σ² I_d) (the product is taken in ``dtype``)."""
        return self.sigma * self.unit(key, k, dtype)

    def chunk(self, key: int | Sequence[int], ks: Iterable[int], dtype: torch.dtype = torch.float32) -> Tensor:
        """Rows δ_k for k in ``ks``, shape (len(ks), d)."""
        return self.sigma * self.unit_chunk(key, ks, dtype)
