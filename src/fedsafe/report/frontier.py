"""Accuracy against ε across methods (``fedsafe frontier``): the privacy–robustness frontier.

Input: sweep folders (``fedsafe sweep --out DIR``), one per method, each optionally labelled
``LABEL=DIR``. Every run listed in a sweep's ``sweep_seeds.csv`` is read from its own
``config.toml`` and ``summary.json``:

* its **attack**: ``attack.name`` when ``attack.f > 0``, ``"none"`` when ``attack.f = 0`` (the
  attack-free line: every client honest);
* its **ε**: the ``epsilon`` its summary reports (the last round's, the run's own accountant),
  never the ``dp.target_epsilon`` it was calibrated to; a run without DP is at ε = ∞; a run
  with DP whose summary has no ε is an error naming it;
* what that ε **means** (``epsilon_of``): client-level or example-level (the worst client's
  records), and against whom (central: the released model; local: every message, the server
  included).

Runs of one sweep cell (the seeds) make one point: the mean and the sample standard deviation
(ddof = 1) of the final accuracy and of the reported ε. ``frontier.csv`` has one row per point;
``frontier.png`` one panel per attack (``none`` is drawn in every panel, dashed, beside the
attacked line of the same method), x = ε on a log axis, methods without DP at an ``∞`` column on
the right edge with a band of their mean ± sd across the panel.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsafe.engine.metrics import SUMMARY
from fedsafe.engine.outdir import OutputKind, fresh_output
from fedsafe.report.runs import CONFIG, ReportError

SEEDS_CSV = "sweep_seeds.csv"  # fedsafe.engine.sweep.SEEDS_CSV (not imported: that module loads torch)
FIGURE = "frontier.png"
CSV = "frontier.csv"
MARKER = ".fedsafe-frontier"
#: A frontier folder (``fedsafe frontier --out``): its figure and CSV.
FRONTIER = OutputKind("frontier", MARKER, frozenset({MARKER, FIGURE, CSV}))
NO_ATTACK = "none"
CSV_COLUMNS = (
    "method", "attack", "f", "epsilon", "epsilon_sd", "epsilon_of", "target_epsilon", "noise_multiplier",
    "accuracy", "accuracy_sd", "n_seeds", "seeds", "accuracies", "epsilons", "sweep", "cell",
)


@dataclass(frozen=True)
class RunPoint:
    """One finished run, as the frontier reads it."""

    method: str
    sweep: Path
    cell: str  # the sweep cell (the folder holding the seeds)
    seed: int
    attack: str
    f: int
    epsilon: float  # math.inf without DP
    epsilon_of: str
    target_epsilon: float | None
    noise_multiplier: float | None
    accuracy: float


@dataclass
class Point:
    """A sweep cell: mean ± sd over its seeds."""

    method: str
    attack: str
    f: int
    epsilon: float
    epsilon_sd: float | None
    epsilon_of: str
    target_epsilon: float | None
    noise_multiplier: float | None
    accuracy: float
    accuracy_sd: float | None
    seeds: list[int] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    epsilons: list[float] = field(default_factory=list)
    sweep: str = ""
    cell: str = ""

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)


def _mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    x = np.asarray(values, dtype=float)
    if np.all(np.isinf(x)):
        return math.inf, None
    return float(x.mean()), (float(x.std(ddof=1)) if x.size > 1 else None)


def _split_label(arg: str) -> tuple[str | None, Path]:
    """``LABEL=DIR`` or ``DIR`` (a path that exists as given is never split)."""
    if "=" in arg and not Path(arg).exists():
        label, _, path = arg.partition("=")
        if not label.strip() or not path:
            raise ReportError(f"{arg}: expected LABEL=SWEEP_DIR or SWEEP_DIR")
        return label.strip(), Path(path)
    return None, Path(arg)


def epsilon_of(cfg: dict[str, Any]) -> str:
    """What a run's reported ε protects and against whom, in words."""
    dp = cfg.get("dp", {})
    if not dp.get("enabled", False):
        return "none (no DP: ε = ∞)"
    placement = dp.get("placement", "central")
    if dp.get("unit", "client") == "example":
        return "example-level: the worst client's records, against everyone (server included)"
    if placement == "central":
        return "client-level: the released model (central, the server trusted)"
    if placement == "local":
        return "client-level: each client's messages, against everyone (server included)"
    return f"client-level ({placement}): against the secure-aggregation server"


