"""Naive reference implementations of the robust rules and pre-aggregators.

Straight from the papers' definitions: numpy float64, explicit Python loops over clients, pairs
and coordinates, no Gram matrices, no vectorised selection. Slow and obviously correct; the
tests check the fast implementations against these. Tie rules are the documented ones: lowest
index first; for "values closest to the median", equal distances prefer the lower value.

Randomised rules take their random draws as arguments; ``dnc_coords`` / ``signguard_coords``
/ ``bucketing_perm`` reproduce the documented recipes for drawing them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedsafe.core.streams import torch_stream


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.array(x, dtype=np.float64)


def _sq(a: np.ndarray, b: np.ndarray) -> float:
    s = 0.0
    for u, v in zip(a, b):
        s += (u - v) * (u - v)
    return s


def _norm(a: np.ndarray) -> float:
    return math.sqrt(sum(v * v for v in a))


def _med(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _mean_rows(rows: list[np.ndarray]) -> np.ndarray:
    out = np.zeros_like(rows[0])
    for r in rows:
        out = out + r
    return out / len(rows)


def _closest_to_median_mean(values: list[float], k: int) -> float:
    v = sorted(values)
    m = _med(v)
    order = sorted(range(len(v)), key=lambda p: (abs(v[p] - m), p))
    return sum(v[p] for p in order[:k]) / k


# ---------------------------------------------------------------- aggregation rules


def mean(x, f=0):
    x = _np(x)
    return _mean_rows(list(x))


def median(x, f):
    x = _np(x)
    return np.array([_med(list(x[:, j])) for j in range(x.shape[1])])


def trimmed_mean(x, f):
    x = _np(x)
    n = x.shape[0]
    out = []
    for j in range(x.shape[1]):
        v = sorted(x[:, j])
        out.append(sum(v[f : n - f]) / (n - 2 * f))
    return np.array(out)


def sq_distances(x) -> np.ndarray:
    x = _np(x)
    n = x.shape[0]
    d2 = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            d2[i, j] = _sq(x[i], x[j])
    return d2


def krum_scores_from(d2: np.ndarray, idx: list[int], k: int) -> list[float]:
    scores = []
    for i in idx:
        others = sorted(d2[i, j] for j in idx if j != i)
        scores.append(sum(others[:k]))
    return scores


def krum_index(x, f) -> int:
    n = len(x)
    scores = krum_scores_from(sq_distances(x), list(range(n)), n - f - 2)
    best = 0
    for i in range(1, n):
        if scores[i] < scores[best]:
            best = i
    return best


def krum(x, f):
    return _np(x)[krum_index(x, f)]


def multi_krum_indices(x, f, m=None) -> list[int]:
    n = len(x)
    m = n - f if m is None else m
    scores = krum_scores_from(sq_distances(x), list(range(n)), n - f - 2)
    return sorted(range(n), key=lambda i: (scores[i], i))[:m]


def multi_krum(x, f, m=None):
    x = _np(x)
    return _mean_rows([x[i] for i in multi_krum_indices(x, f, m)])


def bulyan_indices(x, f) -> list[int]:
    n = len(x)
    d2 = sq_distances(x)
    remaining = list(range(n))
    chosen = []
    for _ in range(n - 2 * f):
        r = len(remaining)
        if r == 1:
            pick = remaining[0]
        else:
            scores = krum_scores_from(d2, remaining, max(r - f - 2, 1))
            pick = min(zip(scores, remaining))[1]
        chosen.append(pick)
        remaining.remove(pick)
    return chosen


def bulyan(x, f):
    x = _np(x)
    sel = x[bulyan_indices(x, f)]
    beta = len(sel) - 2 * f
    return np.array([_closest_to_median_mean(list(sel[:, j]), beta) for j in range(x.shape[1])])


def geometric_median(x, f, eps=1e-8, tol=1e-6, max_iter=100):
    x = _np(x)
    rows = list(x)
    z = _mean_rows(rows)
    for _ in range(max_iter):
        w = [1.0 / max(eps, _norm(z - r)) for r in rows]
        new = sum(wi * r for wi, r in zip(w, rows)) / sum(w)
        step = _norm(new - z)
        z = new
        dist = sorted(_norm(z - r) for r in rows)
        k = len(dist)
        median = dist[k // 2] if k % 2 else (dist[k // 2 - 1] + dist[k // 2]) / 2
        if step <= tol * median:  # the step against the bulk's scale (see distances.py)
            break
    return z


def centered_clipping(x, f, previous=None, tau=None, iters=1):
    x = _np(x)
    n, d = x.shape
    v = np.zeros(d) if previous is None else _np(previous)
    for _ in range(iters):
        step = np.zeros(d)
        radius = tau
        if radius is None:  # the median distance to the centre (even n: mean of the middle two)
            dist = sorted(_norm(r - v) for r in x)
            radius = dist[n // 2] if n % 2 else (dist[n // 2 - 1] + dist[n // 2]) / 2
        for r in x:
            u = r - v
            nu = _norm(u)
            step = step + (u * min(1.0, radius / nu) if nu > 0 else u)
        v = v + step / n
    return v


def meamed(x, f):
    x = _np(x)
    n = x.shape[0]
    return np.array([_closest_to_median_mean(list(x[:, j]), n - f) for j in range(x.shape[1])])


def monna(x, f, reference=0):
    x = _np(x)
    n = x.shape[0]
    dist = [_sq(x[i], x[reference]) for i in range(n)]
    order = sorted(range(n), key=lambda i: (dist[i], i))[: n - f]
    return _mean_rows([x[i] for i in order])


def dnc_coords(seed: int, d: int, sub_dim: int, iteration: int) -> list[int] | None:
    """The documented draw: None (all coordinates) when sub_dim >= d."""
    if sub_dim >= d:
        return None
    return torch.randperm(d, generator=torch_stream(seed, "robust.dnc", iteration))[:sub_dim].tolist()


def dnc(x, f, coords_per_iter: list[list[int] | None], filter_frac=1.0):
    x = _np(x)
    n = x.shape[0]
    removed = math.floor(filter_frac * f + 1e-9)
    kept = set(range(n))
    for coords in coords_per_iter:
        sub = x if coords is None else x[:, coords]
        mu = _mean_rows(list(sub))
        centered = np.array([r - mu for r in sub])
        v = np.linalg.svd(centered, full_matrices=False)[2][0]
        scores = [float(np.dot(c, v)) ** 2 for c in centered]
        good = sorted(range(n), key=lambda i: (scores[i], i))[: n - removed]
        kept &= set(good)
    return _mean_rows([x[i] for i in sorted(kept)])


def signguard_coords(seed: int, d: int, coord_frac: float) -> list[int] | None:
    b = max(1, math.floor(coord_frac * d + 1e-9))
    if b >= d:
        return None
    return torch.randperm(d, generator=torch_stream(seed, "robust.signguard", 0))[:b].tolist()


def mean_shift_largest(feats: np.ndarray, quantile=0.3, max_iter=300) -> set[int]:
    n = len(feats)
    k = max(1, math.floor(quantile * n + 1e-9))
    h = sum(sorted(_norm(feats[i] - feats[j]) for j in range(n))[k - 1] for i in range(n)) / n
    rho = h * (1 + 1e-9) + 1e-12  # "<= h" up to rounding, as documented
    modes = [feats[i].copy() for i in range(n)]
    for _ in range(max_iter):
        new = []
        for y in modes:
            ball = [feats[j] for j in range(n) if _norm(feats[j] - y) <= rho]
            new.append(_mean_rows(ball) if ball else y)
        shift = max(_norm(a - b) for a, b in zip(new, modes))
        modes = new
        if shift <= 1e-3 * h:
            break
    clusters = [{j for j in range(n) if _norm(modes[j] - modes[i]) <= rho} for i in range(n)]
    best = 0
    for i in range(1, n):
        if len(clusters[i]) > len(clusters[best]):
            best = i
    return clusters[best]


def signguard(x, f, coords: list[int] | None, lower=0.1, upper=3.0):
    x = _np(x)
    n = x.shape[0]
    norms = [_norm(r) for r in x]
    m = _med(norms)
    s1 = {i for i in range(n) if lower * m <= norms[i] <= upper * m}
    feats = []
    for r in x:
        vals = r if coords is None else r[coords]
        b = len(vals)
        feats.append(np.array([sum(v > 0 for v in vals) / b, sum(v == 0 for v in vals) / b,
                               sum(v < 0 for v in vals) / b]))
    s2 = mean_shift_largest(np.array(feats))
    keep = s1 & s2 or s1
    out = np.zeros(x.shape[1])
    for i in sorted(keep):
        out = out + x[i] * (min(1.0, m / norms[i]) if norms[i] > 0 else 1.0)
    return out / len(keep)


# ---------------------------------------------------------------- pre-aggregators


def nnm_neighbors(x, f) -> list[list[int]]:
    """For each i: i itself, then its n − f − 1 nearest others (squared distance, then index)."""
    x = _np(x)
    n = x.shape[0]
    out = []
    for i in range(n):
        others = sorted((j for j in range(n) if j != i), key=lambda j: (_sq(x[i], x[j]), j))
        out.append([i, *others[: n - f - 1]])
    return out


def nnm(x, f):
    x = _np(x)
    return np.array([_mean_rows([x[j] for j in nearest]) for nearest in nnm_neighbors(x, f)])


def bucketing_perm(generator: torch.Generator, n: int) -> list[int]:
    return torch.randperm(n, generator=generator).tolist()


def bucketing(x, perm: list[int], s=2):
    x = _np(x)
    return np.array([_mean_rows([x[i] for i in perm[k : k + s]]) for k in range(0, len(perm), s)])


def clipping(x, c):
    x = _np(x)
    out = []
    for r in x:
        nr = _norm(r)
        out.append(r * min(1.0, c / nr) if nr > 0 else r)
    return np.array(out)


def arc(x, f):
    x = _np(x)
    n = x.shape[0]
    k = math.floor(2 * (f / n) * (n - f) + 1e-9)
    norms = [_norm(r) for r in x]
    order = sorted(range(n), key=lambda i: -norms[i])
    tau = norms[order[k]]
    out = x.copy()
    for i in order[:k]:
        if norms[i] > 0:
            out[i] = x[i] * (tau / norms[i])
    return out


# ---------------------------------------------------------------- subset and spectral rules (defences.py)

from itertools import combinations as _combinations

# Eigenvalues within TIE_RTOL (relative) of the smallest are ties: the first one wins.
TIE_RTOL = 1e-9


def _first_near_min(values: list[float]) -> int:
    low = min(values)
    return next(i for i, v in enumerate(values) if v <= low * (1 + TIE_RTOL))


def _weighted_covariance(rows: list[np.ndarray], weights: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(μ, Σ): μ = Σ w_i x_i / Σw, Σ = (1/Σw) Σ w_i (x_i − μ)(x_i − μ)ᵀ, a d × d matrix."""
    s = sum(weights)
    mu = np.zeros_like(rows[0])
    for w, r in zip(weights, rows):
        mu = mu + w * r
    mu = mu / s
    cov = np.zeros((len(mu), len(mu)))
    for w, r in zip(weights, rows):
        cov = cov + w * np.outer(r - mu, r - mu)
    return mu, cov / s


