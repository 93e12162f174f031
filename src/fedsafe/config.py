"""Experiment configuration: pydantic models, TOML loading, ``--set`` overrides, variants.

An experiment is one TOML file. Every section is a strict model: unknown keys, wrong types
and out-of-range values are rejected, and :func:`ConfigError` lists one line per problem,
naming the dotted key and what would be valid. Names that select an implementation (rules,
pre-aggregators, attacks) are checked against their registries, parameters included.

``variants`` runs several versions of one experiment side by side (the default experiment
compares a plain mean with a robust pipeline): each variant is a table of dotted-key overrides
applied to the base config, validated on its own.

Renamed keys (``he.delta`` -> ``he.bits``, ...: :data:`RENAMED_KEYS`) stay accepted for one
release as deprecated aliases (:mod:`fedsafe.core.renames`): in a file, in ``--set``, in a
variant's table and in a saved run's ``config.toml``; :meth:`ExperimentConfig.to_toml` writes
only the new keys.
"""

from __future__ import annotations

import copy
import datetime
import importlib.resources
import json
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fedsafe.audit.config import AuditConfig
from fedsafe.core.clients import CLIENT_ALGORITHMS
from fedsafe.core.errors import ConfigError
from fedsafe.core.protocol import PROTOCOLS
from fedsafe.core.registry import ParamValueError, RegistryError
from fedsafe.core.renames import QUIET, Rename, deprecation_message, warn_renamed
from fedsafe.data.config import DataConfig
from fedsafe.models.config import ModelConfig
from fedsafe.privacy.dp.config import DPConfig, example_problems
from fedsafe.privacy.inherent.config import InherentConfig
from fedsafe.protocols.he.config import HEConfig
from fedsafe.protocols.secagg.config import SecAggConfig
from fedsafe.protocols.tee.config import TEEConfig
from fedsafe.robust.crfl_config import CRFLConfig
from fedsafe.zo.config import ZOConfig


