"""Client-level DP-FedAvg as pure functions over tensors: clipping, Gaussian noise at a
placement, and adaptive clipping (McMahan et al. 2018; Andrew et al. 2021).

Vocabulary (docs/architecture.md, dp-accounting's): the clip norm ``C`` bounds each client's update in
L2; the noise multiplier ``z`` is noise std / ``C``; ``q`` is the sampling probability.

One round of DP-FedAvg, ``m`` = the *expected* number of participants (``q·N`` for Poisson
sampling, the sample size for fixed-size sampling, ``N`` when everyone takes part)::

    x̄_i   = clip(x_i, C)                                   clip_updates
    Δ̃     = (Σ_i x̄_i + ξ) / m,   ξ ~ N(0, (zC)² I_d)        dp_mean (central) / placements

Dividing by the expected ``m`` rather than the realised count keeps the sensitivity of the
released mean at ``C/m``: under Poisson sampling the realised count is itself private (it
changes by one when a client is added or removed), so dividing by it would leak.

Noise placements (who adds ξ; the accounting is in ``fedsafe.privacy.dp.accounting``):

- ``central``: clients send x̄_i in the clear; the server adds ξ ~ N(0, (zC)²) once to the sum
  (:func:`server_noise`, :func:`dp_mean`). The guarantee covers everything released after
  aggregation (models, metrics), not the server, which sees each x̄_i. ε: ``accounting.epsilon``
  with the round's sampling (amplification by sampling applies).
- ``local``: each client adds its own ξ_i ~ N(0, (zC)²) before sending
  (:func:`client_noise`). The guarantee then holds per client *even against the server*: it is
  local DP of each release x̄_i + ξ_i, with the same z per release. Local DP compares any two
  inputs of the client, whose clipped updates can differ by 2C (replace-one), and the server
  knows when a client took part, so there is no amplification by sampling: ε composes over the
  rounds the client participated in (``accounting.epsilon_local``). The sum carries n·(zC)²,
  n times the noise central DP needs for the same ε against outsiders.
- ``distributed``: each client adds a share ξ_i ~ N(0, (zC)²/n_s), meant to be summed under
  secure aggregation, so the server sees only Σ x̄_i + Σ ξ_i, whose noise is (zC)² when n_s
  shares arrive. n_s is the caller's ``n_expected`` (the engine: the expected number of clients
  m, rounded), not the realised count (a client cannot know who else survives). When n honest
  shares are in the sum — fewer under Poisson sampling or dropouts, more in a large sample;
  Byzantine messages and canaries carry none — the noise variance is (n/n_s)(zC)², an
  effective multiplier z·√(n/n_s) (:func:`distributed_noise_multiplier`). The engine accounts
  every round with that multiplier (``DPPlan.round_multiplier``, ``Aggregate.included``), against
  each of two observers (``accounting.DistributedAccountant``): the secure-aggregation server,
  which sees who took part (no amplification; the headline ε), and an outsider who sees the
  released model (amplified, but the count of shares is revealed). To keep a floor on the noise instead,
  pass the minimum number of contributions the protocol accepts (the secure-aggregation
  threshold) as ``n_expected``: the sum then carries at least (zC)².

Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021, "Differentially private learning
with adaptive clipping", Algorithm 1 and Theorem 1). Each client also reports
b_i = 1[‖x_i‖ ≤ C] (its update was *not* clipped); the server estimates the unclipped fraction
and moves C geometrically towards the target quantile γ of the update norms::

    b̃ = (Σ_i (b_i − ½) + N(0, σ_b²)) / m + ½                   noised_clipped_fraction
    C ← C · exp(−η_C (b̃ − γ))                                 update_clip

Centring the bits at ½ (as the paper and TF Privacy's QuantileEstimatorQuery do) makes the
count's sensitivity ½ under add/remove-one, so the count is a Gaussian mechanism with noise
multiplier 2σ_b. The round releases the update sum with multiplier z_Δ and the count with 2σ_b;
the pair is one Gaussian mechanism on the concatenated vector with multiplier z, where

    z^{−2} = z_Δ^{−2} + (2σ_b)^{−2}    ⇔    z_Δ = (z^{−2} − (2σ_b)^{−2})^{−1/2}

(:func:`adaptive_clip_split`), possible only when 2σ_b > z. So a run configured with total
noise multiplier z is accounted exactly as non-adaptive DP-FedAvg with z, and adds
N(0, (z_Δ C_t)²) to the update sum. The paper's default σ_b = m/20 (:func:`default_count_stddev`).
Under ``distributed`` placement the clients add both noises as shares (the count's too, so the
server never sees the exact count), and both scale by √(n/n_s) with the honest shares present.

All randomness comes from the generator passed in: a ``torch.Generator``, or a stream of a
:class:`fedsafe.core.randomness.RandomSource` (secret by default in a run, so the noise cannot be
regenerated from the seed); inputs are never modified; noise is drawn on the CPU (where
generators live) and moved to the data's device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedsafe.core.randomness import Generator, standard_normal

PLACEMENTS: tuple[str, ...] = ("central", "local", "distributed")


def _finite_positive(name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def _finite_nonneg(name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def _check_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown noise placement {placement!r}; valid: {', '.join(PLACEMENTS)}")


def _gaussian(shape: tuple[int, ...], std: float, generator: Generator, dtype: torch.dtype) -> Tensor:
    return standard_normal(shape, generator, dtype) * std


def clip_updates(updates: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Per-client flat L2 clipping: ``x̄_i = x_i · min(1, C / ‖x_i‖₂)``.

    Returns ``(clipped[n, d], norms[n])`` with ``norms`` the norms *before* clipping (what the
    adaptive-clipping bit b_i = 1[‖x_i‖ ≤ C] is computed from). A zero row stays zero; rows with
    ‖x_i‖ ≤ C are returned unchanged. The input is not modified. Rows must be finite (a
    non-finite norm would clip to NaN): the engine filters non-finite updates first.
    """
    clip = _finite_positive("clip", clip)
    if updates.ndim != 2:
        raise ValueError(f"clip_updates: updates must be a 2-D (n, d) tensor, got shape {tuple(updates.shape)}")
    if not updates.is_floating_point():
        raise ValueError(f"clip_updates: updates must be floating point, got {updates.dtype}")
    norms = torch.linalg.vector_norm(updates, dim=1)
    bad = (~torch.isfinite(norms)).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"clip_updates: non-finite update rows {bad.tolist()[:10]} (filter them before clipping)")
    # C/0 = inf, min(1, inf) = 1: a zero row is multiplied by 1.
    factors = torch.clamp(clip / norms, max=1.0)
    return updates * factors.unsqueeze(1), norms


