"""Finding finished (or killed) runs on disk and loading them.

A *run directory* holds ``config.toml``, ``metrics.jsonl`` and, once the run finished,
``summary.json``. An experiment with variants is a directory whose ``summary.json`` is
``{"variants": {name: summary, ...}}`` with one run directory per variant beneath it.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsafe.core.errors import FedsafeError
from fedsafe.engine.metrics import METRICS, SUMMARY, read_metrics, summarize

CONFIG = "config.toml"


class ReportError(FedsafeError, ValueError):
    """A path cannot be reported on; the message names the path and what was expected."""


@dataclass
class Run:
    """One run: its label in tables and legends, its directory, summary and metrics rows.

    ``summary["incomplete"]`` is true when ``summary.json`` was missing (the run was killed)
    and the summary was recomputed from the rows that were written.
    """

    label: str
    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def incomplete(self) -> bool:
        return bool(self.summary.get("incomplete", False))

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(rounds, values) of ``key`` over the rows where it is present and not null."""
        pts = [(r["round"], r[key]) for r in self.rows if r.get(key) is not None and "round" in r]
        return [p[0] for p in pts], [p[1] for p in pts]

    def final(self, key: str) -> float | None:
        """The last non-null value of ``key`` in the rows, else the summary's value."""
        _, vals = self.series(key)
        return vals[-1] if vals else self.summary.get(key)


def find_runs(paths: list[Path]) -> list[Run]:
    """Expand each directory into runs, in the order given.

    A run directory (it has ``metrics.jsonl``) gives one run labelled with its directory name;
    a variants directory (``summary.json`` with ``"variants"``, or sub-directories with
    ``metrics.jsonl``) gives one run per variant, labelled ``"DIRNAME/variant"``.
    """
    runs: list[Run] = []
    for p in paths:
        p = Path(p)
        if not p.is_dir():
            raise ReportError(f"{p}: no such directory (expected a fedsafe run or experiment directory)")
        if (p / METRICS).is_file():
            runs.append(_load(p.name, p))
            continue
        names = _variant_names(p)
        if not names:
            raise ReportError(
                f"{p}: not a fedsafe run directory: no {METRICS}, no {SUMMARY} with \"variants\", "
                f"and no sub-directory with {METRICS}"
            )
        top = _read_summary(p) or {}
        listed = top.get("variants", {}) if isinstance(top.get("variants"), dict) else {}
        for name in names:
            runs.append(_load(f"{p.name}/{name}", p / name, fallback=listed.get(name)))
    return _dedupe(runs)


def _variant_names(p: Path) -> list[str]:
    # summary.json's order is the config's order; killed variants (no summary yet) follow, sorted.
    top = _read_summary(p) or {}
    names = list(top["variants"]) if isinstance(top.get("variants"), dict) else []
    names += sorted(d.name for d in p.iterdir() if d.is_dir() and (d / METRICS).is_file() and d.name not in names)
    return names


def _read_summary(d: Path) -> dict[str, Any] | None:
    path = d / SUMMARY
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load(label: str, d: Path, fallback: dict[str, Any] | None = None) -> Run:
    try:
        rows = read_metrics(d) if (d / METRICS).is_file() else []
    except ValueError as e:
        raise ReportError(str(e)) from None
    summary = _read_summary(d) or fallback
    if summary is None:
        summary = summarize(rows, **_from_config(d), incomplete=True)
    else:
        summary = dict(summary)
    return Run(label=label, path=d, summary=summary, rows=rows)


def _from_config(d: Path) -> dict[str, Any]:
    """What the engine's summary takes from the config (name, pipeline, attack, f), best effort:
    a killed run's config.toml is read as plain TOML, without validating it."""
    try:
        cfg = tomllib.loads((d / CONFIG).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {"name": d.name}
    robust = cfg.get("robust", {})
    attack = cfg.get("attack", {})
    pre = [x if isinstance(x, str) else x.get("name", "?") for x in robust.get("pre", [])]
    # Mirrors RobustPipeline.describe().
    return {
        "name": cfg.get("name", d.name),
        "pipeline": " → ".join([*pre, robust.get("rule", "mean")]),
        "attack": attack.get("name", "none"),
        "f": attack.get("f", 0),
    }


def _dedupe(runs: list[Run]) -> list[Run]:
    # Two runs given with the same directory name would share a legend entry otherwise.
    seen: dict[str, int] = {}
    for run in runs:
        n = seen.get(run.label, 0) + 1
        seen[run.label] = n
        if n > 1:
            run.label = f"{run.label} #{n}"
    return runs
