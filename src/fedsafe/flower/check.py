"""What fedsafe's two Flower paths refuse, found before anything runs: ``fedsafe check --flower``
(fedsafe's ServerApp and ClientApp, :func:`fedsafe.flower.server_app`) and ``fedsafe check
--flower-strategy`` (:class:`fedsafe.flower.FedsafeStrategy` in your own Flower project).

:class:`~fedsafe.flower.strategy.FedsafeStrategy` refuses with the functions here
(:func:`algorithm_problem`, :func:`config_problems`, :func:`pipeline_problem`), so the check and
the strategy say the same thing. Nothing here imports Flower.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedsafe.config import ConfigError, ExperimentConfig, apply_overrides
from fedsafe.engine.check import CheckResult, Job, _touches, _unique, read_raw, validate_all

#: What the ServerApp's own refusals (fedsafe.flower.server.check_config) read.
_APP_READS = ("protocol", "secagg", "attack", "audit", "clients.num_clients")


def app_problems(cfg: ExperimentConfig, jobs: list[Job], replaced: set[str], *, nodes: int | None = None) -> list[str]:
    """What fedsafe's ServerApp refuses of ``cfg`` (its variants: the ``jobs`` that validated
    cleanly) beyond ``fedsafe run``'s checks, and ``nodes`` SuperNodes against its clients.
    ``replaced``: the keys of the experiment set back to their defaults (their checks are left
    out)."""
    from fedsafe.flower.server import check_config

    clean = {job.name for job in jobs if job.prefix and job.clean}
    cfg = cfg.model_copy(update={"variants": {n: over for n, over in cfg.variants.items() if n in clean}})
    try:
        check_config(cfg)
        lines: list[str] = []
    except ConfigError as e:
        lines = list(e.problems)
    replaced_of = {job.prefix: job.replaced for job in jobs if job.prefix}
    out = []
    for line in lines:
        prefix = next((p for p in replaced_of if line.startswith(p)), "")
        if not _touches(_APP_READS, replaced_of.get(prefix, replaced)):
            out.append(line)
    n = cfg.clients.num_clients
    if nodes is not None and nodes != n and not _touches(("clients.num_clients",), replaced):
        out.append(
            f"--nodes {nodes}: fedsafe's ServerApp needs one SuperNode per client (partition-id 0..{n - 1}), "
            f"and clients.num_clients = {n}"
        )
    return out


# --- FedsafeStrategy ---------------------------------------------------------------------------


def algorithm_problem(raw: Mapping[str, Any]) -> str | None:
    """FedsafeStrategy's messages are FedAvg's (model deltas): ``clients.algorithm`` must be
    unset or ``fedavg``."""
    clients = raw.get("clients", {})
    algorithm = clients.get("algorithm", "fedavg") if isinstance(clients, Mapping) else "fedavg"
    if algorithm == "fedavg":
        return None
    return (
        f"clients.algorithm = {algorithm!r}: your ClientApps send trained models, whose deltas are "
        "FedAvg's messages; leave it unset (fedavg)"
    )


def config_problems(cfg: ExperimentConfig) -> list[str]:
    """What of a valid config FedsafeStrategy cannot run."""
    problems = []
    if cfg.variants:
        problems.append("variants: a strategy runs one experiment; pick one with fedsafe.config.variant_config")
    if cfg.protocol != "plain":
        problems.append(
            f"protocol = {cfg.protocol!r} needs fedsafe's own ClientApp: use fedsafe.flower.server_app/client_app"
        )
    if cfg.clients.gradient != "backprop":
        problems.append("clients.gradient: zeroth-order clients need fedsafe's own ClientApp (fedsafe.flower.client_app)")
    if cfg.attack.name != "none" or cfg.attack.f:
        problems.append(
            "attack: with your own ClientApps the attackers are real clients; set robust.f to the number of "
            "Byzantine clients the rule must tolerate instead"
        )
    if cfg.dp.enabled and cfg.dp.unit == "example":
        problems.append(
            "dp.unit = 'example': DP-SGD runs inside each client's training, which your own ClientApps do; "
            "use dp.unit = 'client' (Flower's DP mods), or fedsafe's own ServerApp and ClientApp, which run it"
        )
    if cfg.crfl.enabled and cfg.crfl.certify:  # the clip and noise run in the strategy; certifying needs more
        problems.append(
            "crfl.certify: FedsafeStrategy holds neither the model nor test data, so it cannot certify the "
            "smoothed model; set crfl.certify = false (each round's clipping and noise still run), or use "
            "fedsafe's own ServerApp (fedsafe.flower.server_app), which certifies"
        )
    return problems


def pipeline_problem(pipeline: Any, rule: str) -> str | None:
    """A rule that needs what only fedsafe's engine has: a root dataset (FLTrust) or each
    client's history."""
    if pipeline.uses_server_update or pipeline.follows_clients:
        return f"robust.rule = {rule!r} needs fedsafe's own ServerApp (a root dataset or client histories)"
    return None


