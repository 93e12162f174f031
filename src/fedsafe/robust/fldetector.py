"""FLDetector (Zhang, Cao, Jia, Gong, KDD 2022, "FLDetector: Defending federated learning
against model poisoning attacks via detecting malicious clients"): predict each client's
update from its previous one and an L-BFGS estimate of the Hessian, score the gap between the
prediction and what the client sent, and flag the clients whose scores stand apart.

The detector follows clients across rounds and needs the global model's change each round, so
it is a stateful object (:class:`FLDetector`, state in :meth:`FLDetector.state_dict`) rather
than a pure rule: the round-by-round state (each client's last update, the window of model and
aggregate differences, each client's recent scores, the flagged clients) must be kept by
whoever runs the rounds and saved with its checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def lbfgs_hvp(s: Tensor, y: Tensor, v: Tensor) -> Tensor:
    """``B v`` for the L-BFGS approximation B of the Hessian built from the pairs
    ``s_k = w_k − w_{k−1}`` (rows of ``s``, (N, d)) and ``y_k = g_k − g_{k−1}`` (rows of
    ``y``), oldest first, in the compact representation (Byrd, Nocedal, Schnabel 1994) that
    FLDetector's Algorithm 2 uses:

    ``B v = σ v − [σS  Y] M⁻¹ [σ Sᵀv; Yᵀv]``, ``M = [[σ SᵀS, L], [Lᵀ, −D]]``, where
    ``σ = y_Nᵀ s_N / s_Nᵀ s_N`` (the newest pair), D the diagonal of ``SᵀY`` and L its strictly
    lower triangle. Float64 throughout. Scaling every s_k and v by one factor c ≠ 0 leaves
    ``B v`` unchanged (B scales by 1/c), so any fixed multiple of the model's change serves."""
    s = s.to(torch.float64)
    y = y.to(torch.float64)
    v = v.to(torch.float64)
    sy = s @ y.T  # (N, N): entry (i, j) = s_iᵀ y_j
    ss = s @ s.T
    sigma = float(y[-1] @ s[-1]) / float(s[-1] @ s[-1])
    lower = torch.tril(sy, diagonal=-1)
    m = torch.cat([torch.cat([sigma * ss, lower], dim=1), torch.cat([lower.T, -torch.diag(torch.diagonal(sy))], dim=1)])
    p = torch.cat([s @ (sigma * v), y @ v])
    return sigma * v - torch.cat([sigma * s, y]).T @ torch.linalg.solve(m, p)


