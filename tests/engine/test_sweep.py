import csv
import itertools
import json
import re
import statistics

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.config import ConfigError
from fedsafe.engine.sweep import cell_configs, cells, parse_grid, run_sweep
from fedsafe.report.heatmap import accuracy_grid, figure_sweep

BASE = {
    "rounds": 2,
    "eval_every": 1,
    "data": {"name": "digits", "max_train": 300},
    "model": {"name": "logreg"},
    "clients": {"num_clients": 7},
    "attack": {"name": "sign_flip"},
}


def test_parse_grid_types_values():
    g = parse_grid(["attack.f=1,2", "robust.rule=mean,median", "server.lr=0.1"])
    assert g == {"attack.f": [1, 2], "robust.rule": ["mean", "median"], "server.lr": [0.1]}
    assert len(cells(g)) == 4
    with pytest.raises(ConfigError, match="expected section.key"):
        parse_grid(["attack.f"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["a.b=1", "a.b=2"])
    with pytest.raises(ConfigError, match="at least one"):
        parse_grid([])


def test_typo_in_any_cell_fails_before_running():
    with pytest.raises(ConfigError) as e:
        cell_configs(BASE, parse_grid(["robust.rule=mean,medain"]))
    assert any("medain" in p for p in e.value.problems)


def test_sweep_runs_cells_records_not_applicable_and_reuses(tmp_path):
    grid = parse_grid(["robust.rule=mean,krum", "attack.f=1,3"])
    seen = []
    recs = run_sweep(BASE, grid, tmp_path, on_cell=lambda c, r: seen.append(c.dirname))
    assert len(recs) == 4 and len(seen) == 4
    by = {(r["robust.rule"], r["attack.f"]): r for r in recs}
    # Krum needs n >= 2f + 3: 7 clients allow f = 1 but not f = 3.
    assert by[("krum", 3)]["final_accuracy"] is None and "2f" in by[("krum", 3)]["not_applicable"]
    assert by[("krum", 1)]["final_accuracy"] is not None and by[("mean", 3)]["final_accuracy"] is not None
    with open(tmp_path / "sweep.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["robust.rule"] for r in rows] == ["mean", "mean", "krum", "krum"]
    assert float(rows[0]["final_accuracy"]) == pytest.approx(recs[0]["final_accuracy"])
    # A second call reuses every finished cell; only the not-applicable one is tried again.
    again = []
    run_sweep(BASE, grid, tmp_path, on_cell=lambda c, r: again.append(c.dirname))
    assert again == ["robust.rule=krum__attack.f=3"]


def test_heatmap_worst_case():
    recs = [
        {"a": "x", "r": "mean", "f": 1, "final_accuracy": 0.9},
        {"a": "y", "r": "mean", "f": 1, "final_accuracy": 0.2},
        {"a": "x", "r": "med", "f": 1, "final_accuracy": 0.8},
        {"a": "y", "r": "med", "f": 1, "final_accuracy": None},
    ]
    _, _, m = accuracy_grid(recs, "r", "f", {"a": "y"})
    assert m[0, 0] == 0.2 and m[1, 0] != m[1, 0]  # NaN where not applicable
    fig = figure_sweep(recs, ["a", "r", "f"], "r", "f", worst_case=True)
    assert len(fig.axes) == 4  # two attack panels, the worst case, the colour bar
    worst = fig.axes[2].images[0].get_array()
    assert worst[0, 0] == pytest.approx(20) and worst[1, 0] == pytest.approx(80)


def test_sweep_cli_writes_heatmap(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('rounds = 2\n[data]\nname = "digits"\nmax_train = 200\n[model]\nname = "logreg"\n[clients]\nnum_clients = 5\n[attack]\nname = "sign_flip"\n')
    r = CliRunner().invoke(
        app, ["sweep", str(base), "--grid", "robust.rule=mean,median", "--grid", "attack.f=0,1", "--out", str(tmp_path / "s")]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s" / "heatmap.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_of_the_default_config_replaces_its_variants(tmp_path):
    r = CliRunner().invoke(app, ["sweep", "--grid", "robust.rule=mean,median", "--grid", "attack.f=0,1",
                                 "--set", "rounds=1", "--set", "attack.params={}", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "variants (mean, nnm_trimmed_mean) are not run" in r.output
    assert (tmp_path / "s" / "heatmap.png").exists()


# --- list-valued axes, directory names, n/a visibility ------------------------------------


def test_grid_values_split_at_top_level_commas_only():
    from fedsafe.engine.sweep import split_values

    assert split_values('[],["nnm"],["nnm", "bucketing"]') == ["[]", '["nnm"]', '["nnm", "bucketing"]']
    assert split_values('{tau=1, iters=2},{tau=3}') == ["{tau=1, iters=2}", "{tau=3}"]
    assert split_values('"a,b",c') == ['"a,b"', "c"]
    g = parse_grid(['robust.pre=[],["nnm"],[{name="bucketing", params={s=2}}]'])
    assert g["robust.pre"] == [[], ["nnm"], [{"name": "bucketing", "params": {"s": 2}}]]
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(['robust.pre=["nnm"],[ "nnm" ]'])


def test_cell_directory_names_are_safe_readable_and_unique():
    from fedsafe.config import check_run_name

    g = {"robust.pre": [[], ["nnm"], [{"name": "bucketing", "params": {"s": 2}}]],
         "x.y": [1, "1", "a b", "mean"], "robust.rule": ["trimmed_mean"]}
    names = [c.dirname for c in cells(g)]
    assert len(set(names)) == len(names) == 12
    for n in names:
        check_run_name(n)  # the config's own rule for names that become folders
        check_run_name(n + "__seed=18446744073709551615")
    # Plain values keep their plain names (and finished cells of older sweeps stay reusable);
    # values that collide once written (1 and "1") get a hash each.
    assert any(n.endswith("__x.y=mean__robust.rule=trimmed_mean") for n in names)
    ones = {n.split("__")[1] for n in names if n.split("__")[1].startswith("x.y=1")}
    assert len(ones) == 2 and all(re.fullmatch(r"x\.y=1-[0-9a-f]{8}", o) for o in ones)
    assert any("robust.pre=bucketing-s-2-" in n for n in names) and any("x.y=a-b-" in n for n in names)
    long = {"a.b": ["x" * 300, "y" * 300]}
    for c in cells(long):
        check_run_name(c.dirname)


def _contrast(c1, c2):
    # WCAG 2 contrast ratio of two sRGB colours.
    def lum(c):
        ch = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c[:3]]
        return 0.2126 * ch[0] + 0.7152 * ch[1] + 0.0722 * ch[2]
    hi, lo = sorted([lum(c1), lum(c2)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _annotations_are_readable(fig):
    """Every number drawn in a cell contrasts (WCAG ≥ 4.5) with the pixels painted under it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_rgb

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    px = np.asarray(canvas.buffer_rgba())[..., :3] / 255.0
    h = px.shape[0]
    checked = 0
    for ax in fig.axes:
        if not ax.images:
            continue
        for t in ax.texts:
            x, y = t.get_position()
            # Sample the cell's fill near a corner, away from the glyphs.
            dx, dy = ax.transData.transform((x - 0.4, y - 0.4))
            fill = px[h - int(round(dy)) - 1, int(round(dx))]
            assert _contrast(to_rgb(t.get_color()), fill) >= 4.5, (t.get_text(), t.get_color(), fill)
            checked += 1
    return checked


def test_heatmap_draws_not_applicable_cells_visibly_and_list_values():
    recs = [
        {"robust.pre": [], "r": "mean", "f": 1, "final_accuracy": 0.9},
        {"robust.pre": ["nnm"], "r": "mean", "f": 1, "final_accuracy": 0.55},
        {"robust.pre": [], "r": "krum", "f": 1, "final_accuracy": None, "not_applicable": "n >= 2f + 3"},
        {"robust.pre": ["nnm"], "r": "krum", "f": 1, "final_accuracy": 0.1},
    ]
    fig = figure_sweep(recs, ["robust.pre", "r", "f"], "r", "robust.pre", worst_case=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("n/a") == 1
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["[]", '["nnm"]']
    assert _annotations_are_readable(fig) == 8  # the f=1 panel and the worst-case panel


def test_heatmap_annotates_mean_and_sd_over_seeds():
    recs = [
        {"r": "mean", "f": 1, "final_accuracy": 0.8, "final_accuracy_sd": 0.05, "n_seeds": 3},
        {"r": "mean", "f": 2, "final_accuracy": 0.4, "final_accuracy_sd": 0.1, "n_seeds": 3},
    ]
    fig = figure_sweep(recs, ["r", "f"], "r", "f")
    assert [t.get_text() for t in fig.axes[0].texts] == ["80 ± 5", "40 ± 10"]
    assert _annotations_are_readable(fig) == 2


# --- seeds -------------------------------------------------------------------------------


def test_mean_sd_matches_statistics():
    from fedsafe.engine.sweep import mean_sd

    vals = [0.91, 0.85, 0.88, None]
    m, sd, n = mean_sd(vals)
    assert n == 3 and m == pytest.approx(statistics.mean([0.91, 0.85, 0.88]))
    assert sd == pytest.approx(statistics.stdev([0.91, 0.85, 0.88]))
    assert mean_sd([0.5]) == (0.5, None, 1) and mean_sd([None]) == (None, None, 0)


def test_seeds_reuse_across_seed_counts_and_rerun_stale_cells(tmp_path):
    grid = parse_grid(["robust.rule=mean"])
    seen = []
    recs = run_sweep(BASE, grid, tmp_path, seeds=1, on_cell=lambda c, r: seen.append(r["seed"]))
    assert seen == [0] and (tmp_path / "robust.rule=mean" / "summary.json").exists()
    seen.clear()
    recs = run_sweep(BASE, grid, tmp_path, seeds=3, on_cell=lambda c, r: seen.append(r["seed"]))
    assert seen == [1, 2]  # seed 0 is the one-seed sweep's run
    assert recs[0]["n_seeds"] == 3 and recs[0]["final_accuracy_seeds"][0] == pytest.approx(
        json.loads((tmp_path / "robust.rule=mean" / "summary.json").read_text())["final_accuracy"])
    assert sorted(p.name for p in (tmp_path / "robust.rule=mean").iterdir() if p.is_dir()) == ["seed=1", "seed=2"]
    # A cell is reused only when its resolved config matches: a changed base reruns every run.
    seen.clear()
    run_sweep({**BASE, "rounds": 1}, grid, tmp_path, seeds=3, on_cell=lambda c, r: seen.append(r["seed"]))
    assert sorted(seen) == [0, 1, 2]


def test_parallel_jobs_with_seeds(tmp_path):
    grid = parse_grid(["robust.rule=mean,median"])
    serial = run_sweep(BASE, grid, tmp_path / "a", seeds=2)
    parallel = run_sweep(BASE, grid, tmp_path / "b", seeds=2, jobs=2)
    # Same seeds, same runs: parallel cells give the serial figures.
    for s, p in zip(serial, parallel):
        assert p["final_accuracy_seeds"] == pytest.approx(s["final_accuracy_seeds"])


# --- worst case over attacks, best over hyper-parameters ------------------------------------


def _naive_best_worst(records, rule):
    # Reference: loop over settings, require every attack, keep the first maximum.
    settings = []
    for r in records:
        s = (json.dumps(r["robust.pre"]), r["server.lr"])
        if r["robust.rule"] == rule and s not in settings:
            settings.append(s)
    attacks = list(dict.fromkeys(r["attack.name"] for r in records))
    best, best_val = None, -1.0
    for s in settings:
        accs = [r["final_accuracy"] for r in records
                if r["robust.rule"] == rule and (json.dumps(r["robust.pre"]), r["server.lr"]) == s]
        if len(accs) < len(attacks) or any(a is None for a in accs):
            continue
        if min(accs) > best_val:
            best, best_val = s, min(accs)
    return best, best_val


def _matches_row(r, row, lr):
    return r["robust.rule"] == row["robust.rule"] and r["robust.pre"] == row["robust.pre"] and r["server.lr"] == lr


def test_best_worst_case_selects_the_max_min_setting():
    from fedsafe.engine.sweep import best_worst_case, split_axes

    rng = np.random.default_rng(3)
    keys = ["robust.rule", "robust.pre", "server.lr", "attack.name", "attack.f"]
    records = []
    for rule, pre, lr, att in itertools.product(["mean", "median"], [[], ["nnm"]], [0.1, 1.0], ["alie", "foe", "ipm"]):
        acc = float(rng.uniform(0.1, 0.9))
        records.append({"robust.rule": rule, "robust.pre": pre, "server.lr": lr, "attack.name": att,
                        "attack.f": 2, "final_accuracy": acc, "final_accuracy_sd": None})
    # A setting that is best on average but collapses under one attack must not be chosen.
    for r in records:
        if r["robust.rule"] == "mean" and r["robust.pre"] == [] and r["server.lr"] == 0.1:
            r["final_accuracy"] = 0.99 if r["attack.name"] != "ipm" else 0.05
    # A setting with an attack that did not run is not eligible, however good the others are.
    for r in records:
        if r["robust.rule"] == "median" and r["robust.pre"] == ["nnm"] and r["server.lr"] == 1.0:
            r["final_accuracy"] = 0.98 if r["attack.name"] != "foe" else None
    axes = split_axes(keys)
    assert axes.group == ["robust.rule", "attack.f"] and axes.attack == ["attack.name"]
    assert axes.hyper == ["robust.pre", "server.lr"]
    rows = best_worst_case(records, keys)
    assert [r["robust.rule"] for r in rows] == ["mean", "median"]
    for row in rows:
        (pre, lr), val = _naive_best_worst(records, row["robust.rule"])
        assert (json.dumps(row["robust.pre"]), row["server.lr"]) == (pre, lr)
        assert row["worst_case_accuracy"] == pytest.approx(val)
        worst = min((r for r in records if r["robust.rule"] == row["robust.rule"]
                     and json.dumps(r["robust.pre"]) == pre and r["server.lr"] == lr),
                    key=lambda r: r["final_accuracy"])
        assert row["worst_attack"] == worst["attack.name"]
        assert row["settings"] == (4 if row["robust.rule"] == "mean" else 3)
    # --per robust.pre: each pre-aggregator chain is judged on its own, only server.lr is tuned.
    per = best_worst_case(records, keys, per=["robust.pre"])
    assert [(r["robust.rule"], r["robust.pre"]) for r in per] == [
        ("mean", []), ("mean", ["nnm"]), ("median", []), ("median", ["nnm"])]
    for row in per:
        cand = {lr: min(r["final_accuracy"] for r in records if _matches_row(r, row, lr)) for lr in (0.1, 1.0)
                if all(r["final_accuracy"] is not None for r in records if _matches_row(r, row, lr))}
        assert row["worst_case_accuracy"] == pytest.approx(max(cand.values()))
        assert row["server.lr"] == max(cand, key=cand.get)
    # No eligible setting: the row says why.
    bad = [dict(r, final_accuracy=None, not_applicable="n >= 2f + 3") for r in records if r["robust.rule"] == "mean"]
    (row,) = best_worst_case(bad, keys)
    assert row["worst_case_accuracy"] is None and "2f" in row["not_applicable"]


def test_eta_from_throughput():
    from fedsafe.engine.sweep import eta_seconds, progress_line

    assert eta_seconds(elapsed=30.0, ran=3, remaining=6) == pytest.approx(60.0)
    assert eta_seconds(elapsed=5.0, ran=0, remaining=6) is None
    assert progress_line(4, 12, "cells", eta=65.0) == "4/12 cells done, ETA 0:01:05"
    assert progress_line(2, 12, "cells", eta=None) == "2/12 cells done, ETA ?"
    assert progress_line(12, 12, "runs", eta=0.0) == "12/12 runs done"


def test_per_keys_join_the_groups_and_unknown_ones_are_refused():
    from fedsafe.engine.sweep import split_axes

    keys = ["robust.rule", "robust.pre", "data.alpha", "attack.name", "attack.params.z", "attack.f"]
    axes = split_axes(keys, per=["data.alpha"])
    assert axes.group == ["robust.rule", "data.alpha", "attack.f"]
    assert axes.attack == ["attack.name", "attack.params.z"] and axes.hyper == ["robust.pre"]
    with pytest.raises(ConfigError, match="--per data.beta: not a grid axis"):
        split_axes(keys, per=["data.beta"])


def test_best_worst_case_figure_is_readable_and_marks_not_applicable():
    from fedsafe.engine.sweep import best_worst_case, split_axes
    from fedsafe.report.heatmap import figure_best_worst_case

    keys = ["robust.rule", "robust.pre", "attack.name", "attack.f"]
    recs = [{"robust.rule": rule, "robust.pre": pre, "attack.name": a, "attack.f": f,
             "final_accuracy": None if (rule == "krum" and f == 3) else acc, "final_accuracy_sd": 0.02,
             "not_applicable": "n >= 2f + 3" if (rule == "krum" and f == 3) else ""}
            for (rule, pre, a, f), acc in zip(
                itertools.product(["mean", "krum"], [[], ["nnm"]], ["alie", "foe"], [1, 3]),
                np.linspace(0.05, 0.95, 16))]
    rows = best_worst_case(recs, keys)
    fig = figure_best_worst_case(rows, split_axes(keys))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("n/a") == 1 and sum("worst: " in t for t in texts) == 3
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "3"]
    assert _annotations_are_readable(fig) == 4


def test_a_cell_directory_holding_foreign_files_fails_the_sweep_before_any_run(tmp_path):
    from fedsafe.core.errors import FedsafeError

    from fedsafe.engine.sweep import SWEEP_MARKER

    (tmp_path / "robust.rule=median").mkdir()
    (tmp_path / "robust.rule=median" / "notes.txt").write_text("mine")
    seen = []
    # An unmarked folder that is not empty is not fedsafe's sweep: refused as a whole.
    with pytest.raises(FedsafeError, match="not a sweep folder fedsafe created"):
        run_sweep(BASE, parse_grid(["robust.rule=mean,median"]), tmp_path, on_cell=lambda c, r: seen.append(c))
    # In fedsafe's own sweep folder, not "not applicable": a cell folder the sweep may not
    # replace is the user's to resolve.
    (tmp_path / SWEEP_MARKER).write_text("{}")
    with pytest.raises(FedsafeError, match="robust.rule=median"):
        run_sweep(BASE, parse_grid(["robust.rule=mean,median"]), tmp_path, on_cell=lambda c, r: seen.append(c))
    assert seen == [] and (tmp_path / "robust.rule=median" / "notes.txt").read_text() == "mine"