def unclipped_indicator(norms: Tensor, clip: float) -> Tensor:
    """The adaptive-clipping bits ``b_i = 1[‖x_i‖ ≤ C]`` (bool, shape [n]) from pre-clip norms."""
    clip = _finite_positive("clip", clip)
    return norms <= clip


def server_noise(
    d: int,
    *,
    clip: float,
    z: float,
    placement: str,
    generator: Generator,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The server's noise on the sum of clipped updates: ``N(0, (zC)² I_d)`` for ``central``,
    zeros (and no draw from ``generator``) for ``local`` and ``distributed``, whose noise the
    clients add (:func:`client_noise`)."""
    _check_placement(placement)
    clip = _finite_positive("clip", clip)
    z = _finite_nonneg("z", z)
    if d < 0:
        raise ValueError(f"d must be >= 0, got {d}")
    if placement != "central":
        return torch.zeros(d, dtype=dtype)
    return _gaussian((d,), z * clip, generator, dtype)


def client_noise(
    n: int,
    d: int,
    *,
    clip: float,
    z: float,
    placement: str,
    n_expected: int | None = None,
    generator: Generator,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Noise each client adds to its clipped update before sending; row i is client i's.

    - ``central``: zeros (and no draw from ``generator``): the server adds the noise.
    - ``local``: ``N(0, (zC)² I_d)`` per client — local DP of each release, with the same z.
    - ``distributed``: ``N(0, (zC)²/n_expected · I_d)`` per client, so that the sum of
      ``n_expected`` shares is ``N(0, (zC)² I_d)``. ``n_expected`` defaults to ``n``; pass a lower
      bound on the number of shares that will reach the sum (the secure-aggregation threshold)
      to keep the noise at least (zC)² under dropouts (see the module docstring).
    """
    _check_placement(placement)
    clip = _finite_positive("clip", clip)
    z = _finite_nonneg("z", z)
    if n < 0 or d < 0:
        raise ValueError(f"n and d must be >= 0, got n={n}, d={d}")
    if placement == "central":
        return torch.zeros(n, d, dtype=dtype)
    if placement == "local":
        return _gaussian((n, d), z * clip, generator, dtype)
    n_exp = n if n_expected is None else n_expected
    if isinstance(n_exp, bool) or not isinstance(n_exp, int) or n_exp < 1:
        raise ValueError(f"n_expected must be an integer >= 1 for placement 'distributed', got {n_expected!r}")
    return _gaussian((n, d), z * clip / math.sqrt(n_exp), generator, dtype)


def distributed_noise_multiplier(z: float, n_contributing: int, n_expected: int) -> float:
    """The noise multiplier the *sum* actually carries under ``distributed`` placement when
    ``n_contributing`` of the shares sized for ``n_expected`` arrive: ``z·√(n_contributing /
    n_expected)`` (variance (n/n_expected)(zC)²). The engine accounts each round with it."""
    z = _finite_nonneg("z", z)
    if n_expected < 1 or n_contributing < 0:
        raise ValueError(f"need n_expected >= 1 and n_contributing >= 0, got {n_expected}, {n_contributing}")
    return z * math.sqrt(n_contributing / n_expected)


def dp_mean(
    clipped_sum: Tensor,
    *,
    clip: float,
    z: float,
    expected_clients: float,
    generator: Generator,
) -> Tensor:
    """Central DP-FedAvg aggregate: ``(Σ_i x̄_i + N(0, (zC)² I_d)) / m``.

    ``clipped_sum`` is the sum of the clipped updates (shape [d]); ``m = expected_clients`` is
    the *expected* number of participants (``q·N`` under Poisson sampling, the sample size under
    fixed-size sampling), so the mean has sensitivity C/m and noise std zC/m. The noise is the
    draw :func:`server_noise` makes for ``central`` (same stream consumption).
    """
    m = _finite_positive("expected_clients", expected_clients)
    if clipped_sum.ndim != 1 or not clipped_sum.is_floating_point():
        raise ValueError(
            "dp_mean: clipped_sum must be a 1-D floating tensor, "
            f"got shape {tuple(clipped_sum.shape)}, {clipped_sum.dtype}"
        )
    noise = server_noise(
        clipped_sum.shape[0], clip=clip, z=z, placement="central", generator=generator, dtype=clipped_sum.dtype
    )
    return (clipped_sum + noise.to(clipped_sum.device)) / m


def default_count_stddev(expected_clients: float) -> float:
    """Andrew et al.'s recommended count noise ``σ_b = m / 20``."""
    return _finite_positive("expected_clients", expected_clients) / 20.0


def adaptive_clip_split(z: float, sigma_b: float) -> float:
    """Value noise multiplier ``z_Δ = (z^{−2} − (2σ_b)^{−2})^{−1/2}`` (Andrew et al. 2021, Thm 1).

    ``z`` is the round's total noise multiplier (what the accountant composes), ``σ_b`` the std of
    the Gaussian noise on the centred unclipped count (sensitivity ½, hence 2σ_b). Requires
    ``2σ_b > z``; otherwise the count alone would spend more than the whole budget and a
    ValueError gives the numbers and the valid range. ``z = 0`` (no privacy) returns 0.
    """
    z = _finite_nonneg("z", z)
    if z == 0:
        return 0.0
    sigma_b = _finite_positive("sigma_b (count_stddev)", sigma_b)
    rest = z**-2 - (2 * sigma_b) ** -2
    if not 2 * sigma_b > z or rest <= 0:
        raise ValueError(
            f"adaptive clipping cannot reach total noise multiplier z={z:g} with count noise "
            f"sigma_b={sigma_b:g}: z^-2 - (2 sigma_b)^-2 = {rest:.6g} <= 0. The split needs "
            f"2*sigma_b > z, i.e. sigma_b > {z / 2:g} (or z < {2 * sigma_b:g}); raise count_stddev "
            "or lower the noise multiplier"
        )
    return rest**-0.5


def noised_clipped_fraction(
    bits: Tensor,
    *,
    sigma_b: float,
    expected_clients: float,
    generator: Generator,
) -> float:
    """Noised fraction of *unclipped* updates: ``b̃ = (Σ_i (b_i − ½) + N(0, σ_b²)) / m + ½``.

    ``bits[n]`` are b_i = 1[‖x_i‖ ≤ C] (bool or 0/1). The sum is centred at ½ per client so its
    add/remove sensitivity is ½ (what :func:`adaptive_clip_split` assumes); when the realised
    count n equals m this is exactly ``(Σ b_i + N(0, σ_b²)) / m``. b̃ is not clamped, so it can
    leave [0, 1] by the noise (TF Privacy clamps to [0, 1] before the update; the paper does not).
    One standard normal is drawn from ``generator`` (float64), even when σ_b = 0.
    """
    m = _finite_positive("expected_clients", expected_clients)
    sigma_b = _finite_nonneg("sigma_b (count_stddev)", sigma_b)
    if bits.ndim != 1:
        raise ValueError(f"bits must be a 1-D tensor of 0/1 values, got shape {tuple(bits.shape)}")
    b = bits.detach().to("cpu", torch.float64)
    if not bool(((b == 0) | (b == 1)).all()):
        raise ValueError("bits must contain only 0/1 (or bool) values")
    noise = float(standard_normal((), generator, torch.float64)) * sigma_b
    return (float((b - 0.5).sum()) + noise) / m + 0.5


def update_clip(clip: float, noised_fraction: float, *, target_quantile: float, clip_lr: float) -> float:
    """Geometric clip update ``C ← C · exp(−η_C (b̃ − γ))`` (Andrew et al. 2021, Algorithm 1).

    b̃ (``noised_fraction``) is the noised fraction of unclipped updates and γ
    (``target_quantile``) the target one: too many unclipped updates (b̃ > γ) shrink C, too few
    grow it; with b̃ ∈ [0, 1] one step changes C by a factor in [e^{−η_C}, e^{η_C}].
    """
    clip = _finite_positive("clip", clip)
    if not 0.0 <= float(target_quantile) <= 1.0:
        raise ValueError(f"target_quantile must be in [0, 1], got {target_quantile!r}")
    clip_lr = _finite_nonneg("clip_lr", clip_lr)
    b = float(noised_fraction)
    if not math.isfinite(b):
        raise ValueError(f"noised_fraction must be finite, got {noised_fraction!r}")
    return clip * math.exp(-clip_lr * (b - float(target_quantile)))