def kmeans_1d(values: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """The optimal k-means clustering of 1-D ``values``: (within-cluster sum of squares, labels
    numbered in increasing order of value). Optimal clusters of points on a line are runs of
    the sorted values, so dynamic programming over the sorted values finds the global optimum
    (``O(k n²)``); ties between equal costs go to the earliest split. Labels follow the sorted
    order; equal values share a cluster."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if not 1 <= k <= n:
        raise ValueError(f"kmeans_1d: k must be in [1, {n}], got {k}")
    order = np.argsort(x, kind="stable")
    v = x[order]
    c1 = np.concatenate([[0.0], np.cumsum(v)])
    c2 = np.concatenate([[0.0], np.cumsum(v * v)])

    def cost(a: int, b: int) -> float:  # SSE of v[a:b]
        m = b - a
        s = c1[b] - c1[a]
        return max(0.0, (c2[b] - c2[a]) - s * s / m)

    best = np.full((k + 1, n + 1), math.inf)
    arg = np.zeros((k + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for j in range(1, k + 1):
        for b in range(j, n + 1):
            for a in range(j - 1, b):
                c = best[j - 1, a] + cost(a, b)
                if c < best[j, b] - 1e-15 * max(1.0, abs(c)):
                    best[j, b], arg[j, b] = c, a
    labels_sorted = np.empty(n, dtype=np.int64)
    b = n
    for j in range(k, 0, -1):
        a = int(arg[j, b])
        labels_sorted[a:b] = j - 1
        b = a
    labels = np.empty(n, dtype=np.int64)
    labels[order] = labels_sorted
    return float(best[k, n]), labels


def gap_statistic_k(scores: np.ndarray, generator: torch.Generator, *, refs: int = 10, max_k: int = 7) -> int:
    """The number of clusters the gap statistic (Tibshirani, Walther, Hastie 2001) picks for
    the 1-D ``scores``, as FLDetector's Algorithm 3: scores rescaled to [0, 1]; for
    k = 1..max_k (at most the number of distinct scores), ``gap_k = log(mean_b W*_kb) − log W_k``
    with ``W_k`` the within-cluster sum of squares of :func:`kmeans_1d` and ``W*_kb`` that of
    ``refs`` uniform [0, 1] samples of the same size (drawn from ``generator``, float64);
    ``s_k = √(1 + 1/refs) · sd_b(log W*_kb)`` (population sd); the first k with
    ``gap_k ≥ gap_{k+1} − s_{k+1}``, else the largest k tried. All scores equal: 1."""
    x = np.asarray(scores, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    if not hi > lo:
        return 1
    x = (x - lo) / (hi - lo)
    ks = range(1, min(max_k, len(np.unique(x))) + 1)
    gaps, sds = [], []
    n = len(x)
    for k in ks:
        w = kmeans_1d(x, k)[0]
        ref = np.array([
            kmeans_1d(torch.rand(n, generator=generator, dtype=torch.float64).numpy(), k)[0] for _ in range(refs)
        ])
        logs = np.log(np.maximum(ref, 1e-300))
        gaps.append(float(np.log(np.mean(np.maximum(ref, 1e-300))) - np.log(max(w, 1e-300))))
        sds.append(float(math.sqrt(1 + 1 / refs) * np.std(logs)))
    for i in range(len(gaps) - 1):
        if gaps[i] - gaps[i + 1] + sds[i + 1] >= 0:
            return i + 1
    return len(gaps)


class FLDetector:
    """FLDetector's detection, round by round, and the mean of the clients it has not flagged.

    Each round, :meth:`aggregate` gets the round's updates (n, d), the clients that sent them,
    the model's change since the previous round ``model_delta`` (``w_t − w_{t−1}``; any fixed
    multiple of it, see :func:`lbfgs_hvp`) and a seeded generator (for the gap statistic's
    reference samples). Once ``window`` pairs ``(Δw, Δg)`` are recorded (Δg the change of the
    aggregate between consecutive rounds), every client that also took part in the previous
    round gets the prediction ``ĝ_i = g_i^{t−1} + H Δw_t`` (:func:`lbfgs_hvp`, the same HVP for
    all) and this round's score ``‖ĝ_i − g_i^t‖ / Σ_j ‖ĝ_j − g_j^t‖`` (normalised over the
    clients scored this round, as the reference code does); a client's suspicion is the mean of
    its last ``window`` scores. When at least ``min_scores`` rounds of scores exist and the gap
    statistic over the suspicions (:func:`gap_statistic_k`) finds more than one cluster, the
    optimal 2-means split flags the cluster of higher suspicion.

    What happens to flagged clients (the paper removes them and restarts training; the reference
    code only reports them): fedsafe excludes them from the mean from the round they are flagged
    on, and for the rest of the run; the aggregate is the mean of the other rows (the mean of
    all rows if every row is flagged, so the round still moves). ``max_k`` (7) and ``refs``
    (10) are the reference code's ``ks = range(1, 8)`` and ``nrefs``; ``window`` (10) its
    record length. 1-D k-means is exact (dynamic programming) where the reference runs
    scikit-learn's heuristic KMeans, and the reference samples come from the given generator
    where the reference draws unseeded ones. Clients sampled in non-consecutive rounds are
    scored only in rounds that follow one they took part in."""

    def __init__(self, *, window: int = 10, min_scores: int = 1, refs: int = 10, max_k: int = 7) -> None:
        for name, value, low in (("window", window, 1), ("min_scores", min_scores, 1), ("refs", refs, 2), ("max_k", max_k, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"fldetector: {name} must be an integer >= {low}, got {value!r}")
        self.window, self.min_scores, self.refs, self.max_k = window, min_scores, refs, max_k
        self.last_updates: dict[int, Tensor] = {}  # client -> its update in the previous round
        self.last_aggregate: Tensor | None = None
        self.s: list[Tensor] = []  # model differences, oldest first
        self.y: list[Tensor] = []  # aggregate differences
        self.scores: dict[int, list[float]] = {}  # client -> its last `window` scores
        self.flagged: set[int] = set()
        self.last_round_ids: tuple[int, ...] = ()

    def suspicion(self) -> dict[int, float]:
        """Each scored client's mean score over its last ``window`` scores."""
        return {c: float(np.mean(v)) for c, v in self.scores.items() if v}

    def detect(self, generator: torch.Generator) -> set[int]:
        """The clients the gap statistic and 2-means flag now (empty when no attack is found)."""
        sus = self.suspicion()
        if len(sus) < 2 or max((len(v) for v in self.scores.values()), default=0) < self.min_scores:
            return set()
        ids = sorted(sus)
        values = np.array([sus[c] for c in ids])
        if gap_statistic_k(values, generator, refs=self.refs, max_k=self.max_k) <= 1:
            return set()
        _, labels = kmeans_1d(values, 2)
        return {c for c, lab in zip(ids, labels) if lab == 1}  # label 1: the higher values

    def aggregate(self, updates: Tensor, ids: Sequence[int], model_delta: Tensor | None, generator: torch.Generator) -> Tensor:
        """Score this round, flag, and return the mean of the unflagged rows; records the state
        the next round needs (call once per round, in order)."""
        n, d = updates.shape
        ids = tuple(int(i) for i in ids)
        if len(ids) != n or len(set(ids)) != n:
            raise ValueError("fldetector: needs one distinct client id per row")
        x = updates.detach().to(torch.float64)
        if model_delta is not None and len(self.s) >= self.window:
            hvp = lbfgs_hvp(torch.stack(self.s), torch.stack(self.y), model_delta)
            rows = [i for i, c in enumerate(ids) if c in self.last_updates and c in self.last_round_ids]
            if len(rows) >= 2:
                dist = torch.stack([torch.linalg.vector_norm(self.last_updates[ids[i]] + hvp - x[i]) for i in rows])
                total = float(dist.sum())
                if total > 0:
                    for i, dv in zip(rows, (dist / total).tolist()):
                        self.scores.setdefault(ids[i], []).append(dv)
                        del self.scores[ids[i]][: -self.window]
            self.flagged |= self.detect(generator)
        keep = [i for i, c in enumerate(ids) if c not in self.flagged] or list(range(n))
        out = x[keep].mean(dim=0)
        if self.last_aggregate is not None and model_delta is not None:
            self.s.append(model_delta.detach().to(torch.float64).clone())
            self.y.append(out - self.last_aggregate)
            del self.s[: -self.window]
            del self.y[: -self.window]
        self.last_aggregate = out
        self.last_updates = {c: x[i].clone() for i, c in enumerate(ids)}
        self.last_round_ids = ids
        return out.to(updates.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`aggregate` reads, as tensors and plain values (checkpointable)."""
        return {
            "last_updates": {str(c): v for c, v in self.last_updates.items()},
            "last_aggregate": self.last_aggregate,
            "s": list(self.s), "y": list(self.y),
            "scores": {str(c): list(v) for c, v in self.scores.items()},
            "flagged": sorted(self.flagged), "last_round_ids": list(self.last_round_ids),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_updates = {int(c): v.to(torch.float64) for c, v in state["last_updates"].items()}
        self.last_aggregate = state["last_aggregate"]
        self.s, self.y = list(state["s"]), list(state["y"])
        if len(self.s) != len(self.y):
            raise ValueError("fldetector: the model and aggregate difference windows differ in length")
        self.scores = {int(c): [float(v) for v in vs] for c, vs in state["scores"].items()}
        self.flagged = {int(c) for c in state["flagged"]}
        self.last_round_ids = tuple(int(c) for c in state["last_round_ids"])
