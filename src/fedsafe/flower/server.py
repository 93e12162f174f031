"""fedsafe's ServerApp: a fedsafe experiment run by fedsafe's engine, with Flower SuperNodes as
its clients.

The ServerApp runs :class:`fedsafe.engine.federation.Federation` itself: sampling, the
Byzantine emulation, the robust pre-aggregators and rule, central DP and its accountant, the
audit's canaries, the server optimizer, evaluation, metrics rows, checkpoints and the run
directory are the engine's, unchanged. Only the clients differ: each round's local work (and
the clients' DP clipping and noise) runs on the SuperNodes (:class:`~fedsafe.flower.nodes.
FlowerClientWork`), and ``protocol = "secagg"`` runs its client parties there too
(:class:`~fedsafe.flower.secagg.FlowerSecAgg`). With the same config and seed, a run over
Flower gives the model fedsafe's own engine gives (tested, for ``noise_seed = "experiment"``
where DP noise is drawn on the clients).

The experiment comes from ``server_app(config=...)`` or from the run config: ``fedsafe-config``
(a TOML path; a relative one is read from the ServerApp's working directory, else from
``app_dir``),
``fedsafe-set`` (``;``-separated ``section.key=value`` overrides), ``fedsafe-out`` (the run
directory, default ``runs/flower``), ``fedsafe-timeout`` (seconds the server waits for the
nodes' replies to one message, default 120), ``fedsafe-wait`` (seconds to wait for every
client's node to connect, default 120) and ``fedsafe-resume`` (true: continue the run in
``fedsafe-out`` from its last checkpoint, as ``fedsafe run --resume``; default false, which
starts the run directory afresh).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from fedsafe.config import ConfigError, ExperimentConfig, apply_overrides, parse_override, validate
from fedsafe.core.errors import FedsafeError
from fedsafe.flower.records import FlowerError

DEFAULT_OUT = "runs/flower"
PROTOCOLS = ("plain", "secagg")


def check_config(cfg: ExperimentConfig) -> None:
    """Refuse, before any node is contacted, what fedsafe cannot run over Flower (in the base
    experiment or any of its variants)."""
    from fedsafe.config import variant_config
    from fedsafe.flower.secagg import check_config as secagg_problems

    problems = []
    jobs = [("", cfg)] + [(f"variants.{name}: ", variant_config(cfg, name)) for name in cfg.variants]
    for where, job in jobs:
        if job.protocol not in PROTOCOLS:
            problems.append(
                f"{where}protocol = {job.protocol!r}: over Flower fedsafe runs {' and '.join(map(repr, PROTOCOLS))}; "
                "HE and the TEE still run in fedsafe's own engine"
            )
        if job.protocol == "secagg":
            problems.extend(where + p for p in secagg_problems(job))
        if job.clients.num_clients != cfg.clients.num_clients:
            problems.append(f"{where}every variant must keep clients.num_clients (one SuperNode per client)")
    if problems:
        raise ConfigError(problems)


def run_over_flower(
    cfg: ExperimentConfig,
    grid: Any,
    out_dir: str | Path,
    *,
    model: Any = None,
    loss: Any = None,
    timeout: float = 120.0,
    wait: float = 120.0,
    resume: bool = False,
    overwrite: bool = True,
    progress: TextIO | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``cfg`` (every variant) with the SuperNodes of ``grid`` as its clients; the run
    directory ``out_dir`` is the same as ``fedsafe run``'s. Returns the summaries by job name.
    ``progress``: a stream for a line per round (the ServerApp's is its stdout, which Flower
    sends to the run's log: ``flwr log``, ``fedsafe flower run``)."""
    from fedsafe.engine.run import ProgressLines, jobs, run_experiment
    from fedsafe.flower.nodes import Nodes

    for name, value in (("timeout", timeout), ("wait", wait)):
        if not value > 0:
            raise ConfigError([f"flower {name} must be > 0 seconds, got {value}"])
    check_config(cfg)
    nodes = Nodes(grid, cfg.clients.num_clients, timeout=timeout, wait=wait)

    def make(job_cfg: ExperimentConfig, job_dir: Path) -> Federation:
        return flower_federation(job_cfg, nodes, out_dir=job_dir, model=model, loss=loss)

    on_round = None
    if progress is not None:
        lines = ProgressLines(progress, every_round=True)
        rounds = {job.name: job.cfg.rounds for job in jobs(cfg, Path(out_dir))}
        on_round = lambda name, row: lines(name, rounds[name], row)  # noqa: E731
    summaries = run_experiment(cfg, Path(out_dir), resume=resume, overwrite=overwrite and not resume, quiet=True,
                               federation=make, on_round=on_round)
    if progress is not None:
        print(f"fedsafe: done; run directory {out_dir} on the ServerApp's machine", file=progress, flush=True)
    return summaries


