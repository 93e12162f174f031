"""The sweep's worst case per setting over the attacks (worst_case.csv and the heatmap's
"worst case" column), each against a naive recomputation from the per-cell summaries."""

import csv
import itertools
import json
import random
import statistics

import numpy as np
import pytest
import torch

from fedsafe.engine.sweep import WORST_COLUMNS, parse_grid, run_sweep, worst_case
from fedsafe.report.heatmap import WORST_LABEL, figure_sweep, worst_column


def _naive(records, settings, attacks):
    """Per setting: scan the attacks in order, keep the strictly lowest accuracy and the
    strictly highest ASR (so the first of equals), skipping missing values."""
    out = []
    for s in settings:
        acc = asr = None
        missing = []
        for a in attacks:
            cell = [r for r in records if all(r[k] == v for k, v in {**s, **a}.items())]
            r = cell[0] if cell else None
            if r is None or r.get("final_accuracy") is None:
                missing.append(a)
            elif acc is None or r["final_accuracy"] < acc[0]:
                acc = (r["final_accuracy"], r.get("final_accuracy_sd"), a)
            if r is not None and r.get("final_attack_success_rate") is not None:
                if asr is None or r["final_attack_success_rate"] > asr[0]:
                    asr = (r["final_attack_success_rate"], r.get("final_attack_success_rate_sd"), a)
        out.append((acc, asr, missing))
    return out


def _random_records(rng: random.Random):
    rules, pres, names, zs = ["mean", "median", "flame"], [[], ["nnm"]], ["alie", "pattern_backdoor", "dba"], [1, 2]
    recs = []
    for rule, pre, name, z in itertools.product(rules, pres, names, zs):
        r = {"robust.rule": rule, "robust.pre": pre, "attack.name": name, "attack.params.z": z}
        if rng.random() < 0.15:
            r.update(final_accuracy=None, not_applicable="n/a")
        else:  # coarse values, so that ties occur
            r.update(final_accuracy=rng.choice([0.1, 0.5, 0.5, 0.9]), final_accuracy_sd=rng.random())
            if name != "alie":
                r.update(final_attack_success_rate=rng.choice([0.0, 0.3, 0.3, 1.0]),
                         final_attack_success_rate_sd=rng.random())
        recs.append(r)
    return recs


@pytest.mark.parametrize("seed", range(20))
def test_worst_case_against_a_naive_scan(seed):
    recs = _random_records(random.Random(seed))
    keys = ["robust.rule", "robust.pre", "attack.name", "attack.params.z"]
    rows = worst_case(recs, keys)
    settings = [{"robust.rule": r, "robust.pre": p} for r in ["mean", "median", "flame"] for p in [[], ["nnm"]]]
    attacks = [{"attack.name": n, "attack.params.z": z} for n in ["alie", "pattern_backdoor", "dba"] for z in [1, 2]]
    assert [{k: r[k] for k in ("robust.rule", "robust.pre")} for r in rows] == settings
    for row, (acc, asr, missing) in zip(rows, _naive(recs, settings, attacks)):
        name = lambda a: f"attack.name={a['attack.name']}, attack.params.z={a['attack.params.z']}"  # noqa: E731
        assert row["attacks"] == len(attacks) - len(missing)
        assert row["missing"] == "; ".join(map(name, missing))
        if acc is None:
            assert row["worst_accuracy"] is None and row["worst_accuracy_attack"] == ""
        else:
            assert (row["worst_accuracy"], row["worst_accuracy_sd"], row["worst_accuracy_attack"]) == (
                acc[0], acc[1], name(acc[2]))
        if asr is None:
            assert row["worst_asr"] is None and row["asr_attacks"] == 0
        else:
            assert (row["worst_asr"], row["worst_asr_sd"], row["worst_asr_attack"]) == (asr[0], asr[1], name(asr[2]))


def test_worst_column_against_a_naive_scan():
    rng = np.random.default_rng(0)
    for _ in range(50):
        m = rng.choice([0.1, 0.5, 0.9, np.nan], size=(4, 5))
        sd = rng.random((4, 5))
        for higher in (True, False):
            w, s = worst_column(m, sd, higher)
            for i in range(4):
                vals = [(m[i, j], sd[i, j]) for j in range(5) if not np.isnan(m[i, j])]
                if not vals:
                    assert np.isnan(w[i]) and np.isnan(s[i])
                    continue
                best = vals[0]
                for v in vals[1:]:
                    if (v[0] < best[0]) if higher else (v[0] > best[0]):
                        best = v
                assert (w[i], s[i]) == best