def mda(x, f):
    """The first subset (combinations order) of n − f rows of strictly smallest diameter."""
    x = _np(x)
    n = len(x)
    best, best_subset = math.inf, None
    for subset in _combinations(range(n), n - f):
        diameter = max(_sq(x[i], x[j]) for i in subset for j in subset)
        if diameter < best:
            best, best_subset = diameter, subset
    return _mean_rows([x[i] for i in best_subset])


def smea(x, f):
    """Top eigenvalue of each subset's d × d covariance; the first near-smallest wins."""
    x = _np(x)
    n = len(x)
    subsets = list(_combinations(range(n), n - f))
    lams = []
    for subset in subsets:
        _, cov = _weighted_covariance([x[i] for i in subset], [1.0] * len(subset))
        lams.append(max(0.0, float(np.linalg.eigvalsh(cov)[-1])))
    best = subsets[_first_near_min(lams)]
    return _mean_rows([x[i] for i in best])


def caf(x, f):
    """CAF with exact d × d eigenpairs, τ_max over the rows with positive weight, a do-while
    loop, a stop at λ = 0, and the first near-smallest λ's weighted mean."""
    x = _np(x)
    n = len(x)
    c = [1.0] * n
    lams, means = [], []
    while True:
        mu, cov = _weighted_covariance(list(x), c)
        evals, evecs = np.linalg.eigh(cov)
        lam = max(float(evals[-1]), 0.0)
        lams.append(lam)
        means.append(mu)
        if lam == 0:
            break
        v = evecs[:, -1]
        tau = [float(np.dot(r - mu, v)) ** 2 for r in x]
        tau_max = max(tau[i] for i in range(n) if c[i] > 0)
        if not tau_max > 0:
            break
        c = [max(0.0, c[i] * (1.0 - tau[i] / tau_max)) for i in range(n)]
        if sum(c) <= n - 2 * f:
            break
    return means[_first_near_min(lams)]


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    """1 − cos(a, b), cos clamped to [−1, 1]; 1 if either vector is zero."""
    na, nb = _norm(a), _norm(b)
    if na == 0 or nb == 0:
        return 1.0
    return 1.0 - min(1.0, max(-1.0, sum(u * v for u, v in zip(a, b)) / (na * nb)))


