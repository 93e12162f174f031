"""docs/make_figures.py's mnist_frontier figure: its commands are the recipe's, its quick path
shrinks every sweep, and --resume reuses an interrupted work directory (the plotting command
itself is tested on fabricated and digits sweeps in tests/report/test_frontier.py)."""

from __future__ import annotations

import importlib.util
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