def flower_federation(
    cfg: ExperimentConfig, nodes: Any, *, out_dir: Path | None = None, model: Any = None, loss: Any = None
) -> Any:
    """The engine's :class:`~fedsafe.engine.federation.Federation` for one job of ``cfg`` (no
    variants), with the clients of ``nodes`` (:class:`~fedsafe.flower.nodes.Nodes`)."""
    from fedsafe.engine.federation import Federation
    from fedsafe.flower.nodes import FlowerClientWork
    from fedsafe.flower.secagg import FlowerSecAgg

    secure = cfg.protocol == "secagg"
    fed = Federation(
        cfg, out_dir=out_dir, model=model, loss=loss,
        client_work=lambda c, backend, data: FlowerClientWork(c, backend, data, nodes, secure=secure),
        protocol=FlowerSecAgg(cfg.secagg, nodes) if secure else None,
    )
    fed.work.plugins = fed.plugins
    return fed


def _config(
    config: Any, run_config: Mapping[str, Any], overrides: Sequence[str], app_dir: Path | None
) -> ExperimentConfig:
    from fedsafe.api import raw_config

    if config is None:
        path = run_config.get("fedsafe-config")
        if path is None or not str(path):
            raise ConfigError([
                "no experiment: pass server_app(config=...) or set the run config's fedsafe-config to a TOML path"
            ])
        config = Path(str(path))
        if not config.is_absolute() and app_dir is not None and not config.is_file():
            config = app_dir / config
    raw = raw_config(config)
    items = list(overrides)
    extra = str(run_config.get("fedsafe-set", "")).strip()
    items += [s for s in (part.strip() for part in extra.split(";")) if s]
    return validate(apply_overrides(raw, dict(parse_override(o) for o in items)))


def _seconds(run_config: Mapping[str, Any], key: str, default: float) -> float:
    v = run_config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError([f"run config {key} = {v!r}: must be a number of seconds > 0"])
    return float(v)


def server_app(
    *,
    config: str | Path | Mapping[str, Any] | ExperimentConfig | None = None,
    overrides: Sequence[str] = (),
    out_dir: str | Path | None = None,
    model: Any = None,
    loss: Any = None,
    app_dir: str | Path | None = None,
) -> Any:
    """fedsafe's Flower ``ServerApp`` running an experiment (see the module docstring).

    ``config``: a TOML path, a dict or an ExperimentConfig (None: the run config's
    ``fedsafe-config``); ``overrides``: ``section.key=value`` items; ``out_dir``: the run
    directory (None: the run config's ``fedsafe-out``, else ``runs/flower``); ``model``/``loss``:
    your own ``nn.Module`` and loss (give the ClientApp the same ones); ``app_dir``: where a
    relative ``fedsafe-config`` is found when it is not in the working directory (your app's
    directory: ``Path(__file__).parent``).
    """
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        try:
            _main(grid, context)
        except FedsafeError as e:  # the run's log ends with the problem in a line of its own
            for line in e.problems:
                print(f"error: {line}", flush=True)
            raise

    def _main(grid: Any, context: Any) -> None:
        rc = context.run_config
        cfg = _config(config, rc, overrides, None if app_dir is None else Path(app_dir))
        out = Path(out_dir if out_dir is not None else str(rc.get("fedsafe-out", DEFAULT_OUT)))
        resume = rc.get("fedsafe-resume", False)
        if not isinstance(resume, bool):
            raise ConfigError([f"run config fedsafe-resume = {resume!r}: must be true or false"])
        run_over_flower(
            cfg, grid, out, model=model, loss=loss,
            timeout=_seconds(rc, "fedsafe-timeout", 120.0), wait=_seconds(rc, "fedsafe-wait", 120.0),
            resume=resume, progress=sys.stdout,
        )

    return app


__all__ = ["FlowerError", "check_config", "flower_federation", "run_over_flower", "server_app"]
