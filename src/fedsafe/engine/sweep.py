"""Grid sweeps: the cartesian product of ``--grid key=v1,v2,...`` over a base experiment.

Every run is an ordinary run in its own directory, so a sweep is resumable (finished runs whose
resolved config matches are reused) and each run can be inspected with ``fedsafe report``.
Cells are validated before any work starts: a typo fails the whole sweep; a cell whose rule
cannot run at its size (e.g. Krum with n < 2f + 3) is recorded as not applicable, with the
reason, and the sweep goes on.

With ``seeds = N`` every cell runs N times, with seeds s, s+1, ..., s+N-1 where s is the cell's
own ``seed`` (the base config's unless ``seed`` is a grid axis), and the cell reports the mean
and the sample standard deviation (ddof = 1) over the seeds that produced an accuracy.

Directory names: ``key=value`` per axis, joined by ``__``. A value that is a plain word or
number (letters, digits, ``. _ + -``) is written as it is; any other value (a list, a table, a
string with spaces or quotes) is written as a slug of the words in it followed by ``-`` and the
first 8 hex digits of the SHA-256 of its canonical JSON (``robust.pre=nnm-bucketing-c9a10bb3``,
``robust.pre=empty-4f53cda1`` for ``[]``), which keeps the name readable and unique; plain
values that would collide (``1`` and ``"1"``) get the hash too. A name longer than 100
characters is cut and ends with the hash of the full name.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsafe.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    parse_override,
    parse_toml,
    read_toml,
    validate,
)
from fedsafe.core.errors import RunDirError
from fedsafe.engine.metrics import SUMMARY
from fedsafe.engine.outdir import REPORT, DirLock, OutputKind, check_folder, clear, entries, foreign, lock_holder
from fedsafe.data.loader import shared_loads
from fedsafe.engine.run import CONFIG, RUN, describe_os_error, is_run_dir, prepare_out_dir, run_experiment

SWEEP_CSV = "sweep.csv"
SEEDS_CSV = "sweep_seeds.csv"
BEST_CSV = "best_worst_case.csv"
WORST_CSV = "worst_case.csv"
GRID_JSON = "grid.json"
SWEEP_MARKER = ".fedsafe-sweep"
#: Every file fedsafe writes at the top of a sweep folder (the CLI's figures included).
SWEEP_FILES = frozenset({
    SWEEP_MARKER, GRID_JSON, SWEEP_CSV, SEEDS_CSV, BEST_CSV, WORST_CSV, "best_worst_case.png", "heatmap.png", "heatmap_asr.png",
})


def _seed_layout(path: Path) -> bool:
    # A cell run with several seeds: ``<cell>/seed=<s>/``, each a run directory.
    found = entries(path)
    return bool(found) and all(e.name.startswith("seed=") and is_run_dir(e) for e in found)


#: A sweep folder: SWEEP_FILES, its cells (run directories, or folders of per-seed run
#: directories) and reports written into it.
SWEEP = OutputKind("sweep", SWEEP_MARKER, SWEEP_FILES, children=(
    RUN, OutputKind("cell", "", frozenset(), children=(RUN,), recognise=_seed_layout), REPORT,
))


def _legacy_sweep(path: Path) -> bool:
    # A sweep written before folders were marked: its grid.json, and nothing fedsafe did not write.
    grid = path / GRID_JSON
    return grid.is_file() and not grid.is_symlink() and not foreign(path, SWEEP)


@contextmanager
def sweep_folder(out_dir: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Hold ``out_dir`` as this process's sweep folder: refuse one another fedsafe process is
    writing, or a non-empty folder that is not a sweep fedsafe wrote (unless ``overwrite``:
    then only fedsafe's own outputs in it are replaced); with ``overwrite``, fedsafe's own
    outputs (files and cells) are removed first, so no cell is reused. Re-entrant."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise RunDirError(f"--out {out_dir}: exists and is not a directory")
    holder = lock_holder(out_dir) if out_dir.is_dir() else None
    if holder is not None:  # before anything is created
        raise RunDirError(f"--out {out_dir}: in use by {holder}; wait for it to finish or choose another --out")
    check_folder(out_dir, SWEEP, "--out", overwrite=overwrite, legacy=_legacy_sweep)
    try:
        with DirLock(out_dir, "--out", "sweep"):
            check_folder(out_dir, SWEEP, "--out", overwrite=overwrite, legacy=_legacy_sweep)  # under the lock
            if overwrite:
                clear(out_dir, SWEEP)
            marker = out_dir / SWEEP_MARKER
            if not marker.is_file():
                marker.write_text(json.dumps({"fedsafe": "sweep", "created": time.time()}) + "\n")
            yield out_dir
    except RunDirError:
        raise
    except OSError as e:
        raise RunDirError(describe_os_error(e, f"--out {out_dir}: cannot write")) from None

#: Axes that define the scenario a rule is judged in, never tuned: the rule, the declared and
#: actual number of Byzantine clients, and the seed.
GROUP_KEYS = ("robust.rule", "robust.f", "attack.f", "seed")

_PLAIN = re.compile(r"[A-Za-z0-9._+-]+")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SLUG_MAX = 40
# Per-seed runs are named ``<cell>__seed=<s>``; 100 + 7 + 20 digits stays within the
# 128 characters a run name may have.
_NAME_MAX = 100


# --- values: parsing, display, directory names --------------------------------------------


def split_values(raw: str) -> list[str]:
    """Split ``v1,v2,...`` at the commas outside brackets, braces and quotes, so that
    ``[],["nnm","bucketing"]`` is two values and ``{tau=1, iters=2}`` one."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(raw):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(raw[start:i])
            start = i + 1
    items.append(raw[start:])
    return [s.strip() for s in items if s.strip()]


