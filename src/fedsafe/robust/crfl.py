"""CRFL (Xie, Chen, Chen, Li, ICML 2021, "CRFL: Certifiably robust federated learning against
backdoor attacks"): the server clips the global *model*'s norm and adds Gaussian noise to it
every round; at test time, the parameter-smoothed model's vote margins give each input a
certified radius against backdoor patterns of bounded magnitude.

Both training-time steps act on the model's parameters, not on the clients' updates, so they
are functions of the parameter vector here (:func:`clip_model`, :func:`perturb_model`), and
the certificate is :func:`certified_radius` with :func:`vote_bounds` for the Monte Carlo vote
frequencies. Noise comes from a :class:`fedsafe.core.randomness.RandomSource` stream, secure
unless the caller chose a seeded source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from scipy.stats import norm
from torch import Tensor

from fedsafe.core.randomness import Generator, standard_normal

# the reference code's guard in the clipping coefficient ρ / (‖w‖ + 1e-6)
CLIP_EPS = 1e-6


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"crfl: {name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"crfl: {name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def clip_model(params: Tensor, rho: float) -> Tensor:
    """The model's parameters with their L2 norm clipped to ``rho``: ``w · ρ / (‖w‖ + 1e-6)``
    when ``‖w‖ > ρ``, else ``w`` unchanged (a new tensor either way). The ``1e-6`` is the
    reference code's (``clip_weight_norm``), so a clipped norm is a hair below ρ."""
    rho = _positive("rho", rho)
    total = float(torch.linalg.vector_norm(params.detach().to(torch.float64)))
    if total > rho:
        return params * (rho / (total + CLIP_EPS))
    return params.clone()


def perturb_model(params: Tensor, sigma: float, generator: Generator) -> Tensor:
    """``w + N(0, σ² I)``, the noise from ``generator``: a :class:`RandomSource` stream (secure
    when the source is; the noise is what the certificate rests on) or a torch generator in
    tests. σ = 0 returns a copy."""
    sigma = _positive("sigma", sigma, allow_zero=True)
    if sigma == 0:
        return params.clone()
    z = standard_normal(tuple(params.shape), generator, torch.float64)
    return (params.to(torch.float64) + sigma * z).to(params.dtype)


def vote_bounds(p_a: float, p_b: float, samples: int, alpha: float) -> tuple[float, float]:
    """Hoeffding bounds on the smoothed model's top two class frequencies, each holding with
    probability ``1 − alpha``: ``p_A ≥ p̂_A − √(ln(1/α) / 2M)`` and ``p_B ≤ p̂_B + √(ln(1/α) / 2M)``,
    clamped to ``[1e-8, 1 − 1e-8]`` as in the reference code, M = ``samples`` noisy models."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"crfl: samples must be an integer >= 1, got {samples!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"crfl: alpha must be in (0, 1), got {alpha!r}")
    for name, p in (("p_a", p_a), ("p_b", p_b)):
        if not 0 <= p <= 1:
            raise ValueError(f"crfl: {name} must be in [0, 1], got {p!r}")
    h = math.sqrt(math.log(1 / alpha) / 2 / samples)
    return max(1e-8, p_a - h), min(1 - 1e-8, p_b + h)


def certified_radius(
    p_a: float,
    p_b: float,
    *,
    sigma_train: float,
    sigma_test: float,
    rho: Sequence[float],
    attack_round: int,
    attackers: int,
    weights: Sequence[float],
    local_iters: float,
    lipschitz: float,
    scale: float,
    lr: float,
    poison_fraction: float,
) -> float:
    """CRFL's certified radius (Xie et al., Theorem 1): the largest L2 magnitude ‖δ‖ of a
    backdoor pattern under which the parameter-smoothed model's prediction on an input provably
    does not change, given the lower bound ``p_a`` on its top class's frequency and the upper
    bound ``p_b`` on the runner-up's (:func:`vote_bounds`):

    ``RAD = √( −ln(1 − (√p_A − √p_B)²) σ² / (2 R τ² L² Σ_i p_i² γ² η² (q/n)² Π_t (2Φ(ρ_t/σ_t) − 1)) )``

    with σ = ``sigma_train``, R = ``attackers`` (each poisoning once, at ``attack_round`` =
    t_adv), p_i their aggregation ``weights`` (R values), τ = ``local_iters``, L =
    ``lipschitz`` (the loss's Lipschitz constant in the parameters), γ = ``scale`` (the
    attackers' boost), η = ``lr`` (local learning rate), q/n = ``poison_fraction`` (poisoned
    samples per batch), and the product over the rounds ``t = t_adv + 1, ..., T``, T =
    ``len(rho)``, of ``2Φ(ρ_t/σ_t) − 1`` with ``ρ = rho`` (``rho[t − 1]`` the clipping norm of
    round t), σ_t = ``sigma_train`` for t < T and ``sigma_test`` at round T (the smoothing
    noise at test time).

    Conventions against the reference code (AI-secure/CRFL, ``certify_mnist.py``), each pinned
    by a test: ρ_t is the norm the training actually clipped to (the reference recomputes its
    0.1t + 2 schedule without the ``param_clip_thres`` cap training applied); ``p_a ≤ p_b``
    gives 0 (not certified) where the reference would take the square root of a negative
    number; ``p_a = 1`` is computed from the formula where the reference returns the sentinel
    100000 (:func:`vote_bounds` keeps p_A below 1 anyway)."""
    for name, value in (("sigma_train", sigma_train), ("sigma_test", sigma_test), ("local_iters", local_iters),
                        ("lipschitz", lipschitz), ("scale", scale), ("lr", lr), ("poison_fraction", poison_fraction)):
        _positive(name, value)
    if not (0 <= p_a <= 1 and 0 <= p_b <= 1):
        raise ValueError(f"crfl: p_a and p_b must be in [0, 1], got {p_a!r}, {p_b!r}")
    T = len(rho)
    if isinstance(attack_round, bool) or not isinstance(attack_round, int) or not 1 <= attack_round <= T:
        raise ValueError(f"crfl: attack_round must be an integer in [1, T] = [1, {T}], got {attack_round!r}")
    if isinstance(attackers, bool) or not isinstance(attackers, int) or attackers < 1 or len(weights) != attackers:
        raise ValueError(f"crfl: attackers must be an integer >= 1 with one weight each, got {attackers!r} and {len(weights)} weights")
    for r in rho:
        _positive("rho", r)
    if p_a <= p_b:
        return 0.0
    gap = (math.sqrt(p_a) - math.sqrt(p_b)) ** 2
    if gap >= 1:  # p_A = 1, p_B = 0: no backdoor of any size changes the vote
        return math.inf
    numerator = -math.log1p(-gap) * sigma_train**2
    contraction = 1.0
    for t in range(attack_round + 1, T + 1):
        sigma_t = sigma_test if t == T else sigma_train
        contraction *= 2 * norm.cdf(rho[t - 1] / sigma_t) - 1
    denominator = (2 * attackers * local_iters**2 * lipschitz**2 * sum(w * w for w in weights)
                   * scale**2 * lr**2 * poison_fraction**2 * contraction)
    return math.sqrt(numerator / denominator)
