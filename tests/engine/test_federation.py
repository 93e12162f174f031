import json

import numpy as np
import pytest
import torch

from fedsafe.config import apply_overrides, validate
from fedsafe.engine.federation import Federation
from fedsafe.engine.metrics import read_metrics
from fedsafe.engine.run import run_experiment


def small(**over):
    raw = {
        "seed": 3,
        "rounds": 6,
        "eval_every": 2,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "mlp", "hidden": 16},
        "clients": {"num_clients": 8, "batch_size": 16},
        "server": {"lr": 0.3, "momentum": 0.5},
    }
    return validate(apply_overrides(raw, over))


def strip(rows):
    """Rows without wall-clock timings (every key ending in "seconds")."""
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]


def close_rows(a, b, rtol=1e-4):
    assert len(a) == len(b)
    for ra, rb in zip(strip(a), strip(b)):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float):
                assert ra[k] == pytest.approx(rb[k], rel=rtol, abs=1e-6), k
            else:
                assert ra[k] == rb[k], k


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"clients.algorithm": "fedavg", "clients.local_epochs": 1, "clients.lr": 0.05, "clients.momentum": 0.0},
        {"clients.sampling": "fixed", "clients.sample_size": 5, "clients.weight_decay": 1e-3},
    ],
)
@pytest.mark.parametrize("chunk", [None, 3])
def test_serial_and_vectorized_agree(over, chunk, monkeypatch):
    # chunk 3: vmap over 3 clients at a time into one output (what execution = "auto" does for
    # models whose gradients of every client do not fit in AUTO_CHUNK_BYTES)
    from fedsafe.engine import backends

    if chunk is not None:
        monkeypatch.setattr(backends, "auto_chunk", lambda dim, itemsize=4: chunk)
        monkeypatch.setattr(backends, "AUTO_WHOLE_BYTES", 0)
    fa = Federation(small(execution="serial", **over))
    fb = Federation(small(execution="vectorized", **over))
    assert backends.describe(fb.backend) == f"vectorized(chunk={chunk or backends.auto_chunk(fb.layout.dim)})"
    fa.run(), fb.run()
    close_rows(fa.rows, fb.rows)
    torch.testing.assert_close(fa.state.params, fb.state.params, rtol=1e-4, atol=1e-5)


def test_auto_execution_batches_small_models_and_loops_over_large_ones():
    from fedsafe.engine import backends

    assert backends.auto_chunk(7510) == (8 << 20) // (4 * 7510) == 279
    assert backends.auto_chunk(75010) == 27 and backends.auto_chunk(431080) == 4
    assert backends.auto_chunk(5_000_000) == 1
    fed = Federation(small(execution="auto"))
    assert backends.describe(fed.backend) == f"vectorized(chunk={backends.auto_chunk(fed.layout.dim)})"
    fed.run()
    assert fed.summary()["execution"] == backends.describe(fed.backend)
    big = Federation(small(execution="auto", **{"model.hidden": 40_000}))  # 2.97M parameters
    assert big.layout.dim > (8 << 20) // 8 and backends.describe(big.backend) == "serial"


def test_every_client_taking_part_keeps_momentum_without_copies():
    # with sampling "all" the round's momentum becomes the state itself (no gather or scatter);
    # with a sample, the rows are gathered and written back: both equal the formula
    fed = Federation(small(rounds=2))
    fed.run_round()
    everyone = np.arange(fed.cfg.clients.num_clients)
    m1 = fed.state.momentum.gather(everyone)
    assert fed.state.momentum.gather(everyone) is m1  # the stored rows themselves, no gather
    fed.run_round()
    assert fed.state.momentum.gather(everyone).data_ptr() != m1.data_ptr()
    part = Federation(small(rounds=2, **{"clients.sampling": "fixed", "clients.sample_size": 8}))
    part.run()
    torch.testing.assert_close(part.state.params, fed.state.params)


def test_fedavg_masks_clients_that_finished():
    # With local_epochs, clients with more data run more steps; each client's delta must equal
    # a plain per-client loop of its own number of steps.
    cfg = small(**{"clients.algorithm": "fedavg", "clients.local_epochs": 1, "clients.lr": 0.1})
    fed = Federation(cfg, )
    ids = np.arange(cfg.clients.num_clients)
    res = fed.work.run(1, fed.state.params, ids)
    from fedsafe.engine.clients import draw_batches

    steps = fed.work.steps
    assert len(set(steps.tolist())) > 1, "partition should give clients different step counts"
    for row, c in enumerate(ids):
        w = fed.state.params.clone()
        for s in range(steps[c]):
            idx = torch.from_numpy(draw_batches(cfg.seed, 1, s, np.array([c]), fed.data.client_indices, 16))
            g, _ = fed.backend.gradients(w, fed.data.x_train[idx], fed.data.y_train[idx])
            w = w - 0.1 * g[0]
        torch.testing.assert_close(res.updates[row], w - fed.state.params, rtol=1e-4, atol=1e-6)