def test_heatmap_ends_in_the_worst_case_column_when_attacks_are_the_columns():
    recs = [
        {"robust.rule": "mean", "attack.name": "alie", "final_accuracy": 0.2, "final_accuracy_sd": 0.01},
        {"robust.rule": "mean", "attack.name": "dba", "final_accuracy": 0.9, "final_accuracy_sd": 0.02,
         "final_attack_success_rate": 0.95, "final_attack_success_rate_sd": 0.03},
        {"robust.rule": "flame", "attack.name": "alie", "final_accuracy": None, "not_applicable": "x"},
        {"robust.rule": "flame", "attack.name": "dba", "final_accuracy": 0.8, "final_accuracy_sd": 0.05,
         "final_attack_success_rate": 0.1, "final_attack_success_rate_sd": 0.04},
    ]
    keys = ["robust.rule", "attack.name"]
    fig = figure_sweep(recs, keys, "robust.rule", "attack.name", worst_case=True)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["alie", "dba", WORST_LABEL]
    assert [t.get_text() for t in fig.axes[0].texts] == ["20 ± 1", "90 ± 2", "20 ± 1", "n/a", "80 ± 5", "80 ± 5"]
    asr = figure_sweep(recs, keys, "robust.rule", "attack.name", worst_case=True, metric="final_attack_success_rate")
    assert [t.get_text() for t in asr.axes[0].texts] == ["95 ± 3", "95 ± 3", "10 ± 4", "10 ± 4"]
    # without --worst-case, or with columns that are not attacks, no such column
    plain = figure_sweep(recs, keys, "robust.rule", "attack.name")
    assert WORST_LABEL not in [t.get_text() for t in plain.axes[0].get_xticklabels()]
    swapped = figure_sweep(recs, keys, "attack.name", "robust.rule", worst_case=True)
    assert WORST_LABEL not in [t.get_text() for t in swapped.axes[0].get_xticklabels()]


def test_sweep_writes_worst_case_csv_matching_its_runs(tmp_path):
    base = {"rounds": 2, "eval_every": 1, "data": {"name": "digits", "max_train": 300}, "model": {"name": "logreg"},
            "clients": {"num_clients": 7}, "attack": {"name": "alie", "f": 1}}
    grid = parse_grid(["robust.rule=mean,median", "attack.name=alie,pattern_backdoor"])
    run_sweep(base, grid, tmp_path, seeds=2)
    with open(tmp_path / "worst_case.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["robust.rule", *WORST_COLUMNS]
    # naive: each run's own summary.json, mean and sd over its seeds, then the worst over attacks
    for row in rows:
        cells = {}
        for attack in ("alie", "pattern_backdoor"):
            runs = [json.loads(p.read_text()) for p in sorted(
                (tmp_path / f"robust.rule={row['robust.rule']}__attack.name={attack}").glob("seed=*/summary.json"))]
            assert len(runs) == 2
            acc = [r["final_accuracy"] for r in runs]
            asr = [r.get("final_attack_success_rate") for r in runs]
            cells[attack] = (statistics.mean(acc), statistics.stdev(acc),
                             None if asr[0] is None else (statistics.mean(asr), statistics.stdev(asr)))
        worst = min(cells, key=lambda a: cells[a][0])
        assert row["worst_accuracy_attack"] == worst
        assert float(row["worst_accuracy"]) == pytest.approx(cells[worst][0])
        assert float(row["worst_accuracy_sd"]) == pytest.approx(cells[worst][1])
        assert row["asr_attacks"] == "1" and row["worst_asr_attack"] == "pattern_backdoor"
        assert float(row["worst_asr"]) == pytest.approx(cells["pattern_backdoor"][2][0])
        assert float(row["worst_asr_sd"]) == pytest.approx(cells["pattern_backdoor"][2][1])
        assert row["attacks"] == "2" and row["missing"] == ""


def test_runs_sharing_a_loaded_dataset_match_runs_that_load_their_own(tmp_path):
    from fedsafe.config import validate
    from fedsafe.data.loader import SHARED_LOADS, load_federated, shared_loads
    from fedsafe.engine.run import run_experiment

    base = {"rounds": 2, "eval_every": 1, "data": {"name": "digits", "max_train": 300, "partition": "dirichlet"},
            "model": {"name": "logreg"}, "clients": {"num_clients": 7}, "attack": {"name": "pattern_backdoor", "f": 1}}
    grid = parse_grid(["robust.rule=mean,median"])
    recs = run_sweep(base, grid, tmp_path / "s", seeds=2)  # in one process: the cells share the loads
    for rec in recs:
        for seed, acc in zip(rec["seeds"], rec["final_accuracy_seeds"]):
            cfg = validate({**base, "seed": seed, "robust": {"rule": rec["robust.rule"]}})
            alone = run_experiment(cfg, tmp_path / f"{rec['robust.rule']}{seed}", quiet=True)[cfg.name]
            assert alone["final_accuracy"] == acc
    cfg = validate(base)
    assert load_federated(cfg.data, 7, 0) is not load_federated(cfg.data, 7, 0)  # outside: every call loads
    with shared_loads():
        first = load_federated(cfg.data, 7, 0)
        assert load_federated(cfg.data, 7, 0) is first
        assert load_federated(cfg.data, 7, 1) is not first  # another seed, another partition
        first.x_train.add_(1.0)  # a dataset changed in place is loaded afresh
        again = load_federated(cfg.data, 7, 0)
        assert again is not first and not torch.equal(again.x_train, first.x_train)
        for seed in range(1, SHARED_LOADS + 1):  # the least recently used is dropped
            load_federated(cfg.data, 7, seed)
        assert load_federated(cfg.data, 7, 0) is not again