class _Problems(ValueError):
    """Several problems found by one validator, one line each (:func:`format_errors`)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)


class ClientsConfig(Strict):
    """Client population, sampling and local work."""

    @field_validator("algorithm", check_fields=False)
    @classmethod
    def _registered_algorithm(cls, v: str) -> str:
        names = sorted({k.split(":")[0] for k in CLIENT_ALGORITHMS.names()})
        if v not in names:
            raise ValueError(f"unknown client algorithm {v!r}; valid: {', '.join(names)}")
        return v

    num_clients: int = Field(20, ge=1, le=1_000_000, description="clients in the population")
    sampling: Literal["all", "fixed", "poisson"] = Field(
        "all", description="all clients every round; a fixed-size sample without replacement; "
        "or Poisson sampling (each client independently with probability sample_rate)"
    )
    sample_size: int | None = Field(None, ge=1, description="clients per round for sampling='fixed'")
    sample_rate: float | None = Field(None, gt=0, le=1, description="q for sampling='poisson'")
    algorithm: str = Field(
        "dsgd", description="a registered client algorithm (fedsafe.core.clients.CLIENT_ALGORITHMS): "
        "dsgd: one minibatch gradient per round, sends local momentum; "
        "fedavg: local SGD steps, sends the model delta; inherent: FedSGD releasing a Table 1 "
        "row of Zhang et al. (see [inherent])"
    )
    batch_size: int = Field(32, ge=1, le=1_000_000)
    momentum: float = Field(
        0.9, ge=0, lt=1, description="dsgd local momentum beta (zeroth-order dsgd: on the decoded direction)"
    )
    lr: float = Field(0.1, gt=0, description="fedavg local learning rate")
    local_steps: int | None = Field(None, ge=1, le=100_000, description="fedavg minibatch steps per round")
    local_epochs: int | None = Field(None, ge=1, le=10_000, description="fedavg epochs per round")
    weight_decay: float = Field(
        0.0, ge=0, description="L2 regularisation added to client gradients (zeroth-order dsgd: to the decoded direction)"
    )
    gradient: Literal["backprop", "zeroth_order"] = Field(
        "backprop", description="zeroth_order: BAFFLE clients, K forward passes and no backpropagation ([zo])"
    )

    @property
    def round_size(self) -> int | None:
        """Clients sampled per round where the config fixes it (``all``: the population;
        ``fixed``: ``sample_size``); None under Poisson sampling, where it varies (expected
        ``num_clients · sample_rate``)."""
        return {"all": self.num_clients, "fixed": self.sample_size}.get(self.sampling)

    @model_validator(mode="after")
    def _consistent(self) -> ClientsConfig:
        if self.sampling == "fixed":
            if self.sample_size is None:
                raise ValueError("clients.sample_size is required when clients.sampling = 'fixed'")
            if self.sample_size > self.num_clients:
                raise ValueError(
                    f"clients.sample_size={self.sample_size} exceeds clients.num_clients={self.num_clients}"
                )
        elif self.sample_size is not None:
            raise ValueError("clients.sample_size applies only to clients.sampling = 'fixed'")
        if self.sampling == "poisson":
            if self.sample_rate is None:
                raise ValueError("clients.sample_rate is required when clients.sampling = 'poisson'")
        elif self.sample_rate is not None:
            raise ValueError("clients.sample_rate applies only to clients.sampling = 'poisson'")
        if self.algorithm != "fedavg" and (self.local_steps or self.local_epochs):
            raise ValueError(
                "clients.local_steps/local_epochs apply only to clients.algorithm = 'fedavg'"
            )
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("set at most one of clients.local_steps and clients.local_epochs")
        return self




class ServerConfig(Strict):
    """Server optimizer on the aggregated descent direction, and the model it evaluates."""

    optimizer: Literal["sgd", "adam"] = Field("sgd", description="sgd (torch.optim.SGD semantics) or adam")
    lr: float = Field(0.5, gt=0, description="server learning rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd momentum")
    betas: tuple[float, float] = Field((0.9, 0.99), description="adam betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0, description="adam epsilon")
    weight_decay: float = Field(0.0, ge=0)
    ema: float | None = Field(
        None, ge=0, lt=1, description="evaluate an exponential moving average of the model with this decay "
        "(warm-up min(decay, (1+n)/(10+n)), as BAFFLE)"
    )

    @model_validator(mode="after")
    def _betas(self) -> ServerConfig:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"server.betas must each lie in [0, 1), got {list(self.betas)}")
        if self.optimizer == "sgd" and self.betas != (0.9, 0.99):
            raise ValueError("server.betas applies only to server.optimizer = 'adam'")
        if self.optimizer == "adam" and self.momentum:
            raise ValueError("server.momentum applies only to server.optimizer = 'sgd' (adam has betas)")
        return self


class PreSpec(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class RobustConfig(Strict):
    """Server-side robust aggregation: pre-aggregators then a rule."""

    rule: str = "mean"
    params: dict[str, Any] = Field(default_factory=dict, description="parameters of the rule")
    f: int | None = Field(
        None, ge=0, description="Byzantine count the rule tolerates (default: attack.f)"
    )
    pre: list[PreSpec] = Field(default_factory=list, description="pre-aggregators, in order")

    @field_validator("pre", mode="before")
    @classmethod
    def _pre_names(cls, v: Any) -> Any:
        # `pre = ["nnm", {name = "bucketing", params = {s = 2}}]`: bare names are allowed.
        if isinstance(v, list):
            return [{"name": x} if isinstance(x, str) else x for x in v]
        return v

    @model_validator(mode="after")
    def _registered(self) -> RobustConfig:
        from fedsafe.robust.aggregators import AGGREGATORS  # torch: with the first validation, not the import
        from fedsafe.robust.preaggregators import PREAGGREGATORS

        problems = []
        try:
            AGGREGATORS.check_params(self.rule, self.params, where="robust.params")
        except ParamValueError as e:  # names its full key
            problems.append(str(e))
        except RegistryError as e:
            problems.append(f"robust.rule: {e}")
        for i, p in enumerate(self.pre):
            try:
                PREAGGREGATORS.check_params(p.name, p.params, where=f"robust.pre[{i}].params")
            except ParamValueError as e:
                problems.append(str(e))
            except RegistryError as e:
                problems.append(f"robust.pre[{i}]: {e}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class AttackConfig(Strict):
    """Byzantine clients: how many and what they send."""

    name: str = "none"
    f: int = Field(0, ge=0, description="number of Byzantine clients in the population")
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _registered(self) -> AttackConfig:
        from fedsafe.robust.attacks import ATTACKS

        try:
            ATTACKS.check_params(self.name, self.params, where="attack.params")
        except ParamValueError as e:  # names its full key
            raise ValueError(str(e)) from None
        except RegistryError as e:
            raise ValueError(f"attack.name: {e}") from None
        return self


class RayConfig(Strict):
    """``execution = "ray"``: where and how client tasks run."""

    address: str = Field(
        "local", description='"local" starts a Ray instance here; "auto" (on a cluster node) or '
        '"ray://host:port" (Ray Client; needs ray[client], in the ray extra) joins a cluster'
    )
    local_cpus: int | None = Field(None, ge=1, description="CPUs of a locally started instance (default: all)")
    num_cpus: float = Field(1.0, gt=0, description="CPUs reserved per client task")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved per client task")
    max_concurrent: int | None = Field(None, ge=1, description="cap on tasks in flight")
    clients_per_task: int = Field(1, ge=1, description="clients computed by one task")
    inner: Literal["auto", "serial", "vectorized"] = Field("serial", description="backend inside a task")
    retries: int = Field(0, ge=0, le=100, description="retries of a failed task before its clients drop out")
    task_timeout: float | None = Field(
        None, gt=0, description="seconds after submission before a client task is cancelled and its clients "
        "count as dropouts (None: wait forever); with it, tasks in flight default to the cluster's free slots"
    )
    fail: list[tuple[int, int]] = Field(
        default_factory=list,
        description="fault injection for tests: (round, client) pairs whose task's worker process dies",
    )
    hang: list[tuple[int, int]] = Field(
        default_factory=list,
        description="fault injection for tests: (round, client) pairs whose task hangs (see task_timeout)",
    )


def uses_privacy_noise(cfg: ExperimentConfig) -> bool:
    """Whether ``cfg`` runs a privacy mechanism whose noise must be secret (DP, inherent noise)."""
    return cfg.dp.enabled or cfg.inherent is not None


class ExperimentConfig(Strict):
    """One federated experiment."""

    name: str = Field(
        "experiment", description="run name: the folder under runs/ (letters, digits and . _ - = , + @)"
    )
    seed: int = Field(0, ge=0, le=2**63 - 1)
    secure_randomness: bool = Field(
        True, description="true: DP and inherent noise, and the client sample under DP, come from a secret "
        "drawn from the OS (fedsafe.core.randomness); false: derived from seed, reproducible and NOT private "
        "(summaries and saved models say so)"
    )
    rounds: int = Field(30, ge=1, le=10_000_000)
    eval_every: int = Field(1, ge=1, description="evaluate on the test set every this many rounds")
    checkpoint_every: int = Field(
        10, ge=0, description="checkpoint every this many rounds and at the last (0: never); --resume continues from it"
    )
    execution: Literal["auto", "serial", "vectorized", "ray"] = Field(
        "auto", description="auto: vectorized, or a plain loop for models too large to batch "
        "(fedsafe.engine.backends.make_backend); serial: a plain autograd loop; vectorized: vmap over "
        "cache-sized chunks of clients; ray: client tasks on a Ray cluster (ray.inner inside each task)"
    )
    protocol: str = Field(
        "plain", description="who sees what (a registered protocol, fedsafe.core.protocol.PROTOCOLS): plain: "
        "the server sees every update; secagg: only the sum (Bonawitz/SecAgg+); he: trimmed mean / median "
        "over BFV ciphertexts (SABLE); tee: an enclave offloads encoded distance computations to untrusted "
        "accelerators (Hashemi et al.)"
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    robust: RobustConfig = Field(default_factory=RobustConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    dp: DPConfig = Field(default_factory=DPConfig)
    zo: ZOConfig = Field(default_factory=ZOConfig)
    inherent: InherentConfig | None = None
    secagg: SecAggConfig = Field(default_factory=SecAggConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    crfl: CRFLConfig = Field(default_factory=CRFLConfig)
    he: HEConfig = Field(default_factory=HEConfig)
    tee: TEEConfig = Field(default_factory=TEEConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="name -> {dotted.key = value} overrides, run side by side"
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        check_run_name(v)
        return v

    @field_validator("protocol")
    @classmethod
    def _registered_protocol(cls, v: str) -> str:
        if v not in PROTOCOLS:
            raise ValueError(f"unknown protocol {v!r}; valid: {', '.join(PROTOCOLS.names())}")
        return v

    @field_validator("variants", mode="before")
    @classmethod
    def _renamed_variant_keys(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, dict):
            return v
        warn = not (info.context or {}).get(QUIET)
        return {
            name: rename_tree(over, warn=warn) if isinstance(over, dict) else over for name, over in v.items()
        }

    @field_validator("variants")
    @classmethod
    def _safe_variant_names(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, over in v.items():
            if name == BASE_VARIANT and over:
                raise ValueError(
                    f"variants.{BASE_VARIANT}: reserved for the base experiment itself, so it takes no "
                    f"overrides (`--variant {BASE_VARIANT}` selects it); give this variant another name"
                )
            try:
                check_run_name(name)
            except ValueError as e:
                raise ValueError(f"variants.{name}: {e}") from None
        return v

    @model_validator(mode="after")
    def _cross(self, info: ValidationInfo) -> ExperimentConfig:
        if (info.context or {}).get("cross", True):
            problems = [msg for msg, _ in self.cross_problems()]
            if problems:
                raise _Problems(problems)
        return self

    def cross_problems(self) -> list[tuple[str, tuple[str, ...]]]:
        """Every problem between settings of different sections, all at once: (the message,
        which names its keys; the dotted keys it reads). ``fedsafe check`` leaves out a problem
        that reads a key it had to set back to its default (fedsafe.engine.check)."""
        out: list[tuple[str, tuple[str, ...]]] = []
        n_total = self.clients.num_clients
        if self.attack.f >= n_total:
            out.append((
                f"attack.f={self.attack.f} must be < clients.num_clients={n_total} "
                "(at least one honest client)", ("attack.f", "clients.num_clients"),
            ))
        if self.clients.gradient == "zeroth_order" and self.clients.algorithm == "inherent":
            out.append((
                "clients.gradient = 'zeroth_order' applies to dsgd and fedavg, not inherent",
                ("clients.gradient", "clients.algorithm"),
            ))
        if (self.clients.algorithm == "inherent") != (self.inherent is not None):
            out.append((
                "clients.algorithm = 'inherent' and the [inherent] section go together "
                "(set both, or neither)", ("clients.algorithm", "inherent"),
            ))
        if self.protocol == "secagg":
            c = self.clients
            most = c.round_size or c.num_clients  # Poisson: up to the whole population
            try:
                self.secagg.check_capacity(most)
            except ValueError as e:
                msg = str(e).removeprefix("secagg: ")
                out.append((msg if msg.startswith("secagg.") else f"secagg: {msg}", ("protocol", "secagg", "clients")))
            if self.dp.enabled and self.dp.placement == "central":
                out.append((
                    "dp.placement = 'central' with protocol = 'secagg': the server sees only the sum, "
                    "so it cannot clip what a client sends; use dp.placement = 'distributed'",
                    ("protocol", "dp.enabled", "dp.placement"),
                ))
        if self.audit.enabled and not (self.dp.enabled and self.clients.algorithm == "fedavg"):
            out.append((
                "audit.canaries needs dp.enabled = true and clients.algorithm = 'fedavg' "
                "(canaries are clients of DP-FedAvg, scaled to its clip norm)",
                ("audit", "dp.enabled", "clients.algorithm"),
            ))
        if self.dp.enabled:
            c = self.clients
            try:
                self.dp.check(
                    sampling=c.sampling, rounds=self.rounds, num_clients=c.num_clients,
                    q=c.sample_rate, sample_size=c.sample_size,
                )
            except ValueError as e:
                out.append((str(e), ("dp", "clients", "rounds")))
            if self.dp.placement != "local" and (self.robust.rule != "mean" or self.robust.pre):
                out.append((
                    f"dp.enabled with dp.placement = '{self.dp.placement}' needs robust.rule = 'mean' "
                    "and no robust.pre: the privacy analysis bounds the sensitivity of the clipped "
                    "sum (with placement 'local' every message is already private and any rule may run)",
                    ("dp.enabled", "dp.placement", "robust.rule", "robust.pre"),
                ))
            if self.dp.unit == "example":  # DP-SGD at the clients: what they must be (privacy/dp/config.py)
                out.extend((m, ("dp.unit", "clients", "execution")) for m in example_problems(self.clients, self.execution))
        out.extend(self.crfl.problems(self))  # robust/crfl_config.py
        return out

    @property
    def rule_f(self) -> int:
        """The f the robust pipeline assumes: robust.f, or the actual Byzantine count."""
        return self.attack.f if self.robust.f is None else self.robust.f

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(self.model_dump(mode="json"))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


#: The name ``--variant`` gives the base experiment of a file with variants.
BASE_VARIANT = "base"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=,+@-]{0,127}")


def check_run_name(name: str) -> None:
    """Names become folder names: refuse anything that could escape or reuse a folder."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{name!r} is not a valid run name: use 1-128 letters, digits and . _ - = , + @, "
            "starting with a letter or digit, without '..' (it becomes a folder name)"
        )