def test_training_learns():
    fed = Federation(small(rounds=30, **{"model.name": "logreg"}))
    s = fed.run()
    assert s["final_accuracy"] > 0.85
    assert fed.rows[-1]["train_loss"] < fed.rows[0]["train_loss"]


def test_resume_equals_uninterrupted(tmp_path):
    cfg = small(rounds=9, checkpoint_every=3)
    full = tmp_path / "full"
    run_experiment(cfg, full, quiet=True)

    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "config.toml").write_text(cfg.to_toml())
    fed = Federation(cfg, out_dir=killed)
    for _ in range(7):  # checkpoint after round 6; round 7 is written, then the process "dies"
        fed.run_round()
    del fed
    assert len(read_metrics(killed)) == 7
    run_experiment(cfg, killed, resume=True, quiet=True)

    a, b = read_metrics(full), read_metrics(killed)
    assert strip(a) == strip(b)  # exactly the same numbers
    sa = json.loads((full / "summary.json").read_text())
    sb = json.loads((killed / "summary.json").read_text())
    assert sa["final_accuracy"] == sb["final_accuracy"] and sa["rounds"] == sb["rounds"] == 9


def test_metrics_rows_have_required_fields(tmp_path):
    run_experiment(small(), tmp_path / "r", quiet=True)
    rows = read_metrics(tmp_path / "r")
    for r in rows:
        for key in ("round", "train_loss", "test_loss", "test_accuracy", "seconds", "bytes_up", "bytes_down"):
            assert key in r
    assert [r["round"] for r in rows] == list(range(1, 7))
    assert rows[0]["test_accuracy"] is None and rows[1]["test_accuracy"] is not None
    d = Federation(small()).state.params.numel()
    assert rows[0]["bytes_up"] == rows[0]["bytes_down"] == 8 * d * 4
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds"] == 6 and summary["final_accuracy"] == rows[-1]["test_accuracy"]


def test_poisson_sampling_skips_empty_rounds():
    fed = Federation(small(rounds=12, **{"clients.sampling": "poisson", "clients.sample_rate": 0.05}))
    fed.run()
    skipped = [r for r in fed.rows if r.get("skipped")]
    assert skipped and all(r["participants"] == 0 for r in skipped)
    assert len(fed.rows) == 12


def test_variants_run_side_by_side(tmp_path):
    cfg = small(rounds=2, variants={"a": {"server.lr": 0.1}, "b": {"model": {"name": "logreg"}}})
    out = run_experiment(cfg, tmp_path / "v", quiet=True)
    assert list(out) == ["a", "b"]
    top = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert set(top["variants"]) == {"a", "b"}
    assert (tmp_path / "v" / "a" / "metrics.jsonl").exists()
    assert "lr = 0.1" in (tmp_path / "v" / "a" / "config.toml").read_text()


def test_nonfinite_updates_never_reach_the_model():
    fed = Federation(small(rounds=15, **{"attack.name": "inf_nan", "attack.f": 2, "model.name": "logreg"}))
    fed.run()
    assert all(r["excluded_nonfinite"] == 2 for r in fed.rows)
    assert torch.isfinite(fed.state.params).all()
    assert fed.rows[-1]["test_accuracy"] > 0.3


def test_label_flip_trains_byzantine_clients_on_flipped_labels():
    cfg = small(rounds=1, **{"attack.name": "label_flip", "attack.f": 2})
    fed = Federation(cfg)
    byz = np.array(sorted(fed.byzantine))
    flipped = fed.work.run(1, fed.state.params, byz, torch.zeros(2, fed.state.params.numel()),
                           lambda x, y, c: (x, c - 1 - y))
    honest_way = fed.work.run(1, fed.state.params, byz, torch.zeros(2, fed.state.params.numel()))
    assert not torch.allclose(flipped.updates, honest_way.updates)
    seen = {}
    proto = fed.protocol.aggregate

    def spy(messages, pipeline, ctx):
        seen["byz"] = torch.stack([m.vector for m in messages[-2:]])
        return proto(messages, pipeline, ctx)

    fed.protocol.aggregate = spy
    fed.run_round()
    torch.testing.assert_close(seen["byz"], flipped.updates)


def test_robust_pipeline_holds_where_mean_collapses():
    over = {"attack.name": "alie", "attack.f": 2, "attack.params": {"z": 30.0}, "rounds": 20}
    mean = Federation(small(**over)).run()
    robust = Federation(small(**over, **{"robust.rule": "trimmed_mean", "robust.pre": ["nnm"]})).run()
    clean = Federation(small(rounds=20)).run()
    assert mean["final_accuracy"] < 0.2  # chance is 0.1
    assert robust["final_accuracy"] > clean["final_accuracy"] - 0.05


