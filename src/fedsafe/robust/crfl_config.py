"""``[crfl]``: CRFL (Xie, Chen, Chen, Li, ICML 2021), the server clips the global model's norm
and perturbs it every round, and certifies the parameter-smoothed final model (a light module:
the config imports it without loading scipy; the plugin is :mod:`fedsafe.robust.crfl`).

:func:`make_plugin` is the ``"crfl"`` entry of :data:`fedsafe.core.plugins.ROUND_PLUGINS`
(registered lazily there, after ``dp``, ``inherent`` and ``audit``: its stage acts on the
model after the server step, not on messages).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CRFLConfig(BaseModel):
    """``[crfl]``: the model norm bound ρ_t and training noise σ_train applied to the global
    model after every server step, and the test-time certification of the smoothed model."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
    enabled: bool = Field(False, description="clip and perturb the global model every round, certify at the end")
    rho: float = Field(
        15.0, gt=0, description="cap of the model norm bound: ρ_t = min(rho, rho_start + rho_growth·t) "
        "(the reference's param_clip_thres)"
    )
    rho_start: float = Field(2.0, gt=0, description="ρ_0 of the schedule (the reference's MNIST 2)")
    rho_growth: float = Field(0.1, ge=0, description="growth of ρ_t per round (the reference's MNIST 0.1; 0: constant)")
    sigma_train: float = Field(
        0.01, gt=0, description="σ of the Gaussian noise added to the clipped global model after rounds 1..T−1"
    )
    certify: bool = Field(True, description="certify the smoothed model at the last round (and every certify_every)")
    certify_every: int = Field(0, ge=0, description="also certify every this many rounds (0: at the last round only)")
    samples: int = Field(1000, ge=1, le=1_000_000, description="M, noisy copies of the model that vote (reference N_m)")
    sigma_test: float = Field(0.01, gt=0, description="σ of the smoothing noise at test time (reference test_sigma)")
    alpha: float = Field(0.001, gt=0, lt=1, description="error tolerance of the Hoeffding vote bounds")
    radii: list[float] = Field(
        [0.0, 0.001, 0.002, 0.005], min_length=1, description="radii at which certified accuracy is reported"
    )
    batch_models: int = Field(16, ge=1, le=4096, description="noisy models evaluated in one vectorised forward pass")
    attack_round: int | None = Field(
        None, ge=1, description="t_adv, the round the certified-against attackers poison (default: the last round)"
    )
    attackers: int | None = Field(None, ge=1, description="R, attackers poisoning at t_adv (default: attack.f)")
    weight: float | None = Field(
        None, gt=0, description="p_i, an attacker's weight in the global step (default: server.lr / participants)"
    )
    local_iters: float | None = Field(
        None, gt=0, description="τ, local iterations (default: fedavg's steps per round; 1 for dsgd)"
    )
    lr: float | None = Field(None, gt=0, description="η, local learning rate (default: clients.lr for fedavg, 1 for dsgd)")
    lipschitz: float = Field(
        4.123105625617661, gt=0, description="L, the loss's Lipschitz constant in the parameters (reference: √17)"
    )
    scale: float | None = Field(
        None, gt=0, description="γ, the attackers' boost (default: the backdoor attack's boost/scale, else 1)"
    )
    poison_fraction: float | None = Field(
        None, gt=0, le=1, description="q/n, poisoned share of a batch (default: the backdoor attack's fraction)"
    )

    @model_validator(mode="after")
    def _radii(self) -> CRFLConfig:
        if any(r < 0 for r in self.radii):
            raise ValueError(f"crfl.radii must all be >= 0, got {list(self.radii)}")
        return self

    def problems(self, cfg: Any) -> list[tuple[str, tuple[str, ...]]]:
        """What of ``cfg`` (an ExperimentConfig) CRFL cannot run, each with the keys it reads."""
        if not self.enabled:
            return []
        out: list[tuple[str, tuple[str, ...]]] = []
        if self.attack_round is not None and self.attack_round > cfg.rounds:
            out.append((f"crfl.attack_round = {self.attack_round} must be in [1, rounds] = [1, {cfg.rounds}]",
                        ("crfl.attack_round", "rounds")))
        if self.certify:
            if self.attackers is None and cfg.attack.f == 0:
                out.append(("crfl.attackers: set the number of attackers the certificate is against "
                            "(it defaults to attack.f, which is 0)", ("crfl.attackers", "attack.f")))
            if self.poison_fraction is None and backdoor_fraction(cfg) is None:
                out.append(("crfl.poison_fraction: set the poisoned share of a batch the certificate is against "
                            f"(it defaults to the backdoor attack's fraction; attack.name = {cfg.attack.name!r} has none)",
                            ("crfl.poison_fraction", "attack.name")))
        return out


def backdoor_fraction(cfg: Any) -> float | None:
    """The configured backdoor attack's poisoned share of a batch (None without one)."""
    from fedsafe.robust.backdoor import backdoor_settings

    try:
        settings = backdoor_settings(cfg.attack.name, cfg.attack.params)
    except (ValueError, TypeError, KeyError):
        return None
    return None if settings is None else settings[2]


def make_plugin(setup: Any) -> Any:
    """The round plugin for ``[crfl]``: None unless ``crfl.enabled``."""
    cfg = setup.cfg
    if not cfg.crfl.enabled:
        return None
    problems = cfg.crfl.problems(cfg)
    if problems:  # the config's own lines, so `fedsafe check` (which also builds plugins) says each once
        from fedsafe.core.errors import ConfigError

        raise ConfigError([msg for msg, _ in problems])
    from fedsafe.robust.crfl import CRFLPlugin, threat_from_config

    return CRFLPlugin(cfg.crfl, rounds=cfg.rounds, source=setup.source,
                      threat=threat_from_config(cfg, setup.client_sizes) if cfg.crfl.certify else None)