def _drop_none(d: Any) -> Any:
    # TOML has no null: omitted keys mean "default", which is what None encodes here.
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_drop_none(v) for v in d]
    return d


# --- loading -------------------------------------------------------------------------------


def default_config_text() -> str:
    return importlib.resources.files("fedsafe").joinpath("defaults/default.toml").read_text()


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            [f"{path}: not a TOML text file (byte {e.start} is not UTF-8); give an experiment .toml file"]
        ) from None
    return parse_toml(text, str(path))


def parse_toml(text: str, where: str = "config") -> dict[str, Any]:
    """A TOML experiment as a raw dict; each renamed key in it is warned about (it is mapped
    when the dict is validated)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{where}: not valid TOML: {e}"]) from None
    warn_renamed_keys(raw)
    return raw


def parse_override(item: str) -> tuple[str, Any]:
    """``section.key=value``; the value is read as a TOML value, else as a bare string."""
    if "=" not in item:
        raise ConfigError([f"--set {item!r}: expected section.key=value"])
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError([f"--set {item!r}: empty key"])
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    warn_renamed_keys(apply_overrides({}, {key: value}))
    return key, value


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``raw`` with each dotted key set (tables created as needed). A renamed key
    (:data:`RENAMED_KEYS`) set by either name replaces the setting under both."""
    out = copy.deepcopy(raw)
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError([f"{key}: {part!r} is a value, not a table"])
            node = nxt
        other = RENAMED_KEYS.get(key) or _OLD_KEYS.get(key)
        if other is not None:
            node.pop(other.rsplit(".", 1)[1], None)
        node[parts[-1]] = value
    return out


