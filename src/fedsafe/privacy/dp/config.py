"""The ``[dp]`` config section: client-level DP-FedAvg settings, validated, and the per-run
plan the engine follows (noise multipliers, expected clients, how to account a round).

``noise_multiplier`` and ``target_epsilon`` are alternatives: set at most one. With
``target_epsilon`` the noise multiplier is calibrated from it (``accounting.calibrate_noise``)
for the run's sampling, rounds and delta; with neither, z = 1.0. ``noise_multiplier`` defaults
to None rather than 1.0 so that a config written back to TOML (defaults included) and re-read,
or a variant that sets ``dp.target_epsilon``, is not mistaken for setting both.

Noise multiplier semantics: z is the *total* per-round noise multiplier, the one accounted. With
``adaptive = true`` the update sum gets z_Δ = (z⁻² − (2σ_b)⁻²)^{−1/2} ≥ z and the unclipped count
gets σ_b (Andrew et al. 2021), σ_b = ``count_stddev`` or expected_clients / 20.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedsafe.core.errors import ConfigError
if TYPE_CHECKING:
    from fedsafe.privacy.dp import accounting


def _mechanisms():
    """The mechanisms module (torch) loads when a DP plan is made, not with the config."""
    from fedsafe.privacy.dp import mechanisms

    return mechanisms


def _accounting():
    """dp-accounting and scipy load when a DP setting is checked, not when the config module is
    imported (every ``fedsafe`` command imports the config)."""
    from fedsafe.privacy.dp import accounting

    return accounting

DEFAULT_NOISE_MULTIPLIER = 1.0
# Distributed placement's headline ε (against the secure-aggregation server) composes, per client,
# the rounds it is sampled in at the noise that reached each sum: known only as the run goes, so no
# multiplier can be calibrated to it beforehand (the central-DP calibration would understate it).
DISTRIBUTED_TARGET = (
    "dp.target_epsilon: not available with dp.placement = 'distributed': its headline epsilon (against "
    "the secure-aggregation server, which sees who takes part) depends on which rounds each client is "
    "sampled in and how many noise shares reach each sum, known only as the run goes; set "
    "dp.noise_multiplier (a client in all T rounds with every share present has the epsilon of "
    "`fedsafe privacy epsilon --z Z --rounds T --delta D --sampling none`)"
)


@dataclass(frozen=True)
class DPPlan:
    """What the engine does each round with DP enabled (all plain numbers)."""

    placement: str  # central | local | distributed
    clip: float  # initial clip norm C
    z: float  # total noise multiplier: what each round is accounted with
    value_z: float  # multiplier of the noise on the update sum (z_Δ when adaptive, else z)
    count_stddev: float | None  # σ_b on the centred unclipped count (adaptive only)
    expected_clients: float  # m: the divisor of the noised sum (q·N, the sample size, or N)
    adaptive: bool
    target_quantile: float
    clip_lr: float
    delta: float
    accountant: str  # pld | rdp
    neighboring: str  # relation the accountant uses
    sampling: str  # accounting sampling: poisson | fixed | none
    q: float | None
    num_clients: int
    sample_size: int | None
    rounds: int = 0  # planned rounds: the PLD interval is chosen for them (0: per ε computation)
    honest_clients: int | None = None  # clients that are not Byzantine (default: num_clients)

    @property
    def epsilon_observer(self) -> str:
        """Who the headline ``epsilon`` is against: ``"released"`` (central: anyone who sees what
        the server releases; the server is trusted) or ``"server"`` (local: local DP of each
        message; distributed: the secure-aggregation server, which sees who takes part)."""
        return "released" if self.placement == "central" else "server"

    @property
    def engine(self) -> type[accounting.AccountingEngine]:
        """The accounting engine registered under :attr:`accountant` (what it can do:
        ``plans_interval``, ``epsilon_every_round``)."""
        return _accounting().engine_class(self.accountant)

    def new_accountant(self) -> accounting.Accountant | accounting.DistributedAccountant:
        """The run's accountant. ``central`` / ``local``: an ``Accountant`` whose PLD is composed
        incrementally at the interval chosen for the planned run (``accounting.planned_interval``).
        ``distributed``: a ``DistributedAccountant`` (ε against the secure-aggregation server, the
        headline, and against an outsider who sees the released model)."""
        acc = _accounting()
        if self.placement == "distributed":
            return acc.DistributedAccountant(
                self.delta,
                self.accountant,
                self.neighboring,
                sampling=self.sampling,
                z=self.z,
                q=self.q,
                honest_clients=self.honest_clients or self.num_clients,
                noise_shares=self.noise_shares,
                rounds=self.rounds,
            )
        interval = None
        if self.engine.plans_interval:
            fixed = self.sampling == "fixed"
            record = acc.make_round_record(
                self.z, self.q, self.sampling, self.num_clients if fixed else None, self.sample_size if fixed else None
            )
            interval = acc.planned_interval(record, self.rounds, self.delta, self.neighboring)
        return acc.Accountant(self.delta, self.accountant, self.neighboring, value_discretization_interval=interval)

    @property
    def noise_shares(self) -> int:
        """n_s: how many ``distributed`` noise shares make the full noise: the expected number of
        clients m rounded to an integer (at least 1). Each share is N(0, (z_Δ C)²/n_s)."""
        return max(1, int(round(self.expected_clients)))

    def round_multiplier(self, honest_shares: int) -> float:
        """The noise multiplier z_t a round is accounted with.

        ``central`` and ``local``: z (the server, or each client, adds the full noise). For
        ``local``, ε is then the local-DP ε of a client taking part in every round (worst case).

        ``distributed``: only the noise shares of honest clients that are inside the released sum
        count — a Byzantine client's message carries no trusted noise, a canary carries none, a
        client that dropped out before its masked input reached the sum adds nothing. With
        n_t = ``honest_shares`` such shares the sum carries (n_t/n_s)(z_Δ C)², and with adaptive
        clipping the count (whose noise the clients add as shares too) (n_t/n_s)σ_b², so

            z_t = (z_Δ,t⁻² + (2σ_b,t)⁻²)^(−1/2) = z·√(n_t/n_s),
            z_Δ,t = z_Δ·√(n_t/n_s),   σ_b,t = σ_b·√(n_t/n_s)

        (the split of ``dp.adaptive_clip_split`` scales with both parts). Choice, as in the
        distributed-DP literature (e.g. Kairouz, Liu, Steinke 2021, which accounts the noise of
        the shares actually summed): the accounted Gaussian counts the honest shares present
        *including the target client's own share*. A client not in the sum would have added a
        share had it been, so the worst case over clients is n_t, or 1 when no honest share is in
        the sum (an empty sample, a skipped round): n_t is taken as max(n_t, 1). Below n_s the
        multiplier is rounded down to the grid of ``accounting.grid_floor`` (less noise than
        present: still an upper bound on ε) so a run has few distinct rounds to compose.
        """
        if self.placement != "distributed":
            return self.z
        n = max(1, int(honest_shares))
        if n == self.noise_shares:
            return self.z
        return _accounting().grid_floor(_mechanisms().distributed_noise_multiplier(self.z, n, self.noise_shares))

    def compose_round(
        self,
        acc: accounting.Accountant | accounting.DistributedAccountant,
        z: float | None = None,
        count: int = 1,
        *,
        shares: int | None = None,
        sampled: int | None = None,
        clients: Iterable[int] | None = None,
    ) -> None:
        """Compose ``count`` rounds of this plan into ``acc``, with noise multiplier ``z``
        (default the plan's z; the engine passes :meth:`round_multiplier`'s). A
        ``DistributedAccountant`` also takes the round's honest noise ``shares`` in the released
        sum, the honest clients ``sampled`` and the honest ``clients`` whose updates are in it
        (defaults: n_s shares, all sampled, no client)."""
        if isinstance(acc, _accounting().DistributedAccountant):
            n = self.noise_shares if shares is None else shares
            ids = list(clients or ())
            for _ in range(count):
                acc.compose_round(
                    self.z if z is None else z, shares=n, sampled=n if sampled is None else sampled, clients=ids
                )
            return
        acc.compose_round(
            self.z if z is None else z,
            self.q,
            self.sampling,
            num_clients=self.num_clients,
            sample_size=self.sample_size,
            count=count,
        )


@functools.lru_cache(maxsize=64)
def _calibrate(
    target: float,
    q: float | None,
    rounds: int,
    delta: float,
    sampling: str,
    accountant: str,
    num_clients: int | None,
    sample_size: int | None,
    neighboring: str,
) -> float:
    return _accounting().calibrate_noise(
        target,
        q,
        rounds,
        delta,
        sampling,
        accountant,
        num_clients,
        sample_size=sample_size,
        neighboring=neighboring,
    )


class DPConfig(BaseModel):
    """Client-level differential privacy (DP-FedAvg with clipping and Gaussian noise)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)

    enabled: bool = False
    clip: float = Field(1.0, gt=0, allow_inf_nan=False, description="L2 clip norm C (initial C when adaptive)")
    noise_multiplier: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="z = noise std / C, the total per-round multiplier (default 1.0; exclusive with target_epsilon)",
    )
    placement: Literal["central", "local", "distributed"] = Field(
        "central",
        description="central: server adds noise to the sum; local: each client noises its own update "
        "(local DP against the server); distributed: each client adds a 1/n share, summed under secure aggregation",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="delta of the (epsilon, delta) guarantee")
    accountant: Literal["pld", "rdp"] = "pld"
    adaptive: bool = Field(False, description="adaptive clipping to a target quantile (Andrew et al. 2021)")
    target_quantile: float = Field(0.5, ge=0, le=1, description="target fraction of unclipped updates")
    clip_lr: float = Field(0.2, gt=0, allow_inf_nan=False, description="geometric clip learning rate eta_C")
    count_stddev: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="noise std sigma_b on the unclipped count (default expected_clients/20)",
    )
    target_epsilon: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="calibrate the noise multiplier to reach this epsilon after all rounds "
        "(exclusive with noise_multiplier)",
    )
    unit: Literal["client", "example"] = Field(
        "client",
        description="what DP protects: 'client' (each client's whole update, DP-FedAvg) or 'example' "
        "(each record of a client's dataset: DP-SGD at every local step, private against the server)",
    )
    example_sampling: Literal["poisson", "fixed"] = Field(
        "poisson",
        description="unit = 'example': how a client samples its records at each step: 'poisson' (each "
        "with probability clients.batch_size / its record count; add/remove-one) or 'fixed' "
        "(clients.batch_size records without replacement; replace-one, accountant 'rdp')",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DPConfig:
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ValueError(
                "set either dp.noise_multiplier or dp.target_epsilon, not both "
                "(dp.target_epsilon calibrates the noise multiplier)"
            )
        if self.unit == "example":
            if self.placement != "local":
                raise ValueError(
                    f"dp.placement = {self.placement!r} with dp.unit = 'example': example-level DP adds its "
                    "noise at each client's every local step (DP-SGD), which is local by nature; "
                    "set dp.placement = 'local'"
                )
            if self.adaptive:
                raise ValueError(
                    "dp.adaptive with dp.unit = 'example': adaptive clipping tunes a client-level clip norm "
                    "from the clients' unclipped bits; example-level DP clips each record's gradient to the "
                    "fixed dp.clip: set dp.adaptive = false"
                )
            if self.example_sampling == "fixed" and self.accountant != "rdp":
                raise ValueError(
                    "dp.example_sampling = 'fixed' (records sampled without replacement, replace-one) is "
                    "accounted only by dp-accounting's RDP: set dp.accountant = 'rdp' or "
                    "dp.example_sampling = 'poisson'"
                )
        if self.adaptive and self.placement == "local":
            raise ValueError(
                "dp.adaptive with dp.placement = 'local': adaptive clipping needs each client's "
                "unclipped bit, which the server would see in the clear, breaking local DP; "
                "use placement 'central' or 'distributed'"
            )
        return self

    # -- helpers the engine / config cross-checks use

    @staticmethod
    def _accounting_sampling(sampling: str) -> str:
        if sampling in _accounting().CLIENT_SAMPLING:
            return _accounting().CLIENT_SAMPLING[sampling]
        if sampling in _accounting().SAMPLINGS:
            return sampling
        valid = sorted(set(_accounting().CLIENT_SAMPLING) | set(_accounting().SAMPLINGS))
        raise ValueError(f"clients.sampling: unknown scheme {sampling!r}; valid: {', '.join(valid)}")

    @staticmethod
    def expected_clients(
        sampling: str, num_clients: int, q: float | None = None, sample_size: int | None = None
    ) -> float:
        """m: q·N (poisson), the sample size (fixed), N (all / none)."""
        s = DPConfig._accounting_sampling(sampling)
        if s == "poisson":
            if q is None:
                raise ValueError("clients.sample_rate is required for Poisson sampling")
            return q * num_clients
        if s == "fixed":
            if sample_size is None:
                if q is None:
                    raise ValueError("clients.sample_size is required for fixed-size sampling")
                return float(round(q * num_clients))
            return float(sample_size)
        return float(num_clients)

    def _where(self, sampling: str) -> tuple[str, str]:
        """(accounting sampling, neighbouring relation) for this placement."""
        if self.placement == "local":
            return "none", "replace_one"
        s = self._accounting_sampling(sampling)
        return s, _accounting().natural_neighboring(s)

    def _split(self, z: float, m: float) -> tuple[float, float | None]:
        if not self.adaptive:
            return z, None
        sigma_b = self.count_stddev if self.count_stddev is not None else _mechanisms().default_count_stddev(m)
        try:
            return _mechanisms().adaptive_clip_split(z, sigma_b), sigma_b
        except ValueError as err:
            default = "" if self.count_stddev is not None else f" (default expected_clients/20 = {m:g}/20)"
            raise ValueError(f"dp.count_stddev{default}: {err}") from None

    def check(
        self,
        *,
        sampling: str,
        rounds: int,
        num_clients: int,
        q: float | None = None,
        sample_size: int | None = None,
    ) -> None:
        """Cheap config-time checks against the rest of the experiment (no calibration):
        dp-accounting supports the (sampling, accountant, relation); with a fixed noise
        multiplier, the adaptive-clipping split is possible. No-op when disabled."""
        if not self.enabled:
            return
        _accounting()._check_count("rounds", rounds, 1)
        if self.unit == "example":
            return  # the per-client record checks need the clients' data: make_plugin
        if self.target_epsilon is not None and self.placement == "distributed":
            raise ValueError(DISTRIBUTED_TARGET)
        s, rel = self._where(sampling)
        record = _accounting().make_round_record(1.0, q, s, num_clients if s == "fixed" else None, sample_size)
        try:
            _accounting().Accountant(self.delta, self.accountant, rel).check_supported(record)
        except _accounting().UnsupportedAccountingError as err:
            raise ValueError(f"dp.accountant: {err}") from None
        if self.target_epsilon is None:
            z = DEFAULT_NOISE_MULTIPLIER if self.noise_multiplier is None else self.noise_multiplier
            self._split(z, self.expected_clients(sampling, num_clients, q, sample_size))

    def resolve_noise_multiplier(
        self,
        *,
        sampling: str,
        rounds: int,
        num_clients: int,
        q: float | None = None,
        sample_size: int | None = None,
    ) -> float:
        """z: ``noise_multiplier``, 1.0 by default, or calibrated from ``target_epsilon`` (for
        ``local`` placement, the local-DP ε of a client taking part in every round). Calibrations
        are cached per process."""
        if self.target_epsilon is None:
            return DEFAULT_NOISE_MULTIPLIER if self.noise_multiplier is None else float(self.noise_multiplier)
        if self.placement == "distributed":
            raise ValueError(DISTRIBUTED_TARGET)
        s, rel = self._where(sampling)
        try:
            return _calibrate(
                float(self.target_epsilon),
                None if s == "none" else q,
                int(rounds),
                float(self.delta),
                s,
                self.accountant,
                num_clients if s == "fixed" else None,
                sample_size if s == "fixed" else None,
                rel,
            )
        except ValueError as err:
            raise ValueError(f"dp.target_epsilon: {err}") from None

    def plan(
        self,
        *,
        sampling: str,
        rounds: int,
        num_clients: int,
        q: float | None = None,
        sample_size: int | None = None,
        byzantine: int = 0,
    ) -> DPPlan:
        """Everything the engine needs per round; raises ValueError (naming the ``dp.`` key)
        when the run cannot be made private as configured. ``byzantine``: how many of the
        ``num_clients`` are Byzantine (their messages carry no trusted noise; distributed DP's
        released-model bound is over the others)."""
        self.check(sampling=sampling, rounds=rounds, num_clients=num_clients, q=q, sample_size=sample_size)
        m = self.expected_clients(sampling, num_clients, q, sample_size)
        z = self.resolve_noise_multiplier(
            sampling=sampling, rounds=rounds, num_clients=num_clients, q=q, sample_size=sample_size
        )
        value_z, sigma_b = self._split(z, m)
        s, rel = self._where(sampling)
        fixed = s == "fixed"
        return DPPlan(
            placement=self.placement,
            clip=self.clip,
            z=z,
            value_z=value_z,
            count_stddev=sigma_b,
            expected_clients=m,
            adaptive=self.adaptive,
            target_quantile=self.target_quantile,
            clip_lr=self.clip_lr,
            delta=self.delta,
            accountant=self.accountant,
            neighboring=rel,
            sampling=s,
            q=q if s == "poisson" else None,
            num_clients=num_clients,
            sample_size=(sample_size if sample_size is not None else int(m)) if fixed else None,
            rounds=int(rounds),
            honest_clients=max(1, num_clients - int(byzantine)),
        )


def make_plugin(setup: Any) -> Any:
    """The round plugin for ``[dp]`` (``fedsafe.core.plugins.ROUND_PLUGINS``): None unless
    ``dp.enabled``; a plan that cannot hold (e.g. adaptive clipping with too little noise) is a
    ConfigError with its reason."""
    cfg = setup.cfg
    if not cfg.dp.enabled:
        return None
    if cfg.dp.unit == "example":
        return make_example_plugin(setup)
    from fedsafe.privacy.dp.plugin import DPPlugin

    c = cfg.clients
    try:
        plan = cfg.dp.plan(
            sampling=c.sampling, rounds=cfg.rounds, num_clients=c.num_clients, q=c.sample_rate, sample_size=c.sample_size,
            byzantine=cfg.attack.f,
        )
    except ValueError as e:
        raise ConfigError([str(e)]) from None
    return DPPlugin(plan, setup.source)


def make_example_plugin(setup: Any) -> Any:
    """``dp.unit = "example"``: DP-SGD at each honest client (``fedsafe.privacy.dp.dpsgd``).
    Refuses, with what to set, the client algorithms and executions that cannot run it."""
    cfg = setup.cfg
    c, dp = cfg.clients, cfg.dp
    problems = example_problems(c, cfg.execution)
    audit = getattr(cfg, "audit", None)
    if audit is not None and audit.enabled:
        problems.append(
            "audit.canaries with dp.unit = 'example': the canary audit measures client-level DP-FedAvg "
            "(canary clients scaled to its clip norm); set dp.unit = 'client' or audit.canaries = 0"
        )
    if problems:
        raise ConfigError(problems)
    from fedsafe.privacy.dp import dpsgd

    sizes = tuple(int(v) for v in setup.client_sizes)
    try:
        z = DEFAULT_NOISE_MULTIPLIER if dp.noise_multiplier is None else float(dp.noise_multiplier)
        settings = dpsgd.DPSGDSettings(dp.clip, z, c.batch_size, dp.example_sampling)
        if dp.target_epsilon is not None:
            steps = dpsgd.planned_steps(c.algorithm, sizes, c.batch_size, c.local_steps, c.local_epochs)
            try:
                z = dpsgd.calibrate_example_noise(
                    float(dp.target_epsilon), settings, sizes, steps, cfg.rounds, delta=dp.delta, accountant=dp.accountant
                )
            except ValueError as err:
                raise ValueError(f"dp.target_epsilon: {err}") from None
            settings = dpsgd.DPSGDSettings(dp.clip, z, c.batch_size, dp.example_sampling)
        return dpsgd.ExampleDPPlugin(settings, setup.source, sizes, delta=dp.delta, accountant=dp.accountant)
    except _accounting().UnsupportedAccountingError as err:
        raise ConfigError([f"dp.accountant: {err}"]) from None
    except ValueError as err:
        raise ConfigError([str(err)]) from None


def example_problems(clients: Any, execution: str) -> list[str]:
    """Why the ``[clients]`` settings and ``execution`` cannot run ``dp.unit = "example"``
    (none: they can); the config's cross-checks and the plugin factory both ask."""
    c = clients
    problems: list[str] = []
    if c.gradient != "backprop":
        problems.append(
            "dp.unit = 'example' needs per-example gradients: set clients.gradient = 'backprop' "
            f"(got {c.gradient!r}; forward-only clients have none to clip)"
        )
    if c.algorithm not in ("dsgd", "fedavg"):
        problems.append(
            f"dp.unit = 'example' runs DP-SGD in the dsgd and fedavg clients: set clients.algorithm to one "
            f"of them (got {c.algorithm!r})"
        )
    if execution == "ray":
        problems.append(
            "dp.unit = 'example' with execution = 'ray': the DP-SGD clients run in process; "
            "set execution = 'auto', 'serial' or 'vectorized'"
        )
    return problems
