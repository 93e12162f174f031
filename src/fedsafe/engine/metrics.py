"""Per-round metrics (``metrics.jsonl``) and the run summary (``summary.json``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


def _clean(v: Any) -> Any:
    # JSON has no NaN/Inf; a non-finite figure is written as null rather than corrupting the file.
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsWriter:
    """Appends one JSON object per round, flushed, so a killed run keeps what it finished."""

    def __init__(self, out_dir: Path | None) -> None:
        self.path = None if out_dir is None else Path(out_dir) / METRICS

    def write(self, row: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")

    def truncate_after(self, round_: int) -> list[dict[str, Any]]:
        """Drop rows after ``round_`` (a resumed run redoes them); return the rows kept."""
        if self.path is None or not self.path.exists():
            return []
        rows = read_metrics(self.path.parent)
        kept = [r for r in rows if r["round"] <= round_]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        return kept


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            # Only the last line can be torn (the process was killed mid-write): drop it.
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: not valid JSON") from None
    return rows


def summarize(rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Final and best accuracy, rounds, wall seconds, plus the last value of privacy figures."""
    evals = [r for r in rows if r.get("test_accuracy") is not None]
    summary: dict[str, Any] = {
        "rounds": rows[-1]["round"] if rows else 0,
        "final_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "best_accuracy": max((r["test_accuracy"] for r in evals), default=None),
        "final_test_loss": evals[-1]["test_loss"] if evals else None,
        "wall_seconds": sum(r.get("seconds", 0.0) for r in rows),
        "bytes_up": sum(r.get("bytes_up", 0.0) for r in rows),
        "bytes_down": sum(r.get("bytes_down", 0.0) for r in rows),
        "skipped_rounds": sum(1 for r in rows if r.get("skipped")),
        "excluded_nonfinite": sum(r.get("excluded_nonfinite", 0.0) for r in rows),
    }
    asr = [r["attack_success_rate"] for r in rows if r.get("attack_success_rate") is not None]
    if asr:  # a backdoor attack: the success rate of the evaluated model at the end
        summary["final_attack_success_rate"] = asr[-1]
    # Privacy figures (epsilon, ...) are cumulative: the summary reports the last round's value.
    for key in ("epsilon", "delta"):
        vals = [r[key] for r in rows if r.get(key) is not None]
        if vals:
            summary[key] = vals[-1]
    summary.update(extra)
    return summary


def write_summary(out_dir: Path, summary: dict[str, Any]) -> None:
    (Path(out_dir) / SUMMARY).write_text(json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2) + "\n")