# --- renamed keys ------------------------------------------------------------------------------

_RENAMING_SECTIONS = {"he": HEConfig, "secagg": SecAggConfig, "tee": TEEConfig, "inherent": InherentConfig}
#: Every renamed key, dotted: old name -> (section, its :class:`~fedsafe.core.renames.Rename`).
RENAMES: dict[str, tuple[str, Rename]] = {
    f"{section}.{r.old}": (section, r) for section, model in _RENAMING_SECTIONS.items() for r in model.renames
}
#: Every renamed key, dotted: old name -> new name (``"he.delta": "he.bits"``).
RENAMED_KEYS: dict[str, str] = {old: f"{section}.{r.new}" for old, (section, r) in RENAMES.items()}
_OLD_KEYS = {new: old for old, new in RENAMED_KEYS.items()}


def warn_renamed_keys(raw: dict[str, Any]) -> None:
    """A deprecation warning for each renamed key in ``raw`` (a raw config, variants included),
    where a user's keys enter: a file, ``--set``, the Python API. Nothing is changed or refused
    here: validation maps the keys (quietly) and refuses both names of one key."""
    try:
        rename_tree(raw, warn=True)
    except ValueError:
        pass


def canonical_key(key: str) -> str:
    """``key`` under its current name (``he.delta`` -> ``he.bits``; others as they are)."""
    return RENAMED_KEYS.get(key, key)