def agglomerate_two(dist: np.ndarray, linkage: str = "average") -> list[list[int]]:
    """Greedy agglomerative clustering down to two clusters: merge the pair of clusters with the
    smallest linkage distance (average / min / max over their members' pairs)."""
    clusters = [[i] for i in range(len(dist))]
    link = {"average": lambda v: sum(v) / len(v), "single": min, "complete": max}[linkage]
    while len(clusters) > 2:
        best = None
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                value = link([dist[i, j] for i in clusters[a] for j in clusters[b]])
                if best is None or value < best[0]:
                    best = (value, a, b)
        _, a, b = best
        clusters[a] = sorted(clusters[a] + clusters[b])
        del clusters[b]
    return clusters


def clipped_clustering(x, f, linkage="average"):
    x = _np(x)
    n = len(x)
    if n == 1:
        keep = [0]
    else:
        dist = np.array([[cosine_distance(x[i], x[j]) for j in range(n)] for i in range(n)])
        a, b = agglomerate_two(dist, linkage)
        keep = a if len(a) > len(b) or (len(a) == len(b) and min(a) < min(b)) else b
    norms = [_norm(r) for r in x]
    m = _med(norms)
    out = np.zeros(x.shape[1])
    for i in keep:
        out = out + x[i] * (min(1.0, m / norms[i]) if norms[i] > 0 else 1.0)
    return out / len(keep)