def canonical(value: Any) -> str:
    """A value's identity: canonical JSON, so that ``1`` and ``"1"`` differ and key order of a
    table does not matter (values read from TOML are JSON-compatible; dates become strings)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def toml_value(value: Any) -> str:
    """One-line TOML text of a value: what ``--set`` / ``--grid`` read back as the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = (k if _BARE_KEY.fullmatch(k) else json.dumps(k) for k in value)
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in zip(keys, value.values())) + "}"
    return str(value)


def format_value(value: Any) -> str:
    """How a grid value is shown in labels and CSV cells: a string or number as itself, a list
    or table as one-line TOML."""
    return value if isinstance(value, str) else str(value) if isinstance(value, (int, float)) else toml_value(value)


def _hash8(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()[:8]


def _plain(value: Any) -> str | None:
    # str(), not TOML, for scalars: the names sweeps have always used (``attack.f=1``).
    if isinstance(value, (str, int, float)):
        text = str(value)
        if _PLAIN.fullmatch(text) and ".." not in text and len(text) <= _SLUG_MAX:
            return text
    return None


def _words(value: Any) -> str:
    # The readable part of a slug: the values, with the keys of tables, except the structural
    # ``name`` / ``params`` of a pre-aggregator spec ({name = "bucketing", params = {s = 2}}
    # reads "bucketing-s-2").
    if isinstance(value, (list, tuple)):
        return "-".join(_words(v) for v in value)
    if isinstance(value, dict):
        return "-".join(_words(v) if k in ("name", "params") else f"{k}-{_words(v)}" for k, v in value.items())
    return str(value)


def value_slug(value: Any) -> str:
    """A value's part of a directory name: itself when plain, else a slug plus a hash."""
    plain = _plain(value)
    if plain is not None:
        return plain
    text = re.sub(r"[^A-Za-z0-9._+-]+", "-", _words(value))
    text = re.sub(r"\.{2,}", ".", text).strip("-._")[:_SLUG_MAX].rstrip("-._")
    return f"{text or 'empty'}-{_hash8(value)}"


def axis_slugs(values: Sequence[Any]) -> list[str]:
    """Slugs of one axis's values, made unique: plain values that collide get the hash."""
    slugs = [value_slug(v) for v in values]
    counts = Counter(slugs)
    return [f"{s}-{_hash8(v)}" if counts[s] > 1 and s == _plain(v) else s for s, v in zip(slugs, values)]


@dataclass(frozen=True)
class Cell:
    assignment: tuple[tuple[str, Any], ...]  # (dotted key, value) per grid axis
    dirname: str


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["attack.f=1,2", "robust.rule=mean,median"]`` → {key: [values]} (TOML-typed values;
    commas inside ``[...]``, ``{...}`` and quotes belong to the value)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, _, raw = item.partition("=")
        if not raw:
            raise ConfigError([f"--grid {item!r}: expected section.key=v1,v2,..."])
        key = key.strip()
        if key in grid:
            raise ConfigError([f"--grid {key}: given twice"])
        values = [parse_override(f"{key}={v}")[1] for v in split_values(raw)]
        if not values:
            raise ConfigError([f"--grid {item!r}: no values"])
        seen = Counter(canonical(v) for v in values)
        twice = [format_value(v) for v in values if seen.pop(canonical(v), 0) > 1]
        if twice:
            raise ConfigError([f"--grid {key}: value {', '.join(twice)} given twice"])
        grid[key] = values
    if not grid:
        raise ConfigError(["sweep needs at least one --grid section.key=v1,v2,..."])
    return grid


def cells(grid: dict[str, list[Any]]) -> list[Cell]:
    keys = list(grid)
    slugs = {k: dict(zip(map(canonical, grid[k]), axis_slugs(grid[k]))) for k in keys}
    out = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        name = "__".join(f"{k}={slugs[k][canonical(v)]}" for k, v in zip(keys, combo))
        if len(name) > _NAME_MAX:
            name = f"{name[:_NAME_MAX - 9].rstrip('-._')}-{_hash8(name)}"
        out.append(Cell(tuple(zip(keys, combo)), name))
    return out


def cell_configs(base_raw: dict[str, Any], grid: dict[str, list[Any]]) -> list[tuple[Cell, ExperimentConfig]]:
    """Validate every cell up front; ConfigError lists every problem of every cell."""
    out, problems = [], []
    for cell in cells(grid):
        raw = apply_overrides(base_raw, dict(cell.assignment))
        raw["name"] = cell.dirname
        try:
            cfg = validate(raw)
        except ConfigError as e:
            problems.extend(f"[{cell.dirname}] {p}" for p in e.problems)
            continue
        if cfg.variants:
            raise ConfigError(["sweep: the base config must not define variants"])
        out.append((cell, cfg))
    if problems:
        raise ConfigError(problems)
    return out


# --- seeds -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replicate:
    """One run of a cell: the cell's config with seed ``cell seed + i``."""

    cell: Cell
    seed: int
    cfg: ExperimentConfig


def replicates(pairs: list[tuple[Cell, ExperimentConfig]], seeds: int) -> list[Replicate]:
    if seeds < 1:
        raise ConfigError([f"--seeds {seeds}: must be at least 1"])
    out, problems = [], []
    for cell, cfg in pairs:
        for i in range(seeds):
            if seeds == 1:
                out.append(Replicate(cell, cfg.seed, cfg))
                continue
            seed = cfg.seed + i
            try:
                rep = validate({**cfg.to_dict(), "seed": seed, "name": f"{cell.dirname}__seed={seed}"})
            except ConfigError as e:
                problems.extend(f"[{cell.dirname}, seed {seed}] {p}" for p in e.problems)
                continue
            out.append(Replicate(cell, seed, rep))
    if problems:
        raise ConfigError(problems)
    return out


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, sample standard deviation with ddof = 1, count) of the values that are not None;
    the sd is None below two values, the mean None with none."""
    x = np.array([v for v in values if v is not None], dtype=float)
    if x.size == 0:
        return None, None, 0
    return float(x.mean()), (float(x.std(ddof=1)) if x.size > 1 else None), int(x.size)


# --- reuse --------------------------------------------------------------------------------


def _same_config(a: ExperimentConfig, b: ExperimentConfig) -> bool:
    # The name is the directory's business, not the experiment's.
    da, db = a.to_dict(), b.to_dict()
    da.pop("name", None)
    db.pop("name", None)
    return da == db


def finished_summary(run_dir: Path, cfg: ExperimentConfig) -> dict[str, Any] | None:
    """The summary of a finished run in ``run_dir`` whose resolved config is ``cfg`` (up to
    the name), else None: a run of an older base config is not reused."""
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
        done = validate(read_toml(run_dir / CONFIG))
    except (OSError, ValueError):  # missing, unreadable, or no longer a valid config
        return None
    return summary if _same_config(done, cfg) else None


def run_dir_for(cell_dir: Path, seed: int, seeds: int) -> Path:
    """Where a run goes: the cell's directory with one seed, ``<cell>/seed=<s>/`` with more
    (then ``fedsafe report <cell>`` overlays the seeds). A cell directory that already holds
    per-seed runs keeps that layout, so no run of another seed count is ever removed."""
    nested = cell_dir / f"seed={seed}"
    if seeds > 1 or (cell_dir.is_dir() and any(p.name.startswith("seed=") for p in cell_dir.iterdir())):
        return nested
    return cell_dir


def _locate(out_dir: Path, rep: Replicate, seeds: int) -> tuple[Path, dict[str, Any] | None]:
    cell_dir = out_dir / rep.cell.dirname
    # Either layout may hold a finished run of this seed (an earlier sweep with another count).
    for cand in (cell_dir / f"seed={rep.seed}", cell_dir):
        done = finished_summary(cand, rep.cfg)
        if done is not None:
            return cand, done
    target = run_dir_for(cell_dir, rep.seed, seeds)
    # Refuse a directory fedsafe may not replace now, before any cell runs (it writes nothing).
    prepare_out_dir(target, overwrite=True)
    return target, None


# --- progress -----------------------------------------------------------------------------


def eta_seconds(elapsed: float, ran: int, remaining: int) -> float | None:
    """Time left at the throughput so far (runs finished in this call per second of wall
    time, which accounts for ``--jobs``); None before the first run finishes."""
    return None if ran <= 0 else elapsed / ran * remaining


def _hms(seconds: float) -> str:
    h, rest = divmod(int(round(seconds)), 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


def progress_line(done: int, total: int, unit: str, eta: float | None) -> str:
    """``4/12 cells done, ETA 0:01:05`` (``ETA ?`` before any estimate; no ETA at the end)."""
    head = f"{done}/{total} {unit} done"
    if done >= total:
        return head
    return f"{head}, ETA {'?' if eta is None else _hms(eta)}"


@dataclass(frozen=True)
class Tick:
    """A progress event: the start of the sweep (``cell`` None) or one finished run."""

    cell: Cell | None
    seed: int | None
    result: dict[str, Any]
    done: int
    total: int
    reused: int
    unit: str
    eta: float | None

    @property
    def line(self) -> str:
        return progress_line(self.done, self.total, self.unit, self.eta)


# --- running ------------------------------------------------------------------------------


#: Modules imported before anything runs (``fedsafe --import``), recorded for worker processes.
IMPORT_ENV = "FEDSAFE_IMPORT"


def import_user_modules(names: Sequence[str]) -> None:
    """Import each module (found from the current directory too, as ``python -m`` would): a
    user's module that registers rules, attacks or datasets, so that configs can name them.
    The names are kept in the environment variable ``FEDSAFE_IMPORT``, which sweep workers
    read (a worker process started by spawn re-imports them). ImportError names the module."""
    import importlib
    import sys

    if not names:
        return
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the user's module: any failure is reported as an import error
            raise ImportError(f"--import {name}: {type(e).__name__}: {e}") from None
    have = [m for m in os.environ.get(IMPORT_ENV, "").split(",") if m]
    os.environ[IMPORT_ENV] = ",".join(dict.fromkeys([*have, *names]))


def _run_cell(cfg_toml: str, out_dir: str, threads: int) -> dict[str, Any]:
    # Runs in a worker process: one thread each, so parallel cells do not oversubscribe cores.
    torch.set_num_threads(threads)
    import_user_modules([m for m in os.environ.get(IMPORT_ENV, "").split(",") if m])
    cfg = validate(parse_toml(cfg_toml))
    try:
        return run_experiment(cfg, Path(out_dir), overwrite=True, quiet=True)[cfg.name]
    except ConfigError as e:
        return {"not_applicable": "; ".join(e.problems)}


def run_sweep(
    base_raw: dict[str, Any],
    grid: dict[str, list[Any]],
    out_dir: Path,
    *,
    jobs: int = 1,
    seeds: int = 1,
    overwrite: bool = False,
    on_cell: Callable[[Cell, dict[str, Any]], None] | None = None,
    on_progress: Callable[[Tick], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell ``seeds`` times (reusing finished runs unless ``overwrite``); write
    ``sweep.csv`` (one row per cell: mean and sd over seeds), ``sweep_seeds.csv`` (one row
    per run) and ``worst_case.csv`` (one row per setting: its worst case over the attack axes,
    :func:`worst_case`); return the cell records. ``out_dir`` must be empty, new, or a sweep folder fedsafe
    wrote (see :func:`sweep_folder`). ``on_cell(cell, result)`` is called after each run,
    ``on_progress(tick)`` at the start and after each run."""
    reps = replicates(cell_configs(base_raw, grid), seeds)
    out_dir = Path(out_dir)
    with sweep_folder(out_dir, overwrite=overwrite):
        return _run_sweep(reps, grid, out_dir, jobs=jobs, seeds=seeds, on_cell=on_cell, on_progress=on_progress)