def rename_tree(table: dict[str, Any], prefix: str = "", *, warn: bool = False) -> dict[str, Any]:
    """A copy of ``table`` (a raw config, or a variant's overrides: nested or dotted keys) with
    every renamed key under its new name and value; ``warn``: with a deprecation warning each.
    Both names of one key: ValueError naming both."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        full = f"{prefix}{k}"
        if full in RENAMES:
            section, r = RENAMES[full]
            new_k = k[: len(k) - len(r.old)] + r.new
            if new_k in table:
                raise ValueError(
                    f"{full} and {RENAMED_KEYS[full]} are the same setting ({full} is the deprecated name): "
                    f"set only {RENAMED_KEYS[full]}"
                )
            if warn:
                warn_renamed(deprecation_message(section, r, v))
            out[new_k] = r.new_value(v)
        elif isinstance(v, dict) and k != "params" and full != "variants":
            out[k] = rename_tree(v, f"{full}.", warn=warn)
        elif isinstance(v, dict) and full == "variants":
            out[k] = {name: rename_tree(over, warn=warn) if isinstance(over, dict) else over for name, over in v.items()}
        else:
            out[k] = v
    return out


def validate(raw: dict[str, Any], prefix: str = "") -> ExperimentConfig:
    """An ExperimentConfig from a raw dict, or ConfigError with one line per problem."""
    try:
        cfg = _validate_strict(raw, prefix)
    except ValidationError as e:
        raise ConfigError(format_errors(e, prefix)) from None
    problems = []
    for name in cfg.variants:
        try:
            variant_config(cfg, name)
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _validate_strict(raw: dict[str, Any], prefix: str = "", *, cross: bool = True) -> ExperimentConfig:
    """Validate in pydantic's strict mode, over JSON: no coercion between bool, int and str
    (``rounds = true``, ``dp.enabled = "yes"``, ``server.lr = "0.1"`` are errors naming the
    key), while an int still widens to a float (``lr = 1``) and an array fills a tuple
    (``betas = [0.9, 0.99]``), as in TOML. Values with no TOML/JSON form (a TOML date, an object
    passed through the Python API) are errors naming their key. ``cross = False`` leaves out
    the checks between sections (:meth:`ExperimentConfig.cross_problems`)."""
    problems: list[str] = []
    plain = _plain(raw, "", problems)
    if problems:
        raise ConfigError([f"{prefix}{p}" for p in problems])
    return ExperimentConfig.model_validate_json(
        json.dumps(plain, allow_nan=True), strict=True, context={"cross": cross, QUIET: True}
    )


def _plain(value: Any, key: str, problems: list[str]) -> Any:
    """``value`` as JSON types (numpy scalars and paths unwrapped); a problem for anything else."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(f"{key or 'config'}: table keys must be strings, got {k!r}")
                continue
            out[k] = _plain(v, f"{key}.{k}" if key else k, problems)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return _plain(value.item(), key, problems)
    if isinstance(value, (datetime.date, datetime.time)):
        problems.append(f"{key}: a TOML date/time is not a valid value here (got {value.isoformat()})")
    else:
        problems.append(
            f"{key}: a {type(value).__name__} is not a config value (got {value!r}); use a number, "
            "string, boolean, array or table"
        )
    return None