def _short_epsilon_of(of: str) -> str:
    """``epsilon_of`` in a few words, for the legend."""
    if of.startswith("none"):
        return "ε = ∞ (no DP)"
    if of.startswith("example-level"):
        return "example-level ε, worst client, vs. the server too"
    if "released model" in of:
        return "client-level ε of the released model (central)"
    if "each client's messages" in of:
        return "client-level ε, vs. the server too (local)"
    return of


def describe_method(cfg: dict[str, Any]) -> str:
    """A line's default label, from its runs' config: privacy, protocol and robust pipeline."""
    dp = cfg.get("dp", {})
    robust = cfg.get("robust", {})
    pre = [p if isinstance(p, str) else p.get("name", "?") for p in robust.get("pre", [])]
    rules = " → ".join([*pre, robust.get("rule", "mean")])
    protocol = cfg.get("protocol", "plain")
    if dp.get("enabled", False):
        if dp.get("unit", "client") == "example":
            privacy = "example-level DP-SGD"
        else:
            privacy = f"{dp.get('placement', 'central')} client-level DP"
    elif protocol == "plain":
        privacy = "no DP"
    else:  # a protocol that hides the updates (he, secagg, tee), without noise
        backend = cfg.get(protocol, {}).get("backend")
        return f"{protocol}{f' ({backend})' if backend else ''}, {rules}, no DP"
    where = "" if protocol == "plain" else f" over {protocol}"
    return f"{privacy}{where}, {rules}"


def _read(path: Path, parse: Callable[[str], dict[str, Any]], missing: str) -> dict[str, Any]:
    """``parse`` of the file at ``path``; a missing or unreadable file is a ReportError naming it."""
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: missing ({missing})") from None
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: unreadable: {e}") from None


def read_sweep(path: Path, label: str | None = None) -> tuple[list[RunPoint], list[str]]:
    """The runs of one sweep folder, and a line per run the sweep found not applicable."""
    if not path.is_dir():
        raise ReportError(f"{path}: no such directory (expected a sweep folder: fedsafe sweep --out {path})")
    index = path / SEEDS_CSV
    if not index.is_file():
        raise ReportError(f"{path}: not a sweep folder: no {SEEDS_CSV} (run fedsafe sweep --out {path} first)")
    with index.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ReportError(f"{index}: lists no runs")
    points, skipped = [], []
    method = label
    for row in rows:
        if row.get("not_applicable"):
            skipped.append(f"{path}/{row.get('dir', '?')}: not applicable: {row['not_applicable']}")
            continue
        run_dir = path / row["dir"]
        cfg = _read(run_dir / CONFIG, tomllib.loads, "not a fedsafe run directory")
        summary = _read(run_dir / SUMMARY, json.loads,
                        "the run did not finish; rerun its sweep, which reuses finished runs")
        if method is None:
            method = describe_method(cfg)
        attack = cfg.get("attack", {})
        f = int(attack.get("f", 0))
        dp = cfg.get("dp", {})
        if dp.get("enabled", False):
            eps = summary.get("epsilon")
            if eps is None:
                raise ReportError(f"{run_dir / SUMMARY}: dp.enabled but no epsilon in the summary: the frontier "
                                  "plots the ε a run reports")
            eps = float(eps)
            if not math.isfinite(eps):
                raise ReportError(f"{run_dir / SUMMARY}: epsilon = {eps}: a DP run without a finite ε "
                                  "(noise multiplier 0?) cannot be placed on the ε axis")
        else:
            eps = math.inf
        acc = summary.get("final_accuracy")
        if acc is None:
            raise ReportError(f"{run_dir / SUMMARY}: no final_accuracy (the run was never evaluated)")
        nm = summary.get("noise_multiplier")
        points.append(RunPoint(
            method=method, sweep=path, cell=Path(row["dir"]).parts[0], seed=int(row["seed"]),
            attack=attack.get("name", NO_ATTACK) if f > 0 else NO_ATTACK, f=f, epsilon=eps,
            epsilon_of=epsilon_of(cfg), target_epsilon=dp.get("target_epsilon") if dp.get("enabled") else None,
            noise_multiplier=float(nm) if nm is not None else None, accuracy=float(acc),
        ))
    return points, skipped