def _run_sweep(
    reps: list[Replicate],
    grid: dict[str, list[Any]],
    out_dir: Path,
    *,
    jobs: int,
    seeds: int,
    on_cell: Callable[[Cell, dict[str, Any]], None] | None,
    on_progress: Callable[[Tick], None] | None,
) -> list[dict[str, Any]]:
    (out_dir / GRID_JSON).write_text(json.dumps(grid, indent=2) + "\n")
    results: dict[tuple[str, int], dict[str, Any]] = {}
    where: dict[tuple[str, int], Path] = {}
    pending: list[Replicate] = []
    for rep in reps:
        key = (rep.cell.dirname, rep.seed)
        where[key], done = _locate(out_dir, rep, seeds)
        if done is not None:
            results[key] = done
        else:
            pending.append(rep)

    unit = "cells" if seeds == 1 else "runs"
    reused, start = len(reps) - len(pending), time.monotonic()
    counter = {"done": reused}

    def tick(rep: Replicate | None, res: dict[str, Any]) -> None:
        ran = counter["done"] - reused
        eta = eta_seconds(time.monotonic() - start, ran, len(reps) - counter["done"])
        if on_progress:
            cell, seed = (None, None) if rep is None else (rep.cell, rep.seed)
            on_progress(Tick(cell, seed, res, counter["done"], len(reps), reused, unit, eta))

    def finish(rep: Replicate, res: dict[str, Any]) -> None:
        results[(rep.cell.dirname, rep.seed)] = res = {**res, "seed": rep.seed}
        counter["done"] += 1
        if on_cell:
            on_cell(rep.cell, res)
        tick(rep, res)

    tick(None, {})
    # One thread per parallel cell; in one process, the caller's torch setting (OMP_NUM_THREADS=1 keeps it at one)
    threads = 1 if jobs > 1 else max(1, torch.get_num_threads())
    args = [(rep.cfg.to_toml(), str(where[(rep.cell.dirname, rep.seed)]), threads) for rep in pending]
    if jobs > 1 and len(pending) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_run_cell, *a): rep for rep, a in zip(pending, args)}
            for fut in as_completed(futures):  # report runs as they finish, not in grid order
                finish(futures[fut], fut.result())
    else:
        with shared_loads():
            for rep, a in zip(pending, args):
                finish(rep, _run_cell(*a))

    runs, records = [], []
    for cell, group in itertools.groupby(reps, key=lambda r: r.cell):  # a cell's seeds are adjacent
        res = [(rep.seed, results[(cell.dirname, rep.seed)]) for rep in group]
        for seed, r in res:
            runs.append({**dict(cell.assignment), "seed": seed, "final_accuracy": r.get("final_accuracy"),
                         "best_accuracy": r.get("best_accuracy"),
                         "final_attack_success_rate": r.get("final_attack_success_rate"),
                         "not_applicable": r.get("not_applicable", ""),
                         "dir": where[(cell.dirname, seed)].relative_to(out_dir).as_posix()})
        finals = [r.get("final_accuracy") for _, r in res]
        final, final_sd, n = mean_sd(finals)
        best, best_sd, _ = mean_sd(r.get("best_accuracy") for _, r in res)
        asr, asr_sd, _ = mean_sd(r.get("final_attack_success_rate") for _, r in res)
        records.append({
            **dict(cell.assignment),
            "final_accuracy": final, "final_accuracy_sd": final_sd,
            "best_accuracy": best, "best_accuracy_sd": best_sd, "n_seeds": n,
            "final_attack_success_rate": asr, "final_attack_success_rate_sd": asr_sd,
            "seeds": [s for s, _ in res], "final_accuracy_seeds": finals,
            "not_applicable": next((r["not_applicable"] for _, r in res if r.get("not_applicable")), ""),
        })
    write_sweep_csv(out_dir / SWEEP_CSV, list(grid), records)
    _write_csv(out_dir / SEEDS_CSV, [*grid, "seed", "final_accuracy", "best_accuracy", "final_attack_success_rate",
                                     "not_applicable", "dir"], runs)
    write_worst_case_csv(out_dir / WORST_CSV, split_axes(list(grid)), worst_case(records, list(grid)))
    return records