def variant_raw(cfg: ExperimentConfig, name: str) -> dict[str, Any]:
    """The raw (unvalidated) config of one variant: the base with the variant's overrides."""
    base = cfg.to_dict()
    base.pop("variants", None)
    over = cfg.variants[name]
    if any(k.split(".")[0] == "variants" for k in over):
        raise ConfigError([f"variants.{name}: a variant cannot define variants"])
    merged = apply_overrides(base, _flatten(over))
    merged["name"] = name
    return merged


def variant_config(cfg: ExperimentConfig, name: str) -> ExperimentConfig:
    """The config of one variant: the base with the variant's overrides, no variants."""
    merged = variant_raw(cfg, name)
    try:
        return _validate_strict(merged, f"variants.{name}: ")
    except ValidationError as e:
        raise ConfigError(format_errors(e, f"variants.{name}: ")) from None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    # Variant tables may be written nested ({robust = {rule = "x"}}) or dotted ("robust.rule").
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key.split(".")[-1] not in ("params",):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load(
    path: Path | None, overrides: Sequence[str] = (), variants: Sequence[str] = ()
) -> ExperimentConfig:
    """The experiment at ``path`` (the embedded default when None) with ``--set`` overrides,
    restricted to the ``--variant`` names in ``variants`` (see :func:`select_variants`)."""
    raw = parse_toml(default_config_text(), "default config") if path is None else read_toml(path)
    pairs = dict(parse_override(o) for o in overrides)
    return select_variants(validate(apply_overrides(raw, pairs)), variants, pairs)


