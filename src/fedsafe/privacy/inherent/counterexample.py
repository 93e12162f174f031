"""The paper's 4-user counterexample (§3.2, Fig. 3, from Elkordy et al. 2022), runnable.

Users 1–3 have gradients that are exactly zero on the last quarter of the coordinates; user 4's
gradients are not (they use the first coordinate of that quarter). In the neighbouring dataset
user 4 replaces one record by one whose gradient also uses the *last* coordinate, which no
gradient of the original round touches. Under GSGD (Gaussian sampling: the mechanism whose
Theorems 2–3 would otherwise give DP) the released sum's last coordinate is exactly 0 for the
original data and non-zero with probability 1 for the neighbour, so the test
"last coordinate ≠ 0" separates them perfectly, whatever the other users contribute.

The auditor agrees: the aggregate covariance is singular and the new record's gradient fails
Theorem 1's span check. With WF-NA noise (floor σ²) the last coordinate is never exactly 0, the
same distinguisher drops to chance, and Theorem 4 gives a finite ε.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsafe.privacy.inherent.auditor import audit_round
from fedsafe.privacy.inherent.gradients import clip_rows
from fedsafe.privacy.inherent.mechanisms import client_update

__all__ = ["counterexample_four_users"]


def counterexample_four_users(
    *,
    dim: int = 8,
    records_per_user: int = 16,
    batch_size: int = 4,
    clip: float = 1.0,
    trials: int = 200,
    sigma2: float = 1.0,
    delta: float = 1e-5,
    seed: int = 0,
) -> dict[str, Any]:
    """Build the two neighbouring datasets, run the distinguisher, audit both mechanisms.

    Returns a dict with:
        ``datasets``: ``{"D": [4 tensors (D, d)], "D_prime": [...]}`` of clipped gradients;
        ``changed``: ``{"user": 3, "record": 0, "gradient": g'}``;
        ``decisions``: ``{"D": bool[trials], "D_prime": bool[trials]}``, True = "guess D′";
        ``accuracy``: fraction of correct guesses over both (1.0);
        ``candidate_in_span``: Theorem 1's span check of ``g'`` (False);
        ``audit``: the :class:`RoundAudit` of the original round under GSGD without noise;
        ``verdict``: its verdict (singular covariance, rank r < d);
        ``wf_na``: ``{"accuracy", "audit", "verdict", "epsilon"}`` for GSGD + WF-NA at ``sigma2``.
    """
    if dim < 8 or dim % 4:
        raise ValueError(f"dim must be a multiple of 4 and >= 8 (the last quarter needs two coordinates), got {dim}")
    gen = torch.Generator().manual_seed(seed)
    head, tail0, last = dim - dim // 4, dim - dim // 4, dim - 1

    def user(with_tail: bool) -> torch.Tensor:
        g = torch.zeros(records_per_user, dim, dtype=torch.float64)
        g[:, :head] = torch.randn(records_per_user, head, generator=gen, dtype=torch.float64)
        if with_tail:
            g[:, tail0] = torch.randn(records_per_user, generator=gen, dtype=torch.float64)
        return clip_rows(g, clip)

    original = [user(False), user(False), user(False), user(True)]
    new_record = torch.zeros(dim, dtype=torch.float64)
    new_record[:head] = torch.randn(head, generator=gen, dtype=torch.float64)
    new_record[last] = 1.0
    new_record = clip_rows(new_record[None, :], clip)[0]
    neighbor = [g.clone() for g in original]
    neighbor[3][0] = new_record

    def released(users: list[torch.Tensor], noise: str) -> torch.Tensor:
        sig = float(np.sqrt(sigma2)) if noise != "none" else 0.0
        return sum(
            client_update(g, mechanism="gsgd", batch_size=batch_size, noise=noise, sigma=sig, generator=gen)
            for g in users
        )

    def distinguish(noise: str) -> tuple[np.ndarray, np.ndarray, float]:
        says_d = np.array([bool(released(original, noise)[last] != 0) for _ in range(trials)])
        says_dp = np.array([bool(released(neighbor, noise)[last] != 0) for _ in range(trials)])
        acc = (np.count_nonzero(~says_d) + np.count_nonzero(says_dp)) / (2 * trials)
        return says_d, says_dp, float(acc)

    dec_d, dec_dp, acc = distinguish("none")
    audit = audit_round(
        original, mechanism="gsgd", batch_size=batch_size, clip=clip, delta=delta, candidates=new_record[None, :]
    )
    _, _, acc_wf = distinguish("wf_na")
    audit_wf = audit_round(
        original, mechanism="gsgd", noise="wf_na", sigma2=sigma2, batch_size=batch_size, clip=clip, delta=delta
    )
    return {
        "datasets": {"D": original, "D_prime": neighbor},
        "changed": {"user": 3, "record": 0, "gradient": new_record},
        "decisions": {"D": dec_d, "D_prime": dec_dp},
        "accuracy": acc,
        "candidate_in_span": bool(audit.candidates_in_span[0]),
        "audit": audit,
        "verdict": audit.verdict,
        "wf_na": {
            "accuracy": acc_wf,
            "audit": audit_wf,
            "verdict": audit_wf.verdict,
            "epsilon": audit_wf.epsilon.get("theorem4", float("inf")),
        },
    }
