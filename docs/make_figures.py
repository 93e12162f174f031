"""Regenerate every figure under docs/figures/ by re-running the experiments it shows.

Each figure in the README is the output of documented ``fedsafe`` commands on a recipe (the
recipe's header lists them). This script runs exactly those commands, each as its own process
(``python -m fedsafe ...``, from the repository root) in a fresh work directory, then copies the
files the README shows into the output directory:

    inherent   inherent_accuracy_vs_epsilon.png, inherent_sweep.csv   recipes/inherent_noise.toml
    spectrum   inherent_spectrum.png                                  fedsafe privacy spectrum
    audit      audit_all_iterates.png                                 recipes/audit_dpfedavg.toml (z = 0.5, 4 reps)
    baffle     baffle_accuracy.png                                    recipes/baffle.toml

With ``--mnist``, the figures of the README's "Papers on MNIST" section instead (real MNIST:
``make data`` first; about 1.5 hours of wall time on this project's busy 2-core machine, about 11
CPU-minutes, most of it the SABLE and BAFFLE runs):

    mnist_inherent  mnist_inherent_accuracy_vs_epsilon.png, mnist_inherent_sweep.csv  recipes/mnist_inherent.toml
    mnist_audit     mnist_audit_all_iterates.png                   recipes/mnist_audit.toml (z = 0.3)
    mnist_baffle    mnist_baffle_accuracy.png                      recipes/mnist_baffle.toml (K = 100, backprop)
    mnist_sable     mnist_sable_accuracy.png                       recipes/mnist_sable.toml (ALIE, FOE)
    mnist_frontier  mnist_frontier.png, mnist_frontier.csv         recipes/mnist_frontier.toml (5 sweeps, 99 runs, ~40 min)
    mnist_robust_backdoor  mnist_robust_backdoor_{sweep,worst_case}.csv, _heatmap{,_asr}.png  recipes/mnist_robust_backdoor.toml (297 runs)

    python docs/make_figures.py [--mnist] [--only NAME ...] [--quick] [--out-dir DIR] [--work-dir DIR [--resume]] [--list]
    make figures                                          # the digits figures, into docs/figures/
    python docs/make_figures.py --mnist                   # the MNIST figures, into docs/figures/

Every command runs with one OpenMP / torch thread (sweep cells get one thread each from
``--jobs 2``). The same seed and the same thread count give the same numbers; the thread count
matters: WF-NA noise (``gsgd+wf_na``) is drawn in an eigenbasis of each user's covariance, and
that basis, where eigenvalues nearly coincide, moves with the float rounding of the
multi-threaded BLAS, so a run on two threads draws different (equally distributed) noise.

``--quick`` runs each figure at a tiny size (a few rounds, few clients, two ε values) into a new
temporary directory unless ``--out-dir`` is given; it never writes docs/figures/ by default.
It checks that every figure can still be made; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES_DIR = ROOT / "docs" / "figures"

# A command is built when it runs: a later step may name what an earlier one wrote (a glob).
Command = Callable[[Path, bool], list[str]]


@dataclass(frozen=True)
class FigureSpec:
    """One README figure: the fedsafe commands that make it and the files it ships.

    ``outputs`` maps a file name under docs/figures/ to the file the commands write, relative to
    the figure's work directory.
    """

    name: str
    description: str
    commands: tuple[Command, ...]
    outputs: dict[str, str]
    mnist: bool = False  # needs real MNIST (``make data``); made only with ``--mnist``


def _quick(quick: bool, *overrides: str) -> list[str]:
    """``--set`` options that shrink a run in quick mode (none otherwise)."""
    return [arg for o in overrides for arg in ("--set", o)] if quick else []


def _inherent_sweep(work: Path, quick: bool) -> list[str]:
    eps = "1,8" if quick else "1,2,4,8"
    return ["sweep", "recipes/inherent_noise.toml", "--jobs", "2", "--out", str(work),
            "--grid", "inherent.row=sgd_iid+isotropic,gsgd+wf_na,gd+isotropic",
            "--grid", f"inherent.target_epsilon={eps}", "--rows", "inherent.row", "--cols", "inherent.target_epsilon",
            *_quick(quick, "rounds=2", "eval_every=1")]


def _inherent_report(work: Path, quick: bool) -> list[str]:
    # the shell's `inherent.*`: sorted matches, or the pattern itself when nothing matches
    cells = sorted(str(p) for p in work.glob("inherent.*")) or [str(work / "inherent.*")]
    return ["report", *cells, "--out", str(work / "report")]


def _spectrum(work: Path, quick: bool) -> list[str]:
    return ["privacy", "spectrum", "--out", str(work / "spectrum.png")]  # ~1 s: the same in quick mode


def _audit_run(work: Path, quick: bool) -> list[str]:
    return ["run", "recipes/audit_dpfedavg.toml", "--variant", "z_0_5_rep4", "--out", str(work), "--quiet",
            *_quick(quick, "rounds=4", "eval_every=4", "clients.num_clients=20", "audit.canaries=20",
                    "audit.unobserved=20")]


def _baffle_run(work: Path, quick: bool) -> list[str]:
    return ["run", "recipes/baffle.toml", "--out", str(work), "--quiet",
            *_quick(quick, "rounds=1", "eval_every=1", "clients.num_clients=2", "clients.local_steps=1")]


def _baffle_report(work: Path, quick: bool) -> list[str]:
    return ["report", str(work), "--out", str(work / "report")]


def _mnist_inherent_sweep(work: Path, quick: bool) -> list[str]:
    return ["sweep", "recipes/mnist_inherent.toml", "--jobs", "2", "--out", str(work),
            "--grid", "inherent.row=sgd_iid+isotropic,gsgd+wf_na,gd+isotropic",
            "--grid", "inherent.target_epsilon=2,8", "--rows", "inherent.row", "--cols", "inherent.target_epsilon",
            *_quick(quick, "rounds=2", "eval_every=1", "inherent.max_records=40", "data.max_test=500")]


def _mnist_inherent_report(work: Path, quick: bool) -> list[str]:
    cells = sorted(str(p) for p in work.glob("inherent.*")) or [str(work / "inherent.*")]
    return ["report", *cells, "--out", str(work / "report")]


def _mnist_audit_run(work: Path, quick: bool) -> list[str]:
    return ["run", "recipes/mnist_audit.toml", "--variant", "z_0_3", "--out", str(work), "--quiet",
            *_quick(quick, "rounds=4", "eval_every=4", "clients.num_clients=20", "audit.canaries=20",
                    "audit.unobserved=20", "data.max_train=2000", "data.max_test=500")]


def _mnist_baffle_run(work: Path, quick: bool) -> list[str]:
    return ["run", "recipes/mnist_baffle.toml", "--variant", "k100", "--variant", "backprop", "--out", str(work),
            "--quiet", *_quick(quick, "rounds=1", "eval_every=1", "clients.num_clients=2",
                               "data.max_train=2000", "data.max_test=500")]


def _mnist_sable_run(work: Path, quick: bool) -> list[str]:
    variants = ("sable_alie", "robust_dsgd_alie", "sable_foe", "robust_dsgd_foe")
    return ["run", "recipes/mnist_sable.toml", *(a for v in variants for a in ("--variant", v)), "--out", str(work),
            "--quiet", *_quick(quick, "rounds=2", "eval_every=1", "data.max_train=2000", "data.max_test=500")]


def _report(work: Path, quick: bool) -> list[str]:
    return ["report", str(work), "--out", str(work / "report")]


# The frontier (recipes/mnist_frontier.toml): one sweep per method over the attack settings (ALIE
# and FOE with f = 3, no attack with f = 0) and, for the DP methods, dp.target_epsilon; then
# `fedsafe frontier` over the five sweep folders.
FRONTIER_ATTACKS = 'attack={name="alie",f=3},{name="foe",f=3},{name="none",f=0}'
FRONTIER_METHODS: dict[str, tuple[str, ...]] = {  # method: its --grid / --set options on the recipe
    "no_dp": (),
    "dpsgd": ("--grid", "dp.target_epsilon=0.05,0.5,5", "--set", "dp.enabled=true", "--set", "dp.unit=example",
              "--set", "dp.placement=local", "--set", "dp.clip=3", "--set", "dp.accountant=rdp"),
    "central": ("--grid", "dp.target_epsilon=8,64,512", "--set", "dp.enabled=true", "--set", "dp.placement=central",
                "--set", "robust.rule=mean", "--set", "robust.pre=[]"),
    "local": ("--grid", "dp.target_epsilon=64,512,4096", "--set", "dp.enabled=true", "--set", "dp.placement=local"),
    "sable": ("--set", "protocol=he", "--set", "robust.pre=[]"),
}


def _frontier_options(options: tuple[str, ...], quick: bool) -> list[str]:
    if not quick:
        return list(options)
    # quick: the lowest and highest ε of each grid only
    out = list(options)
    for i, o in enumerate(out):
        if o.startswith("dp.target_epsilon="):
            values = o.split("=", 1)[1].split(",")
            out[i] = f"dp.target_epsilon={values[0]},{values[-1]}"
    return out


def _frontier_sweep(method: str) -> Command:
    def command(work: Path, quick: bool) -> list[str]:
        return ["sweep", "recipes/mnist_frontier.toml", "--seeds", "2" if quick else "3", "--jobs", "1",
                "--out", str(work / method), "--grid", FRONTIER_ATTACKS,
                *_frontier_options(FRONTIER_METHODS[method], quick),
                *_quick(quick, "rounds=2", "eval_every=1", "data.max_train=2000", "data.max_test=500")]

    command.__name__ = f"_frontier_sweep_{method}"
    return command


def _frontier_report(work: Path, quick: bool) -> list[str]:
    return ["frontier", *(str(work / m) for m in FRONTIER_METHODS), "--out", str(work / "figure")]


# recipes/mnist_robust_backdoor.toml: eleven rules against nine attacks, 3 seeds; quick: two of each
ROBUST_RULES = "mean,median,trimmed_mean,multi_krum,centered_clipping,fltrust,flame,foolsgold,fldetector,rlr,freqfed"
ROBUST_ATTACKS = ("optimal_alie,optimal_foe,pattern_backdoor,model_replacement,dba,neurotoxin,edge_case_backdoor,"
                  "adaptive_fltrust,adaptive_flame")


def _mnist_robust_backdoor_sweep(work: Path, quick: bool) -> list[str]:
    rules, attacks = ("mean,fldetector", "optimal_alie,dba") if quick else (ROBUST_RULES, ROBUST_ATTACKS)
    return ["sweep", "recipes/mnist_robust_backdoor.toml", "--seeds", "2" if quick else "3", "--jobs", "1",
            "--out", str(work), "--grid", f"robust.rule={rules}", "--grid", f"attack.name={attacks}",
            "--rows", "robust.rule", "--cols", "attack.name", "--worst-case",
            *_quick(quick, "rounds=2", "eval_every=1", "data.max_train=2000", "data.max_test=500")]


FIGURES: dict[str, FigureSpec] = {
    f.name: f
    for f in (
        FigureSpec("inherent", "accuracy vs ε of three Table 1 rows (Zhang et al.), 12-cell sweep",
                   (_inherent_sweep, _inherent_report),
                   {"inherent_accuracy_vs_epsilon.png": "report/accuracy_vs_epsilon.png",
                    "inherent_sweep.csv": "sweep.csv"}),
        FigureSpec("spectrum", "one user's covariance eigenvalues, isotropic vs water-filled noise",
                   (_spectrum,), {"inherent_spectrum.png": "spectrum.png"}),
        FigureSpec("audit", "canary cosines, all iterates (Andrew et al.), variant z_0_5_rep4",
                   (_audit_run,), {"audit_all_iterates.png": "z_0_5_rep4/audit_all.png"}),
        FigureSpec("baffle", "BAFFLE accuracy per round, the recipe's 7 variants",
                   (_baffle_run, _baffle_report), {"baffle_accuracy.png": "report/accuracy.png"}),
        FigureSpec("mnist_inherent", "MNIST: accuracy vs ε of three Table 1 rows (Zhang et al. Fig. 5), 6-cell sweep",
                   (_mnist_inherent_sweep, _mnist_inherent_report),
                   {"mnist_inherent_accuracy_vs_epsilon.png": "report/accuracy_vs_epsilon.png",
                    "mnist_inherent_sweep.csv": "sweep.csv"}, mnist=True),
        FigureSpec("mnist_audit", "MNIST: canary cosines, all iterates (Andrew et al.), variant z_0_3",
                   (_mnist_audit_run,), {"mnist_audit_all_iterates.png": "z_0_3/audit_all.png"}, mnist=True),
        FigureSpec("mnist_baffle", "MNIST: BAFFLE K = 100 against backprop, accuracy per round",
                   (_mnist_baffle_run, _report), {"mnist_baffle_accuracy.png": "report/accuracy.png"}, mnist=True),
        FigureSpec("mnist_sable", "MNIST: SABLE (emulated HTS) against Robust-DSGD under ALIE and FOE",
                   (_mnist_sable_run, _report), {"mnist_sable_accuracy.png": "report/accuracy.png"}, mnist=True),
        FigureSpec("mnist_frontier", "MNIST: accuracy vs ε under ALIE / FOE / no attack, five methods, 3 seeds",
                   (*(_frontier_sweep(m) for m in FRONTIER_METHODS), _frontier_report),
                   {"mnist_frontier.png": "figure/frontier.png", "mnist_frontier.csv": "figure/frontier.csv"},
                   mnist=True),
        FigureSpec("mnist_robust_backdoor", "MNIST: 11 rules x 9 attacks (acc, ASR), worst case per rule, 3 seeds",
                   (_mnist_robust_backdoor_sweep,),
                   {"mnist_robust_backdoor_sweep.csv": "sweep.csv",
                    "mnist_robust_backdoor_worst_case.csv": "worst_case.csv",
                    "mnist_robust_backdoor_heatmap.png": "heatmap.png",
                    "mnist_robust_backdoor_heatmap_asr.png": "heatmap_asr.png"}, mnist=True),
    )
}


def _shell_word(token: str) -> str:
    """``token`` quoted for a POSIX shell, except a glob whose only special character is ``*``."""
    plain = token.replace("*", "x")
    return token if "*" in token and shlex.quote(plain) == plain else shlex.quote(token)


def shell_line(argv: Sequence[str]) -> str:
    """The command as a user would type it."""
    return " ".join(_shell_word(t) for t in ["fedsafe", *argv])


def run_fedsafe(argv: Sequence[str]) -> None:
    """``python -m fedsafe ARGV`` from the repository root with one thread; raise on failure."""
    threads = {v: "1" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    env = {**os.environ, **threads, "MPLBACKEND": "Agg"}
    rc = subprocess.run([sys.executable, "-m", "fedsafe", *argv], cwd=ROOT, env=env).returncode
    if rc != 0:
        raise RuntimeError(f"exit status {rc}: {shell_line(argv)}")


def make_figure(spec: FigureSpec, work: Path, out_dir: Path, quick: bool, resume: bool = False) -> list[Path]:
    """Run ``spec``'s commands in ``work`` (created; with ``resume`` it may exist) and copy its
    outputs to ``out_dir``."""
    work.mkdir(parents=True, exist_ok=resume)
    for command in spec.commands:
        argv = command(work, quick)
        print(f"[{spec.name}] $ {shell_line(argv)}", flush=True)
        run_fedsafe(argv)
    written = []
    for dest, produced in spec.outputs.items():
        src = work / produced
        if not src.is_file():
            raise RuntimeError(f"the commands did not write {produced}")
        shutil.copyfile(src, out_dir / dest)
        written.append(out_dir / dest)
    return written


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help=f"make only this figure (repeatable or comma-separated): {', '.join(FIGURES)}")
    p.add_argument("--mnist", action="store_true",
                   help="the MNIST figures (real MNIST: `make data` first) instead of the digits ones")
    p.add_argument("--quick", action="store_true", help="tiny runs into a temporary directory (a smoke test)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the figures go (default docs/figures/; --quick: a new temporary directory)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="keep the runs here (must be empty or absent; default: a temporary directory, removed)")
    p.add_argument("--resume", action="store_true",
                   help="accept a --work-dir that is not empty: the sweeps there reuse their finished runs "
                        "(for a figure made of sweeps, such as mnist_frontier, after an interruption)")
    p.add_argument("--list", action="store_true", help="print each figure's files and commands, run nothing")
    args = p.parse_args(argv)
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        p.error(f"--only {', '.join(unknown)}: unknown figure; valid: {', '.join(FIGURES)}")
    args.names = ([n for n in FIGURES if n in names] if names
                  else [n for n, spec in FIGURES.items() if spec.mnist == args.mnist])
    if args.resume and args.work_dir is None:
        p.error("--resume needs --work-dir (the folder of the interrupted runs)")
    if args.work_dir is not None and args.work_dir.exists() and any(args.work_dir.iterdir()) and not args.resume:
        p.error(f"--work-dir {args.work_dir}: not empty (give an empty or new directory, or --resume)")
    return args


def _mnist_missing(specs: Sequence[FigureSpec]) -> str | None:
    """Why the MNIST figures among ``specs`` cannot run (MNIST not fetched), or None."""
    if not any(spec.mnist for spec in specs):
        return None
    from fedsafe.data.store import stored_path

    path = stored_path("mnist")
    return None if path.is_file() else f"the MNIST figures need {path}: run `make data` first"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for name in args.names:
            spec = FIGURES[name]
            print(f"{name}: {spec.description}\n  files: {', '.join(spec.outputs)}")
            for command in spec.commands:
                print(f"  $ {shell_line(command(Path('runs/figures') / name, args.quick))}")
        return 0
    missing = _mnist_missing([FIGURES[n] for n in args.names])
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="fedsafe-figures-")) if args.quick else FIGURES_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fedsafe-figures-work-") as tmp:
        work_root = args.work_dir or Path(tmp)
        timings = []
        for name in args.names:
            t0 = time.perf_counter()
            try:
                written = make_figure(FIGURES[name], work_root / name, out_dir, args.quick, args.resume)
            except RuntimeError as e:
                print(f"error: figure {name}: {e}", file=sys.stderr)
                return 1
            timings.append((name, time.perf_counter() - t0, written))
    print(f"\n{'figure':<10}{'seconds':>9}  files")
    for name, seconds, written in timings:
        print(f"{name:<10}{seconds:>9.1f}  {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
