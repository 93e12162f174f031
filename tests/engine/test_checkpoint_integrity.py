"""Checkpoint integrity (issue #26 item 4): flipped bytes, hand edits and another run's checkpoint
are refused with a :class:`CheckpointError` saying what does not match; a forger who recomputes
the checksums still meets the semantic checks (round vs metrics rows, finite tensors)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.config import validate
from fedsafe.core.errors import CheckpointError
from fedsafe.engine.state import (
    CHECKPOINT,
    FederationState,
    load_checkpoint,
    run_identity,
    save_checkpoint,
    with_checksums,
)

runner = CliRunner()

CONFIG = """
name = "integrity"
rounds = 2
eval_every = 1
checkpoint_every = 2
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
[server]
momentum = 0.5
"""


def _run(cfg_text, out, *extra):
    cfg = out.parent / f"{out.name}.toml"
    cfg.write_text(cfg_text)
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out), "-q", *extra])
    assert r.exit_code == 0, r.output
    return out


def _extend(out, rounds=4):
    """Make a finished 2-round run resumable to ``rounds`` (rounds may differ on resume)."""
    text = (out / "config.toml").read_text().replace("rounds = 2", f"rounds = {rounds}")
    (out / "config.toml").write_text(text)
    (out / "summary.json").unlink()
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    return _extend(_run(CONFIG, root / "run"))


@pytest.fixture
def run(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _resume(out):
    r = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    return r, errors


def _refused(out, *needles):
    r, errors = _resume(out)
    assert r.exit_code == 2, r.output
    assert len(errors) == 1 and "checkpoint" in errors[0], r.output
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert "Traceback" not in r.output and not (out / "summary.json").exists()
    return errors[0]


def _blob(out):
    return torch.load(out / CHECKPOINT, weights_only=True)


def test_the_untouched_checkpoint_resumes(run):
    r, errors = _resume(run)
    assert r.exit_code == 0 and not errors, r.output
    assert (run / "summary.json").exists()


@pytest.mark.parametrize("key", ["params", "momentum", "server_buf"])
def test_flipped_bytes_inside_a_tensor_are_refused(run, key):
    """16 flipped low-order bytes keep every number finite and plausible: before checksums the
    run resumed silently and ended at the wrong accuracy."""
    tensor = _blob(run)[key]
    if key == "momentum":  # the clients' rows (ClientRows: their ids and rows)
        tensor = tensor["rows"]
    raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    data = bytearray((run / CHECKPOINT).read_bytes())
    at = data.find(raw)
    assert at >= 0 and data.find(raw, at + 1) < 0  # the tensor's bytes, stored once, uncompressed
    for i in range(16):  # the lowest mantissa byte of 16 float32 values
        data[at + 4 * i] ^= 0x5A
    (run / CHECKPOINT).write_bytes(bytes(data))
    loaded = _blob(run)[key]
    name = key
    if key == "momentum":
        loaded, name = loaded["rows"], "momentum.rows"
    assert bool(torch.isfinite(loaded).all()) and not torch.equal(loaded, tensor)  # corrupt yet finite
    _refused(run, f"tensor {name} does not match its checksum")


def test_a_hand_edited_round_is_refused(run):
    blob = _blob(run)
    blob["round"] = 3
    torch.save(blob, run / CHECKPOINT)
    _refused(run, "does not match the checksum")


def test_hand_scaled_params_are_refused(run):
    blob = _blob(run)
    blob["params"] = blob["params"] * 1e30  # finite in float32: only the checksum sees it
    assert bool(torch.isfinite(blob["params"]).all())
    torch.save(blob, run / CHECKPOINT)
    _refused(run, "tensor params does not match its checksum")


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(run, tmp_path):
    other = _run(CONFIG, tmp_path / "other", "--set", "seed=7", "--set", "clients.lr=0.2")
    shutil.copy(other / CHECKPOINT, run / CHECKPOINT)
    line = _refused(run, "another run", "seed (checkpoint: 7, this run: 0)", "clients.lr")
    assert "rounds" not in line


def test_a_checkpoint_without_checksums_is_refused(run):
    blob = _blob(run)
    del blob["integrity"]
    torch.save(blob, run / CHECKPOINT)
    _refused(run, "integrity")


def test_an_old_format_checkpoint_is_refused_with_the_reason(run):
    blob = _blob(run)
    blob["format"] = 1
    del blob["integrity"], blob["run"]
    torch.save(blob, run / CHECKPOINT)
    _refused(run, "format 1", "without checksums")


# --- a forger who recomputes the checksums: the semantic checks ------------------------------


def _forge(out, change):
    blob = change(_blob(out))
    torch.save(with_checksums(blob), out / CHECKPOINT)


def test_a_resealed_round_ahead_of_the_metrics_is_refused(run):
    def ahead(b):
        b["round"] = 3  # within rounds = 4, but metrics.jsonl holds rounds 1..2 only
        return b

    _forge(run, ahead)
    _refused(run, "round 3", "metrics.jsonl", "rounds 1..2")


def test_a_checkpoint_with_missing_metrics_is_refused(run):
    (run / "metrics.jsonl").unlink()
    _refused(run, "round 2", "metrics.jsonl")


@pytest.mark.parametrize(
    "change",
    [
        lambda b: {**b, "server_buf": torch.full_like(b["server_buf"], math.inf)},
        lambda b: {**b, "attack_state": {"x": torch.tensor([1.0, math.nan])}},
        lambda b: {**b, "attack_state": {"x": [torch.tensor([-math.inf])]}},
        lambda b: {**b, "extra": {"_ema": {"shadow": torch.tensor([math.inf])}}},
        lambda b: {**b, "extra": {"dp": {"clip": math.nan}}},
        lambda b: {**b, "params": torch.full_like(b["params"], math.nan)},
    ],
    ids=["server_buf inf", "attack_state nan", "attack_state nested -inf", "ema inf", "plugin nan float", "params nan"],
)
def test_a_resealed_nonfinite_tensor_is_refused(run, change):
    _forge(run, change)
    _refused(run, "NaN")


def test_a_resealed_sane_checkpoint_resumes(run):
    """The checks reject what is wrong, not every re-saved file."""
    _forge(run, lambda b: b)
    r, errors = _resume(run)
    assert r.exit_code == 0 and not errors, r.output


# --- the API of engine.state ------------------------------------------------------------------


def _cfg(**over):
    return validate({"rounds": 5, "data": {"name": "digits"}, "model": {"name": "logreg"}, **over})


def _state():
    return FederationState(
        round=0,
        params=torch.randn(7),
        server_buf={"m": torch.zeros(7), "v": torch.ones(7), "t": 3},
        momentum=torch.randn(3, 7),
        attack_state={"history": [torch.arange(3), 1.5, "x"]},
        extra={"dp": {"clip": 1.0, "records": [(1.0, "poisson", 2)]}, "audit": {"max_cos": torch.full((4,), -math.inf)}},
    )


def test_save_and_load_round_trip_with_identity(tmp_path):
    cfg = _cfg()
    state = _state()
    save_checkpoint(state, tmp_path, run_identity(cfg))
    back = load_checkpoint(tmp_path, run_identity(cfg))
    assert torch.equal(back.params, state.params) and torch.equal(back.momentum.to_dense(3), state.momentum)
    assert back.server_buf["t"] == 3 and back.extra["dp"]["records"] == [(1.0, "poisson", 2)]
    # A plugin's -inf identity element (the audit's running max before any round) is state.
    assert torch.equal(back.extra["audit"]["max_cos"], state.extra["audit"]["max_cos"])
    # Keys that may differ on resume: more rounds, another execution backend or Ray cluster.
    load_checkpoint(tmp_path, run_identity(_cfg(rounds=9, execution="serial", ray={"num_cpus": 2.0})))
    with pytest.raises(CheckpointError, match=r"another run.*model\.name \(checkpoint: 'logreg', this run: 'mlp'\)"):
        load_checkpoint(tmp_path, run_identity(_cfg(model={"name": "mlp"})))


def test_engine_state_must_be_finite_but_plugins_own_their_infinities(tmp_path):
    state = _state()
    state.extra["audit"]["max_cos"][0] = math.nan
    save_checkpoint(state, tmp_path, run_identity(_cfg()))
    with pytest.raises(CheckpointError, match=r"extra\.audit\.max_cos holds NaN"):
        load_checkpoint(tmp_path)
    state = _state()
    state.extra["_history"] = {"0": torch.tensor([math.inf])}
    save_checkpoint(state, tmp_path, run_identity(_cfg()))
    with pytest.raises(CheckpointError, match=r"extra\._history\.0 holds NaN or infinite"):
        load_checkpoint(tmp_path)


def test_the_checksums_cover_non_tensor_state(tmp_path):
    save_checkpoint(_state(), tmp_path, run_identity(_cfg()))
    blob = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    blob["extra"]["dp"]["clip"] = 2.0
    torch.save(blob, tmp_path / CHECKPOINT)
    with pytest.raises(CheckpointError, match="does not match the checksum"):
        load_checkpoint(tmp_path)
    blob = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    blob["integrity"]["tensors"]["params"] = "0" * 64
    torch.save(blob, tmp_path / CHECKPOINT)
    with pytest.raises(CheckpointError, match="tensor params does not match its checksum"):
        load_checkpoint(tmp_path)
