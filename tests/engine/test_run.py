"""The run directory through the real ``fedsafe run`` command: nothing but fedsafe's own files is
ever deleted, a refused config writes nothing, and variants meet ``--set`` explicitly."""

import errno
import json

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.engine.run import MARKER

runner = CliRunner()

SMALL = """
name = "small"
rounds = 2
eval_every = 1
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
"""

VARIANTS = SMALL + """
[variants.mean]
"robust.rule" = "mean"
[variants.median]
"robust.rule" = "median"
"""


def _cfg(tmp_path, text=SMALL, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _errors(r):
    return [line for line in r.output.splitlines() if line.startswith("error:")]


def _run(*args):
    return runner.invoke(app, ["run", *map(str, args), "-q"])


def test_overwrite_never_deletes_a_folder_fedsafe_did_not_create(tmp_path):
    cfg = _cfg(tmp_path)
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "config.toml").write_text("my own config\n")
    (thesis / "thesis.tex").write_text("\\documentclass{article}\n")
    r = _run(cfg, "--out", thesis, "--overwrite")
    assert r.exit_code == 2 and "not a run directory fedsafe created" in r.output
    assert (thesis / "thesis.tex").read_text().startswith("\\documentclass")
    assert (thesis / "config.toml").read_text() == "my own config\n"


def test_overwrite_refuses_a_run_directory_holding_foreign_files(tmp_path):
    cfg = _cfg(tmp_path)
    out = tmp_path / "run"
    assert _run(cfg, "--out", out).exit_code == 0
    (out / "notes.txt").write_text("mine\n")
    r = _run(cfg, "--out", out, "--overwrite")
    assert r.exit_code == 2 and "notes.txt" in r.output and "did not write" in r.output
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "summary.json").exists()


def test_overwrite_replaces_fedsafe_runs_including_variant_folders(tmp_path):
    out = tmp_path / "run"
    assert _run(_cfg(tmp_path, VARIANTS), "--out", out).exit_code == 0
    assert (out / MARKER).is_file() and (out / "mean" / MARKER).is_file() and (out / "median").is_dir()
    r = _run(_cfg(tmp_path, SMALL, "b.toml"), "--out", out, "--overwrite", "--set", "rounds=1")
    assert r.exit_code == 0, r.output
    assert not (out / "mean").exists() and not (out / "median").exists()
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1


@pytest.mark.parametrize("name", ["", "../../x", "a/b", ".hidden", "a b", "x\"]"])
def test_unsafe_names_are_refused_before_anything_is_written(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    r = _run(_cfg(tmp_path), "--set", f"name={json.dumps(name)}")
    assert r.exit_code == 2 and _errors(r) and "not a valid run name" in r.output
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "x").exists()