def select_variants(
    cfg: ExperimentConfig, names: Sequence[str] = (), overrides: Iterable[str] = ()
) -> ExperimentConfig:
    """Which runs an experiment makes, and how command-line overrides meet its variants.

    - No ``names``: every variant of the file runs (side by side); a file without variants is
      one run.
    - ``names``: only those variants run; ``base`` is the base experiment itself (the file with
      no variant applied), so ``--variant base`` runs a file's base alone and
      ``--variant base --variant mean`` runs it beside one variant.
    - An override (``--set key=value``) applies to the base and so to every variant, except
      where a selected variant sets the same key (or a table holding it) itself: the variant
      would silently undo the override, so that is an error naming the variants.
    """
    known = dict(cfg.variants)
    chosen = list(dict.fromkeys(names)) if names else list(known)
    unknown = [n for n in chosen if n not in known and n != BASE_VARIANT]
    if unknown:
        valid = ", ".join([BASE_VARIANT, *known])
        raise ConfigError([f"--variant {n}: no such variant; valid: {valid}" for n in unknown])
    problems = []
    for key in overrides:
        clash = [
            n for n in chosen
            if any(_overlaps(canonical_key(key), canonical_key(v)) for v in _flatten(known.get(n, {})))
        ]
        if clash:
            problems.append(
                f"--set {key}: variant(s) {', '.join(clash)} set {key} themselves, so the override "
                "would not reach them; select other runs with --variant NAME "
                f"(--variant {BASE_VARIANT} runs the base experiment) or drop the override"
            )
    if problems:
        raise ConfigError(problems)
    if chosen == [BASE_VARIANT]:
        return cfg.model_copy(update={"variants": {}})
    return cfg.model_copy(update={"variants": {n: known.get(n, {}) for n in chosen}})


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


# --- error formatting ----------------------------------------------------------------------


def format_errors(err: ValidationError, prefix: str = "") -> list[str]:
    return [line for e in err.errors() for line in error_lines(e, prefix)]


def error_lines(e: Any, prefix: str = "") -> list[str]:
    """The lines of one of pydantic's errors (one, or one per problem a validator found)."""
    loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"]).replace(".[", "[")
    key = loc or "config"
    typ = e["type"]
    if typ == "extra_forbidden":
        valid = _valid_keys(e["loc"][:-1])
        return [f"{prefix}{key}: unknown key; valid keys here: {', '.join(valid)}"]
    if typ == "value_error":
        error = e.get("ctx", {}).get("error", e["msg"])
        return [problem_line(msg, key, prefix) for msg in getattr(error, "problems", None) or [str(error)]]
    got = e.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return [f"{prefix}{key}: {e['msg']}{shown}"]


def problem_line(msg: str, key: str = "config", prefix: str = "") -> str:
    """One ``error:`` line: ``msg`` as it is where it names its key, else after ``key``."""
    return f"{prefix}{msg}" if _names_key(msg) else f"{prefix}{key}: {msg}"


def _names_key(msg: str) -> bool:
    # Cross-field validators name their keys themselves ("clients.sample_size ...").
    head = msg.split(" ", 1)[0].split(":", 1)[0]
    return "." in head and head.split(".")[0] in ExperimentConfig.model_fields


def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = ExperimentConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args] + [a for x in args for a in getattr(x, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(model.model_fields)


def write_toml(path: Path, data: dict[str, Any]) -> None:
    Path(path).write_text(tomli_w.dumps(data))
