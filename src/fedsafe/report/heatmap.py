"""Heatmaps of a sweep's final accuracy: one panel per combination of the remaining grid axes,
and optionally a worst-case panel (the minimum over those axes, e.g. over attacks); and the
figure of each rule's best hyper-parameters under the worst attack.

With the worst case asked for and attacks as the columns, every panel also ends in a column
"worst case": per row, the worst of its cells (the same as the sweep's ``worst_case.csv``).

A cell shows its final accuracy in percent, ``mean ± sd`` when it ran with several seeds, and
``n/a`` on grey where it could not run. Each label is black or white, whichever contrasts more
with the colour under it (WCAG relative luminance), so every label stays readable.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes as MplAxes
from matplotlib.colors import Normalize, to_rgb
from matplotlib.figure import Figure

from fedsafe.engine.sweep import Axes, canonical, combos, format_value, label, matches, split_axes
from fedsafe.report.runs import ReportError

NA_COLOUR = "#d0d0d0"  # light grey: n/a cells must not vanish into the white figure
CMAP = matplotlib.colormaps["viridis"].with_extremes(bad=NA_COLOUR)
# for metrics where lower is better (attack success): the same colours, good still bright
CMAP_LOWER_BETTER = matplotlib.colormaps["viridis_r"].with_extremes(bad=NA_COLOUR)
NORM = Normalize(vmin=0, vmax=100)


def _unique(values) -> list[Any]:
    # By canonical JSON, not hashing: grid values may be lists or tables.
    seen: dict[str, Any] = {}
    for v in values:
        seen.setdefault(canonical(v), v)
    return list(seen.values())


def _index(values: list[Any], v: Any) -> int:
    c = canonical(v)
    return next(i for i, x in enumerate(values) if canonical(x) == c)


def accuracy_grid(
    records: Sequence[dict[str, Any]], rows: str, cols: str, fixed: dict[str, Any], key: str = "final_accuracy"
) -> tuple[list[Any], list[Any], np.ndarray]:
    """Matrix of ``key`` (final accuracy; NaN where not applicable) for records matching ``fixed``."""
    row_vals = _unique(r[rows] for r in records)
    col_vals = _unique(r[cols] for r in records)
    m = np.full((len(row_vals), len(col_vals)), np.nan)
    for r in records:
        if matches(r, fixed) and r.get(key) is not None:
            m[_index(row_vals, r[rows]), _index(col_vals, r[cols])] = r[key]
    return row_vals, col_vals, m


def _luminance(rgb: Sequence[float]) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def ink(background: Sequence[float]) -> str:
    """Black or white, whichever has the larger contrast ratio (L1 + 0.05) / (L2 + 0.05) with
    the background; the larger of the two is always at least √21 ≈ 4.6."""
    lum = _luminance(background)
    return "k" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "w"


def cell_text(mean: float, sd: float) -> str:
    """``80`` or ``80 ± 5`` (percent); ``n/a`` for NaN."""
    if np.isnan(mean):
        return "n/a"
    return f"{100 * mean:.0f}" if np.isnan(sd) else f"{100 * mean:.0f} ± {100 * sd:.0f}"


def _draw(
    ax: MplAxes, m: np.ndarray, sd: np.ndarray, row_vals: list[Any], col_vals: list[Any], notes=None, fontsize: int = 8,
    cmap=CMAP,
):
    im = ax.imshow(100 * m, cmap=cmap, norm=NORM, aspect="auto")
    labels = [format_value(v) for v in col_vals]
    long = max((len(t) for t in labels), default=0) > 8  # would overlap their neighbours
    ax.set_xticks(range(len(col_vals)), labels, rotation=30 if long else 0, ha="right" if long else "center")
    ax.set_yticks(range(len(row_vals)), [format_value(v) for v in row_vals])
    for i, j in itertools.product(range(m.shape[0]), range(m.shape[1])):
        fill = to_rgb(NA_COLOUR) if np.isnan(m[i, j]) else cmap(NORM(100 * m[i, j]))
        text = cell_text(m[i, j], sd[i, j])
        if notes is not None and notes[i][j]:
            text += "\n" + notes[i][j]
        ax.text(j, i, text, ha="center", va="center", color=ink(fill), fontsize=fontsize)
    return im


WORST_LABEL = "worst case"


def worst_column(m: np.ndarray, sd: np.ndarray, higher_better: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``m``, its worst cell (the lowest if higher is better, else the highest; the
    first of equals; NaN cells skipped) and that cell's ``sd``; NaN for a row without a value."""
    filled = np.where(np.isnan(m), np.inf if higher_better else -np.inf, m)
    at = (filled.argmin(axis=1) if higher_better else filled.argmax(axis=1))[:, None]
    return np.take_along_axis(m, at, 1)[:, 0], np.take_along_axis(sd, at, 1)[:, 0]


#: What a sweep heatmap can show: key -> (title, colour-bar label, higher is better, measured
#: only by some cells: the grid then keeps just the rows and columns where it was measured).
METRICS = {
    "final_accuracy": ("final accuracy", "final test accuracy (%)", True, False),
    "final_attack_success_rate": ("attack success rate", "backdoor attack success rate (%)", False, True),
}


def has_metric(records: Sequence[dict[str, Any]], metric: str) -> bool:
    """Whether any record has a value of ``metric``."""
    return any(r.get(metric) is not None for r in records)


