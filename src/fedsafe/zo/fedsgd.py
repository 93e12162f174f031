"""FedSGD mode, both ends: clients upload M loss differences, the server decodes the aggregate.

Round t with experiment seed s: every party builds ``PerturbationSource(s, d, σ, "zo.delta")``
and uses key ``t``, so all clients perturb along the same δ_1..δ_M and the message space is
M-dimensional (M = K forward, K/2 central). Any aggregation that is linear in the messages
(mean, weighted mean, secure-aggregation sum, DP noise on the sum) commutes with decoding:
the server runs it on the (n, M) scalars and decodes once. Robust rules also run on the
scalars (coordinate-wise over the M directions); decoding their output is well defined but
their guarantees then hold in the M-dimensional message space, not in parameter space.

Scale: a loss difference is s_k ≈ σ z_kᵀ∇L, i.e. of order σ‖∇L‖ (about 1e-4 for LeNet at
σ = 1e-4), not of order 1. Fixed-point secure aggregation (clip c, q bits, step 2c/(2^q−1))
must use a clip on that scale (e.g. c = 1e-3 at σ = 1e-4) or the quantization step swamps
the signal; likewise DP noise and clipping norms are in units of loss differences.

Bytes up per client per round: 4M (:func:`~fedsafe.zo.perturbations.upload_bytes`), vs 4d
for backprop FedSGD.

Client momentum and weight decay (``clients.momentum`` β, ``clients.weight_decay`` λ) act on
the decoded direction, :class:`DecodedMomentum`. They cannot act on the messages: the δ_k are
redrawn every round, so coordinate k of round t and coordinate k of round t−1 are loss
differences along unrelated directions, and an average of messages across rounds averages
unrelated numbers. Nor can a client keep its own d-dimensional momentum and still upload M
scalars: the server's decode of any M-vector lies in the span of the round's M directions,
which a momentum vector generally does not. Decoding is linear, so for the mean rule
β-momentum of the decoded mean equals the mean of the clients' decoded momenta whenever the
same clients take part every round; under a robust rule it comes after aggregation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from fedsafe.core.types import vector_problem
from fedsafe.zo.estimator import (
    DEFAULT_CHUNK,
    DEFAULT_DECODE_CHUNK,
    LossFn,
    loss_differences_many,
    reconstruct,
)
from fedsafe.zo.perturbations import (
    PerturbationSource,
    check_scheme,
    num_directions,
    upload_bytes,
)

SHARED_STREAM = "zo.delta"


@dataclass(frozen=True)
class ZOSettings:
    """``[client] gradient = "zeroth_order"`` knobs: ``k`` perturbed forwards per client per
    round, ``sigma``, ``scheme`` ("forward" = twice-FD, or "central"), ``chunk`` perturbed
    models per batched call (memory bound), ``decode_chunk`` perturbations per server
    accumulation step."""

    k: int = 100
    sigma: float = 1e-4
    scheme: str = "forward"
    chunk: int = DEFAULT_CHUNK
    decode_chunk: int = DEFAULT_DECODE_CHUNK

    def __post_init__(self) -> None:
        check_scheme(self.scheme)
        num_directions(self.k, self.scheme)
        if not self.sigma > 0:
            raise ValueError(f"client.sigma must be > 0, got {self.sigma}")
        for name in ("chunk", "decode_chunk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"client.{name} must be a positive integer, got {v!r}")

    @property
    def message_dim(self) -> int:
        """M: length of one client's FedSGD message."""
        return num_directions(self.k, self.scheme)

    @property
    def upload_bytes(self) -> int:
        return upload_bytes(self.k, self.scheme)

    def source(self, seed: int, dim: int) -> PerturbationSource:
        return PerturbationSource(seed, dim, self.sigma, SHARED_STREAM)


def client_messages(
    loss_fn: LossFn,
    params: Tensor,
    x: Tensor,
    y: Tensor,
    settings: ZOSettings,
    seed: int,
    round: int,
) -> tuple[Tensor, Tensor]:
    """(messages (n, M), losses (n,)): each client's loss differences on its batch at W.

    ``params``: the global model (d,); ``x``: (n, B, ...); ``y``: (n, B).
    """
    src = settings.source(seed, params.shape[-1])
    return loss_differences_many(
        loss_fn, params, x, y, src, round, settings.k, settings.scheme, settings.chunk, return_loss=True
    )


