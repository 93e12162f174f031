"""``fedsafe frontier``: accuracy against the ε each run reports, from sweep folders.

Fabricated sweep folders (the layout ``fedsafe sweep --seeds N`` writes: ``sweep_seeds.csv``
listing ``<cell>/seed=<s>`` run directories with ``config.toml`` and ``summary.json``) keep the
fast tests fast; one slow test runs two tiny digits sweeps end to end. The CSV's numbers are
checked against a naive recomputation from the runs' summaries."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.report.frontier import CSV_COLUMNS, load_frontier

runner = CliRunner()


def _config(attack: str, f: int, dp: dict | None, protocol: str = "plain") -> str:
    lines = ['name = "x"', f'protocol = "{protocol}"', "[robust]", 'rule = "trimmed_mean"', 'pre = ["nnm"]',
             "[attack]", f'name = "{attack}"', f"f = {f}", "[dp]"]
    if dp is None:
        lines.append("enabled = false")
    else:
        lines.append("enabled = true")
        lines += [f"{k} = {json.dumps(v)}" for k, v in dp.items()]
    return "\n".join(lines) + "\n"


def _sweep(root, name, cells):
    """cells: [(cell_dir, attack, f, dp or None, [(seed, accuracy, epsilon or None), ...])]."""
    d = root / name
    d.mkdir()
    rows = []
    for cell, attack, f, dp, runs in cells:
        for seed, acc, eps in runs:
            run = d / cell / f"seed={seed}"
            run.mkdir(parents=True)
            (run / "config.toml").write_text(_config(attack, f, dp))
            summary = {"final_accuracy": acc, **({"epsilon": eps, "noise_multiplier": 1.5} if eps is not None else {})}
            (run / "summary.json").write_text(json.dumps(summary))
            rows.append({"seed": seed, "final_accuracy": acc, "not_applicable": "", "dir": f"{cell}/seed={seed}"})
    with (d / "sweep_seeds.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["seed", "final_accuracy", "not_applicable", "dir"])
        w.writeheader()
        w.writerows(rows)
    return d


DP = {"placement": "local", "unit": "example", "target_epsilon": 2.0}


def _two_sweeps(tmp_path):
    plain = _sweep(tmp_path, "plain", [
        ("attack=alie", "alie", 3, None, [(0, 0.81, None), (1, 0.79, None), (2, 0.84, None)]),
        ("attack=none", "none", 0, None, [(0, 0.90, None), (1, 0.88, None), (2, 0.91, None)]),
    ])
    dp = _sweep(tmp_path, "dp", [
        ("attack=alie__eps=2", "alie", 3, DP, [(0, 0.61, 1.98), (1, 0.55, 2.01), (2, 0.58, 1.99)]),
        ("attack=foe__eps=2", "foe", 3, DP, [(0, 0.40, 1.98), (1, 0.47, 2.01), (2, 0.45, 1.99)]),
        ("attack=none__eps=2", "alie", 0, DP, [(0, 0.70, 1.98), (1, 0.72, 2.01), (2, 0.69, 1.99)]),
    ])
    return plain, dp


def _naive(sweep_dir):
    """Mean and sd (ddof = 1) of each cell's final accuracy and ε, straight from the summaries."""
    out = {}
    for cell in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        sums = [json.loads((r / "summary.json").read_text()) for r in sorted(cell.iterdir())]
        accs = [s["final_accuracy"] for s in sums]
        eps = [s.get("epsilon", math.inf) for s in sums]
        out[cell.name] = (statistics.mean(accs), statistics.stdev(accs),
                          statistics.mean(eps) if all(math.isfinite(e) for e in eps) else math.inf)
    return out


