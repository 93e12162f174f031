"""``fedsafe sweep`` through the command: list-valued axes, safe run-directory names, seeds,
the best-hyper-parameter worst case, and progress on stderr."""

import csv
import json
import re
import statistics
import tomllib

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app

BASE = """rounds = 2
[data]
name = "digits"
max_train = 200
[model]
name = "logreg"
[clients]
num_clients = 5
[attack]
name = "sign_flip"
"""

SAFE_NAME = re.compile(r"[A-Za-z0-9._+=-]+")


def _sweep(tmp_path, *args):
    base = tmp_path / "base.toml"
    base.write_text(BASE)
    return CliRunner().invoke(app, ["sweep", str(base), "--out", str(tmp_path / "s"), *args])


def _csv(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _run_dirs(root):
    return sorted(p.parent for p in root.rglob("summary.json"))


def test_list_valued_axis_runs_draws_and_names_directories_safely(tmp_path):
    # The command: this used to crash after every cell ran (a list is unhashable).
    r = _sweep(tmp_path, "--grid", 'robust.pre=[],["nnm"],["nnm","bucketing"]', "--grid", "robust.rule=mean,median",
               "--grid", "attack.f=1")
    assert r.exit_code == 0, r.output
    out = tmp_path / "s"
    assert (out / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    rows = _csv(out / "sweep.csv")
    # The commas inside brackets belong to one value: three pre-aggregator settings, not four.
    assert len(rows) == 6
    # The CSV writes list values as TOML, so a value can be pasted back into --grid / --set.
    assert [row["robust.pre"] for row in rows[::2]] == ["[]", '["nnm"]', '["nnm", "bucketing"]']
    cells = [p for p in out.iterdir() if p.is_dir()]
    names = [p.name for p in cells]
    assert len(names) == 6 and len(set(names)) == 6
    for name in names:
        assert SAFE_NAME.fullmatch(name), name
    # Readable: the value shows in the name, next to a hash that keeps it unique.
    assert any("robust.pre=nnm-bucketing-" in n for n in names) and any("robust.pre=empty-" in n for n in names)
    # Each directory holds the run of its own cell.
    for d in cells:
        pre = tomllib.loads((d / "config.toml").read_text())["robust"].get("pre", [])
        assert [p["name"] for p in pre] in ([], ["nnm"], ["nnm", "bucketing"])
        assert ("nnm" in d.name) == bool(pre)


def test_seeds_repeat_each_cell_and_report_mean_and_sd(tmp_path):
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,median", "--grid", "attack.f=1", "--seeds", "3",
               "--set", "seed=5")
    assert r.exit_code == 0, r.output
    out = tmp_path / "s"
    per_seed = _csv(out / "sweep_seeds.csv")
    assert [(row["robust.rule"], int(row["seed"])) for row in per_seed] == [
        ("mean", 5), ("mean", 6), ("mean", 7), ("median", 5), ("median", 6), ("median", 7)]
    # Every per-seed value is the accuracy its own run directory reports, under its own seed.
    for row in per_seed:
        run = out / row["dir"]
        assert f"seed = {row['seed']}" in (run / "config.toml").read_text()
        assert float(row["final_accuracy"]) == pytest.approx(json.loads((run / "summary.json").read_text())["final_accuracy"])
    for row in _csv(out / "sweep.csv"):
        accs = [float(s["final_accuracy"]) for s in per_seed if s["robust.rule"] == row["robust.rule"]]
        assert int(row["n_seeds"]) == 3
        assert float(row["final_accuracy"]) == pytest.approx(statistics.mean(accs))
        assert float(row["final_accuracy_sd"]) == pytest.approx(statistics.stdev(accs))
        bests = [float(s["best_accuracy"]) for s in per_seed if s["robust.rule"] == row["robust.rule"]]
        assert float(row["best_accuracy"]) == pytest.approx(statistics.mean(bests))
    # A second call with more seeds reuses the three finished seeds of each cell.
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,median", "--grid", "attack.f=1", "--seeds", "4",
               "--set", "seed=5")
    assert r.exit_code == 0, r.output
    assert "6 reused, 2 to run" in r.stderr
    assert len(_csv(out / "sweep_seeds.csv")) == 8


def test_best_worst_case_over_attacks_is_written(tmp_path):
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,median", "--grid", "attack.name=sign_flip,ipm",
               "--grid", "server.lr=0.1,1.0", "--grid", "attack.f=1")
    assert r.exit_code == 0, r.output
    out = tmp_path / "s"
    rows = _csv(out / "best_worst_case.csv")
    cells = _csv(out / "sweep.csv")
    assert [row["robust.rule"] for row in rows] == ["mean", "median"]
    for row in rows:
        # Naive reference: every setting's minimum over attacks, then the setting with the largest.
        worst = {}
        for c in cells:
            if c["robust.rule"] == row["robust.rule"]:
                worst[c["server.lr"]] = min(worst.get(c["server.lr"], 2.0), float(c["final_accuracy"]))
        best_lr = max(worst, key=lambda lr: worst[lr])
        assert row["server.lr"] == best_lr
        assert float(row["worst_case_accuracy"]) == pytest.approx(worst[best_lr])
    assert (out / "best_worst_case.png").read_bytes()[:4] == b"\x89PNG"


def test_progress_lines_on_stderr_with_eta(tmp_path):
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,krum", "--grid", "attack.f=1,2")
    assert r.exit_code == 0, r.output
    lines = [l for l in r.stderr.splitlines() if "cells done" in l]
    assert [l.split(" cells done")[0].lstrip("[") for l in lines] == ["1/4", "2/4", "3/4", "4/4"], r.stderr
    assert all("ETA" in l for l in lines[:-1])
    assert "n/a" in lines[-1] and "2f" in lines[-1]  # Krum at f=2 with 5 clients
    assert "\x1b" not in r.stderr and "\r" not in r.stderr  # plain lines: stderr is not a terminal
    assert "cells done" not in r.stdout


def test_unknown_per_axis_is_refused_before_any_run(tmp_path):
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,median", "--per", "data.alpha")
    assert r.exit_code == 2
    assert "error: --per data.alpha: not a grid axis; grid axes: robust.rule" in r.stderr
    assert not (tmp_path / "s").exists()


def test_heatmap_axes_are_checked_before_any_run(tmp_path):
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,median", "--grid", "attack.f=0,1", "--cols", "attack.name")
    assert r.exit_code == 2 and "--cols attack.name: not a grid axis; grid axes: robust.rule, attack.f" in r.stderr
    r = _sweep(tmp_path, "--grid", "robust.rule=mean,median", "--grid", "attack.f=0,1", "--rows", "attack.f", "--cols", "attack.f")
    assert r.exit_code == 2 and "must be different" in r.stderr
    assert not (tmp_path / "s").exists()