def test_rule_requirement_refused_at_config_time():
    from fedsafe.config import ConfigError

    with pytest.raises(ConfigError, match="krum"):
        Federation(small(**{"robust.rule": "krum", "attack.f": 3}))


def test_adam_and_ema_resume_exactly(tmp_path):
    cfg = small(rounds=6, checkpoint_every=2, **{"server.optimizer": "adam", "server.lr": 0.01, "server.momentum": 0.0, "server.ema": 0.9})
    run_experiment(cfg, tmp_path / "a", quiet=True)
    d = tmp_path / "b"
    d.mkdir()
    (d / "config.toml").write_text(cfg.to_toml())
    fed = Federation(cfg, out_dir=d)
    for _ in range(5):
        fed.run_round()
    run_experiment(cfg, d, resume=True, quiet=True)
    assert strip(read_metrics(tmp_path / "a")) == strip(read_metrics(d))


def test_ema_is_what_gets_evaluated():
    fed = Federation(small(rounds=3, **{"server.ema": 0.5}))
    fed.run()
    assert fed.evaluate() == fed.evaluate(fed.ema.value)
    assert fed.evaluate() != fed.evaluate(fed.state.params)


def test_poisson_skips_only_rule_requirements_and_protocol_errors(monkeypatch):
    # Under Poisson sampling a round whose sample breaks the rule's n/f requirement is skipped
    # with the reason; any other ValueError is a bug and must propagate, not become a skip.
    from fedsafe.core.errors import RequirementError

    poisson = {"clients.sampling": "poisson", "clients.sample_rate": 0.9, "robust.rule": "krum", "attack.f": 0}
    fed = Federation(small(rounds=3, **poisson))
    calls = []

    def too_small(updates, **kw):  # the rule the pipeline calls, whoever aggregates
        calls.append(len(updates))
        raise RequirementError("krum requires n >= 2f + 3, got n=2, f=0")

    monkeypatch.setattr(fed.pipeline, "rule", too_small)
    fed.run()
    assert calls and all(r["skipped"] == "krum requires n >= 2f + 3, got n=2, f=0" for r in fed.rows if r["participants"])

    fed = Federation(small(rounds=3, **poisson))

    def bug(updates, **kw):
        raise ValueError("operands could not be broadcast together")

    monkeypatch.setattr(fed.pipeline, "rule", bug)
    with pytest.raises(ValueError, match="broadcast"):
        fed.run()


def test_rule_requirement_errors_are_requirement_errors():
    from fedsafe.core.errors import RequirementError
    from fedsafe.robust.aggregators import AGGREGATORS
    from fedsafe.robust.preaggregators import PREAGGREGATORS

    x = torch.zeros(3, 4)
    with pytest.raises(RequirementError, match=r"krum requires n >= 2f \+ 3, got n=3, f=1"):
        AGGREGATORS.get("krum", {})(x, f=1)
    with pytest.raises(RequirementError, match="trimmed_mean requires"):
        AGGREGATORS.get("trimmed_mean", {})(x, f=2)
    with pytest.raises(RequirementError, match="nnm requires"):
        PREAGGREGATORS.get("nnm", {})(x, f=2)
    with pytest.raises(ValueError, match="f must be an integer >= 0") as err:
        AGGREGATORS.get("krum", {})(x, f=-1)
    assert not isinstance(err.value, RequirementError)


def test_a_model_that_overflows_stops_naming_the_round_and_the_learning_rates():
    """A finite direction times server.lr = 1e308 overflows float32: the run stops at that round
    with a DivergedError instead of training an all-inf model (a non-finite *direction* still
    only skips its round: test_nonfinite_updates_never_reach_the_model)."""
    from fedsafe.core.errors import DivergedError, FedsafeError

    fed = Federation(small(rounds=3, **{"server.lr": 1e308, "model.name": "logreg"}))
    before = fed.state.params.clone()
    with pytest.raises(DivergedError, match=r"round 1: .*not finite.*server\.lr = 1e\+308.*clients\.lr") as e:
        fed.run_round()
    assert isinstance(e.value, FedsafeError)
    assert fed.state.round == 0 and torch.equal(fed.state.params, before)  # the state is not overwritten


def test_diverged_run_is_one_error_line_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from fedsafe.cli import app

    r = CliRunner().invoke(app, [
        "run", "--out", str(tmp_path / "o"), "-q", "--variant", "base", "--set", "rounds=2",
        "--set", "server.lr=1e308", "--set", "data.name=digits", "--set", "model.name=logreg",
        "--set", "clients.num_clients=5",
    ])
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "round 1" in errors[0] and "server.lr" in errors[0], r.output
    assert "Traceback" not in r.output
