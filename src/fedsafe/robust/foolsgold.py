"""FoolsGold (Fung, Yoon, Beschastnikh, RAID 2020, "The limitations of federated learning in
sybil settings"): clients whose update histories point the same way are sybils; they lose
weight."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.distances import gram
from fedsafe.robust.rows import check_matrix, require
from fedsafe.robust.rowwise import centered_weighted_sum


_IDENTICAL = 1e-12


def foolsgold_weights(histories: Tensor, kappa: float = 1.0) -> Tensor:
    """FoolsGold's learning rates α (n,) from the clients' histories (n, d), float64: Fung et
    al. Algorithm 1 without the feature-importance weighting.

    ``cs_ij = cos(H_i, H_j)`` for j ≠ i (0 for a zero history) and ``cs_ii = 0``: the
    official code's ``cosine_similarity(H) − I``, so that every maximum below is floored at 0
    (a client whose history opposes every other one is no sybil: ``v_i = 0``, full weight);
    ``v_i = max_j cs_ij``; pardoning ``cs_ij ← cs_ij · v_i / v_j`` where ``v_j > v_i``;
    ``α_i = 1 − max_j cs_ij`` clipped to [0, 1], and 0 below 1e-12 (rounding of an identical
    direction); ``α ← α / max α`` (all zero stays zero); ``α_i = 0.99`` where it is 1;
    ``α_i ← κ (ln(α_i / (1 − α_i)) + 0.5)`` clipped to [0, 1] (``α_i = 0`` gives 0).
    Conformance with the official code (DistributedML/FoolsGold, ``deep-fg/fg/foolsgold.py``)
    is tested, e.g. H = [[1, 0], [0.9, 0.1], [−1, 0.05]] gives [0, 0, 1]."""
    return weights_from_gram(gram(histories, dtype=torch.float64).to(torch.float64), kappa)


def weights_from_gram(g: Tensor, kappa: float = 1.0) -> Tensor:
    """:func:`foolsgold_weights` from the histories' Gram matrix ``g`` (n, n), float64."""
    n = g.shape[0]
    if n == 1:
        return torch.ones(1, dtype=torch.float64)
    norms = torch.diagonal(g).clamp_min(0).sqrt()
    denom = norms[:, None] * norms[None, :]
    cs = torch.where(denom > 0, g / torch.where(denom > 0, denom, 1.0), torch.zeros_like(denom)).clamp(-1, 1)
    cs.fill_diagonal_(0.0)  # the floor at 0 (not -inf: see the docstring)
    v = cs.max(dim=1).values
    pardon = v[None, :] > v[:, None]  # v_j > v_i: scale row i's entry j by v_i / v_j
    cs = torch.where(pardon, cs * v[:, None] / torch.where(v[None, :] != 0, v[None, :], 1.0), cs)
    alpha = (1 - cs.max(dim=1).values).clamp(0, 1)
    # a cosine within 1e-12 of 1 is an identical direction computed with rounding: without this,
    # n exact sybils (α ≈ 1e-16 each) would be normalised back up to full weight below
    alpha = torch.where(alpha < _IDENTICAL, torch.zeros_like(alpha), alpha)
    top = float(alpha.max())
    if top == 0:
        return torch.zeros(n, dtype=torch.float64)
    alpha = alpha / top
    alpha = torch.where(alpha == 1, torch.full_like(alpha, 0.99), alpha)
    logit = torch.where(alpha > 0, torch.log(alpha / (1 - alpha)) + 0.5, torch.full_like(alpha, -math.inf))
    return (kappa * logit).clamp(0, 1)


@AGGREGATORS.register("foolsgold")
def foolsgold(
    updates: Tensor,
    *,
    f: int,
    client_ids: Sequence[int] | None = None,
    history: Mapping[int, Tensor] | None = None,
    kappa: float = 1.0,
) -> Tensor:
    """FoolsGold: the updates weighted by how little each client's history of updates
    resembles any other client's (sybils sending the same poison get weight 0).

    Each row's history is its client's sum of past updates (``history``, kept by the pipeline
    across rounds and checkpointed) plus this round's; :func:`foolsgold_weights` turns the
    histories into weights α, and the aggregate is ``Σ_i α_i x_i / Σ_i α_i`` (the zero vector
    when every α is 0). The paper applies ``Σ_i α_i x_i`` with the server's learning rate;
    fedsafe divides by ``Σ α`` so that, with every α = 1, the rule is the mean and the server's
    learning rate means what it means for the other rules. ``kappa`` is the paper's κ (1).
    Rows must be clients' own updates (``client_ids``; refused after pre-aggregators). Works for
    any n; f is not used: FoolsGold targets sybils, not a bounded number of attackers.
    Cost: the histories' Gram matrix (float64, the tiled kernel of ``robust.rowwise``; one
    float64 copy of the updates once clients have histories) and one weighted sum. Memory: one
    float64 history of d numbers per client seen so far (a dict keyed by client id, never an
    array over the population); the engine refuses at set-up a run whose bound on it, the
    clients it can see over its rounds times 8d bytes, exceeds
    ``fedsafe.engine.federation.MAX_CLIENT_STATE_BYTES`` (8 GiB)."""
    n = check_matrix(updates, "foolsgold")
    require("foolsgold", n, f, True, "f >= 0")
    if not kappa > 0:
        raise ValueError(f"foolsgold: kappa must be > 0, got {kappa}")
    if client_ids is None or len(client_ids) != n:
        raise ValueError("foolsgold: needs the client id of every row (client_ids); the pipeline supplies them")
    history = history or {}
    d = updates.shape[1]
    past = [(i, history.get(int(cid))) for i, cid in enumerate(client_ids)]
    past = [(i, h) for i, h in past if h is not None]
    for i, h in past:
        if h.shape != (d,):
            raise ValueError(f"foolsgold: history of client {client_ids[i]} has shape {tuple(h.shape)}, expected ({d},)")
    if past:  # this round's histories, in float64
        hist = updates.to(torch.float64, copy=True)  # never the caller's tensor
        for i, h in past:
            hist[i] += h
    else:  # nobody has a history yet: the updates are the histories (no copy)
        hist = updates
    alpha = weights_from_gram(gram(hist, dtype=torch.float64).to(torch.float64), kappa)
    total = float(alpha.sum())
    if total == 0:
        return torch.zeros(d, dtype=updates.dtype, device=updates.device)
    return centered_weighted_sum(updates, alpha / total, None)
