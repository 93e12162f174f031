"""Output paths and failures outside the config are one ``error:`` line, never a traceback
(issue #26 item 6): ``privacy spectrum --out`` and ``audit gaussian --json`` that cannot be
written (found before the work, not after), a Ray cluster that fails mid-run (with the command
that continues the run), and a checkpoint whose pickle asks for code (naming what it asked for)."""

import errno
import json
import pickle
import socket
import threading
import time

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app

runner = CliRunner()

SMALL = """
name = "small"
rounds = 4
eval_every = 2
checkpoint_every = 2
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
"""


def _errors(r):
    return [line for line in r.output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("where", ["dir", "under_a_file", "under_a_missing_dir"])
def test_audit_json_that_cannot_be_written_is_refused_before_the_trials(tmp_path, monkeypatch, where):
    import fedsafe.audit

    ran = []
    monkeypatch.setattr(fedsafe.audit, "gaussian_table1", lambda *a, **k: ran.append(1) or [])
    (tmp_path / "f").write_text("x")
    path = {"dir": tmp_path, "under_a_file": tmp_path / "f" / "rows.json",
            "under_a_missing_dir": tmp_path / "nope" / "rows.json"}[where]
    r = runner.invoke(app, ["audit", "gaussian", "--json", str(path)])
    assert r.exit_code == 2 and len(_errors(r)) == 1 and "Traceback" not in r.output, r.output
    assert _errors(r)[0].startswith(f"error: --json {path}: ") and ran == []


def test_audit_json_write_failure_is_one_error_line(tmp_path, monkeypatch):
    import pathlib

    import fedsafe.audit

    monkeypatch.setattr(fedsafe.audit, "gaussian_table1", lambda *a, **k: [])
    monkeypatch.setattr(fedsafe.audit, "format_table1", lambda rows: "table")
    real = pathlib.Path.write_text

    def full(self, *a, **k):
        if self.name == "rows.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    r = runner.invoke(app, ["audit", "gaussian", "--json", str(tmp_path / "rows.json")])
    assert r.exit_code == 2 and "no space left on the device" in _errors(r)[0] and "Traceback" not in r.output


@pytest.mark.parametrize("where", ["dir", "under_a_file"])
def test_spectrum_out_that_cannot_be_written_is_refused_before_the_data_loads(tmp_path, monkeypatch, where):
    import fedsafe.config

    loaded = []
    monkeypatch.setattr(fedsafe.config, "load", lambda *a, **k: loaded.append(1))
    (tmp_path / "f").write_text("x")
    path = tmp_path if where == "dir" else tmp_path / "f" / "s.png"
    r = runner.invoke(app, ["privacy", "spectrum", "--out", str(path)])
    assert r.exit_code == 2 and len(_errors(r)) == 1 and "Traceback" not in r.output, r.output
    assert _errors(r)[0].startswith(f"error: --out {path}: ") and loaded == []


def test_spectrum_write_failure_is_one_error_line(tmp_path, monkeypatch):
    import torch
    from matplotlib.figure import Figure

    import fedsafe.privacy.inherent.figures as figures

    monkeypatch.setattr(figures, "user_gradients", lambda *a, **k: torch.randn(40, 6, dtype=torch.float64))
    def refuse(self, path, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(Figure, "savefig", refuse)
    out = tmp_path / "s.png"
    r = runner.invoke(app, ["privacy", "spectrum", "--out", str(out), "--sigma2", "0.01"])
    assert r.exit_code == 2 and _errors(r) == [f"error: --out {out}: cannot write: permission denied ({out})"], r.output


def test_a_ray_failure_mid_run_says_how_to_continue(tmp_path, monkeypatch):
    exceptions = pytest.importorskip("ray.exceptions")
    from fedsafe.engine.federation import Federation

    cfg = tmp_path / "c.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "run"
    real = Federation.run_round

    def raylet_gone(self):
        if self.state.round == 3:
            raise exceptions.RaySystemError("the raylet died\nmore detail")
        return real(self)

    monkeypatch.setattr(Federation, "run_round", raylet_gone)
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out), "-q"])
    assert r.exit_code == 1, r.output
    assert _errors(r) == [f"error: {out}: Ray failed (RaySystemError: System error: the raylet died)"], r.output
    assert f"last checkpoint: small: round 2; continue with: fedsafe run --resume {out}" in r.output
    assert "Traceback" not in r.output
    monkeypatch.setattr(Federation, "run_round", real)
    r = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 0 and json.loads((out / "summary.json").read_text())["rounds"] == 4, r.output


def test_the_raylet_watch_reports_a_raylet_that_stops_listening():
    from fedsafe.engine.run import RayWatch

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    lost = threading.Event()
    where = []
    watch = RayWatch("127.0.0.1", port, lambda w: (where.append(w), lost.set()), interval=0.05, misses=2)
    watch.start()
    try:
        time.sleep(0.3)
        assert not lost.is_set()  # answering: nothing to say
        server.close()  # the raylet dies
        assert lost.wait(5) and where == [f"127.0.0.1:{port}"]
    finally:
        watch.stop()
        server.close()


class _Evil:
    def __reduce__(self):
        # eval, not print: an imported ray replaces builtins.print, which then pickles by its name
        return (eval, ("print('pwned')",))


def test_a_checkpoint_that_asks_for_code_names_what_was_refused(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(SMALL.replace("rounds = 4", "rounds = 2"))
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(cfg), "--out", str(out), "-q"]).exit_code == 0
    (out / "summary.json").unlink()
    (out / "checkpoint.pt").write_bytes(pickle.dumps(_Evil()))  # pickle's default protocol
    r = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 2 and "pwned" not in r.output, r.output
    assert _errors(r) == [
        f"error: {out / 'checkpoint.pt'}: not a readable fedsafe checkpoint (it asks to load builtins.eval, which is refused)"
    ]


def test_fedsafes_own_warnings_are_one_line_each(tmp_path):
    # a run that ends at chance level: the warning names the setting, as one stderr line
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "fedsafe", "run", "--set", "rounds=1", "--set", "eval_every=1", "--set", "server.lr=1e-9",
         "--variant", "mean", "--out", str(tmp_path / "run"), "--quiet"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: the run ended at chance level"), res.stderr
    assert "robust.rule = 'mean'" in lines[0]