def check_strategy(path: Path | None, overrides: Sequence[str] = (), *, nodes: int | None = None) -> CheckResult:
    """Every problem of the experiment at ``path`` as FedsafeStrategy's config: what the
    strategy refuses when it is made and at its first round (its rule and round plugins), each
    rule's (n, f) requirement at the configured round size, and ``nodes`` SuperNodes against
    ``clients.num_clients``. The data, model and protocol are your Flower project's, so they are
    not checked."""
    try:
        raw, _ = read_raw(path, overrides)
    except ConfigError as e:
        return CheckResult(list(e.problems))
    problems = []
    problem = algorithm_problem(raw)
    if problem is not None:
        problems.append(problem)
    try:
        raw = apply_overrides(raw, {"clients.algorithm": "fedavg"})
    except ConfigError as e:
        return CheckResult(problems + list(e.problems))
    v = validate_all(raw)
    problems.extend(v.problems)
    result = CheckResult(problems)
    if v.cfg is None:
        return result
    cfg = v.cfg
    problems.extend(config_problems(cfg))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        problems.extend(_strategy_setup(cfg, v.replaced))
    n = cfg.clients.num_clients
    if nodes is not None and nodes < n and not _touches(("clients.num_clients",), v.replaced):
        problems.append(
            f"--nodes {nodes}: FedsafeStrategy's population is the first clients.num_clients = {n} nodes to connect"
        )
    result.problems = _unique(problems)
    result.warnings = _unique(str(w.message) for w in caught if issubclass(w.category, UserWarning))
    return result


def _strategy_setup(cfg: ExperimentConfig, replaced: set[str]) -> list[str]:
    """FedsafeStrategy's first round: its pipeline and round plugins (on a stand-in model: the
    plugins' plans do not depend on your model's size)."""
    import torch

    from fedsafe.core.plugins import make_plugins
    from fedsafe.core.randomness import RandomSource
    from fedsafe.engine.federation import check_pipeline_size
    from fedsafe.robust.pipeline import RobustPipeline

    problems: list[str] = []
    if not _touches(("robust", "attack.f", "seed"), replaced):
        try:
            pipeline = RobustPipeline(cfg.robust.rule, cfg.robust.params, [(p.name, p.params) for p in cfg.robust.pre],
                                      cfg.rule_f, cfg.seed)
        except ValueError as e:
            problems.append(f"robust: {e}")
        else:
            problem = pipeline_problem(pipeline, cfg.robust.rule)
            if problem is not None:
                problems.append(problem)
            elif not _touches(("clients",), replaced):
                try:
                    check_pipeline_size(cfg, pipeline)
                except ConfigError as e:
                    problems.extend(e.problems)
    if not _touches(("dp", "audit", "inherent", "clients", "rounds", "attack.f", "seed", "secure_randomness"), replaced):
        n = cfg.clients.num_clients
        try:
            make_plugins(cfg, RandomSource.for_run(cfg.seed, cfg.secure_randomness), torch.zeros(1), (1,) * n)
        except ConfigError as e:
            problems.extend(e.problems)
    return problems
