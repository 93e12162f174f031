"""FLDetector (Zhang, Cao, Jia, Gong, KDD 2022, "FLDetector: Defending federated learning
against model poisoning attacks via detecting malicious clients"): predict each client's
update from its previous one and an L-BFGS estimate of the Hessian, score the gap between the
prediction and what the client sent, and flag the clients whose scores stand apart.

The detector follows clients across rounds and needs the global model's change each round, so
it is a stateful object (:class:`FLDetector`, state in :meth:`FLDetector.state_dict`): the
round-by-round state (each client's last update, the window of model and aggregate
differences, each client's recent scores, the flagged clients). The rule ``fldetector``
(:func:`fldetector`) is registered with it as its state: the robust pipeline makes one detector
per run from the rule's parameters, hands it and the model's change since the previous round to
the rule, lets it record only when the pipeline aggregates the round (not when an attacker
simulates the rule), and saves it with the checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.rows import check_matrix, require


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
    sol = torch.linalg.solve(m, p)
    k = s.shape[0]
    return sigma * v - (sigma * (sol[:k] @ s) + sol[k:] @ y)  # [σS Y] M⁻¹ p without forming [σS Y]


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

    # cost[a, b] = SSE of v[a:b] (a < b), every pair at once
    counts = np.arange(n + 1)[None, :] - np.arange(n + 1)[:, None]
    sums = c1[None, :] - c1[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.maximum(0.0, (c2[None, :] - c2[:, None]) - sums * sums / counts)
    cost[counts <= 0] = math.inf
    best = np.full((k + 1, n + 1), math.inf)
    arg = np.zeros((k + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for j in range(1, k + 1):
        # best[j, b] = min over a of best[j-1, a] + cost[a, b]; among equal costs (to 1e-15
        # relative) the earliest split a
        total = best[j - 1][:, None] + cost
        low = total.min(axis=0)
        with np.errstate(invalid="ignore"):
            ties = total <= low + 1e-15 * np.maximum(1.0, np.abs(low))
        best[j] = low
        arg[j] = ties.argmax(axis=0)
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
    """FLDetector's detection, round by round, and the base rule over the clients not flagged.

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
    optimal 2-means split flags the cluster of higher suspicion: the attack is detected.

    Detection is once, as in the paper (Algorithm 1 stops at the first detection, removes the
    flagged clients and restarts training without them; the reference code only reports):
    fedsafe excludes the flagged clients from that round on, for the rest of the run, and stops
    scoring (a rule cannot rewind the run, so training continues from the current model rather
    than restarting). The aggregate is the base ``rule`` over the other rows (all rows if every
    row is flagged, so the round still moves), with ``f`` reduced by the flagged rows removed;
    the reference code's default base rule is the median, which also protects the rounds before
    detection. ``max_k`` (7) and ``refs`` (10) are the reference code's ``ks = range(1, 8)`` and
    ``nrefs``; ``window`` (10) its record length. 1-D k-means is exact (dynamic programming)
    where the reference runs scikit-learn's heuristic KMeans, and the reference samples come
    from the given generator where the reference draws unseeded ones. Clients sampled in
    non-consecutive rounds are scored only in rounds that follow one they took part in.

    Like its reference code (each client's full-batch gradient), FLDetector assumes an honest
    client's update is predictable from its last one: with small minibatches the honest
    clients' sampling noise can exceed a smooth attacker's deviation, and the cluster of
    higher suspicion is then the honest one."""

    def __init__(
        self, *, window: int = 10, min_scores: int = 1, refs: int = 10, max_k: int = 7, rule: str = "median"
    ) -> None:
        for name, value, low in (("window", window, 1), ("min_scores", min_scores, 1), ("refs", refs, 2), ("max_k", max_k, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"fldetector: {name} must be an integer >= {low}, got {value!r}")
        self.window, self.min_scores, self.refs, self.max_k = window, min_scores, refs, max_k
        self.rule_name = rule
        self.rule, self._rule_takes_generator = _base_rule(rule)
        self.last_updates: dict[int, Tensor] = {}  # client -> its update in the previous round (its dtype)
        self.last_aggregate: Tensor | None = None
        self.s: list[Tensor] = []  # model differences, oldest first
        self.y: list[Tensor] = []  # aggregate differences
        self.scores: dict[int, list[float]] = {}  # client -> its last `window` scores
        self.flagged: set[int] = set()
        self.detected = False  # the attack was detected: the flagged clients are final
        self.last_round_ids: tuple[int, ...] = ()

    def suspicion(self, scores: Mapping[int, Sequence[float]] | None = None) -> dict[int, float]:
        """Each scored client's mean score over its last ``window`` scores (``scores``, default
        the recorded ones)."""
        scores = self.scores if scores is None else scores
        return {c: float(np.mean(v)) for c, v in scores.items() if v}

    def detect(self, generator: torch.Generator, scores: Mapping[int, Sequence[float]] | None = None) -> set[int]:
        """The clients the gap statistic and 2-means flag now (empty when no attack is found),
        over ``scores`` (default the recorded ones)."""
        scores = self.scores if scores is None else scores
        sus = self.suspicion(scores)
        if len(sus) < 2 or max((len(v) for v in scores.values()), default=0) < self.min_scores:
            return set()
        ids = sorted(sus)
        values = np.array([sus[c] for c in ids])
        if gap_statistic_k(values, generator, refs=self.refs, max_k=self.max_k) <= 1:
            return set()
        _, labels = kmeans_1d(values, 2)
        return {c for c, lab in zip(ids, labels) if lab == 1}  # label 1: the higher values

    def aggregate(
        self, updates: Tensor, ids: Sequence[int], model_delta: Tensor | None, generator: torch.Generator,
        *, f: int = 0, commit: bool = True,
    ) -> Tensor:
        """Score this round, flag, and return the base rule over the unflagged rows. With
        ``commit`` (call it once per round, in order) the detector records what the next round
        needs; without, it changes nothing (what an attacker simulating the server's rule sees)."""
        n, d = updates.shape
        ids = tuple(int(i) for i in ids)
        if len(ids) != n or len(set(ids)) != n:
            raise ValueError("fldetector: needs one distinct client id per row")
        if model_delta is not None and tuple(model_delta.shape) != (d,):
            raise ValueError(
                f"fldetector: the model's change has {model_delta.numel()} coordinates and the messages {d}: "
                "FLDetector predicts updates in parameter space (backprop clients; not zeroth-order messages)"
            )
        x = updates.detach()  # kept in its dtype; each prediction gap is computed in float64
        scores, flagged, detected = self.scores, self.flagged, self.detected
        hvp = None
        if not detected and model_delta is not None and len(self.s) >= self.window:
            hvp = _hvp_or_none(self.s, self.y, model_delta)
        if hvp is not None:
            rows = [i for i, c in enumerate(ids) if c in self.last_updates and c in self.last_round_ids]
            if len(rows) >= 2:
                dist = torch.stack([
                    torch.linalg.vector_norm(self.last_updates[ids[i]].to(torch.float64) + hvp - x[i].to(torch.float64))
                    for i in rows
                ])
                total = float(dist.sum())
                if total > 0:
                    scores = dict(scores)  # this round's copy: the recorded scores change only on commit
                    for i, dv in zip(rows, (dist / total).tolist()):
                        scores[ids[i]] = [*scores.get(ids[i], []), dv][-self.window :]
            found = self.detect(generator, scores)
            if found:
                flagged, detected = set(found), True
        keep = [i for i, c in enumerate(ids) if c not in flagged] or list(range(n))
        kw = {"generator": generator} if self._rule_takes_generator else {}
        rows_kept = x if len(keep) == n else x[keep]
        out = self.rule(rows_kept, f=max(0, f - (n - len(keep))), **kw).to(torch.float64)
        if commit:
            self.scores, self.flagged, self.detected = scores, flagged, detected
            if not detected:  # the scoring's inputs; none are needed once the attack is detected
                if self.last_aggregate is not None and model_delta is not None:
                    self.s = [*self.s, model_delta.detach().to(torch.float64).clone()][-self.window :]
                    self.y = [*self.y, out - self.last_aggregate][-self.window :]
                self.last_aggregate = out
                self.last_updates = {c: x[i].clone() for i, c in enumerate(ids)}
                self.last_round_ids = ids
            else:
                self.last_updates, self.s, self.y, self.last_aggregate = {}, [], [], None
        return out.to(updates.dtype)

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`aggregate` reads, as tensors and plain values (checkpointable)."""
        return {
            "last_updates": {str(c): v for c, v in self.last_updates.items()},
            "last_aggregate": self.last_aggregate,
            "s": list(self.s), "y": list(self.y),
            "scores": {str(c): list(v) for c, v in self.scores.items()},
            "flagged": sorted(self.flagged), "detected": self.detected, "last_round_ids": list(self.last_round_ids),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_updates = {int(c): v for c, v in state["last_updates"].items()}
        self.last_aggregate = state["last_aggregate"]
        self.s, self.y = list(state["s"]), list(state["y"])
        if len(self.s) != len(self.y):
            raise ValueError("fldetector: the model and aggregate difference windows differ in length")
        self.scores = {int(c): [float(v) for v in vs] for c, vs in state["scores"].items()}
        self.flagged = {int(c) for c in state["flagged"]}
        self.detected = bool(state.get("detected", bool(self.flagged)))
        self.last_round_ids = tuple(int(c) for c in state["last_round_ids"])


def _hvp_or_none(s: Sequence[Tensor], y: Sequence[Tensor], v: Tensor) -> Tensor | None:
    """:func:`lbfgs_hvp` of the window, or None where the pairs define no approximation (the
    model or the aggregate did not move: a zero newest step, a singular compact matrix, a
    non-finite product); the round is then not scored."""
    if float(s[-1].to(torch.float64) @ s[-1].to(torch.float64)) == 0:
        return None
    try:
        hvp = lbfgs_hvp(torch.stack(list(s)), torch.stack(list(y)), v)
    except torch.linalg.LinAlgError:
        return None
    return hvp if bool(torch.isfinite(hvp).all()) else None


def _base_rule(name: str) -> tuple[Any, bool]:
    """The registered rule ``name`` that aggregates the unflagged rows, and whether it takes a
    generator; refused when it needs what only the pipeline has (client histories, a server
    update, the previous aggregate) or is FLDetector itself."""
    if not isinstance(name, str) or name not in AGGREGATORS.names():
        raise ValueError(f"fldetector: rule must be a registered aggregation rule ({', '.join(AGGREGATORS.names())}), got {name!r}")
    entry = AGGREGATORS.entry(name)
    import inspect

    needs = {p.name for p in inspect.signature(entry.impl).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    extra = needs & (set(AGGREGATORS.reserved) - {"f", "generator"})
    if extra or name == "fldetector":
        raise ValueError(
            f"fldetector: rule {name!r} needs {', '.join(sorted(extra)) or 'client histories'}, which the detector "
            "cannot give it; choose a rule that takes only the rows (e.g. median, trimmed_mean, mean, krum)"
        )
    return entry.impl, "generator" in needs


@AGGREGATORS.register("fldetector", state=FLDetector)
def fldetector(
    updates: Tensor,
    *,
    f: int,
    client_ids: Sequence[int] | None = None,
    model_delta: Tensor | None = None,
    generator: torch.Generator | None = None,
    state: FLDetector | None = None,
    commit: bool = False,
    window: int = 10,
    min_scores: int = 1,
    refs: int = 10,
    max_k: int = 7,
    rule: str = "median",
) -> Tensor:
    """FLDetector (Zhang et al., KDD 2022): ``rule`` over the clients not flagged, a client being
    flagged once its updates stray from what its previous update and an L-BFGS Hessian estimate
    predict (:class:`FLDetector`). ``state`` is the run's detector (the pipeline keeps it across
    rounds; without one, a fresh detector sees a single round: ``rule`` over all rows), ``commit``
    whether this call is the round's aggregation (the detector then records the round),
    ``model_delta`` the model's change since the previous round, ``client_ids`` the rows'
    clients. ``window`` (10): the L-BFGS pairs and the scores averaged per client; ``min_scores``
    (1): rounds of scores before anyone is flagged; ``refs`` (10) and ``max_k`` (7): the gap
    statistic's reference samples and largest k; ``rule`` ("median", the reference code's
    default): the rule that aggregates the unflagged rows, with f reduced by the rows removed
    (the gap statistic, not f, decides how many clients are malicious). Refuses what ``rule``
    refuses at the round's n and f."""
    n = check_matrix(updates, "fldetector")
    require("fldetector", n, f, True, "f >= 0")
    if client_ids is None or len(client_ids) != n:
        raise ValueError("fldetector: needs the client id of every row (client_ids); the pipeline supplies them")
    det = state if state is not None else FLDetector(window=window, min_scores=min_scores, refs=refs, max_k=max_k, rule=rule)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    return det.aggregate(updates, client_ids, model_delta, gen, f=f, commit=commit)