def rlr(x, f, threshold=None):
    """Robust learning rate (Ozdayi et al.): per coordinate, +1 × the mean where the absolute
    sum of the clients' signs (sign(0) = 0) is at least θ (default f + 1), −1 × it elsewhere."""
    x = _np(x)
    n, d = x.shape
    theta = f + 1 if threshold is None else threshold
    out = []
    for j in range(d):
        votes = 0
        total = 0.0
        for i in range(n):
            v = x[i, j]
            votes += 1 if v > 0 else (-1 if v < 0 else 0)
            total += v
        out.append((total / n) * (1.0 if abs(votes) >= theta else -1.0))
    return np.array(out)


def dct2_ortho(row: np.ndarray) -> np.ndarray:
    """The orthonormal type-II DCT from its definition: X_k = s_k Σ_j x_j cos(π k (2j+1) / 2d),
    s_0 = √(1/d), s_k = √(2/d)."""
    d = len(row)
    out = np.zeros(d)
    for k in range(d):
        s = 0.0
        for j in range(d):
            s += row[j] * math.cos(math.pi * k * (2 * j + 1) / (2 * d))
        out[k] = s * math.sqrt((1.0 if k == 0 else 2.0) / d)
    return out


def freqfed(x, f, fraction=0.25):
    """FreqFed (Fereidooni et al.): the first ⌈fraction·d⌉ DCT-II coefficients of each update,
    HDBSCAN (min cluster ⌊n/2⌋+1, min_samples 1, one cluster allowed) on their cosine
    distances, the mean of the largest cluster's updates (all of them if there is none)."""
    import hdbscan

    x = _np(x)
    n, d = x.shape
    k = max(1, math.ceil(fraction * d - 1e-9))
    low = [dct2_ortho(r)[:k] for r in x]
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i != j:
                dist[i, j] = cosine_distance(low[i], low[j])
    labels = hdbscan.HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
                             allow_single_cluster=True).fit_predict(dist)
    sizes = {c: int((labels == c).sum()) for c in set(labels.tolist()) if c >= 0}
    if sizes:
        best = min(sizes, key=lambda c: (-sizes[c], c))
        keep = [i for i in range(n) if labels[i] == best]
    else:
        keep = list(range(n))
    return _mean_rows([x[i] for i in keep])


def bfgs_matrix(s_rows, y_rows) -> np.ndarray:
    """The BFGS Hessian approximation from its recursion, as a d × d matrix: B₀ = σI with
    σ = y_Nᵀs_N / s_Nᵀs_N (the newest pair), then for each pair, oldest first,
    B ← B − B s sᵀ B / (sᵀ B s) + y yᵀ / (yᵀ s)."""
    s_rows, y_rows = _np(s_rows), _np(y_rows)
    d = s_rows.shape[1]
    sigma = float(y_rows[-1] @ s_rows[-1]) / float(s_rows[-1] @ s_rows[-1])
    b = sigma * np.eye(d)
    for s, y in zip(s_rows, y_rows):
        bs = b @ s
        b = b - np.outer(bs, bs) / float(s @ bs) + np.outer(y, y) / float(y @ s)
    return b


def kmeans_1d_sse(values, k) -> float:
    """The least within-cluster sum of squares of 1-D ``values`` in k clusters, by trying every
    split of the sorted values into k runs."""
    import itertools

    v = sorted(float(a) for a in values)
    n = len(v)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        sse = 0.0
        for a, b in zip(bounds, bounds[1:]):
            m = sum(v[a:b]) / (b - a)
            sse += sum((t - m) ** 2 for t in v[a:b])
        best = min(best, sse)
    return best