@dataclass(frozen=True)
class ZODecoder:
    """Server-side decoder: aggregate in the M-dim message space -> descent direction (d,).

    Implements the engine's ``Decoder`` protocol, ``decoder(aggregate, ctx)``, reading the
    round and seed from ``ctx`` (a ``RoundContext``). Returns ĝ ≈ ∇L(W) (a gradient
    estimate, to be fed to the server optimizer as its direction).
    """

    dim: int
    settings: ZOSettings

    def __call__(self, aggregate: Tensor, ctx) -> Tensor:
        m = self.settings.message_dim
        if aggregate.shape != (m,):
            raise ValueError(
                f"zeroth-order aggregate must have shape ({m},) (M for k = {self.settings.k}, "
                f"scheme = {self.settings.scheme!r}), got {tuple(aggregate.shape)}"
            )
        return reconstruct(
            aggregate, self.settings.source(ctx.seed, self.dim), ctx.round, self.settings.scheme,
            self.settings.decode_chunk,
        )


class _ServerStep(Protocol):
    def step(self, params: Tensor, direction: Tensor, buf: Any) -> tuple[Tensor, Any]: ...

    def buffer_problem(self, buf: object, dim: int) -> str | None: ...


@dataclass(frozen=True)
class DecodedMomentum:
    """Zeroth-order FedSGD's client momentum β and weight decay λ, on the decoded direction.

    With ĝ_t the server's decode of round t's aggregate (after ``zo.clip_inf``) and W_t the
    global model, the direction handed to the ``inner`` server optimizer is

        u_t = ĝ_t + λ W_t;   m_t = β m_{t−1} + (1 − β) u_t,  m_0 = 0;   inner.step(W_t, m_t)

    — backprop dsgd's client update m ← βm + (1−β)(g + λw) with ĝ in place of g (see the
    module docstring for why it cannot run on the clients). λW is added exactly by the server,
    which knows W, rather than estimated from a λ‖W‖²/2 term in the clients' losses (that
    estimate would carry the estimator's (d+M)/M variance). ``buf`` is
    ``{"momentum": m_t (None when β = 0), "inner": the inner optimizer's buffer}`` (None before
    the first step).
    """

    inner: _ServerStep
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ValueError(f"clients.momentum must lie in [0, 1), got {self.momentum}")
        if not self.weight_decay >= 0:
            raise ValueError(f"clients.weight_decay must be >= 0, got {self.weight_decay}")

    def step(self, params: Tensor, direction: Tensor, buf: dict[str, Any] | None) -> tuple[Tensor, dict[str, Any]]:
        m_prev, inner_buf = (None, None) if buf is None else (buf["momentum"], buf["inner"])
        u = direction if self.weight_decay == 0 else direction + self.weight_decay * params
        if self.momentum == 0:
            m = u
        else:
            m = self.momentum * (torch.zeros_like(u) if m_prev is None else m_prev) + (1 - self.momentum) * u
        params, inner_buf = self.inner.step(params, m, inner_buf)
        return params, {"momentum": m if self.momentum else None, "inner": inner_buf}

    def buffer_problem(self, buf: object, dim: int) -> str | None:
        """Why ``buf`` (e.g. from a checkpoint) cannot be this step's state, else None."""
        if buf is None:
            return None
        if not isinstance(buf, dict) or set(buf) != {"momentum", "inner"}:
            return "not zeroth-order FedSGD's state {momentum, inner} (clients.momentum / weight_decay)"
        m = buf["momentum"]
        if (m is None) != (self.momentum == 0):
            return f"client momentum {'missing' if m is None else 'present'}, but clients.momentum = {self.momentum}"
        problem = None if m is None else vector_problem(m, dim)
        if problem is not None:
            return f"client momentum: {problem}"
        return self.inner.buffer_problem(buf["inner"], dim)
