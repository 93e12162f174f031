"""FedAvg mode: clients take local zeroth-order steps and upload the model delta.

In BAFFLE's epoch-level variant (Feng et al., Sec. 3, "Remark on communication cost") each
client updates its local copy several times with the estimator and uploads w_local − w, like
FedAvg (so bytes up are 4d, as for backprop FedAvg). The server never decodes anything, so the
perturbations need not be shared: they come from the stream

    δ_{k} for client c, local step s, round t:  PerturbationSource(seed, d, σ, "zo.local"),
                                                key (t, c, s), index k

private to the client and step (two clients never reuse directions, which would correlate
their errors). One local step, at the client's current w on its step-s batch:

    ĝ = reconstruct(loss_differences(w)) ;  ĝ ← clip_inf(ĝ) if clip ;  ĝ ← ĝ + λw
    w ← w − η ĝ

(plain SGD locally; the engine passes ``zo.clip_inf`` as ``clip``, so BAFFLE's clip bounds every
local step, as their guideline bounds every estimate; their Adam and EMA act on the server).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.func import vmap

from fedsafe.zo.clip import clip_inf
from fedsafe.zo.estimator import (
    DEFAULT_CHUNK,
    LossFn,
    _check_chunk,
    _directions_per_call,
    decode_scale,
)
from fedsafe.zo.perturbations import PerturbationSource, check_scheme, num_directions

LOCAL_STREAM = "zo.local"


@dataclass
class LocalZOResult:
    delta: Tensor  # (d,) or (n, d): w_local − w_global, the FedAvg message
    losses: Tensor  # () or (n,): each client's loss at the global model on its first batch


def _step_direction(g: Tensor, w: Tensor, clip: float | None, weight_decay: float) -> Tensor:
    if clip is not None:
        g = clip_inf(g, clip)
    if weight_decay:
        g = g + weight_decay * w
    return g


def zo_local_steps(
    loss_fn: LossFn,
    params: Tensor,
    batches: Callable[[int], tuple[Tensor, Tensor]],
    *,
    steps: int,
    lr: float,
    k: int,
    sigma: float,
    seed: int,
    client: int,
    round: int,
    scheme: str = "forward",
    chunk: int = DEFAULT_CHUNK,
    weight_decay: float = 0.0,
    clip: float | None = None,
) -> LocalZOResult:
    """``steps`` local ZO-SGD steps of one client from ``params``; ``batches(s) -> (x, y)``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")

    def one(s: int, active: np.ndarray) -> tuple[Tensor, Tensor]:
        x, y = batches(s)
        return x.unsqueeze(0), y.unsqueeze(0)

    res = zo_local_steps_many(
        loss_fn, params, one, clients=[client], steps=steps, lr=lr, k=k, sigma=sigma,
        seed=seed, round=round, scheme=scheme, chunk=chunk, weight_decay=weight_decay, clip=clip,
    )
    return LocalZOResult(res.delta[0], res.losses[0])


def zo_local_steps_many(
    loss_fn: LossFn,
    params: Tensor,
    batches: Callable[[int, np.ndarray], tuple[Tensor, Tensor]],
    *,
    clients: Sequence[int] | np.ndarray,
    steps: int | Sequence[int] | np.ndarray,
    lr: float,
    k: int,
    sigma: float,
    seed: int,
    round: int,
    scheme: str = "forward",
    chunk: int = DEFAULT_CHUNK,
    weight_decay: float = 0.0,
    clip: float | None = None,
) -> LocalZOResult:
    """:func:`zo_local_steps` for n clients in one batched call per step.

    ``steps`` is one count or one per client; at step s only clients with more than s steps
    move (rows ``active``), and ``batches(s, active) -> (x[len(active), B, ...], y)`` gives
    their batches. Row i equals ``zo_local_steps(..., client=clients[i])`` up to float
    rounding. Memory per call: n · ``chunk`` perturbed models and as many d-vectors.
    """
    check_scheme(scheme)
    _check_chunk(chunk)
    ids = np.asarray(clients, dtype=np.int64)
    n, d = len(ids), params.shape[-1]
    counts = np.broadcast_to(np.asarray(steps, dtype=np.int64), (n,))
    if (counts < 1).any():
        raise ValueError(f"steps must be >= 1 for every client, got {counts.tolist()}")
    m = num_directions(k, scheme)
    source = PerturbationSource(seed, d, sigma, LOCAL_STREAM)
    step_dirs = _directions_per_call(chunk, scheme)
    over_deltas = vmap(loss_fn, in_dims=(0, None, None))
    batched = vmap(over_deltas, in_dims=(0, 0, 0))
    base_fn = vmap(loss_fn, in_dims=(0, 0, 0))
    w = params.detach().expand(n, d).clone()
    losses0 = params.new_zeros(n)
    with torch.no_grad():
        for s in range(int(counts.max(initial=0))):
            active = np.flatnonzero(counts > s)
            x, y = batches(s, active)
            wa = w[torch.from_numpy(active)]
            keys = [(round, int(ids[r]), s) for r in active]
            base = base_fn(wa, x, y) if (scheme == "forward" or s == 0) else None
            if s == 0:
                losses0[torch.from_numpy(active)] = base
            # Each client holds its own z's while evaluating them, so it accumulates
            # Σ z_k s_k on the fly instead of regenerating them as the server's decoder does.
            acc = torch.zeros(len(active), d, dtype=torch.float64)
            for start in range(0, m, step_dirs):
                stop = min(m, start + step_dirs)
                z = torch.stack([source.unit_chunk(key, range(start, stop), dtype=wa.dtype) for key in keys])
                delta = sigma * z
                models = wa.unsqueeze(1)
                if scheme == "forward":
                    diffs = batched(models + delta, x, y) - base[:, None]
                else:
                    both = batched(torch.cat([models + delta, models - delta], dim=1), x, y)
                    diffs = both[:, : stop - start] - both[:, stop - start :]
                acc += torch.einsum("ic,icd->id", diffs.to(torch.float64), z.to(torch.float64))
            g = (acc * decode_scale(m, sigma, scheme)).to(wa.dtype)
            g = _step_direction(g, wa, clip, weight_decay)
            w[torch.from_numpy(active)] = wa - lr * g
    return LocalZOResult(w - params, losses0)
