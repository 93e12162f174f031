"""Robust aggregation rules: pure functions ``rule(updates[n, d], *, f, **params) -> [d]``.

Conventions (docs/architecture.md): inputs are never modified; ``f`` is the number of Byzantine updates the
rule must tolerate; a rule that needs state (centered clipping) receives it explicitly as the
reserved keyword ``previous`` (the previous round's aggregate, or None in the first round).
The output has the updates' dtype; float64 is used inside only where rounding would matter
(the geometric median's distances, DnC's SVD, SignGuard's statistics). Inputs must be finite:
the engine filters non-finite updates before aggregation.

Every rule refuses an (n, f) outside its requirement with a ValueError naming the rule, n, f
and the requirement. Ties are broken by the lowest client index (see ``distances``); for the
coordinate-wise "values closest to the median" rules, equally close values below the median
are preferred to those above it.

Randomised rules (DnC, SignGuard) take an explicit ``seed`` parameter and draw their coordinate
subsample from the named stream ``torch_stream(seed, "robust.<rule>", iteration)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedsafe.core.registry import Registry
from fedsafe.core.streams import torch_stream
from fedsafe.robust.distances import pairwise_sq_distances, weiszfeld_weights
from fedsafe.robust.filters import (
    cosine_filter,
    cosine_filter_select,
    norm_filter,
    norm_filter_select,
)
from fedsafe.robust.krum import bulyan_select, krum_select, multi_krum_select
from fedsafe.robust.rows import average_rows, median_value
from fedsafe.robust.rows import check_matrix as _check_matrix
from fedsafe.robust.rows import require as _require
from fedsafe.robust.rowwise import centered_weighted_sum, row_sq_norms
from fedsafe.robust.selection import (
    coordinate_mean_around_median,
    coordinate_median,
    coordinate_trimmed_mean,
    mean_around_median,  # noqa: F401  (re-exported: the reference the tests compare with)
)
from fedsafe.robust.split import TAG as SPLIT
from fedsafe.robust.split import DistanceSplit

AGGREGATORS: Registry = Registry(
    "aggregation rule",
    reserved=("f", "previous", "server_update", "generator", "client_ids", "history", "model_delta", "state", "commit"),
)




def _int_param(rule: str, name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{rule}: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def _floor(x: float) -> int:
    # ⌊c·f⌋ with c·f computed in floating point: 0.29 * 100 = 28.999999999999996 means 29.
    return math.floor(x + 1e-9)


def _clip_factors(norms: Tensor, tau: Tensor | float) -> Tensor:
    """``min(1, τ/‖x‖)``, written so that zero norms (and τ = 0) give 1, never NaN."""
    return torch.where(norms > tau, tau / norms, torch.ones_like(norms))


@AGGREGATORS.register("mean")
def mean(updates: Tensor, *, f: int = 0) -> Tensor:
    """Arithmetic mean over clients: (1/n) Σ_i x_i. Not robust (breakdown point 0); any f."""
    _check_matrix(updates, "mean")
    return updates.mean(dim=0)


@AGGREGATORS.register("median")
def median(updates: Tensor, *, f: int) -> Tensor:
    """Coordinate-wise median: ``z_j = median_i x_ij``; an even count averages the two middle
    values (Yin, Chen, Ramchandran, Bartlett 2018). Requires ``n > 2f``."""
    n = _check_matrix(updates, "median")
    _require("median", n, f, 2 * f < n, "n > 2f")
    return coordinate_median(updates)


@AGGREGATORS.register("trimmed_mean")
def trimmed_mean(updates: Tensor, *, f: int) -> Tensor:
    """Coordinate-wise trimmed mean: per coordinate, drop the f smallest and f largest values and
    average the other ``n − 2f``, ``z_j = (1/(n−2f)) Σ_{r=f}^{n−f−1} x_(r)j`` (Yin et al. 2018).
    Requires ``n > 2f``."""
    n = _check_matrix(updates, "trimmed_mean")
    _require("trimmed_mean", n, f, 2 * f < n, "n > 2f")
    return coordinate_trimmed_mean(updates, f)


def _first(updates: Tensor, idx: Tensor, f: int) -> Tensor:
    return updates[int(idx[0])].clone()


def _average(updates: Tensor, idx: Tensor, f: int) -> Tensor:
    return average_rows(updates, idx)


def _bulyan_combine(updates: Tensor, idx: Tensor, f: int) -> Tensor:
    return coordinate_mean_around_median(updates, idx.numel() - 2 * f, rows=idx)


def _krum_index(d2: Tensor, f: int) -> Tensor:
    return torch.tensor([krum_select(d2, f)])


@AGGREGATORS.register("krum", tags=(SPLIT,), split=DistanceSplit("distances", _krum_index, _first))
def krum(updates: Tensor, *, f: int) -> Tensor:
    """Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017): the update with the lowest score
    ``s_i = Σ_{j ∈ N_i} ‖x_i − x_j‖²``, ``N_i`` its ``n − f − 2`` nearest other updates.
    Ties by lowest index. Requires ``n ≥ 2f + 3``."""
    n = _check_matrix(updates, "krum")
    _require("krum", n, f, n >= 2 * f + 3, "n >= 2f + 3")
    return updates[krum_select(pairwise_sq_distances(updates), f)].clone()


@AGGREGATORS.register("multi_krum", tags=(SPLIT,), split=DistanceSplit("distances", multi_krum_select, _average))
def multi_krum(updates: Tensor, *, f: int, m: int | None = None) -> Tensor:
    """Multi-Krum (Blanchard et al. 2017): the mean of the ``m`` updates with the lowest Krum
    scores (default ``m = n − f``), scores as in ``krum``. Ties by lowest index.
    Requires ``n ≥ 2f + 3`` and ``1 ≤ m ≤ n``."""
    n = _check_matrix(updates, "multi_krum")
    _require("multi_krum", n, f, n >= 2 * f + 3, "n >= 2f + 3")
    return average_rows(updates, multi_krum_select(pairwise_sq_distances(updates), f, m))


@AGGREGATORS.register("bulyan", tags=(SPLIT,), split=DistanceSplit("distances", bulyan_select, _bulyan_combine))
def bulyan(updates: Tensor, *, f: int) -> Tensor:
    """Bulyan (El Mhamdi, Guerraoui, Rouault 2018) over Krum.

    1. Select ``θ = n − 2f`` updates by Krum applied repeatedly to the not-yet-selected set
       (``krum.bulyan_select``).
    2. Per coordinate, average the ``β = θ − 2f`` selected values closest to the selected
       values' median (ties at equal distance prefer values below the median).

    Requires ``n ≥ 4f + 3``."""
    n = _check_matrix(updates, "bulyan")
    _require("bulyan", n, f, n >= 4 * f + 3, "n >= 4f + 3")
    return _bulyan_combine(updates, bulyan_select(pairwise_sq_distances(updates), f), f)


@AGGREGATORS.register("geometric_median")
def geometric_median(
    updates: Tensor, *, f: int, eps: float = 1e-8, tol: float = 1e-6, max_iter: int = 100
) -> Tensor:
    """Geometric median ``argmin_z Σ_i ‖z − x_i‖`` by the smoothed Weiszfeld iteration of RFA
    (Pillutla, Kakade, Harchaoui 2022): from the mean, ``z ← Σ_i w_i x_i / Σ_i w_i`` with
    ``w_i = 1 / max(eps, ‖z − x_i‖)``, stopping when a step moves z by at most ``tol`` times
    the median distance ``‖z − x_i‖``, or after ``max_iter`` steps (RFA stops on the
    objective's relative change, which far outliers dominate). Runs on the float64
    squared-distance matrix (``distances.weiszfeld_weights``); the output is one final
    weighted sum of the updates.
    Requires ``n > 2f`` (breakdown point 1/2)."""
    n = _check_matrix(updates, "geometric_median")
    _require("geometric_median", n, f, 2 * f < n, "n > 2f")
    alpha = weiszfeld_weights(
        pairwise_sq_distances(updates, dtype=torch.float64), eps=eps, tol=tol, max_iter=max_iter
    )
    return alpha.to(updates.dtype) @ updates


@AGGREGATORS.register("centered_clipping")
def centered_clipping(
    updates: Tensor,
    *,
    f: int,
    previous: Tensor | None = None,
    tau: float | None = None,
    iters: int = 1,
) -> Tensor:
    """Centered clipping (Karimireddy, He, Jaggi 2021, "Learning from history"): from
    ``v = previous`` (the previous aggregate; zeros in the first round), ``iters`` times
    ``v ← v + (1/n) Σ_i (x_i − v) · min(1, τ / ‖x_i − v‖)``.

    ``iters = 1``: the paper finds one step enough when ``v`` starts at the previous aggregate
    of momentum updates. ``tau`` is in the updates' norm units. The paper tunes it by hand
    (and ByzFL defaults to 100, which on normalised models never clips: the rule is then the
    mean). fedsafe's default, ``tau = None``, is adaptive: each iteration τ is the median of the
    distances ``‖x_i − v‖`` (even n: the mean of the two middle ones), the radius
    ClippedClustering (Li et al. 2023) clips by, so the farther half of the updates — with
    ``n > 2f`` every Byzantine update that lies beyond the honest median — is pulled in to it
    whatever the updates' scale. Requires ``n > 2f``; the paper's guarantee needs a small
    Byzantine fraction (``f/n ≲ 0.1``), which is not enforced.

    Each iteration is two passes over the updates and no (n, d) intermediate: the norms
    ``‖x_i − v‖`` (``rowwise.row_sq_norms``, float64) and the step
    (``rowwise.centered_weighted_sum``: differences and sum in float64, rounded once)."""
    n = _check_matrix(updates, "centered_clipping")
    _require("centered_clipping", n, f, 2 * f < n, "n > 2f")
    if tau is not None and not tau > 0:
        raise ValueError(f"centered_clipping: tau must be > 0 (or None: the median distance), got {tau}")
    _int_param("centered_clipping", "iters", iters, 1)
    d = updates.shape[1]
    if previous is None:
        v = torch.zeros(d, dtype=updates.dtype, device=updates.device)
    else:
        if previous.shape != (d,):
            raise ValueError(
                f"centered_clipping: previous must have shape ({d},), got {tuple(previous.shape)}"
            )
        v = previous.to(dtype=updates.dtype, device=updates.device)
    for it in range(iters):
        # the first round starts at 0: plain norms, no read of a zero vector
        center = None if previous is None and it == 0 else v
        dist = row_sq_norms(updates, center).sqrt()
        radius = median_value(dist) if tau is None else tau
        c = _clip_factors(dist, radius)
        v = centered_weighted_sum(updates, c / n, v)
    return v


@AGGREGATORS.register("meamed")
def meamed(updates: Tensor, *, f: int) -> Tensor:
    """Mean around median (Xie, Koyejo, Gupta 2018): per coordinate, the mean of the ``n − f``
    values closest to the coordinate's median (ties at equal distance prefer values below the
    median). Requires ``n > 2f``."""
    n = _check_matrix(updates, "meamed")
    _require("meamed", n, f, 2 * f < n, "n > 2f")
    return coordinate_mean_around_median(updates, n - f)


@AGGREGATORS.register("monna")
def monna(updates: Tensor, *, f: int, reference: int = 0) -> Tensor:
    """MoNNA (Farhadkhani, Guerraoui, Gupta, Hoang, Pinot, Stephan 2023; Allouah et al. 2023):
    the mean of the ``n − f`` updates nearest (L2) to a *trusted* reference update
    ``x_reference``, the reference itself included; ties by lowest index.

    In the paper every honest worker uses its own vector as the reference. A server has no
    vector of its own, so the caller designates one: ``reference`` is the index (default 0) of an
    update it trusts (e.g. its own update on a held-out batch, placed at that index). With a
    Byzantine reference the guarantee is void. Requires ``n > 2f`` and
    ``0 ≤ reference < n``.

    Two passes: squared distances to the reference (``rowwise.row_sq_norms``, differences and
    sums in float64, no (n, d) intermediate), then the mean of the selected rows."""
    n = _check_matrix(updates, "monna")
    _require("monna", n, f, 2 * f < n, "n > 2f")
    if not isinstance(reference, int) or isinstance(reference, bool) or not 0 <= reference < n:
        raise ValueError(f"monna: reference must be an index in [0, n={n}), got {reference!r}")
    dist = row_sq_norms(updates, updates[reference])
    return average_rows(updates, torch.sort(dist, stable=True).indices[: n - f])


@AGGREGATORS.register("dnc")
def dnc(
    updates: Tensor,
    *,
    f: int,
    num_iters: int = 1,
    sub_dim: int = 10000,
    filter_frac: float = 1.0,
    seed: int = 0,
) -> Tensor:
    """Divide-and-Conquer (Shejwalkar & Houmansadr 2021, NDSS, Algorithm 2).

    For each iteration ``t < num_iters``: sample ``b = min(sub_dim, d)`` coordinates without
    replacement (``torch.randperm(d, generator=torch_stream(seed, "robust.dnc", t))[:b]``; all
    coordinates and no draw when ``b = d``); center the sub-sampled ``(n, b)`` matrix by its
    mean row; take its top right-singular vector ``v``; score ``s_i = ⟨x_i[r] − μ, v⟩²``; keep
    the ``n − ⌊filter_frac · f⌋`` lowest scores (ties: the lower index is kept). The kept set is
    intersected over iterations and the output is the mean of the updates in it.

    Defaults are the paper's (``num_iters = 1``, ``b = 10000``, ``c = 1``). ``seed`` is an
    explicit parameter because aggregators get no generator; the same seed gives the same
    coordinates every round unless the caller varies it. Requires ``n > 2f`` and
    ``n > num_iters · ⌊filter_frac · f⌋`` (so the intersection is never empty)."""
    n = _check_matrix(updates, "dnc")
    _int_param("dnc", "num_iters", num_iters, 1)
    _int_param("dnc", "sub_dim", sub_dim, 1)
    _int_param("dnc", "seed", seed, 0)
    if not filter_frac >= 0:
        raise ValueError(f"dnc: filter_frac must be >= 0, got {filter_frac}")
    _require("dnc", n, f, 2 * f < n, "n > 2f")
    removed = _floor(filter_frac * f)
    _require("dnc", n, f, n > num_iters * removed,
             f"n > num_iters * floor(filter_frac * f) = {num_iters} * {removed}")
    d = updates.shape[1]
    b = min(sub_dim, d)
    keep = torch.ones(n, dtype=torch.bool)
    for t in range(num_iters):
        if b < d:
            coords = torch.randperm(d, generator=torch_stream(seed, "robust.dnc", t))[:b]
            sub = updates[:, coords.to(updates.device)]
        else:
            sub = updates
        sub = sub.to(torch.float64).cpu()
        centered = sub - sub.mean(dim=0)
        v = torch.linalg.svd(centered, full_matrices=False).Vh[0]
        # a row-wise reduction, not a matvec: BLAS may sum rows in different lane orders, and
        # identical (e.g. colluding) rows must get identical scores for the tie rule to hold
        scores = (centered * v).sum(dim=1) ** 2
        good = torch.zeros(n, dtype=torch.bool)
        good[torch.sort(scores, stable=True).indices[: n - removed]] = True
        keep &= good
    return average_rows(updates, keep)


def _mean_shift_largest_cluster(feats: Tensor, quantile: float = 0.3, max_iter: int = 300) -> Tensor:
    """Boolean mask of the largest cluster of the rows of ``feats`` by flat-kernel mean shift.

    Bandwidth ``h``: the mean over points of the distance to their ``k``-th nearest point,
    itself counted first, ``k = max(1, ⌊quantile · n⌋)`` (scikit-learn's ``estimate_bandwidth``).
    Every point seeds a mode ``y_i``; all modes move together,
    ``y_i ← mean{F_j : ‖F_j − y_i‖ ≤ ρ}`` (unchanged if that ball is empty), until no mode moves
    more than ``1e-3 · h`` or ``max_iter`` steps. Cluster of ``i``: ``{j : ‖y_j − y_i‖ ≤ ρ}``;
    the largest wins, ties by lowest ``i``. ``ρ = h (1 + 1e-9) + 1e-12``: "≤ h" up to
    rounding."""
    n = feats.shape[0]

    def pdist(a: Tensor, b: Tensor) -> Tensor:
        # broadcast difference, not cdist: cdist may use the (inexact) Gram expansion
        return torch.linalg.vector_norm(a[:, None, :] - b[None, :, :], dim=-1)

    k = max(1, _floor(quantile * n))
    h = float(torch.sort(pdist(feats, feats), dim=1).values[:, k - 1].mean())
    # Features are fractions on a lattice, so distances exactly equal to h are common; the
    # slack keeps last-bit rounding in h or in a mode from deciding ball membership.
    radius = h * (1 + 1e-9) + 1e-12
    y = feats.clone()
    for _ in range(max_iter):  # over iterations, all n modes at once
        ball = (pdist(y, feats) <= radius).to(feats.dtype)
        count = ball.sum(dim=1, keepdim=True)
        new = torch.where(count > 0, (ball @ feats) / count.clamp_min(1), y)
        shift = float(torch.linalg.vector_norm(new - y, dim=1).max())
        y = new
        if shift <= 1e-3 * h:
            break
    same = pdist(y, y) <= radius
    best = int(torch.argmax(same.sum(dim=1)))  # first maximum: lowest index
    return same[best]


@AGGREGATORS.register("signguard")
def signguard(
    updates: Tensor,
    *,
    f: int,
    lower: float = 0.1,
    upper: float = 3.0,
    coord_frac: float = 0.1,
    seed: int = 0,
) -> Tensor:
    """SignGuard (Xu, Huang, Song, Lan 2022): norm filter ∩ sign-statistics cluster, then the
    mean of the kept updates clipped to the median norm.

    1. Norms ``‖x_i‖``, ``M`` their median (even n: mean of the two middle).
       ``S1 = {i : lower · M ≤ ‖x_i‖ ≤ upper · M}``.
    2. Sample ``b = max(1, ⌊coord_frac · d⌋)`` coordinates
       (``torch.randperm(d, generator=torch_stream(seed, "robust.signguard", 0))[:b]``; all, no
       draw, when ``b = d``); features ``(pos_i, zero_i, neg_i)`` = fractions of those
       coordinates of ``x_i`` that are > 0, = 0, < 0. ``S2`` = the largest cluster of the
       features by deterministic flat-kernel mean shift (bandwidth: mean distance to the
       ⌊0.3 n⌋-th nearest point, as scikit-learn's default estimate; details in
       ``_mean_shift_largest_cluster``). The paper uses scikit-learn's MeanShift; this
       stand-in is deterministic and permutation-invariant up to exact ties.
    3. ``S = S1 ∩ S2`` (``S1`` if the intersection is empty);
       output ``(1/|S|) Σ_{i∈S} x_i · min(1, M/‖x_i‖)``.

    Requires ``n > 2f`` (the largest cluster must be honest) and
    ``0 ≤ lower ≤ 1 ≤ upper``, ``0 < coord_frac ≤ 1``."""
    n = _check_matrix(updates, "signguard")
    _require("signguard", n, f, 2 * f < n, "n > 2f")
    if not (0 <= lower <= 1 <= upper):
        raise ValueError(f"signguard: needs 0 <= lower <= 1 <= upper, got lower={lower}, upper={upper}")
    if not 0 < coord_frac <= 1:
        raise ValueError(f"signguard: coord_frac must be in (0, 1], got {coord_frac}")
    _int_param("signguard", "seed", seed, 0)
    norms = torch.linalg.vector_norm(updates, dim=1).to(torch.float64).cpu()
    s = torch.sort(norms).values
    h = n // 2
    med = s[h] if n % 2 else (s[h - 1] + s[h]) / 2
    s1 = (norms >= lower * med) & (norms <= upper * med)

    d = updates.shape[1]
    b = max(1, _floor(coord_frac * d))
    if b < d:
        coords = torch.randperm(d, generator=torch_stream(seed, "robust.signguard", 0))[:b]
        sub = updates[:, coords.to(updates.device)]
    else:
        sub = updates
    feats = torch.stack(
        [(sub > 0).sum(dim=1), (sub == 0).sum(dim=1), (sub < 0).sum(dim=1)], dim=1
    ).to(torch.float64).cpu() / b
    s2 = _mean_shift_largest_cluster(feats)

    keep = s1 & s2
    if not keep.any():
        keep = s1
    w = torch.where(keep, _clip_factors(norms, med), torch.zeros_like(norms)) / keep.sum()
    return w.to(device=updates.device, dtype=updates.dtype) @ updates


# Norm and cosine filters need only the Gram matrix, so the TEE runs the same selections on
# decoded Gram matrices (fedsafe.robust.filters).
AGGREGATORS.register("norm_filter", tags=(SPLIT,), split=DistanceSplit("gram", norm_filter_select, _average))(norm_filter)
AGGREGATORS.register("cosine_filter", tags=(SPLIT,), split=DistanceSplit("gram", cosine_filter_select, _average))(
    cosine_filter
)

# Rules defined in their own modules register themselves into AGGREGATORS when imported here.
from fedsafe.robust import flame as _flame  # noqa: E402,F401  (registers flame)
from fedsafe.robust import foolsgold as _foolsgold  # noqa: E402,F401  (registers foolsgold)
from fedsafe.robust import fltrust as _fltrust  # noqa: E402,F401  (registers fltrust)
from fedsafe.robust import defences as _defences  # noqa: E402,F401  (registers mda, caf, smea, clipped_clustering)
from fedsafe.robust import rlr as _rlr  # noqa: E402,F401  (registers rlr)
from fedsafe.robust import freqfed as _freqfed  # noqa: E402,F401  (registers freqfed)
from fedsafe.robust import fldetector as _fldetector  # noqa: E402,F401  (registers fldetector)