def test_csv_matches_a_naive_recomputation_from_the_summaries(tmp_path):
    plain, dp = _two_sweeps(tmp_path)
    out = tmp_path / "fig"
    r = runner.invoke(app, ["frontier", f"no DP={plain}", str(dp), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "frontier.png").stat().st_size > 10_000
    rows = list(csv.DictReader((out / "frontier.csv").open()))
    assert list(rows[0]) == list(CSV_COLUMNS)
    expected = {**_naive(plain), **_naive(dp)}
    assert {row["cell"] for row in rows} == set(expected)
    for row in rows:
        acc, sd, eps = expected[row["cell"]]
        assert float(row["accuracy"]) == pytest.approx(acc, abs=1e-12)
        assert float(row["accuracy_sd"]) == pytest.approx(sd, abs=1e-12)
        assert float(row["epsilon"]) == pytest.approx(eps, abs=1e-12)  # the runs' ε, not the target 2
        assert row["n_seeds"] == "3" and row["seeds"] == "0 1 2"
    by_cell = {row["cell"]: row for row in rows}
    assert by_cell["attack=alie"]["method"] == "no DP" and by_cell["attack=alie"]["epsilon"] == "inf"
    # attack.f = 0 is the attack-free line whatever attack.name says
    assert by_cell["attack=none__eps=2"]["attack"] == "none"
    assert by_cell["attack=foe__eps=2"]["attack"] == "foe"
    assert by_cell["attack=foe__eps=2"]["target_epsilon"] == "2.0"
    assert by_cell["attack=foe__eps=2"]["method"] == "example-level DP-SGD, nnm → trimmed_mean"
    assert by_cell["attack=foe__eps=2"]["epsilon_of"].startswith("example-level: the worst client's records")
    assert "no DP" in r.output and "wrote" in r.output


def test_a_missing_folder_is_one_error_line(tmp_path):
    plain, _ = _two_sweeps(tmp_path)
    r = runner.invoke(app, ["frontier", str(plain), str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        f"error: {tmp_path / 'nope'}: no such directory (expected a sweep folder: fedsafe sweep --out {tmp_path / 'nope'})"]
    assert not (tmp_path / "o").exists()


def test_a_folder_that_is_no_sweep_is_refused(tmp_path):
    (tmp_path / "runs").mkdir()
    r = runner.invoke(app, ["frontier", str(tmp_path / "runs"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "not a sweep folder: no sweep_seeds.csv" in r.output


def test_sweeps_without_epsilon_are_refused(tmp_path):
    plain, _ = _two_sweeps(tmp_path)
    r = runner.invoke(app, ["frontier", str(plain), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "no run has an epsilon (none has dp.enabled)" in r.output
    assert not (tmp_path / "o").exists()


def test_a_dp_run_whose_summary_lacks_epsilon_is_named(tmp_path):
    dp = _sweep(tmp_path, "dp", [("c", "alie", 3, DP, [(0, 0.5, None)])])
    r = runner.invoke(app, ["frontier", str(dp), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert f"{dp / 'c' / 'seed=0' / 'summary.json'}: dp.enabled but no epsilon in the summary" in r.output


def test_an_unfinished_run_is_named(tmp_path):
    plain, dp = _two_sweeps(tmp_path)
    (dp / "attack=foe__eps=2" / "seed=1" / "summary.json").unlink()
    with pytest.raises(Exception, match=r"seed=1/summary.json: missing \(the run did not finish"):
        load_frontier([plain, dp])


def test_two_lines_with_one_label_are_refused(tmp_path):
    plain, _ = _two_sweeps(tmp_path)
    dp = _sweep(tmp_path, "dp2", [("c", "alie", 3, DP, [(0, 0.5, 1.0)])])
    r = runner.invoke(app, ["frontier", f"A={plain}", f"A={dp}", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "give one of them a label" in r.output


def test_a_users_folder_needs_overwrite(tmp_path):
    plain, dp = _two_sweeps(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    r = runner.invoke(app, ["frontier", str(plain), str(dp), "--out", str(mine)])
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = runner.invoke(app, ["frontier", str(plain), str(dp), "--out", str(mine), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert (mine / "notes.txt").read_text() == "x" and (mine / "frontier.csv").is_file()
    r = runner.invoke(app, ["frontier", str(plain), str(dp), "--out", str(mine)])  # now marked as its own: replaced
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_tiny_digits_sweeps_end_to_end(tmp_path):
    attacks = 'attack={name="alie",f=2},{name="none",f=0}'
    common = ["--seeds", "2", "--grid", attacks, "--set", "rounds=2", "--set", "clients.num_clients=8",
              "--set", "robust.rule=trimmed_mean"]
    r = runner.invoke(app, ["sweep", "--out", str(tmp_path / "plain"), *common])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["sweep", "--out", str(tmp_path / "dp"), *common, "--grid", "dp.target_epsilon=2,8",
                            "--set", "dp.enabled=true", "--set", "dp.placement=local"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["frontier", str(tmp_path / "plain"), str(tmp_path / "dp"), "--out", str(tmp_path / "f")])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((tmp_path / "f" / "frontier.csv").open()))
    assert len(rows) == 2 + 4
    naive = {**_naive(tmp_path / "plain"), **_naive(tmp_path / "dp")}
    for row in rows:
        acc, sd, eps = naive[row["cell"]]
        assert float(row["accuracy"]) == pytest.approx(acc, abs=1e-12)
        assert float(row["accuracy_sd"]) == pytest.approx(sd, abs=1e-12)
        assert float(row["epsilon"]) == pytest.approx(eps, rel=1e-12)
        if row["target_epsilon"]:
            assert float(row["epsilon"]) == pytest.approx(float(row["target_epsilon"]), rel=1e-3)
