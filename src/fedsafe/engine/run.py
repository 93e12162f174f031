"""Running an experiment to a directory: variants side by side, resume, progress, summaries.

Run directories are fedsafe's own: each holds a marker file (:data:`MARKER`) written when
fedsafe created it, and ``--overwrite`` only ever replaces a marked directory, deleting only the
files fedsafe writes (:data:`RUN_FILES`) and marked sub-directories (variants). A directory that
holds anything else is refused with the names of the foreign entries. Every check — the config,
the data, each rule's requirement on n and f, each protocol's preflight — runs before the output
directory is touched, so a refused experiment writes nothing at all.
"""

from __future__ import annotations

import errno
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from fedsafe import __version__
from fedsafe.config import ExperimentConfig, read_toml, validate, variant_config
from fedsafe.core.errors import ConfigError, RunDirError
from fedsafe.engine.federation import Federation
from fedsafe.engine.metrics import METRICS, SUMMARY, write_summary
from fedsafe.engine.state import CHECKPOINT, CHECKPOINT_TMP
from fedsafe.models.saved import MODEL, MODEL_META

CONFIG = "config.toml"
MARKER = ".fedsafe-run"
# Everything fedsafe writes into a run directory (the audit's files included).
RUN_FILES = frozenset({
    MARKER, CONFIG, METRICS, SUMMARY, CHECKPOINT, CHECKPOINT_TMP, MODEL, MODEL_META,
    "audit_cosines.npz", "audit_final.png", "audit_all.png",
})


FederationFactory = Callable[[ExperimentConfig, Path], Federation]


@dataclass
class Job:
    name: str
    cfg: ExperimentConfig
    out_dir: Path


def jobs(cfg: ExperimentConfig, out_dir: Path) -> list[Job]:
    """One job per variant (in sub-directories), or the experiment itself in ``out_dir``."""
    if not cfg.variants:
        return [Job(cfg.name, cfg, out_dir)]
    return [Job(name, variant_config(cfg, name), out_dir / name) for name in cfg.variants]