def figure_sweep(
    records: Sequence[dict[str, Any]], keys: Sequence[str], rows: str, cols: str, *, worst_case: bool = False,
    metric: str = "final_accuracy",
) -> Figure:
    """One panel per combination of the other grid keys (plus the worst case over them with
    ``worst_case``) of ``metric`` (``METRICS``: the final accuracy, or a backdoor's final attack
    success rate, whose worst case is the highest). Cells show mean ± sd over seeds. With
    ``worst_case`` and an attack axis as ``cols``, each panel ends in a "worst case" column:
    per row, its worst cell (:func:`worst_column`)."""
    if metric not in METRICS:
        raise ReportError(f"unknown heatmap metric {metric!r}; valid: {', '.join(METRICS)}")
    label, bar, higher_better, partial = METRICS[metric]
    if partial:  # e.g. the success rate of backdoors: the untargeted attacks' columns would be n/a
        records = [r for r in records if r.get(metric) is not None]
        if not records:
            raise ReportError(f"no cell of the sweep measured {metric}")
    for k in (rows, cols):
        if k not in keys:
            raise ReportError(f"heatmap axis {k!r} is not a grid key; grid keys: {', '.join(keys)}")
    if rows == cols:
        raise ReportError("heatmap rows and cols must be different grid keys")
    rest = [k for k in keys if k not in (rows, cols)]
    rest_vals = [_unique(r[k] for r in records) for k in rest]
    panels = [(dict(zip(rest, combo)), None) for combo in itertools.product(*rest_vals)]
    if worst_case and rest:
        panels.append(({}, "worst case over " + ", ".join(rest)))
    worst_col = worst_case and cols in split_axes(keys).attack  # a last column: each row's worst attack
    n_rows = len(_unique(r[rows] for r in records))
    n_cols = len(_unique(r[cols] for r in records)) + worst_col
    fig = Figure(figsize=(max(4.2, 0.8 * n_cols + 1.5) * len(panels), max(0.5 * 8, 0.45 * n_rows) + 1.0),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (fixed, title) in zip(axes, panels):
        if title is None:
            row_vals, col_vals, m = accuracy_grid(records, rows, cols, fixed, metric)
            sd = accuracy_grid(records, rows, cols, fixed, f"{metric}_sd")[2]
            title = ", ".join(f"{k}={format_value(v)}" for k, v in fixed.items()) or label
        else:
            row_vals, col_vals, _ = accuracy_grid(records, rows, cols, {})
            combos_ = [dict(zip(rest, c)) for c in itertools.product(*rest_vals)]
            means = np.stack([accuracy_grid(records, rows, cols, c, metric)[2] for c in combos_])
            sds = np.stack([accuracy_grid(records, rows, cols, c, f"{metric}_sd")[2] for c in combos_])
            # A cell is as good as its worst applicable attack (its sd goes with it); all-NaN stays NaN.
            worst = np.where(np.isnan(means), np.inf, means) if higher_better else -np.where(np.isnan(means), -np.inf, means)
            at = worst.argmin(axis=0)[None]
            m = np.take_along_axis(means, at, 0)[0]
            sd = np.take_along_axis(sds, at, 0)[0]
        if worst_col:
            w, w_sd = worst_column(m, sd, higher_better)
            m, sd, col_vals = np.column_stack([m, w]), np.column_stack([sd, w_sd]), [*col_vals, WORST_LABEL]
        im = _draw(ax, m, sd, row_vals, col_vals, cmap=CMAP if higher_better else CMAP_LOWER_BETTER)
        ax.set_xlabel(cols)
        ax.set_ylabel(rows)
        ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=list(axes), label=bar)
    return fig


def plot_sweep(records, keys, rows, cols, out: Path, *, worst_case: bool = False, metric: str = "final_accuracy") -> Path:
    return _save(figure_sweep(records, keys, rows, cols, worst_case=worst_case, metric=metric), out)


def figure_best_worst_case(rows: Sequence[dict[str, Any]], axes: Axes) -> Figure:
    """One panel: a rule per row, a combination of the other group keys (e.g. ``attack.f``)
    per column; each cell shows the chosen setting's worst-case accuracy (``± sd`` with seeds),
    the setting, and the attack that attains the worst case."""
    rule = "robust.rule" if "robust.rule" in axes.group else None
    other = [k for k in axes.group if k != rule]
    row_vals = _unique(r[rule] for r in rows) if rule else ["all"]
    col_sets = combos(rows, other)
    m = np.full((len(row_vals), len(col_sets)), np.nan)
    sd = np.full_like(m, np.nan)
    notes = [["" for _ in col_sets] for _ in row_vals]
    for r in rows:
        i = _index(row_vals, r[rule]) if rule else 0
        j = next(j for j, c in enumerate(col_sets) if matches(r, c))
        if r["worst_case_accuracy"] is None:
            continue
        m[i, j] = r["worst_case_accuracy"]
        sd[i, j] = np.nan if r.get("worst_case_sd") is None else r["worst_case_sd"]
        setting = [f"{k.rsplit('.', 1)[-1]}={format_value(r[k])}" for k in axes.hyper]
        notes[i][j] = "\n".join([*setting, *([f"worst: {r['worst_attack']}"] if r["worst_attack"] else [])])
    col_labels = [label(c) or "all" for c in col_sets]
    fig = Figure(figsize=(2.2 * len(col_sets) + 2.5, 1.0 * len(row_vals) + 1.6), layout="constrained")
    ax = fig.subplots()
    im = _draw(ax, m, sd, row_vals, col_labels, notes, fontsize=7)
    ax.set_ylabel(rule or "")
    ax.set_xlabel(", ".join(other))
    over = ", ".join(axes.attack) or "the base attack"
    best = ", ".join(axes.hyper) or "no hyper-parameter axis"
    ax.set_title(f"worst case over {over}; best over {best}", fontsize=9)
    fig.colorbar(im, ax=ax, label="worst-case final test accuracy (%)")
    return fig


def plot_best_worst_case(rows: Sequence[dict[str, Any]], axes: Axes, out: Path) -> Path:
    return _save(figure_best_worst_case(rows, axes), out)


def _save(fig: Figure, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
