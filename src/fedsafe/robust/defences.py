"""Subset-selection and spectral-filter rules: MDA, CAF, SMEA (as the peer library ByzFL 0.0.11
defines them) and ClippedClustering (Li, Ngai, Voigt 2023).

Every rule here works from an ``(n, n)`` matrix computed in one pass over the updates (the
pairwise squared distances of :func:`fedsafe.robust.distances.pairwise_sq_distances`, or the
Gram matrix of :func:`fedsafe.robust.distances.gram`) and ends with one weighted sum of the
updates, so the ``(n, d)`` matrix is read about twice whatever the search costs: the search
itself (subsets, eigenvalues, clustering) runs on ``n × n`` float64 matrices, never on
``d``-dimensional vectors and never on ``d × d`` covariances.

Covariances from distances: for convex weights ``w`` and ``μ = Σ_k w_k x_k``, the centred Gram
matrix ``K_ij = ⟨x_i − μ, x_j − μ⟩`` is ``−½ (D_ij − a_i − a_j + wᵀa)`` with ``a = D w``
(double centring, as in classical multidimensional scaling). The non-zero eigenvalues of a
weighted covariance ``Σ_c = (1/Σc) Σ_i c_i (x_i − μ)(x_i − μ)ᵀ`` are those of the ``n × n``
matrix ``C^{1/2} K C^{1/2} / Σc``, and its top eigenvector's projections follow from ``K``.

Exhaustive searches (MDA, SMEA) enumerate ``C(n, f)`` subsets and refuse, with a ValueError
naming the rule, n, f and the count, when that exceeds ``max_subsets`` (default 100 000):
``C(50, 10) ≈ 1.0·10¹⁰`` would not finish, ``C(50, 2) = 1225`` takes a fraction of a second.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS, _int_param
from fedsafe.robust.distances import gram, pairwise_sq_distances
from fedsafe.robust.rows import average_rows, check_matrix, median_value, require

#: Default bound on the number of subsets MDA and SMEA enumerate.
MAX_SUBSETS = 100_000
# Eigenvalues within this relative distance of the smallest one are ties (see _first_near_min).
_TIE_RTOL = 1e-9
# Entries of one batch of gathered (m, m) sub-matrices (float64): 4 Mi values, 32 MiB.
_BATCH_VALUES = 1 << 22


def _distances(updates: Tensor) -> Tensor:
    """Pairwise squared distances (accumulated as ``pairwise_sq_distances`` does for the
    updates' dtype) as a float64 CPU matrix."""
    return pairwise_sq_distances(updates).to(device="cpu", dtype=torch.float64)


def _first_near_min(values: Tensor) -> int:
    """Index of the first of the (non-negative) values within ``_TIE_RTOL`` relative of the
    smallest: eigenvalues that are equal in exact arithmetic (e.g. subsets holding the same
    vectors in another order) differ in their last bits, and must not decide. A smallest
    value of exactly 0 (coinciding vectors: an all-zero matrix) ties only with exact zeros."""
    return int(torch.nonzero(values <= values.min() * (1 + _TIE_RTOL))[0, 0])


def _subset_count(rule: str, n: int, f: int, max_subsets: int) -> int:
    _int_param(rule, "max_subsets", max_subsets, 1)
    count = math.comb(n, f)
    if count > max_subsets:
        raise ValueError(
            f"{rule}: exhaustive search over C(n, f) = C({n}, {f}) = {count} subsets of n - f = "
            f"{n - f} updates exceeds max_subsets = {max_subsets}; use a smaller f or another rule "
            "(or raise max_subsets, at a cost proportional to the count)"
        )
    return count


def _subset_batches(n: int, m: int):
    """``(first, idx)`` per batch: the subsets of size ``m`` of ``range(n)`` in
    ``itertools.combinations`` order (lexicographic), as (b, m) index tensors, ``first`` the
    position of the batch's first subset in that order."""
    per_batch = max(1, _BATCH_VALUES // max(1, m * m))
    combos = itertools.combinations(range(n), m)
    first = 0
    while True:
        chunk = list(itertools.islice(combos, per_batch))
        if not chunk:
            return
        yield first, torch.tensor(chunk, dtype=torch.long).reshape(len(chunk), m)
        first += len(chunk)


def _nth_subset(n: int, m: int, k: int) -> Tensor:
    return torch.tensor(next(itertools.islice(itertools.combinations(range(n), m), k, None)), dtype=torch.long)


def _gather(d2: Tensor, idx: Tensor) -> Tensor:
    """The (b, m, m) sub-matrices ``D[S, S]`` of the subsets in the rows of ``idx``."""
    return d2[idx[:, :, None], idx[:, None, :]]


@AGGREGATORS.register("mda")
def mda(updates: Tensor, *, f: int, max_subsets: int = MAX_SUBSETS) -> Tensor:
    """Minimum-diameter averaging: the mean of the n − f updates of smallest diameter.

    ``S* = argmin_{|S| = n−f} max_{i,j ∈ S} ‖x_i − x_j‖``, output ``(1/(n−f)) Σ_{i∈S*} x_i``
    (El Mhamdi, Guerraoui, Guirguis, Hoang, Rouault, "Genuinely distributed Byzantine machine
    learning", PODC 2020; ByzFL's ``MDA``). Requires ``n > 2f``.

    Ties: subsets are enumerated in ``itertools.combinations(range(n), n − f)`` order
    (lexicographic in the sorted indices) and the first of equal diameters wins, so lower
    indices are kept; that is also ByzFL's order. Diameters are compared exactly, as entries
    of one distance matrix (a set and its reordering tie exactly). The distances are those of
    ``pairwise_sq_distances`` (squared, which orders as the distances do; for float32 updates
    accumulated as for Krum).

    Exhaustive: refuses (ValueError naming n, f and the count) when ``C(n, f) > max_subsets``
    (default 100 000). Cost: one distance matrix (as Krum: about twice a mean over the
    updates), ``C(n, f) · (n − f)²`` comparisons on it, one weighted sum."""
    n = check_matrix(updates, "mda")
    require("mda", n, f, 2 * f < n, "n > 2f")
    _subset_count("mda", n, f, max_subsets)
    d2 = _distances(updates)
    m = n - f
    best_value, best_index = math.inf, 0
    for first, idx in _subset_batches(n, m):
        diam = _gather(d2, idx).amax(dim=(1, 2))
        k = int(torch.argmin(diam))  # the first minimum of the batch
        if float(diam[k]) < best_value:  # strict: an earlier batch wins ties
            best_value, best_index = float(diam[k]), first + k
    return average_rows(updates, _nth_subset(n, m, best_index))


@AGGREGATORS.register("smea")
def smea(updates: Tensor, *, f: int, max_subsets: int = MAX_SUBSETS) -> Tensor:
    """Smallest maximum eigenvalue averaging: mean of the n − f updates of least top covariance eigenvalue.

    ``S* = argmin_{|S| = n−f} λ_max(Σ_S)``, ``Σ_S = (1/|S|) Σ_{i∈S} (x_i − μ_S)(x_i − μ_S)ᵀ``,
    output ``μ_{S*}`` (Allouah, Guerraoui, Gupta, Pinot, Stephan, "On the privacy-robustness-
    utility trilemma in distributed learning", ICML 2023; ByzFL's ``SMEA``). Requires ``n > 2f``.

    ``λ_max(Σ_S)`` is exact: the top eigenvalue (``torch.linalg.eigvalsh``) of the
    ``(n−f) × (n−f)`` double-centred distance sub-matrix ``−½ J D_SS J / |S|``
    (``J = I − 11ᵀ/|S|``), which has the covariance's non-zero spectrum. ByzFL instead
    estimates it by ONE power-method step from a random start (``np.random.randn`` /
    ``torch.randn``), a random lower bound, so its choice is random where the eigenvalues are
    not far apart; with the exact eigenvector as the start the two agree.

    Ties: subsets in ``itertools.combinations(range(n), n − f)`` order; the first whose
    eigenvalue is within 1e-9 (relative) of the smallest wins (so lower indices are kept, and
    rounding between equal sets in another order does not decide).

    Exhaustive: refuses (ValueError naming n, f and the count) when ``C(n, f) > max_subsets``
    (default 100 000). Cost: one distance matrix (about twice a mean over the updates),
    ``C(n, f)`` symmetric eigenvalue problems of size ``n − f`` (O((n−f)³) each: about 1 s per
    10⁴ subsets of 48), one weighted sum."""
    n = check_matrix(updates, "smea")
    require("smea", n, f, 2 * f < n, "n > 2f")
    _subset_count("smea", n, f, max_subsets)
    d2 = _distances(updates)
    m = n - f
    lams = []
    for _, idx in _subset_batches(n, m):
        sub = _gather(d2, idx)
        rows = sub.mean(dim=2, keepdim=True)
        centered = -0.5 * (sub - rows - rows.transpose(1, 2) + rows.mean(dim=1, keepdim=True))
        lams.append(torch.linalg.eigvalsh(centered)[:, -1].clamp_min(0) / m)
    best = _first_near_min(torch.cat(lams))
    return average_rows(updates, _nth_subset(n, m, best))


@AGGREGATORS.register("caf")
def caf(updates: Tensor, *, f: int) -> Tensor:
    """Covariance-bound-agnostic filter: spectral down-weighting, the weighted mean of least top eigenvalue.

    Allouah, Guerraoui, Stephan, "Towards trustworthy federated learning with untrusted
    participants", ICML 2025; ByzFL's ``CAF``. From weights ``c = 1``, repeat:

    1. ``μ_c = Σ_i c_i x_i / Σc``, ``Σ_c = (1/Σc) Σ_i c_i (x_i − μ_c)(x_i − μ_c)ᵀ``, its top
       eigenpair ``(λ, v)``; ``μ_c`` is a candidate with eigenvalue λ;
    2. ``τ_i = ⟨x_i − μ_c, v⟩²``, ``τ_max = max{τ_i : c_i > 0}``,
       ``c_i ← c_i (1 − τ_i / τ_max)``;
    3. stop when ``Σc ≤ n − 2f``.

    Output: the candidate with the smallest λ. Requires ``n > 2f``.

    Choices where ByzFL 0.0.11 (or the source) is ambiguous or differs:

    * λ and v are exact (``torch.linalg.eigh`` of ``C^{1/2} K C^{1/2} / Σc``, K the double-
      centred distance matrix, see the module docstring). ByzFL runs ONE power-method step
      from a random start, a random under-estimate.
    * ``τ_max`` is over the updates that still carry weight. ByzFL takes it over all n, so an
      update already at weight 0 (a far outlier) keeps setting τ_max, the others' weights
      shrink by factors ``1 − τ_i/τ_max ≈ 1`` and the loop runs for as many iterations as
      ``τ_max/τ_i`` (~2·10⁵, seconds, for one 20-d outlier at 10⁶; unbounded as it grows)
      and then stops at other weights. Here every iteration zeroes the update at τ_max, so
      there are at most n iterations.
    * The first candidate is always evaluated (a do-while loop): with ``f = 0`` the output is
      the mean. ByzFL's while-loop never runs for ``f = 0`` and returns None.
    * If λ = 0 (all weighted updates coincide) the loop stops: μ_c is exact and no candidate
      can have a smaller λ (ByzFL divides by zero there).
    * Ties: the first candidate whose λ is within 1e-9 (relative) of the smallest, as ByzFL's
      strict ``<`` keeps the first; a repeated top eigenvalue leaves v to ``eigh`` (either
      choice is a valid filter step).

    Cost: one distance matrix (about twice a mean over the updates), at most n eigenproblems
    of size n, one weighted sum."""
    n = check_matrix(updates, "caf")
    require("caf", n, f, 2 * f < n, "n > 2f")
    d2 = _distances(updates)
    c = torch.ones(n, dtype=torch.float64)
    lams: list[float] = []
    weights: list[Tensor] = []
    while True:
        s = c.sum()
        w = c / s
        a = d2 @ w
        k = -0.5 * (d2 - a[:, None] - a[None, :] + w @ a)  # ⟨x_i − μ_c, x_j − μ_c⟩
        r = c.sqrt()
        evals, evecs = torch.linalg.eigh(r[:, None] * k * r[None, :] / s)
        lam = max(float(evals[-1]), 0.0)
        lams.append(lam)
        weights.append(w)
        if lam == 0:  # the weighted updates coincide: nothing smaller to find
            break
        proj = k @ (r * evecs[:, -1])  # √(Σc·λ) · ⟨x_i − μ_c, v⟩
        tau = proj * proj
        tau_max = tau[c > 0].max()
        if not tau_max > 0:  # λ > 0 only by rounding
            break
        c = (c * (1 - tau / tau_max)).clamp_min(0)  # exactly 0 at τ_max
        if float(c.sum()) <= n - 2 * f:
            break
    best = _first_near_min(torch.tensor(lams, dtype=torch.float64))
    return weights[best].to(device=updates.device, dtype=updates.dtype) @ updates


_LINKAGES = ("average", "single", "complete")


def _two_clusters(dist: Tensor, linkage: str) -> list[list[int]]:
    """The two clusters of the last merge of scipy's agglomerative clustering of the
    condensed ``dist`` (``method=linkage``), each a sorted index list."""
    from scipy.cluster.hierarchy import linkage as scipy_linkage
    from scipy.cluster.hierarchy import to_tree
    from scipy.spatial.distance import squareform

    z = scipy_linkage(squareform(dist.numpy(), checks=False), method=linkage)
    root = to_tree(z)
    return [sorted(root.get_left().pre_order()), sorted(root.get_right().pre_order())]


@AGGREGATORS.register("clipped_clustering")
def clipped_clustering(updates: Tensor, *, f: int, linkage: str = "average") -> Tensor:
    """ClippedClustering: median-norm clipping, two cosine clusters, the mean of the larger one.

    Li, Ngai, Voigt, "An experimental study of Byzantine-robust aggregation schemes in federated
    learning", IEEE Trans. Big Data 2023 (the ``Clippedclustering`` aggregator of their Blades
    library):

    1. ``M`` = the median of the norms ``‖x_i‖`` of this round's n updates (even n: the mean
       of the two middle ones); ``y_i = x_i · min(1, M / ‖x_i‖)``.
    2. Agglomerative clustering of the updates into two clusters on the cosine distances
       ``1 − cos(x_i, x_j)`` (``scipy.cluster.hierarchy.linkage``, ``method = linkage``,
       default ``"average"`` as the paper; the two clusters are the two sides of the last
       merge). Clipping scales by positive factors, so the cosines are the same before or
       after it.
    3. Output the mean of the ``y_i`` of the larger cluster.

    Choices where the source is ambiguous:

    * The paper clips to the median norm of *all past* updates (a running history, capped at
      ``max_tau = 1e5``); fedsafe rules are functions of one round, so ``M`` is the median of
      the current round's norms (SignGuard's and FLAME's choice). A round in which all
      updates grow is then not shrunk by stale history.
    * A zero update has cosine similarity 0 with everything (distance 1), as torch's
      ``cosine_similarity`` gives; cosines are clamped to [−1, 1].
    * Equal-sized clusters (even n): the one holding the lowest index. (Blades keeps the
      cluster that sklearn labels 1 only if it has more than ⌊n/2⌋ members.)
    * Exact ties between cluster distances are resolved by scipy's nearest-neighbour-chain
      algorithm; the split can depend on that only when the tied merges are the last ones.

    Requires ``n > 2f`` (the larger cluster must be honest) and ``linkage`` ∈ {"average",
    "single", "complete"}. Cost: one Gram matrix (about twice a mean over the updates), an
    O(n²) clustering, one weighted sum; scipy is imported on the first call."""
    n = check_matrix(updates, "clipped_clustering")
    require("clipped_clustering", n, f, 2 * f < n, "n > 2f")
    if linkage not in _LINKAGES:
        raise ValueError(
            f"clipped_clustering: linkage must be one of {', '.join(_LINKAGES)}, got {linkage!r}"
        )
    g = gram(updates).to(device="cpu", dtype=torch.float64)
    norms = torch.diagonal(g).clamp_min(0).sqrt()
    if n == 1:
        keep = [0]
    else:
        denom = norms[:, None] * norms[None, :]
        cos = torch.where(denom > 0, g / torch.where(denom > 0, denom, 1.0), 0.0).clamp(-1.0, 1.0)
        dist = 1.0 - cos
        dist = (dist + dist.T) / 2
        dist.fill_diagonal_(0.0)
        a, b = _two_clusters(dist, linkage)
        keep = a if (len(a), -a[0]) > (len(b), -b[0]) else b
    bound = median_value(norms)
    scale = torch.where(norms > bound, bound / torch.where(norms > 0, norms, 1.0), 1.0)
    w = torch.zeros(n, dtype=torch.float64)
    w[keep] = scale[keep] / len(keep)
    return w.to(device=updates.device, dtype=updates.dtype) @ updates
