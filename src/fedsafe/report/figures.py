"""Figures of finished runs. ``figure_*`` build a matplotlib Figure (for tests and notebooks);
``plot_*`` save it as a PNG (dpi 120) and return the path.

Figures are built on ``matplotlib.figure.Figure`` directly, not through pyplot: no display is
needed, the process-wide backend is left alone, and nothing accumulates in pyplot's registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsafe.report.runs import ReportError, Run

DPI = 120


def _legend_label(run: Run) -> str:
    return run.label + (" (incomplete)" if run.incomplete else "")


def _new_figure() -> tuple[Figure, object]:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def figure_metric(runs: Sequence[Run], key: str, ylabel: str | None = None, *, scale: float = 1.0) -> Figure:
    """``key`` against the round, one line per run that reports it (rounds where it is null,
    e.g. rounds without evaluation, are left out rather than drawn as gaps or zeros)."""
    fig, ax = _new_figure()
    for run in runs:
        xs, ys = run.series(key)
        if xs:
            ax.plot(xs, [scale * y for y in ys], marker="o" if len(xs) < 30 else None,
                    markersize=3, label=_legend_label(run))
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel or key)
    if ax.get_lines():
        ax.legend(fontsize="small")
    return fig


def figure_accuracy(runs: Sequence[Run]) -> Figure:
    """Test accuracy (%) against the round, every run overlaid: how fast each run learns and
    where it plateaus; a robust pipeline under attack should track the clean baseline."""
    fig = figure_metric(runs, "test_accuracy", "test accuracy (%)", scale=100.0)
    fig.axes[0].set_title("test accuracy")
    return fig


def privacy_series(label: str) -> str:
    """The series a run belongs to in accuracy-vs-ε plots: its label without the parts that only
    set the privacy level (sweep cells ``key=value__key=value``; keys naming ``epsilon``,
    ``noise_multiplier`` or ``sigma2``). Runs differing only in privacy form one curve."""
    prefix, _, cell = label.rpartition("/")
    parts = [p for p in cell.split("__") if not any(k in p.split("=")[0] for k in _PRIVACY_KEYS)]
    rest = "__".join(parts) or "runs"
    return f"{prefix}/{rest}" if prefix else rest


_PRIVACY_KEYS = ("epsilon", "noise_multiplier", "sigma2")


def figure_accuracy_vs_epsilon(runs: Sequence[Run]) -> Figure:
    """Final test accuracy (%) against final ε: the privacy–utility trade-off (lower ε is more
    private). Runs that differ only in their privacy level (see :func:`privacy_series`) are joined
    into one curve, sorted by ε. Runs without ε or without an evaluation are skipped."""
    fig, ax = _new_figure()
    with_eps = [r for r in runs if r.final("epsilon") is not None]
    if not with_eps:
        raise ReportError("accuracy vs ε: no run reports epsilon (runs: "
                          + ", ".join(r.label for r in runs) + ")")
    series: dict[str, list[tuple[float, float]]] = {}
    for run in with_eps:
        acc = run.summary.get("final_accuracy")
        if acc is None:
            acc = run.final("test_accuracy")
        if acc is None:
            continue
        series.setdefault(privacy_series(run.label), []).append((run.final("epsilon"), 100.0 * acc))
    for name, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("final ε")
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title("accuracy vs privacy budget")
    if ax.get_lines():
        ax.legend(fontsize="small")
    return fig


def plot_metric(runs: Sequence[Run], key: str, out: Path, ylabel: str | None = None, *, scale: float = 1.0) -> Path:
    """Save ``figure_metric(runs, key, ylabel, scale=scale)`` (e.g. ``test_loss``, ``epsilon``)
    to ``out``."""
    return _save(figure_metric(runs, key, ylabel, scale=scale), out)


def plot_accuracy(runs: Sequence[Run], out: Path) -> Path:
    """Save ``figure_accuracy(runs)`` to ``out``."""
    return _save(figure_accuracy(runs), out)


def plot_accuracy_vs_epsilon(runs: Sequence[Run], out: Path) -> Path:
    """Save ``figure_accuracy_vs_epsilon(runs)`` to ``out``; ReportError if no run has ε."""
    return _save(figure_accuracy_vs_epsilon(runs), out)
