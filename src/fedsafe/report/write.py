"""One call from run directories to a report directory of figures and a CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsafe.engine.outdir import REPORT, fresh_output
from fedsafe.report.figures import plot_accuracy, plot_accuracy_vs_epsilon, plot_metric
from fedsafe.report.runs import find_runs
from fedsafe.report.table import has_backdoor, has_epsilon, write_csv


def write_report(paths: list[Path], out_dir: Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Write ``accuracy.png``, ``test_loss.png``, ``summary.csv`` and, when any run has ε,
    ``epsilon.png`` and ``accuracy_vs_epsilon.png``, when any run is under a backdoor,
    ``attack_success_rate.png`` into ``out_dir`` (created, and marked as a report folder).

    ``out_dir`` must be new, empty, or a report folder fedsafe wrote, whose earlier report is
    replaced; a folder with other files needs ``overwrite``, and then only the report's own
    files in it are replaced (:class:`RunDirError` otherwise, before anything is written).

    Returns ``{"figures": [paths], "csv": path, "runs": number of runs}``.
    """
    runs = find_runs([Path(p) for p in paths])
    with fresh_output(out_dir, REPORT, overwrite=overwrite) as out:
        figures = [
            plot_accuracy(runs, out / "accuracy.png"),
            plot_metric(runs, "test_loss", out / "test_loss.png", "test loss (cross-entropy)"),
        ]
        if has_backdoor(runs):
            figures.append(plot_metric(runs, "attack_success_rate", out / "attack_success_rate.png",
                                       "backdoor attack success rate (%)", scale=100.0))
        if has_epsilon(runs):
            figures.append(plot_metric(runs, "epsilon", out / "epsilon.png", "ε (cumulative)"))
            figures.append(plot_accuracy_vs_epsilon(runs, out / "accuracy_vs_epsilon.png"))
        csv_path = write_csv(runs, out / "summary.csv")
    return {"figures": figures, "csv": csv_path, "runs": len(runs)}
