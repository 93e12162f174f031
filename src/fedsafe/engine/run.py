"""Running an experiment to a directory: variants side by side, resume, progress, summaries.

Run directories are fedsafe's own: each holds a marker file (:data:`MARKER`) written when
fedsafe created it, and ``--overwrite`` only ever replaces a marked directory, deleting only the
files fedsafe writes (:data:`RUN_FILES`) and its marked sub-directories (variants, a report
written into it). A directory that holds anything else — any other name, any symbolic link — is
refused with the names of the foreign entries, and nothing is deleted through a link. Every
check — the config, the data, each rule's requirement on n and f, each protocol's preflight —
runs before the output directory is touched, so a refused experiment writes nothing at all; the
directory is checked again, under its lock (:class:`~fedsafe.engine.outdir.DirLock`, one
fedsafe process per run directory), right before anything in it is replaced.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
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
from fedsafe.core.errors import ConfigError, FedsafeError, RunDirError
from fedsafe.engine.federation import Federation
from fedsafe.engine.metrics import METRICS, SUMMARY, write_summary
from fedsafe.engine.outdir import (
    REPORT,
    DirLock,
    OutputKind,
    clear,
    describe_os_error,
    entries,
    foreign,
    lock_holder,
    shown,
)
from fedsafe.engine.state import CHECKPOINT, CHECKPOINT_TMP
from fedsafe.models.saved import MODEL, MODEL_META

CONFIG = "config.toml"
MARKER = ".fedsafe-run"
# Everything fedsafe writes into a run directory (the audit's files included).
RUN_FILES = frozenset({
    MARKER, CONFIG, METRICS, SUMMARY, CHECKPOINT, CHECKPOINT_TMP, MODEL, MODEL_META,
    "audit_cosines.npz", "audit_final.png", "audit_all.png",
    "crfl_certificate.csv",  # CRFL's per-input certificate (fedsafe.robust.crfl)
})
#: A run directory: RUN_FILES, variants (run directories) and reports written into it.
RUN = OutputKind("run", MARKER, RUN_FILES, children=(REPORT,), nests=True)


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
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and RUN.owns(path)


def _foreign(path: Path) -> list[str]:
    """Entries of a marked run directory that fedsafe did not write (recursively)."""
    return foreign(path, RUN)


def _clear(path: Path) -> None:
    """Delete fedsafe's own entries of a marked run directory: its files and marked
    sub-directories, never through a symbolic link, never anything else (checked by
    :func:`_foreign` first, under the directory's lock)."""
    clear(path, RUN)


def prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Check that ``out_dir`` may receive a new run (nothing is written here)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RunDirError(f"--out {out_dir}: exists and is not a directory")
    holder = lock_holder(out_dir) if out_dir.is_dir() else None
    if holder is not None:
        raise RunDirError(f"--out {out_dir}: in use by {holder}; wait for it to finish or choose another --out")
    if not out_dir.exists() or not entries(out_dir):
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
    found = _foreign(out_dir)
    if found:
        raise RunDirError(
            f"--out {out_dir}: holds files fedsafe did not write ({shown(found)}); refusing to overwrite "
            "it: move them away or choose another --out"
        )


def _make_run_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text(json.dumps({"fedsafe": __version__, "created": time.time()}) + "\n")


def load_run_config(out_dir: Path) -> ExperimentConfig:
    path = out_dir / CONFIG
    if not path.is_file():
        raise ConfigError([f"--resume {out_dir}: no {CONFIG} there; not a fedsafe run directory"])
    return validate(read_toml(path))


# --- progress ------------------------------------------------------------------------------


class ProgressLines:
    """Progress as plain lines on a stream that is not a terminal, flushed: one per evaluation
    and the last round, or one per round with ``every_round`` (fedsafe's Flower ServerApp, whose
    rounds take seconds and whose stdout is the run's log)."""

    def __init__(self, stream: Any, *, every_round: bool = False) -> None:
        self.stream = stream
        self.every_round = every_round
        self.t0 = time.perf_counter()

    def __call__(self, name: str, total_rounds: int, row: dict[str, Any]) -> None:
        acc = row.get("test_accuracy")
        if acc is None and row["round"] != total_rounds and not self.every_round:
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


class RunStopped(FedsafeError):
    """The run stopped part-way for a reason outside its config — the Ray cluster failed — and
    can go on from its last checkpoint: ``fedsafe run --resume out_dir``."""

    def __init__(self, problem: str, out_dir: Path, cfg: ExperimentConfig) -> None:
        super().__init__(problem)
        self.out_dir = Path(out_dir)
        self.cfg = cfg


def resume_hint(out_dir: Path, cfg: ExperimentConfig) -> str:
    """``last checkpoint: name: round N; continue with: fedsafe run --resume DIR``."""
    try:
        done = last_checkpoint_round(out_dir, cfg)
    except Exception:  # noqa: BLE001 - a hint must never hide the error it goes with
        done = {}
    where = ", ".join(f"{name}: round {r}" for name, r in done.items() if r) or "none yet"
    return f"last checkpoint: {where}; continue with: fedsafe run --resume {out_dir}"


def _ray_error(e: BaseException) -> bool:
    """Whether ``e`` is one of Ray's errors (without importing Ray: if it is not imported, no
    Ray error can have been raised)."""
    exc = sys.modules.get("ray.exceptions")
    return exc is not None and isinstance(e, getattr(exc, "RayError", ()))


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
    for a disk that fills up mid-run), or that another fedsafe process is writing (its lock is
    held: the error names the holder's pid, host and start time); :class:`RunStopped` when the
    Ray cluster fails mid-run. ``on_round(job_name, row)`` is called after every round.

    With ``execution = "ray"``, a thread watches this machine's raylet: Ray ends the process
    (status 1, silently) some seconds after the raylet dies, so when it is gone the watch
    prints an ``error:`` line and the resume command to stderr and ends the process itself.
    """
    out_dir = Path(out_dir)
    flag = "--resume" if resume else "--out"
    with ExitStack() as stack:
        if resume:  # one process per run: the lock comes before the checkpoint is read
            _lock(stack, out_dir, flag)
        else:
            prepare_out_dir(out_dir, overwrite)
        feds = build_federations(cfg, out_dir, resume=resume, federation=federation)
        stack.callback(_close, feds)
        if not resume:
            # Data loading took a while: check again, under the lock, right before replacing.
            _lock(stack, out_dir, flag)
            prepare_out_dir(out_dir, overwrite)
            try:
                _clear(out_dir)
                _make_run_dir(out_dir)
                (out_dir / CONFIG).write_text(cfg.to_toml())
                for job, _ in feds:
                    if job.out_dir != out_dir:
                        _make_run_dir(job.out_dir)
                        (job.out_dir / CONFIG).write_text(job.cfg.to_toml())
            except RunDirError:
                raise
            except OSError as e:
                raise RunDirError(describe_os_error(e, f"--out {out_dir}: cannot write")) from None
        for job, fed in feds:
            if fed is not None and fed.state.round == 0 and (job.out_dir / METRICS).exists():
                (job.out_dir / METRICS).unlink()  # started but never checkpointed: start over
        if any(job.cfg.execution == "ray" for job, fed in feds if fed is not None):
            watch = RayWatch.for_this_node(lambda where: _ray_lost(where, out_dir, cfg))
            if watch is not None:
                watch.start()
                stack.callback(watch.stop)
        try:
            return _run_jobs(cfg, out_dir, feds, quiet=quiet, console=console, on_round=on_round)
        except Exception as e:
            if _ray_error(e):
                first = (str(e).strip().splitlines() or [""])[0]
                raise RunStopped(f"{out_dir}: Ray failed ({type(e).__name__}: {first})", out_dir, cfg) from None
            raise
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow


def _lock(stack: ExitStack, out_dir: Path, flag: str) -> None:
    try:
        stack.enter_context(DirLock(out_dir, flag, "run"))
    except RunDirError:
        raise
    except OSError as e:
        raise RunDirError(describe_os_error(e, f"{flag} {out_dir}: cannot write")) from None


def _close(feds: list[tuple[Job, Federation | None]]) -> None:
    for _, fed in feds:
        if fed is not None:
            fed.close()


# --- when Ray's raylet dies ----------------------------------------------------------------


def _ray_lost(where: str, out_dir: Path, cfg: ExperimentConfig) -> None:
    # Ray ends this process with status 1 and no word a few seconds after its node's raylet
    # died (its C++ core calls _Exit); say what happened and how to go on first.
    print(
        f"error: {out_dir}: Ray failed: this machine's raylet ({where}) is gone, and Ray ends this "
        f"process without it\n{resume_hint(out_dir, cfg)}",
        file=sys.stderr, flush=True,
    )
    os._exit(1)


class RayWatch(threading.Thread):
    """Watches the raylet of the node this process is a Ray driver on: when its port refuses
    ``misses`` connections in a row (``interval`` seconds apart), ``on_lost("host:port")`` is
    called once. Ray itself ends the driver's process silently (status 1) some seconds after
    the raylet dies, before any Python error could be raised; this says why first."""

    def __init__(self, host: str, port: int, on_lost: Callable[[str], None], *,
                 interval: float = 1.0, misses: int = 2) -> None:
        super().__init__(name="fedsafe-ray-watch", daemon=True)
        self.host, self.port, self.on_lost = host, int(port), on_lost
        self.interval, self.misses = interval, misses
        self._stop_event = threading.Event()

    @classmethod
    def for_this_node(cls, on_lost: Callable[[str], None]) -> RayWatch | None:
        """A watch of this driver's raylet, or None when Ray is not initialised or does not
        say where the raylet listens."""
        ray = sys.modules.get("ray")
        try:
            if ray is None or not ray.is_initialized():
                return None
            node_id = ray.get_runtime_context().get_node_id()
            node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
        except Exception:  # noqa: BLE001 - the watch is an addition; Ray's own errors surface elsewhere
            return None
        if not node or not node.get("NodeManagerAddress") or not node.get("NodeManagerPort"):
            return None
        return cls(node["NodeManagerAddress"], node["NodeManagerPort"], on_lost)

    def run(self) -> None:
        missed = 0
        while not self._stop_event.wait(self.interval):
            try:
                with socket.create_connection((self.host, self.port), timeout=max(1.0, 2 * self.interval)):
                    missed = 0
            except ConnectionRefusedError:  # nothing listens there any more
                missed += 1
            except OSError:  # slow or unreachable for a moment: not evidence that it is gone
                continue
            if missed >= self.misses and not self._stop_event.is_set():
                self.on_lost(f"{self.host}:{self.port}")
                return

    def stop(self) -> None:
        self._stop_event.set()


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
    lines = None if quiet or console.is_terminal else ProgressLines(console.file if console.file is not None else sys.stderr)
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