SWEEP_COLUMNS = ("final_accuracy", "final_accuracy_sd", "best_accuracy", "best_accuracy_sd", "n_seeds",
                 "final_attack_success_rate", "final_attack_success_rate_sd", "not_applicable")


def write_sweep_csv(path: Path, keys: list[str], records: list[dict[str, Any]]) -> None:
    """One row per cell: the grid values, then the mean and sd over seeds of the final and
    best accuracy, the number of seeds that produced an accuracy, the mean and sd of the final
    attack success rate (backdoor attacks; empty otherwise), and the n/a reason."""
    _write_csv(path, [*keys, *SWEEP_COLUMNS], records)


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    return toml_value(v) if isinstance(v, (list, dict)) else v


def _write_csv(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    with Path(path).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_cell(r.get(k)) for k in fields})


# --- worst case over attacks, best over hyper-parameters ----------------------------------


@dataclass(frozen=True)
class Axes:
    """The grid axes by role: ``group`` (rule, f, seed and ``--per`` keys: one result each),
    ``attack`` (the other ``attack.*`` keys: the worst case is over these) and ``hyper`` (the
    rest, e.g. ``robust.params.*``, ``robust.pre``, ``server.lr``: the best is over these)."""

    group: list[str]
    attack: list[str]
    hyper: list[str]


