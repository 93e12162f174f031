"""A user's FedSGD update under the paper's sampling schemes, with optional added noise.

All take the user's clipped per-example gradients as rows of ``grads`` (``(D, d)``, the whole
local dataset) and return the update ``x_i`` of Eq. (12), ``x_i = G_i w_i``, *without* the
learning rate or sign: the server applies ``θ ← θ − η · (1/N) Σ_i x_i``. Under ideal secure
aggregation the server sees only ``Σ_i x_i``.

=========  ===========================================  =======================  ============
name       weights ``w_i``                               ``E[x_i]``               ``Cov(x_i)``
=========  ===========================================  =======================  ============
sgd_iid    ``1/B`` on a uniform size-B subset (no repl.)  ``ḡ_i``                 discrete
gd         ``1/D`` everywhere                            ``ḡ_i``                  0
gsgd       ``N(1/D, I_D/(B·D))`` (Assumption 2)          ``ḡ_i``                  ``GᵀG/(BD)``
=========  ===========================================  =======================  ============

Added noise: ``isotropic`` ``N(0, σ² I_d)`` per user (Table 1's "Isotropic Gaussian", so the sum
carries ``N·σ²``), or ``wf_na`` water-filling to floor ``σ²`` (:mod:`.waterfilling`).
Every draw comes from the passed generator: a ``torch.Generator`` or a stream of a
:class:`fedsafe.core.randomness.RandomSource` (the engine passes its secret source's).
"""

from __future__ import annotations

import math
from typing import Literal

from torch import Tensor

from fedsafe.core.randomness import Generator, permutation, standard_normal
from fedsafe.privacy.inherent.waterfilling import wf_na_noise

__all__ = ["MECHANISMS", "NOISES", "client_update", "gd", "gsgd", "sgd_iid"]

MECHANISMS = ("sgd_iid", "gd", "gsgd")
NOISES = ("none", "isotropic", "wf_na")


def _check(grads: Tensor, batch_size: int | None = None) -> tuple[int, int]:
    if grads.dim() != 2 or grads.shape[0] == 0:
        raise ValueError(f"grads: expected per-example gradients of shape (D>0, d), got {tuple(grads.shape)}")
    n, d = grads.shape
    if batch_size is not None and not 1 <= batch_size <= n:
        raise ValueError(f"batch_size B must be in [1, D={n}], got {batch_size}")
    return n, d


def _isotropic(shape: tuple[int, ...], std: float, like: Tensor, generator: Generator | None) -> Tensor:
    if std < 0:
        raise ValueError(f"noise_std must be >= 0, got {std}")
    return std * standard_normal(shape, generator, like.dtype).to(like.device)


def sgd_iid(
    grads: Tensor,
    batch_size: int,
    *,
    noise_std: float = 0.0,
    generator: Generator | None = None,
) -> Tensor:
    """Minibatch SGD with IID sampling (Remark 1): mean of ``B`` rows drawn without replacement,
    plus ``N(0, noise_std² I)`` when ``noise_std > 0`` (Table 1 rows 1–2)."""
    n, d = _check(grads, batch_size)
    idx = permutation(n, generator)[:batch_size]
    x = grads[idx.to(grads.device)].mean(dim=0)
    return x + _isotropic((d,), noise_std, grads, generator) if noise_std > 0 else x


def gd(grads: Tensor, *, noise_std: float = 0.0, generator: Generator | None = None) -> Tensor:
    """Full-batch gradient descent: ``ḡ_i = (1/D) Σ_j g_{i,j}``, deterministic unless
    ``noise_std > 0`` (Table 1 rows 3–4)."""
    _, d = _check(grads)
    x = grads.mean(dim=0)
    return x + _isotropic((d,), noise_std, grads, generator) if noise_std > 0 else x


def gsgd(
    grads: Tensor,
    batch_size: int,
    *,
    noise_std: float = 0.0,
    generator: Generator | None = None,
    num: int | None = None,
) -> Tensor:
    """Gaussian-sampling SGD (Assumption 2, Eq. 17): ``x_i = G_i w_i``, ``w_i = 1/D + ξ/√(BD)``,
    ``ξ ~ N(0, I_D)``; so ``x_i ~ N(ḡ_i, G_iG_iᵀ/(BD))``. ``B`` is only a variance scale here
    (Wu et al., 2020): no batch is drawn, so it need not be ``<= D``. Shape ``(d,)``, or
    ``(num, d)`` independent draws when ``num`` is given."""
    n, d = _check(grads)
    if batch_size < 1:
        raise ValueError(f"batch_size B must be >= 1, got {batch_size}")
    m = 1 if num is None else num
    xi = standard_normal((m, n), generator, grads.dtype).to(grads.device)
    w = 1.0 / n + xi / math.sqrt(batch_size * n)
    x = w @ grads
    if noise_std > 0:
        x = x + _isotropic((m, d), noise_std, grads, generator)
    return x[0] if num is None else x


def client_update(
    grads: Tensor,
    *,
    mechanism: Literal["sgd_iid", "gd", "gsgd"],
    batch_size: int,
    noise: Literal["none", "isotropic", "wf_na"] = "none",
    sigma: float = 0.0,
    generator: Generator | None = None,
    wf_method: Literal["exact", "block"] = "exact",
    wf_blocks: int = 1,
) -> Tensor:
    """One user's update for any Table 1 row: ``mechanism`` ∈ {sgd_iid, gd, gsgd} and
    ``noise`` ∈ {none, isotropic, wf_na}.

    ``sigma`` is the paper's σ: the per-user noise std for ``isotropic`` (variance σ²), or the
    square root of the eigenvalue floor σ² for ``wf_na``. WF-NA always estimates
    ``Σ_i = GᵀG/(BD)`` from all ``D`` rows, as §5.1 prescribes, whichever sampling is used.
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if noise != "none" and sigma <= 0:
        raise ValueError(f"noise={noise!r} needs sigma > 0, got {sigma}")
    iso = sigma if noise == "isotropic" else 0.0
    if mechanism == "sgd_iid":
        x = sgd_iid(grads, batch_size, noise_std=iso, generator=generator)
    elif mechanism == "gd":
        _check(grads, batch_size)
        x = gd(grads, noise_std=iso, generator=generator)
    else:
        x = gsgd(grads, batch_size, noise_std=iso, generator=generator)
    if noise == "wf_na":
        x = x + wf_na_noise(
            grads, batch_size, sigma * sigma, generator=generator, method=wf_method, num_blocks=wf_blocks
        )
    return x
