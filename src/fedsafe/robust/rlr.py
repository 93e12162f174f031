"""Robust learning rate (Ozdayi, Kantarcioglu, Gel, AAAI 2021, "Defending against backdoors in
federated learning with robust learning rate"): per coordinate, the server moves along the
mean only where enough clients agree on its sign, and against it elsewhere."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.rows import check_matrix, require
from fedsafe.robust.selection import kernel_eligible, njit, run_chunks, split_range

# columns per block of the torch path: n rows of this many float32 columns stay in cache
_BLOCK = 1 << 14
# columns of the kernel's float64 sums and int32 votes (stay in L1 while the rows stream by)
_KERNEL_BLOCK = 1024
# the kernel below this many entries (n·d): torch is as fast
_MIN_KERNEL_SIZE = 1 << 16
_MIN_COLUMNS_PER_THREAD = 16384

if njit is not None:

    @njit(cache=True, nogil=True)
    def _rlr_columns(x, theta, block, c0, c1, out):  # pragma: no cover - compiled
        """out[c0:c1] = ±(column means), + where |Σ_i sign(x_ij)| ≥ θ: one read of the rows,
        sums in float64, each row added in order."""
        n = x.shape[0]
        acc = np.zeros(block, dtype=np.float64)
        votes = np.zeros(block, dtype=np.int32)
        for a in range(c0, c1, block):
            b = min(a + block, c1)
            w = b - a
            acc[:w] = 0.0
            votes[:w] = 0
            for i in range(n):
                row = x[i, a:b]
                for j in range(w):
                    v = row[j]
                    acc[j] += v
                    votes[j] += (v > 0) - (v < 0)
            for j in range(w):
                m = acc[j] / n
                out[a + j] = m if abs(votes[j]) >= theta else -m


def sign_sums(updates: Tensor) -> Tensor:
    """``Σ_i sign(x_ij)`` per coordinate j (d,), int32, exact: ``sign(0) = 0`` (a zero
    coordinate votes for neither side, as ``torch.sign`` in the reference code). Computed over
    blocks of columns, so no (n, d) temporary is made."""
    d = updates.shape[1]
    out = torch.empty(d, dtype=torch.int32, device=updates.device)
    for a in range(0, d, _BLOCK):
        block = updates[:, a : a + _BLOCK]
        # float32 sums of ±1 and 0 are exact below 2^24 clients; sign() then one reduction is
        # several times faster than counting the two comparisons' booleans
        out[a : a + _BLOCK] = torch.sign(block).sum(dim=0, dtype=torch.float32)
    return out


@AGGREGATORS.register("rlr")
def rlr(updates: Tensor, *, f: int, threshold: int | None = None) -> Tensor:
    """Robust learning rate: the mean, negated on the coordinates where fewer than
    ``threshold`` clients' worth of signs agree.

    Per coordinate j, ``s_j = |Σ_i sign(x_ij)|`` (``sign(0) = 0``); the aggregate is
    ``z_j = mean_j`` where ``s_j ≥ θ`` and ``z_j = −mean_j`` where ``s_j < θ``. The server
    then applies its learning rate η (``server.lr``) to z, so the model moves by ``+η·mean_j``
    or ``−η·mean_j``: the paper's per-coordinate learning rate ``η_θ,j ∈ {+η, −η}``
    (Ozdayi et al.), with η kept where every other rule keeps it.

    ``threshold`` is the paper's θ, an integer count of clients in ``[0, n]``: θ = 0 is the
    mean; θ = n flips every coordinate on which the clients are not unanimous. Default
    ``f + 1``: more agreement than the f Byzantine clients can produce on their own, so a
    coordinate pushed by them alone, on which the honest clients cancel out, is reversed (the
    reference code's examples use θ = 4 with 10 clients and 1 attacker, θ = 8 with 40 and 4;
    set ``threshold`` to follow them). Requires ``threshold ≤ n`` (with the default, n > f).

    Conventions against the reference code (TinfoilHat0/Defending-Against-Backdoors-with-
    Robust-Learning-Rate, ``src/aggregation.py``), each pinned by a test named for it: the mean
    is unweighted (the reference weighs clients by their data sizes); θ = 0 gives the mean
    (the reference reads 0 as "RLR off", the same result); the learning rate's magnitude is
    ``server.lr`` and only its sign is the rule's; the reference's optional server noise and
    client clipping are not part of the rule (fedsafe's DP and pre-aggregators provide them).
    Cost: one read of the updates (a numba kernel over column blocks: float64 sums and int32
    sign votes, each column's mean rounded once; torch per block of columns without numba)."""
    n = check_matrix(updates, "rlr")
    require("rlr", n, f, True, "f >= 0")
    if threshold is None:
        theta = f + 1
    elif isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ValueError(f"rlr: threshold must be an integer in [0, n] (a count of clients), got {threshold!r}")
    else:
        theta = threshold
    require("rlr", n, f, theta <= n, f"threshold <= n (threshold = {theta}{', the default f + 1' if threshold is None else ''})")
    if theta == 0:
        return updates.mean(dim=0)
    if kernel_eligible(updates, _MIN_KERNEL_SIZE):
        x = updates.detach().resolve_neg().contiguous().numpy()
        d = x.shape[1]
        out = np.empty(d, dtype=x.dtype)
        bounds, threads = split_range(d, _KERNEL_BLOCK, _MIN_COLUMNS_PER_THREAD)
        run_chunks(lambda t: _rlr_columns(x, theta, _KERNEL_BLOCK, bounds[t], bounds[t + 1], out), len(bounds) - 1, threads)
        return torch.from_numpy(out)
    # torch: per block of columns (in cache), the mean, the sign sums, the mean or its negation
    d = updates.shape[1]
    out = torch.empty(d, dtype=updates.dtype, device=updates.device)
    for a in range(0, d, _BLOCK):
        block = updates[:, a : a + _BLOCK]
        mean = block.mean(dim=0)
        agree = torch.sign(block).sum(dim=0, dtype=torch.float32).abs_() >= theta
        out[a : a + _BLOCK] = torch.where(agree, mean, mean.neg())
    return out
