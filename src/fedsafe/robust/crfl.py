"""CRFL (Xie, Chen, Chen, Li, ICML 2021, "CRFL: Certifiably robust federated learning against
backdoor attacks"): the server clips the global *model*'s norm and adds Gaussian noise to it
every round; at test time, the parameter-smoothed model's vote margins give each input a
certified radius against backdoor patterns of bounded magnitude.

Both training-time steps act on the model's parameters, not on the clients' updates, so they
are functions of the parameter vector here (:func:`clip_model`, :func:`perturb_model`), and
the certificate is :func:`certified_radius` with :func:`vote_bounds` for the Monte Carlo vote
frequencies. Noise comes from a :class:`fedsafe.core.randomness.RandomSource` stream, secure
unless the caller chose a seeded source.

In a run (``[crfl]``, :mod:`fedsafe.robust.crfl_config`) the :class:`CRFLPlugin` does both: its
``transform_model`` is the round's model stage (``fedsafe.engine.round.finish_step``, after the
server step), and at the last round its observer certifies: :func:`smoothed_votes` (M noisy
copies, batched through one vectorised forward pass), :func:`top_two`, :func:`hoeffding_bounds`
and :func:`certified_radii` with the factor of :func:`radius_factor`, against the attacker of
:func:`threat_from_config` (a :class:`Certificate`, its :meth:`Certificate.summary` in the row).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from scipy.stats import norm
from torch import Tensor

from fedsafe.core.plugins import Observer
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
    factor = radius_factor(sigma_train=sigma_train, sigma_test=sigma_test, rho=rho, attack_round=attack_round,
                           attackers=attackers, weights=weights, local_iters=local_iters, lipschitz=lipschitz,
                           scale=scale, lr=lr, poison_fraction=poison_fraction)
    return math.sqrt(-math.log1p(-gap)) * factor


def contraction(rho: Sequence[float], *, sigma_train: float, sigma_test: float, attack_round: int,
                noised: Sequence[bool] | None = None) -> float:
    """``Π_{t = t_adv + 1}^{T} (2Φ(ρ_t/σ_t) − 1)``, T = ``len(rho)``, σ_t = ``sigma_train`` for
    t < T and ``sigma_test`` at T. ``noised[t − 1]`` false (a round whose server step was
    skipped, so no clipping and no noise ran) makes round t's factor 1: no contraction is
    claimed for it (T's factor, the test-time smoothing, always applies)."""
    T = len(rho)
    out = 1.0
    for t in range(attack_round + 1, T + 1):
        if t < T and noised is not None and not noised[t - 1]:
            continue
        sigma_t = sigma_test if t == T else sigma_train
        out *= 2 * norm.cdf(rho[t - 1] / sigma_t) - 1
    return out


def radius_factor(
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
    noised: Sequence[bool] | None = None,
) -> float:
    """The radius of :func:`certified_radius` is ``√(−ln(1 − (√p_A − √p_B)²))`` times this
    factor, ``σ / √(2 R τ² L² Σ p_i² γ² η² (q/n)² Π_t (2Φ(ρ_t/σ_t) − 1))``, the same for
    every input of one certification (``noised``: :func:`contraction`)."""
    T = len(rho)
    if isinstance(attack_round, bool) or not isinstance(attack_round, int) or not 1 <= attack_round <= T:
        raise ValueError(f"crfl: attack_round must be an integer in [1, T] = [1, {T}], got {attack_round!r}")
    contract = contraction(rho, sigma_train=sigma_train, sigma_test=sigma_test, attack_round=attack_round, noised=noised)
    denominator = (2 * attackers * local_iters**2 * lipschitz**2 * sum(w * w for w in weights)
                   * scale**2 * lr**2 * poison_fraction**2 * contract)
    return sigma_train / math.sqrt(denominator)


def certified_radii(p_a: Tensor, p_b: Tensor, factor: float) -> Tensor:
    """:func:`certified_radius` for many inputs at once (float64): ``p_a``, ``p_b`` the bounds of
    :func:`hoeffding_bounds`, ``factor`` from :func:`radius_factor`; 0 where ``p_a ≤ p_b``
    (not certified), ∞ where ``(√p_A − √p_B)² ≥ 1``."""
    p_a, p_b = p_a.to(torch.float64), p_b.to(torch.float64)
    gap = (p_a.sqrt() - p_b.sqrt()) ** 2
    rad = torch.sqrt(-torch.log1p(-gap.clamp(max=1.0))) * factor
    rad = torch.where(gap >= 1, torch.full_like(rad, math.inf), rad)
    return torch.where(p_a > p_b, rad, torch.zeros_like(rad))


def hoeffding_bounds(p_a: Tensor, p_b: Tensor, samples: int, alpha: float) -> tuple[Tensor, Tensor]:
    """:func:`vote_bounds` on tensors of frequencies (float64)."""
    vote_bounds(0.5, 0.5, samples, alpha)  # the checks
    h = math.sqrt(math.log(1 / alpha) / 2 / samples)
    return (p_a.to(torch.float64) - h).clamp(min=1e-8), (p_b.to(torch.float64) + h).clamp(max=1 - 1e-8)


def clip_schedule(rounds: int, rho: float, rho_start: float, rho_growth: float) -> list[float]:
    """ρ_t for t = 1..``rounds``: ``min(rho, rho_start + rho_growth · t)``, the reference's
    ``min(0.1 t + 2, param_clip_thres)`` on MNIST (``rho_growth = 0``: constant ``min(rho, rho_start)``)."""
    _positive("rho", rho)
    _positive("rho_start", rho_start)
    _positive("rho_growth", rho_growth, allow_zero=True)
    return [min(rho, rho_start + rho_growth * t) for t in range(1, rounds + 1)]


# --- test time: the parameter-smoothed model's votes ---------------------------------------------

Predict = Callable[[Tensor, Tensor], Tensor]  # (models (m, d), inputs (b, ...)) -> logits (m, b, C)


def smoothed_votes(
    predict: Predict,
    params: Tensor,
    inputs: Sequence[Tensor],
    *,
    samples: int,
    sigma: float,
    noise: Callable[[int], Generator],
    num_classes: int,
    batch_models: int = 16,
    batch_inputs: int = 1024,
) -> list[Tensor]:
    """The class votes of ``samples`` noisy copies of the model ``params`` on each tensor of
    ``inputs`` (the clean test inputs, the triggered ones): one (n, C) int64 count matrix per
    tensor. Copy k is ``perturb_model(params, sigma, noise(k))`` (its own stream, so a copy does
    not depend on how the copies are batched); ``batch_models`` copies run in one vectorised
    ``predict`` call on ``batch_inputs`` inputs at a time."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"crfl: samples must be an integer >= 1, got {samples!r}")
    _positive("sigma_test", sigma)
    counts = [torch.zeros((x.shape[0], num_classes), dtype=torch.int64) for x in inputs]
    with torch.no_grad():
        for start in range(0, samples, batch_models):
            ks = range(start, min(samples, start + batch_models))
            models = torch.stack([perturb_model(params, sigma, noise(k)) for k in ks])
            for x, c in zip(inputs, counts):
                for b in range(0, x.shape[0], batch_inputs):
                    pred = predict(models, x[b : b + batch_inputs]).argmax(dim=-1)  # (m, b)
                    c[b : b + batch_inputs] += F.one_hot(pred, num_classes).sum(dim=0)
    return counts


def top_two(votes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's top class (ties: the lowest index, as ``np.argmax`` in the reference), its
    count, and the runner-up's count (the largest among the other classes)."""
    top = votes.argmax(dim=1)
    n_a = votes.gather(1, top[:, None]).squeeze(1)
    rest = votes.scatter(1, top[:, None], -1)
    return top, n_a, rest.max(dim=1).values


@dataclass(frozen=True)
class Certificate:
    """One certification: per test input its ``label``, the smoothed model's ``prediction``, the
    Hoeffding bounds ``p_a`` (top class, lower) and ``p_b`` (runner-up, upper) and the certified
    ``radius`` (0: not certified); for a backdoor, ``poison_prediction`` on the triggered inputs
    of the attack success rate, and its ``target``."""

    round: int
    label: Tensor
    prediction: Tensor
    p_a: Tensor
    p_b: Tensor
    radius: Tensor
    poison_prediction: Tensor | None = None
    target: int | None = None

    def summary(self, radii: Sequence[float]) -> dict[str, float]:
        """``crfl_clean_accuracy`` (the smoothed model's accuracy), ``crfl_certified_accuracy@r``
        for each r of ``radii`` (correct and certified with radius ≥ r), ``crfl_certified_rate``
        (certified, radius > 0), ``crfl_mean_radius`` (the mean over inputs of the radius of the
        correct ones, 0 for the others: the area under the certified-accuracy curve) and, with a
        backdoor, ``crfl_attack_success_rate`` of the smoothed model."""
        correct = self.prediction == self.label
        certified = self.radius > 0
        out = {"crfl_clean_accuracy": float(correct.double().mean()),
               "crfl_certified_rate": float(certified.double().mean()),
               "crfl_mean_radius": float(torch.where(correct, self.radius, 0.0).mean())}
        for r in radii:
            out[f"crfl_certified_accuracy@{r:g}"] = float((correct & certified & (self.radius >= r)).double().mean())
        if self.poison_prediction is not None and self.poison_prediction.numel():
            out["crfl_attack_success_rate"] = float((self.poison_prediction == self.target).double().mean())
        return out

    def csv(self) -> str:
        """One line per test input: ``index,label,prediction,p_a,p_b,radius``."""
        lines = ["index,label,prediction,p_a,p_b,radius"]
        for i, (y, k, pa, pb, r) in enumerate(zip(self.label.tolist(), self.prediction.tolist(), self.p_a.tolist(),
                                                   self.p_b.tolist(), self.radius.tolist())):
            lines.append(f"{i},{y},{k},{pa!r},{pb!r},{r!r}")
        return "\n".join(lines) + "\n"


def certify(
    votes: Tensor, labels: Tensor, *, samples: int, alpha: float, factor: float, round: int,
    poison_votes: Tensor | None = None, target: int | None = None,
) -> Certificate:
    """The certificate of each input from its ``votes`` (n, C) of ``samples`` noisy models:
    frequencies p̂_A, p̂_B of the top two classes, their Hoeffding bounds (:func:`hoeffding_bounds`)
    and the radius ``√(−ln(1 − (√p_A − √p_B)²)) · factor`` (:func:`certified_radii`)."""
    top, n_a, n_b = top_two(votes)
    p_a, p_b = hoeffding_bounds(n_a.double() / samples, n_b.double() / samples, samples, alpha)
    poison = None if poison_votes is None else poison_votes.argmax(dim=1)
    return Certificate(round, labels.to(torch.int64), top, p_a, p_b, certified_radii(p_a, p_b, factor), poison, target)


# --- the run's side: the threat the certificate is against, and the round plugin ------------------


@dataclass(frozen=True)
class Threat:
    """Theorem 1's attacker, whom the certificate is against: R ``attackers`` poisoning at
    ``attack_round`` (None: the last round) with aggregation ``weight`` each, ``local_iters`` τ,
    local ``lr`` η, boost ``scale`` γ and ``poison_fraction`` q/n; ``lipschitz`` L."""

    attack_round: int | None
    attackers: int
    weight: float
    local_iters: float
    lr: float
    scale: float
    poison_fraction: float
    lipschitz: float


def threat_from_config(cfg: Any, client_sizes: Sequence[int]) -> Threat:
    """:class:`Threat` of ``cfg.crfl``, each unset value from the run: R = ``attack.f``; p_i =
    ``server.lr`` / participants per round (the mean's weight times the server's step; Poisson:
    the expected sample); fedavg: τ its local steps per round (``local_epochs · ⌈mean client size
    / batch_size⌉``, as the reference's 60000/N/n_B), η = ``clients.lr``; dsgd and the others send
    one gradient, τ = η = 1; γ = the attack's ``boost`` or ``scale`` (model replacement's default
    n/f), else 1; q/n = the backdoor's ``fraction``."""
    from fedsafe.robust.crfl_config import backdoor_fraction

    c, cr, a = cfg.clients, cfg.crfl, cfg.attack
    n = c.round_size or c.num_clients * c.sample_rate  # Poisson: the expected sample
    if c.algorithm == "fedavg":
        if c.local_steps is not None:
            tau = float(c.local_steps)
        else:
            mean_size = sum(client_sizes) / max(1, len(client_sizes))
            tau = float((c.local_epochs or 1) * math.ceil(mean_size / c.batch_size))
        eta = c.lr
    else:
        tau, eta = 1.0, 1.0
    gamma = cr.scale
    if gamma is None:
        p = a.params
        given = next((p[k] for k in ("boost", "scale", "gamma") if isinstance(p.get(k), (int, float))
                      and not isinstance(p.get(k), bool)), None)
        if given is not None:
            gamma = float(given)
        elif a.name in ("model_replacement", "constrain_and_scale") and a.f > 0:
            server_lr = p.get("server_lr")
            gamma = n / a.f / (float(server_lr) if isinstance(server_lr, (int, float)) else 1.0)
        else:
            gamma = 1.0
    fraction = cr.poison_fraction if cr.poison_fraction is not None else backdoor_fraction(cfg)
    attackers = cr.attackers if cr.attackers is not None else a.f
    if fraction is None or attackers < 1:
        raise ValueError("crfl.attackers and crfl.poison_fraction must be set when no backdoor attack is configured")
    return Threat(cr.attack_round, attackers, cr.weight if cr.weight is not None else cfg.server.lr / n,
                  cr.local_iters if cr.local_iters is not None else tau, cr.lr if cr.lr is not None else eta,
                  float(gamma), float(fraction), cr.lipschitz)


class CRFLPlugin(Observer):
    """``[crfl]`` in a run (``fedsafe.engine.round``'s model stage and an observer).

    ``transform_model(params, t)``, after round t's server step: clip the global model to ρ_t
    and, for t < T, add N(0, σ_train² I) from the stream ``("robust.crfl", t)`` of the run's
    :class:`RandomSource` (secure unless the run is seeded). The last round's model is clipped
    only: the reference saves it before its noise, and the smoothing noise σ_test of
    certification takes that round's place in the certificate. ``on_round_end``: the norm
    before clipping (``crfl_norm``) and ρ_t (``crfl_rho``) of the round, and at a certification
    round the summary of :meth:`Certificate.summary`; the per-input certificate goes to
    ``crfl_certificate.csv`` in the run folder. Certification needs the run's model and test
    data (a ``Federation`` host); the noisy copies come from the streams
    ``("robust.crfl.certify", t, k)``. No state of its own: the rounds that ran the stage are
    in the metrics rows (a resumed run reads them back)."""

    name = "crfl"

    def __init__(self, cfg: Any, *, rounds: int, source: Any, threat: Threat | None) -> None:
        self.cfg = cfg
        self.rounds = rounds
        self.source = source
        self.threat = threat
        self.schedule = clip_schedule(rounds, cfg.rho, cfg.rho_start, cfg.rho_growth)
        self._last: tuple[int, float, float] | None = None
        self.last_certificate: Certificate | None = None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def transform_model(self, params: Tensor, t: int) -> Tensor:
        rho = self.schedule[t - 1]
        before = float(torch.linalg.vector_norm(params.detach().to(torch.float64)))
        out = clip_model(params, rho)
        if t < self.rounds:
            out = perturb_model(out, self.cfg.sigma_train, self.source.stream("robust.crfl", t))
        self._last = (t, before, rho)
        return out

    def due(self, t: int) -> bool:
        """Whether round ``t`` certifies."""
        every = self.cfg.certify_every
        return self.cfg.certify and (t == self.rounds or (every > 0 and t % every == 0))

    def on_round_end(self, host: Any, row: dict[str, Any]) -> dict[str, Any]:
        t = int(row["round"])
        out: dict[str, Any] = {}
        if self._last is not None and self._last[0] == t:
            out["crfl_norm"], out["crfl_rho"] = self._last[1], self._last[2]
        if self.due(t):
            ran = {r.get("round"): "crfl_rho" in r for r in host.rows}
            noised = [bool(ran.get(s, False)) for s in range(1, t)] + ["crfl_rho" in out]
            cert = self.certify(host, t, noised)
            self.last_certificate = cert
            out.update(cert.summary(self.cfg.radii))
            if host.out_dir is not None:
                (host.out_dir / "crfl_certificate.csv").write_text(cert.csv())
        return out

    def factor(self, t: int, noised: Sequence[bool]) -> float:
        """The radius factor (:func:`radius_factor`) of certifying after round ``t``."""
        th = self.threat
        t_adv = t if th.attack_round is None else min(th.attack_round, t)
        return radius_factor(
            sigma_train=self.cfg.sigma_train, sigma_test=self.cfg.sigma_test, rho=self.schedule[:t], attack_round=t_adv,
            attackers=th.attackers, weights=[th.weight] * th.attackers, local_iters=th.local_iters,
            lipschitz=th.lipschitz, scale=th.scale, lr=th.lr, poison_fraction=th.poison_fraction, noised=noised,
        )

    def certify(self, host: Any, t: int, noised: Sequence[bool]) -> Certificate:
        """Certify the host's global model (``host.state.params``) on its test set."""
        from torch.func import functional_call, vmap

        model, layout, data = host.model, host.layout, host.data
        params = host.state.params

        def one(w: Tensor, x: Tensor) -> Tensor:
            return functional_call(model, layout.unflatten(w), (x,))

        batched = vmap(one, in_dims=(0, None))
        inputs = [data.x_test]
        poison = getattr(host, "poison", None)
        trigger = None if poison is None else getattr(poison, "trigger", None)
        if trigger is not None:
            inputs.append(trigger.apply(poison.success_inputs(data.x_test, data.y_test)))
        votes = smoothed_votes(
            batched, params, inputs, samples=self.cfg.samples, sigma=self.cfg.sigma_test,
            noise=lambda k: self.source.stream("robust.crfl.certify", t, k), num_classes=data.num_classes,
            batch_models=self.cfg.batch_models,
        )
        return certify(votes[0], data.y_test, samples=self.cfg.samples, alpha=self.cfg.alpha, factor=self.factor(t, noised),
                       round=t, poison_votes=votes[1] if trigger is not None else None,
                       target=None if trigger is None else int(poison.target))

    def summary(self, host: Any) -> dict[str, Any]:
        """The last certification's keys (from the metrics rows, so a resumed run has them)."""
        for r in reversed(host.rows):
            if "crfl_clean_accuracy" in r:
                return {k: v for k, v in r.items() if k.startswith("crfl_") and k not in ("crfl_norm", "crfl_rho")}
        return {}