# --- the output directory ------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def _foreign(path: Path) -> list[str]:
    """Entries of a marked run directory that fedsafe did not write (recursively)."""
    out = []
    for entry in sorted(path.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and is_run_dir(entry):
            out += [f"{entry.name}/{x}" for x in _foreign(entry)]
        elif entry.name not in RUN_FILES or entry.is_dir() or entry.is_symlink():
            out.append(entry.name)
    return out


def _clear(path: Path) -> None:
    """Delete fedsafe's files in a marked run directory (checked by :func:`_foreign` first)."""
    for entry in path.iterdir():
        if entry.is_dir():
            _clear(entry)
            entry.rmdir()
        else:
            entry.unlink()


def prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Check that ``out_dir`` may receive a new run (nothing is written here)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RunDirError(f"--out {out_dir}: exists and is not a directory")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise RunDirError(
            f"--out {out_dir}: directory is not empty; use --resume {out_dir} to continue it, "
            "--overwrite to replace it, or another --out"
        )
    if not is_run_dir(out_dir):
        raise RunDirError(
            f"--out {out_dir}: not a run directory fedsafe created (no {MARKER} marker); "
            "refusing to overwrite it: choose another --out"
        )
    foreign = _foreign(out_dir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise RunDirError(
            f"--out {out_dir}: holds files fedsafe did not write ({shown}); refusing to overwrite "
            "it: move them away or choose another --out"
        )


def _make_run_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text(json.dumps({"fedsafe": __version__, "created": time.time()}) + "\n")


def describe_os_error(e: OSError, what: str) -> str:
    """One line for an OSError met while writing run outputs."""
    if e.errno == errno.ENOSPC:
        reason = "no space left on the device"
    elif e.errno in (errno.EACCES, errno.EPERM):
        reason = "permission denied"
    elif e.errno == errno.EROFS:
        reason = "read-only file system"
    elif e.errno == errno.ENOTDIR:
        reason = "a path component is a file, not a directory"
    else:
        reason = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename else ""
    return f"{what}: {reason}{where}"


def load_run_config(out_dir: Path) -> ExperimentConfig:
    path = out_dir / CONFIG
    if not path.is_file():
        raise ConfigError([f"--resume {out_dir}: no {CONFIG} there; not a fedsafe run directory"])
    return validate(read_toml(path))


# --- progress ------------------------------------------------------------------------------


class _Lines:
    """Progress as plain lines on a stream that is not a terminal: one per evaluation, flushed."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.t0 = time.perf_counter()

    def __call__(self, name: str, total_rounds: int, row: dict[str, Any]) -> None:
        acc = row.get("test_accuracy")
        if acc is None and row["round"] != total_rounds:
            return
        parts = [f"{name} round {row['round']}/{total_rounds}"]
        if acc is not None:
            parts.append(f"acc {100 * acc:.1f}% loss {row.get('test_loss', float('nan')):.4f}")
        if row.get("epsilon") is not None:
            parts.append(f"eps {row['epsilon']:.3g}")
        if row.get("skipped"):
            parts.append(f"skipped: {row['skipped']}")
        parts.append(f"{time.perf_counter() - self.t0:.1f}s")
        print("  ".join(parts), file=self.stream, flush=True)


# --- running -------------------------------------------------------------------------------


def build_federations(
    cfg: ExperimentConfig, out_dir: Path, *, resume: bool, federation: FederationFactory | None = None
) -> list[tuple[Job, Federation | None]]:
    """Every job's federation, built (data loaded, rules and protocols checked) before any
    output is written, by ``federation(job_cfg, job_out_dir)`` (default: ``Federation`` of the
    config alone); finished jobs of a resumed run get None."""
    make = federation or (lambda job_cfg, job_dir: Federation(job_cfg, out_dir=job_dir))
    feds: list[tuple[Job, Federation | None]] = []
    try:
        for job in jobs(cfg, out_dir):
            if resume and (job.out_dir / SUMMARY).is_file():
                feds.append((job, None))
                continue
            fed = make(job.cfg, job.out_dir)
            feds.append((job, fed))
            if resume and (job.out_dir / CHECKPOINT).exists():
                fed.restore()
    except BaseException:
        for _, fed in feds:
            if fed is not None:
                fed.close()
        raise
    return feds


def run_experiment(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    console: Console | None = None,
    on_round: Callable[[str, dict[str, Any]], None] | None = None,
    federation: FederationFactory | None = None,
) -> dict[str, dict[str, Any]]:
    """Run (or resume) every job of ``cfg`` under ``out_dir``; returns summaries by job name.
    ``federation(job_cfg, job_out_dir)`` builds each job's :class:`Federation` (the Python
    API passes a user's model, data and loss this way).

    Raises :class:`ConfigError` for a config that cannot run and :class:`RunDirError` for an
    output directory that cannot be used or written (nothing is written in either case, except
    for a disk that fills up mid-run); ``on_round(job_name, row)`` is called after every round.
    """
    out_dir = Path(out_dir)
    if not resume:
        prepare_out_dir(out_dir, overwrite)
    feds = build_federations(cfg, out_dir, resume=resume, federation=federation)
    try:
        if not resume:
            try:
                if out_dir.exists():
                    _clear(out_dir)
                _make_run_dir(out_dir)
                (out_dir / CONFIG).write_text(cfg.to_toml())
                for job, _ in feds:
                    if job.out_dir != out_dir:
                        _make_run_dir(job.out_dir)
                        (job.out_dir / CONFIG).write_text(job.cfg.to_toml())
            except OSError as e:
                raise RunDirError(describe_os_error(e, f"--out {out_dir}: cannot write")) from None
        for job, fed in feds:
            if fed is not None and fed.state.round == 0 and (job.out_dir / METRICS).exists():
                (job.out_dir / METRICS).unlink()  # started but never checkpointed: start over
        return _run_jobs(cfg, out_dir, feds, quiet=quiet, console=console, on_round=on_round)
    finally:
        for _, fed in feds:
            if fed is not None:
                fed.close()


def _run_jobs(
    cfg: ExperimentConfig,
    out_dir: Path,
    feds: list[tuple[Job, Federation | None]],
    *,
    quiet: bool,
    console: Console | None,
    on_round: Callable[[str, dict[str, Any]], None] | None,
) -> dict[str, dict[str, Any]]:
    summaries: dict[str, dict[str, Any]] = {}
    for job, fed in feds:
        if fed is None:
            summaries[job.name] = json.loads((job.out_dir / SUMMARY).read_text())
    console = console or Console(stderr=True)
    total = sum(j.cfg.rounds - (f.state.round if f else j.cfg.rounds) for j, f in feds)
    lines = None if quiet or console.is_terminal else _Lines(console.file if console.file is not None else sys.stderr)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[acc]}"),
        TimeRemainingColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
        transient=True,
    ) as progress:
        task = progress.add_task("fedsafe", total=total, acc="")
        for job, fed in feds:
            if fed is None:
                continue

            def tick(row: dict[str, Any], job: Job = job) -> None:
                acc = row.get("test_accuracy")
                shown = f"acc {100 * acc:.1f}%" if acc is not None else ""
                progress.update(task, advance=1, description=f"{job.name} round {row['round']}", acc=shown)
                if lines is not None:
                    lines(job.name, job.cfg.rounds, row)
                if on_round is not None:
                    on_round(job.name, row)

            try:
                summary = fed.run(tick)
                fed.save_model(job.out_dir)
                write_summary(job.out_dir, summary)
            except OSError as e:
                raise RunDirError(describe_os_error(e, f"{job.out_dir}: cannot write run outputs")) from None
            summaries[job.name] = summary
    if cfg.variants:
        write_summary(out_dir, {"variants": {j.name: summaries[j.name] for j, _ in feds}})
    return {j.name: summaries[j.name] for j, _ in feds}


def last_checkpoint_round(out_dir: Path, cfg: ExperimentConfig) -> dict[str, int]:
    """Rounds completed by each job's last checkpoint (0 where none), for resume hints."""
    from fedsafe.engine.state import checkpoint_round

    return {job.name: checkpoint_round(job.out_dir) for job in jobs(cfg, Path(out_dir))}