def collect(runs: Sequence[RunPoint]) -> list[Point]:
    """One point per (method, sweep, cell), in the order the cells first appear."""
    groups: dict[tuple[str, Path, str], list[RunPoint]] = {}
    for r in runs:
        groups.setdefault((r.method, r.sweep, r.cell), []).append(r)
    points = []
    for (method, sweep, cell), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.seed)
        acc, acc_sd = _mean_sd([r.accuracy for r in rs])
        eps, eps_sd = _mean_sd([r.epsilon for r in rs])
        nms = [r.noise_multiplier for r in rs if r.noise_multiplier is not None]
        points.append(Point(
            method=method, attack=rs[0].attack, f=rs[0].f, epsilon=eps, epsilon_sd=eps_sd,
            epsilon_of=rs[0].epsilon_of, target_epsilon=rs[0].target_epsilon,
            noise_multiplier=float(np.mean(nms)) if nms else None, accuracy=acc, accuracy_sd=acc_sd,
            seeds=[r.seed for r in rs], accuracies=[r.accuracy for r in rs], epsilons=[r.epsilon for r in rs],
            sweep=str(sweep), cell=cell,
        ))
    return points


def load_frontier(sweeps: Sequence[str | Path]) -> tuple[list[Point], list[str]]:
    """Points of every sweep (``LABEL=DIR`` or ``DIR``), and the not-applicable lines."""
    if not sweeps:
        raise ReportError("frontier: give at least one sweep folder")
    runs, skipped, labels = [], [], {}
    for arg in sweeps:
        label, path = _split_label(str(arg))
        got, skip = read_sweep(path, label)
        skipped += skip
        if got:
            if got[0].method in labels and labels[got[0].method] != path:
                raise ReportError(f"{path}: its line is labelled {got[0].method!r}, as {labels[got[0].method]}'s; "
                                  "give one of them a label (LABEL=DIR)")
            labels[got[0].method] = path
        runs += got
    if not runs:
        raise ReportError("frontier: no finished run in " + ", ".join(str(s) for s in sweeps))
    if not any(math.isfinite(r.epsilon) for r in runs):
        raise ReportError("frontier: no run has an epsilon (none has dp.enabled): nothing to place on the ε axis; "
                          "add a sweep with DP (e.g. --grid dp.target_epsilon=1,4,16)")
    return collect(runs), skipped


def write_csv(points: Sequence[Point], out: Path) -> Path:
    def num(v: float | None) -> Any:
        if v is None:
            return ""
        return "inf" if math.isinf(v) else repr(float(v))

    with Path(out).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
        w.writeheader()
        for p in points:
            w.writerow({
                "method": p.method, "attack": p.attack, "f": p.f, "epsilon": num(p.epsilon),
                "epsilon_sd": num(p.epsilon_sd), "epsilon_of": p.epsilon_of, "target_epsilon": num(p.target_epsilon),
                "noise_multiplier": num(p.noise_multiplier), "accuracy": num(p.accuracy),
                "accuracy_sd": num(p.accuracy_sd), "n_seeds": len(p.seeds),
                "seeds": " ".join(str(s) for s in p.seeds),
                "accuracies": " ".join(repr(a) for a in p.accuracies),
                "epsilons": " ".join(num(e) for e in p.epsilons), "sweep": p.sweep, "cell": p.cell,
            })
    return Path(out)