def split_axes(keys: Sequence[str], per: Sequence[str] = ()) -> Axes:
    unknown = [k for k in per if k not in keys]
    if unknown:
        raise ConfigError([f"--per {k}: not a grid axis; grid axes: {', '.join(keys)}" for k in unknown])
    group = [k for k in keys if k in GROUP_KEYS or k in per]
    attack = [k for k in keys if k not in group and k.startswith("attack.")]
    return Axes(group, attack, [k for k in keys if k not in group and k not in attack])


def combos(records: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """The distinct assignments of ``keys`` in the records, in order of first appearance."""
    seen: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in records:
        seen.setdefault(tuple(canonical(r[k]) for k in keys), {k: r[k] for k in keys})
    return list(seen.values())


def matches(record: dict[str, Any], assignment: dict[str, Any]) -> bool:
    return all(canonical(record[k]) == canonical(v) for k, v in assignment.items())


def cell_of(records: Sequence[dict[str, Any]], *assignments: dict[str, Any]) -> dict[str, Any] | None:
    """The first record that matches every assignment (a setting and an attack), or None."""
    return next((r for r in records if all(matches(r, a) for a in assignments)), None)


def label(assignment: dict[str, Any]) -> str:
    """``alie`` for one key, ``attack.name=alie, attack.params.z=1`` for several."""
    if len(assignment) == 1:
        return format_value(next(iter(assignment.values())))
    return ", ".join(f"{k}={format_value(v)}" for k, v in assignment.items())


def best_worst_case(
    records: Sequence[dict[str, Any]], keys: Sequence[str], per: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Per group (rule × f × ``per``): the hyper-parameter setting whose worst accuracy over
    the attacks is highest, as ByzFL's benchmark selects it.

    For a setting h, worst(h) = min over the attack combinations a of acc(h, a), where acc is
    the cell's final accuracy (its mean over seeds). Only settings that produced an accuracy
    under every attack of the grid are eligible (one that was not applicable under some attack
    was not tested against it); the row reports argmax_h worst(h), the first such setting in
    grid order on ties, with the attack that attains the minimum and its sd over seeds. A group
    without an eligible setting gets no setting and the first n/a reason.
    """
    axes = split_axes(keys, per)
    attacks = combos(records, axes.attack)
    rows = []
    for group in combos(records, axes.group):
        in_group = [r for r in records if matches(r, group)]
        best: tuple[float, dict[str, Any], dict[str, Any], dict[str, Any]] | None = None
        eligible, reasons = 0, []
        for setting in combos(in_group, axes.hyper):
            scores = []
            for attack in attacks:
                hit = cell_of(in_group, setting, attack)
                if hit is None or hit.get("final_accuracy") is None:
                    reasons.append((hit or {}).get("not_applicable") or f"not run under {label(attack)}")
                    break
                scores.append((hit["final_accuracy"], attack, hit))
            else:
                eligible += 1
                acc, attack, hit = min(scores, key=lambda t: t[0])
                if best is None or acc > best[0]:
                    best = (acc, setting, attack, hit)
        row = {**group, **{k: None for k in axes.hyper}}
        if best is None:
            row.update(worst_case_accuracy=None, worst_case_sd=None, worst_attack="", settings=0,
                       not_applicable=reasons[0] if reasons else "no cells")
        else:
            acc, setting, attack, hit = best
            row.update(setting)
            row.update(worst_case_accuracy=acc, worst_case_sd=hit.get("final_accuracy_sd"),
                       worst_attack=label(attack), settings=eligible, not_applicable="")
        rows.append(row)
    return rows


BEST_COLUMNS = ("worst_case_accuracy", "worst_case_sd", "worst_attack", "settings", "not_applicable")


def write_best_worst_case_csv(path: Path, axes: Axes, rows: list[dict[str, Any]]) -> Path:
    """One row per group: its keys, the chosen hyper-parameters, then ``BEST_COLUMNS``
    (``settings`` counts the settings that ran under every attack)."""
    _write_csv(path, [*axes.group, *axes.hyper, *BEST_COLUMNS], rows)
    return Path(path)


# --- worst case over attacks, per setting ----------------------------------------------------


def worst_case(records: Sequence[dict[str, Any]], keys: Sequence[str], per: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Per setting (each combination of the grid axes that are not attacks: the rule, f,
    ``--per`` keys and the hyper-parameters such as ``robust.pre``), its worst case over the
    attack combinations (the ``attack.*`` axes other than ``attack.f``).

    ``worst_accuracy`` is the lowest mean final accuracy over the attacks that produced one,
    ``worst_asr`` the highest mean final attack success rate over those that measured one (the
    backdoors); each comes with the sd over seeds of the cell that attains it and its attack
    (the first in grid order on ties). ``attacks`` and ``asr_attacks`` count the attacks behind
    each; ``missing`` names the attacks under which the setting has no accuracy (not applicable
    or not run), which the worst case therefore does not cover. A grid without an attack axis
    has one attack combination, the base config's.
    """
    axes = split_axes(keys, per)
    attacks = combos(records, axes.attack)
    rows = []
    for setting in combos(records, [*axes.group, *axes.hyper]):
        acc: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
        asr: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
        missing = []
        for attack in attacks:
            hit = cell_of(records, setting, attack)
            if hit is None or hit.get("final_accuracy") is None:
                missing.append(label(attack) or "the base attack")
            else:
                acc.append((hit["final_accuracy"], attack, hit))
            if hit is not None and hit.get("final_attack_success_rate") is not None:
                asr.append((hit["final_attack_success_rate"], attack, hit))
        row: dict[str, Any] = {**setting, "attacks": len(acc), "asr_attacks": len(asr), "missing": "; ".join(missing)}
        if acc:
            a, attack, hit = min(acc, key=lambda t: t[0])  # min/max keep the first of equals
            row.update(worst_accuracy=a, worst_accuracy_sd=hit.get("final_accuracy_sd"),
                       worst_accuracy_attack=label(attack))
        else:
            row.update(worst_accuracy=None, worst_accuracy_sd=None, worst_accuracy_attack="")
        if asr:
            a, attack, hit = max(asr, key=lambda t: t[0])
            row.update(worst_asr=a, worst_asr_sd=hit.get("final_attack_success_rate_sd"), worst_asr_attack=label(attack))
        else:
            row.update(worst_asr=None, worst_asr_sd=None, worst_asr_attack="")
        rows.append(row)
    return rows


WORST_COLUMNS = ("worst_accuracy", "worst_accuracy_sd", "worst_accuracy_attack", "attacks",
                 "worst_asr", "worst_asr_sd", "worst_asr_attack", "asr_attacks", "missing")


def write_worst_case_csv(path: Path, axes: Axes, rows: list[dict[str, Any]]) -> Path:
    """One row per setting (:func:`worst_case`): its grid values, then ``WORST_COLUMNS``."""
    _write_csv(path, [*axes.group, *axes.hyper, *WORST_COLUMNS], rows)
    return Path(path)
