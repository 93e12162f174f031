"""docs/make_figures.py: every figure under docs/figures/ has a recipe, each is remade by its
quick mode, and a figure made twice is the same file (same seed → same numbers, same pixels)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "make_figures.py"


def load_script():
    """docs/make_figures.py as a module (registered first: its dataclasses look themselves up)."""
    if "make_figures" not in sys.modules:
        spec = importlib.util.spec_from_file_location("make_figures", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["make_figures"] = module
        spec.loader.exec_module(module)
    return sys.modules["make_figures"]


def make(*args: str, threads: int = 1) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=600)  # a hang guard, not a timing


def test_every_committed_figure_has_a_recipe() -> None:
    # A file added under docs/figures/ without a way to remake it fails here, and so does a
    # recipe whose file is no longer committed.
    outputs = {name for spec in load_script().FIGURES.values() for name in spec.outputs}
    committed = {p.name for p in (ROOT / "docs" / "figures").iterdir() if p.is_file()}
    assert outputs == committed


def test_every_figure_the_readme_shows_is_made() -> None:
    readme = (ROOT / "README.md").read_text()
    outputs = {name for spec in load_script().FIGURES.values() for name in spec.outputs}
    shown = {line.split("docs/figures/")[1].split(")")[0] for line in readme.splitlines() if "](docs/figures/" in line}
    assert shown and shown <= outputs


def test_unknown_figure_is_refused_with_the_valid_names(tmp_path: Path) -> None:
    res = make("--only", "nope", "--quick", "--out-dir", str(tmp_path))
    assert res.returncode == 2
    assert "--only nope: unknown figure; valid: inherent, spectrum, audit, baffle" in res.stderr
    assert not any(tmp_path.iterdir())


def test_list_names_the_documented_commands() -> None:
    res = make("--list", "--only", "inherent,audit")
    assert res.returncode == 0, res.stderr
    assert "fedsafe sweep recipes/inherent_noise.toml --jobs 2" in res.stdout
    assert "inherent.target_epsilon=1,2,4,8" in res.stdout
    assert "fedsafe report runs/figures/inherent/inherent.* --out" in res.stdout
    assert "fedsafe run recipes/audit_dpfedavg.toml --variant z_0_5_rep4" in res.stdout
    assert "baffle" not in res.stdout


def test_mnist_figures_are_behind_the_flag() -> None:
    res = make("--list")
    assert res.returncode == 0, res.stderr
    assert "mnist" not in res.stdout  # `make figures` never needs real MNIST
    res = make("--list", "--mnist")
    assert res.returncode == 0, res.stderr
    assert "fedsafe sweep recipes/mnist_inherent.toml --jobs 2" in res.stdout
    assert "fedsafe run recipes/mnist_sable.toml --variant sable_alie" in res.stdout
    assert "recipes/inherent_noise.toml" not in res.stdout
    assert all(spec.mnist == name.startswith("mnist_") for name, spec in load_script().FIGURES.items())


def test_mnist_figures_refuse_without_the_data(tmp_path: Path) -> None:
    env = {**os.environ, "FEDSAFE_DATA": str(tmp_path / "empty")}
    res = subprocess.run([sys.executable, str(SCRIPT), "--mnist", "--quick", "--out-dir", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 2
    assert "the MNIST figures need" in res.stderr and "make data" in res.stderr
    assert not (tmp_path / "out").exists()


def test_quick_mode_remakes_every_figure_identically(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    res = make("--quick", "--out-dir", str(first))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    made = {p.name for p in first.iterdir()}
    assert made == {name for spec in load_script().FIGURES.values() if not spec.mnist for name in spec.outputs}
    rows = list(csv.DictReader((first / "inherent_sweep.csv").open()))
    assert {(r["inherent.row"], r["inherent.target_epsilon"]) for r in rows} == {
        (row, eps) for row in ("sgd_iid+isotropic", "gsgd+wf_na", "gd+isotropic") for eps in ("1", "8")}
    assert all(0.0 <= float(r["final_accuracy"]) <= 1.0 for r in rows)

    # Determinism: the sweep (with WF-NA noise) and the audit again, in fresh processes, from a
    # caller with another thread setting (the script pins one thread per command).
    res = make("--quick", "--only", "inherent", "--only", "audit", "--out-dir", str(second), threads=2)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    again = sorted(p.name for p in second.iterdir())
    assert again == ["audit_all_iterates.png", "inherent_accuracy_vs_epsilon.png", "inherent_sweep.csv"]
    for name in again:
        assert (second / name).read_bytes() == (first / name).read_bytes(), f"{name} differs between two runs"


# -- mnist_frontier: its commands are the recipe's, its quick path shrinks every sweep, and --resume
# reuses an interrupted work directory (the plotting command itself: tests/report/test_frontier.py)

def _argv(quick: bool) -> list[list[str]]:
    spec = load_script().FIGURES["mnist_frontier"]
    return [command(Path("W"), quick) for command in spec.commands]


def test_the_figure_runs_the_recipes_commands():
    mf = load_script()
    spec = mf.FIGURES["mnist_frontier"]
    assert spec.mnist and set(spec.outputs) == {"mnist_frontier.png", "mnist_frontier.csv"}
    *sweeps, report = _argv(quick=False)
    assert [a[0] for a in sweeps] == ["sweep"] * 5 and report[0] == "frontier"
    assert report[1:-2] == [str(Path("W") / m) for m in ("no_dp", "dpsgd", "central", "local", "sable")]
    header = (ROOT / "recipes" / "mnist_frontier.toml").read_text()
    for argv in sweeps:
        assert argv[argv.index("--seeds") + 1] == "3" and argv[argv.index("--jobs") + 1] == "1"
        # every grid and --set of the figure appears in the recipe's header, as typed there
        for flag, value in zip(argv, argv[1:]):
            if flag in ("--grid", "--set") and not value.startswith("attack="):
                assert f"{flag} {value}" in header or f"{flag} '{value}'" in header, (flag, value)
    assert "fedsafe frontier runs/frontier/no_dp runs/frontier/dpsgd" in header


def test_quick_mode_shrinks_every_sweep():
    for argv in _argv(quick=True)[:-1]:
        assert argv[argv.index("--seeds") + 1] == "2"
        assert "rounds=2" in argv and "data.max_train=2000" in argv
        grids = [v for f, v in zip(argv, argv[1:]) if f == "--grid" and v.startswith("dp.target_epsilon=")]
        assert all(len(g.split("=", 1)[1].split(",")) == 2 for g in grids)


def test_resume_needs_a_work_dir_and_accepts_a_used_one(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--resume", "--list"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "--resume needs --work-dir" in res.stderr
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "x").write_text("")
    res = subprocess.run([sys.executable, str(SCRIPT), "--work-dir", str(tmp_path / "old"), "--list"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "or --resume" in res.stderr
    res = subprocess.run([sys.executable, str(SCRIPT), "--work-dir", str(tmp_path / "old"), "--resume", "--list",
                          "--only", "mnist_frontier"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "fedsafe frontier" in res.stdout
