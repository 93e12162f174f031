"""The summary table: one row per run, for the terminal (rich) and for machines (CSV)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from fedsafe.report.runs import Run

DASH = "—"

# The first six are shown in the terminal table: ε_est, the paper's (optimistic) ε_lo, and the
# valid held-out 95% lower bound; the CSV also gets the fitted-σ̂ estimates and the analytical ε.
AUDIT_COLUMNS = (
    "eps_est_final", "eps_est_all", "eps_lo_final", "eps_lo_all", "eps_lo_valid_final", "eps_lo_valid_all",
    "eps_est_final_fitted", "eps_est_all_fitted", "eps_analytical",
)
AUDIT_HEADERS = ("ε_est final", "ε_est all", "ε_lo final", "ε_lo all", "95% lo final", "95% lo all")
CSV_COLUMNS = (
    "run", "pipeline", "attack", "f", "final_acc_pct", "best_acc_pct", "asr_pct",
    "rounds", "wall_s", "mb_up", "epsilon", *AUDIT_COLUMNS, "incomplete",
)


def has_epsilon(runs: Sequence[Run]) -> bool:
    """Whether any run reports a privacy budget ε (in its rows or its summary)."""
    return any(run.final("epsilon") is not None for run in runs)


def has_backdoor(runs: Sequence[Run]) -> bool:
    """Whether any run measured a backdoor's attack success rate."""
    return any(run.summary.get("final_attack_success_rate") is not None for run in runs)


def has_audit(runs: Sequence[Run]) -> bool:
    """Whether any run carries canary-audit estimates (``[audit]``)."""
    return any(run.summary.get("eps_est_final") is not None for run in runs)


def records(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The table's figures as numbers (None where unknown): accuracies in percent, MB = 10⁶ bytes."""
    out = []
    for run in runs:
        s = run.summary
        out.append({
            "run": run.label,
            "pipeline": s.get("pipeline"),
            "attack": s.get("attack"),
            "f": s.get("f"),
            "final_acc_pct": _pct(s.get("final_accuracy")),
            "best_acc_pct": _pct(s.get("best_accuracy")),
            "asr_pct": _pct(s.get("final_attack_success_rate")),
            "rounds": s.get("rounds"),
            "wall_s": s.get("wall_seconds"),
            "mb_up": None if s.get("bytes_up") is None else s["bytes_up"] / 1e6,
            "epsilon": run.final("epsilon"),
            **{k: s.get(k) for k in AUDIT_COLUMNS},
            "incomplete": run.incomplete,
        })
    return out


def summary_table(runs: Sequence[Run]) -> Table:
    """A rich table: run, pipeline, attack (with f), final and best accuracy (%), the final
    attack success rate (%) when any run is under a backdoor, rounds, wall seconds, MB
    uploaded, and ε when any run has one. Killed runs are marked."""
    eps = has_epsilon(runs)
    table = Table(title="fedsafe runs")
    table.add_column("run", no_wrap=True)
    table.add_column("pipeline")
    table.add_column("attack")
    asr = has_backdoor(runs)
    for name in ("final acc (%)", "best acc (%)", *(("ASR (%)",) if asr else ()), "rounds", "wall s", "MB up"):
        table.add_column(name, justify="right")
    if eps:
        table.add_column("ε", justify="right")
    audit = has_audit(runs)
    if audit:
        for name in AUDIT_HEADERS:
            table.add_column(name, justify="right")
    for r in records(runs):
        cells = [
            r["run"] + (" (incomplete)" if r["incomplete"] else ""),
            r["pipeline"] or DASH,
            _attack(r["attack"], r["f"]),
            _fmt(r["final_acc_pct"], ".1f"),
            _fmt(r["best_acc_pct"], ".1f"),
            *((_fmt(r["asr_pct"], ".1f"),) if asr else ()),
            _fmt(r["rounds"], "d"),
            _fmt(r["wall_s"], ".1f"),
            _fmt(r["mb_up"], ".2f"),
        ]
        if eps:
            cells.append(_fmt(r["epsilon"], ".3g"))
        if audit:
            cells += [_fmt(r[k], ".3g") for k in AUDIT_COLUMNS[: len(AUDIT_HEADERS)]]
        table.add_row(*cells)
    return table


def write_csv(runs: Sequence[Run], path: Path) -> Path:
    """``CSV_COLUMNS``, one row per run; numbers at full precision, empty cells where unknown."""
    path = Path(path)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in records(runs):
            w.writerow({k: "" if v is None else v for k, v in r.items()})
    return path


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def _fmt(x: Any, spec: str) -> str:
    if x is None:
        return DASH
    if spec == "d":
        return str(int(x))
    return format(x, spec)


def _attack(name: str | None, f: int | None) -> str:
    if name is None:
        return DASH
    if name == "none" and not f:
        return "none"
    return f"{name} (f={f})" if f is not None else name