def test_a_config_error_found_late_leaves_the_previous_run_intact(tmp_path):
    out = tmp_path / "run"
    assert _run(_cfg(tmp_path), "--out", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    (mnist / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03\x00\x00")  # truncated
    r = _run(_cfg(tmp_path), "--out", out, "--overwrite", "--set", "data.name=mnist", "--set", f"data.path='{mnist}'")
    assert r.exit_code == 2 and _errors(r)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize(
    "override, needle",
    [("clients.num_clients=5000", "training samples"), ("robust.rule=krum", "krum requires n >= 2f + 3")],
)
def test_refused_configs_write_nothing(tmp_path, override, needle):
    out = tmp_path / "never"
    extra = ["--set", "attack.f=2", "--set", "attack.name=sign_flip"] if "krum" in override else []
    r = _run(_cfg(tmp_path), "--out", out, "--set", override, *extra)
    assert r.exit_code == 2 and needle in r.output, r.output
    assert not out.exists()


def test_set_that_a_variant_overrides_is_an_error_naming_the_variants(tmp_path):
    r = _run("--set", "robust.rule=median", "--out", tmp_path / "o")
    assert r.exit_code == 2
    line = _errors(r)[0]
    assert "--set robust.rule" in line and "mean" in line and "nnm_trimmed_mean" in line and "--variant base" in line
    assert not (tmp_path / "o").exists()


def test_variant_selection_and_the_base_experiment(tmp_path):
    cfg = _cfg(tmp_path, VARIANTS)
    out = tmp_path / "base"
    r = _run(cfg, "--variant", "base", "--set", "robust.rule=trimmed_mean", "--out", out)
    assert r.exit_code == 0, r.output
    assert 'rule = "trimmed_mean"' in (out / "config.toml").read_text()
    assert (out / "metrics.jsonl").exists() and not (out / "mean").exists()

    out2 = tmp_path / "one"
    r = _run(cfg, "--variant", "median", "--out", out2)
    assert r.exit_code == 0, r.output
    assert (out2 / "median" / "summary.json").exists() and not (out2 / "mean").exists()

    out3 = tmp_path / "both"
    r = _run(cfg, "--variant", "base", "--variant", "mean", "--out", out3)
    assert r.exit_code == 0, r.output
    assert (out3 / "base" / "summary.json").exists() and (out3 / "mean" / "summary.json").exists()
    r = _run("--resume", out3)
    assert r.exit_code == 0, r.output

    r = _run(cfg, "--variant", "nope", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "--variant nope: no such variant; valid: base, mean, median" in r.output


def test_out_that_is_a_file_is_one_clear_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = _run(_cfg(tmp_path), "--out", f)
    assert r.exit_code == 2 and _errors(r) == [f"error: --out {f}: exists and is not a directory"]
    r = _run(_cfg(tmp_path), "--out", f / "sub")
    assert r.exit_code == 2 and len(_errors(r)) == 1 and "Traceback" not in r.output


@pytest.mark.parametrize(
    "code, words", [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"), (errno.ENOSPC, "no space left")]
)
def test_unwritable_or_full_output_is_one_clear_error(tmp_path, monkeypatch, code, words):
    import fedsafe.engine.run as run_mod

    def refuse(path):
        raise OSError(code, "refused", str(path))

    monkeypatch.setattr(run_mod, "_make_run_dir", refuse)
    r = _run(_cfg(tmp_path), "--out", tmp_path / "o")
    assert r.exit_code == 2 and len(_errors(r)) == 1 and words in r.output, r.output


def test_disk_full_mid_run_is_one_clear_error(tmp_path, monkeypatch):
    from fedsafe.engine.metrics import MetricsWriter

    def full(self, row):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(MetricsWriter, "write", full)
    r = _run(_cfg(tmp_path), "--out", tmp_path / "o")
    assert r.exit_code == 2 and "no space left on the device" in r.output and "Traceback" not in r.output


def test_progress_lines_when_not_a_terminal_and_ctrl_c_says_how_to_resume(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, SMALL.replace("rounds = 2", "rounds = 6\ncheckpoint_every = 2"))
    out = tmp_path / "o"
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out)])
    assert r.exit_code == 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("small round ")]
    assert [line.split()[2] for line in lines] == [f"{t}/6" for t in range(1, 7)] and "acc " in lines[0]

    from fedsafe.engine.federation import Federation

    real = Federation.run_round

    def interrupted(self):
        if self.state.round == 3:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Federation, "run_round", interrupted)
    out2 = tmp_path / "o2"
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out2), "-q"])
    assert r.exit_code == 130
    assert f"fedsafe run --resume {out2}" in r.output and "round 2" in r.output
    monkeypatch.setattr(Federation, "run_round", real)
    r = runner.invoke(app, ["run", "--resume", str(out2), "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads((out2 / "summary.json").read_text())["final_accuracy"] == json.loads(
        (out / "summary.json").read_text()
    )["final_accuracy"]


def test_checkpoints_are_on_by_default_and_the_model_is_saved(tmp_path):
    import torch

    from fedsafe.config import load
    from fedsafe.data import load_federated
    from fedsafe.models import load_trained

    cfg = _cfg(tmp_path, SMALL.replace("rounds = 2", "rounds = 12"))
    out = tmp_path / "o"
    assert _run(cfg, "--out", out).exit_code == 0
    assert (out / "checkpoint.pt").exists()
    state = torch.load(out / "model.pt", weights_only=True)  # a plain state_dict
    model = load_trained(out)
    assert set(state) == set(model.state_dict()) and all(isinstance(v, torch.Tensor) for v in state.values())
    c = load(cfg)
    data = load_federated(c.data, c.clients.num_clients, c.seed)
    with torch.no_grad():
        acc = int((model(data.x_test).argmax(1) == data.y_test).sum()) / len(data.y_test)
    assert acc == pytest.approx(json.loads((out / "summary.json").read_text())["final_accuracy"], abs=1e-9)