def figure_frontier(points: Sequence[Point]):
    """The figure: one panel per attack (attack-free points dashed in every panel), x = reported
    ε (log), y = final accuracy (%), error bars ± sd over seeds; methods without DP at ``∞``."""
    from matplotlib.figure import Figure

    attacks = list(dict.fromkeys(p.attack for p in points if p.attack != NO_ATTACK)) or [NO_ATTACK]
    methods = list(dict.fromkeys(p.method for p in points))
    finite = [p.epsilon for p in points if p.private]
    lo, hi = min(finite), max(finite)
    x_inf = hi * 10 ** max(0.6, 0.15 * math.log10(max(hi / lo, 10)))  # the ∞ column, right of every ε
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    fig = Figure(figsize=(6.2 * len(attacks), 5.4), layout="constrained")
    axes = fig.subplots(1, len(attacks), sharey=True, squeeze=False)[0]
    at_inf = [m for m in methods if any(p.method == m and not p.private for p in points)]
    offsets = {m: 10 ** (0.12 * (i - (len(at_inf) - 1) / 2)) for i, m in enumerate(at_inf)}
    for ax, attack in zip(axes, attacks):
        for m in methods:
            for which, dashed in ((attack, False), (NO_ATTACK, True)):
                if which == NO_ATTACK and dashed and attack == NO_ATTACK:
                    continue
                pts = sorted((p for p in points if p.method == m and p.attack == which), key=lambda p: p.epsilon)
                if not pts:
                    continue
                style = dict(color=colors[m], capsize=3, markersize=5, alpha=0.55 if dashed else 1.0,
                             linestyle="--" if dashed else "-", marker="s" if dashed else "o",
                             markerfacecolor="none" if dashed else colors[m])
                priv = [p for p in pts if p.private]
                if priv:
                    ax.errorbar([p.epsilon for p in priv], [100 * p.accuracy for p in priv],
                                yerr=[100 * (p.accuracy_sd or 0.0) for p in priv], **style)
                for p in (p for p in pts if not p.private):
                    x = x_inf * offsets[m] * (1.3 if dashed else 1.0)  # the attack-free marker beside
                    ax.errorbar([x], [100 * p.accuracy], yerr=[100 * (p.accuracy_sd or 0.0)],
                                **{**style, "linestyle": "none", "marker": "D" if not dashed else "d"})
                    if not dashed:
                        sd = 100 * (p.accuracy_sd or 0.0)
                        ax.axhspan(100 * p.accuracy - sd, 100 * p.accuracy + sd, color=colors[m], alpha=0.10, lw=0)
                        ax.axhline(100 * p.accuracy, color=colors[m], lw=0.8, alpha=0.5, ls=":")
        ax.set_xscale("log")
        ax.axvline(math.sqrt(hi * x_inf), color="0.5", lw=0.8, ls=":")
        ticks = [t for t in ax.get_xticks() if lo / 3 <= t <= hi * 1.5]
        ax.set_xticks([*ticks, x_inf], [*(f"{t:g}" for t in ticks), "∞\n(no DP)"])
        ax.set_xlim(lo / 2, x_inf * 10 ** (0.12 * len(at_inf) / 2 + 0.25))
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("ε reported by each run (mean over seeds; δ from its config)")
        f = max((p.f for p in points if p.attack == attack), default=0)
        ax.set_title("no attack (f = 0)" if attack == NO_ATTACK
                     else f"attack: {attack}, f = {f}  (dashed, hollow: no attack, f = 0)")
    axes[0].set_ylabel("final test accuracy (%), mean ± sd over seeds")
    handles = []
    from matplotlib.lines import Line2D

    for m in methods:
        of = next(p.epsilon_of for p in points if p.method == m)
        handles.append(Line2D([], [], color=colors[m], marker="o", label=f"{m}  [{_short_epsilon_of(of)}]"))
    fig.legend(handles=handles, loc="outside lower center", ncol=1, fontsize="small", frameon=False)
    return fig


def plot_frontier(points: Sequence[Point], out: Path) -> Path:
    fig = figure_frontier(points)
    fig.savefig(out, dpi=120, format="png", metadata={"Software": None})
    return Path(out)


def write_frontier(sweeps: Sequence[str | Path], out_dir: Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Read the sweeps, write ``frontier.png`` and ``frontier.csv`` into ``out_dir`` (new, empty,
    or a frontier folder of fedsafe's; another folder needs ``overwrite``, and then only these
    files are replaced). Returns ``{"figure", "csv", "points", "skipped"}``."""
    points, skipped = load_frontier(sweeps)
    with fresh_output(out_dir, FRONTIER, overwrite=overwrite) as out:
        csv_path = write_csv(points, out / CSV)
        png = plot_frontier(points, out / FIGURE)
    return {"figure": png, "csv": csv_path, "points": points, "skipped": skipped}


def frontier_table(points: Sequence[Point]):
    """The terminal view: one row per point."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("method", "attack", "ε (reported)", "target ε", "accuracy %", "seeds"):
        table.add_column(col, overflow="fold")
    for p in points:
        eps = "∞" if not p.private else f"{p.epsilon:.3g}" + (f" ± {p.epsilon_sd:.2g}" if p.epsilon_sd else "")
        acc = f"{100 * p.accuracy:.1f}" + (f" ± {100 * p.accuracy_sd:.1f}" if p.accuracy_sd is not None else "")
        table.add_row(p.method, p.attack, eps, "" if p.target_epsilon is None else f"{p.target_epsilon:g}", acc,
                      str(len(p.seeds)))
    return table
