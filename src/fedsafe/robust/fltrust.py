"""FLTrust (Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust federated learning via trust
bootstrapping", NDSS 2021): the server bootstraps trust from its own update on a small root
dataset (``fedsafe.engine.root``, which computes ``server_update`` every round)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.rows import check_matrix, require
from fedsafe.robust.rowwise import centered_weighted_sum, row_sq_norms


@AGGREGATORS.register("fltrust")
def fltrust(updates: Tensor, *, f: int, server_update: Tensor | None = None, root_size: int = 100) -> Tensor:
    """FLTrust: each update, rescaled to the server's norm, weighted by its ReLU'd cosine to the
    server's own update on a root dataset of ``root_size`` training samples.

    With ``g0`` the server's update (``server_update``), the trust score of update ``g_i`` is
    ``TS_i = max(0, cos(g_i, g0))``; the aggregate is ``Σ_i TS_i · (‖g0‖ / ‖g_i‖) g_i / Σ_i TS_i``
    (Cao et al. Algorithm 1). When every score is 0 (no update points the server's way) the
    aggregate is the zero vector, as the paper's formula gives in the limit, and the model does
    not move; a zero update has score 0. Norms, dot products and the sum in float64, returned in
    the updates' dtype; three passes over the updates (about 3–4 times a mean).
    ``root_size`` is read by the engine (fedsafe.engine.root: the root dataset is drawn from the
    training set). Works for any n; f is not used (the paper's guarantee does not bound it)."""
    n = check_matrix(updates, "fltrust")
    require("fltrust", n, f, True, "f >= 0")
    if isinstance(root_size, bool) or not isinstance(root_size, int) or root_size < 1:
        raise ValueError(f"fltrust: root_size must be an integer >= 1, got {root_size!r}")
    if server_update is None:
        raise ValueError("fltrust: needs the server's update on its root dataset (server_update); "
                         "the engine supplies it for robust.rule = 'fltrust'")
    d = updates.shape[1]
    if server_update.shape != (d,):
        raise ValueError(f"fltrust: server_update must have shape ({d},), got {tuple(server_update.shape)}")
    zero = torch.zeros(d, dtype=updates.dtype, device=updates.device)
    g0 = server_update.to(device=updates.device, dtype=torch.float64)
    sq0 = float(g0 @ g0)
    if sq0 == 0:
        return zero
    # three passes over the updates, no (n, d) copy: squared norms, squared distances to g0
    # (differences and sums in float64), and the weighted sum; the dot products follow from
    # ⟨x, g0⟩ = (‖x‖² + ‖g0‖² − ‖x − g0‖²) / 2
    sq = row_sq_norms(updates).to(torch.float64)
    dist = row_sq_norms(updates, server_update.to(updates.dtype)).to(torch.float64)
    dots = (sq + sq0 - dist) / 2
    norms = sq.sqrt()
    norm0 = sq0**0.5
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    scores = torch.where(norms > 0, torch.relu(dots / (safe * norm0)), torch.zeros_like(norms))
    total = float(scores.sum())
    if total == 0:
        return zero
    return centered_weighted_sum(updates, scores * (norm0 / safe) / total, None)
