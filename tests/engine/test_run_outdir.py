"""Run folders under concurrent use (issue #26 items 1-3): what appears in ``--out`` while the
data loads is never deleted, nothing is deleted through a symbolic link, one fedsafe process
writes a folder at a time (an OS lock, released when its process dies), and a report written
into a run folder is fedsafe's output, not the user's."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

import fedsafe.engine.run as run_mod
from fedsafe.cli import app
from fedsafe.engine.outdir import LOCK, REPORT_MARKER, clear
from fedsafe.engine.run import MARKER, RUN

runner = CliRunner()

SMALL = """
name = "small"
rounds = 1
eval_every = 1
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
"""


def _cfg(tmp_path, text=SMALL):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def _run(*args):
    return runner.invoke(app, ["run", *map(str, args), "-q"])


def _errors(r):
    return [line for line in r.output.splitlines() if line.startswith("error:")]


def _while_loading(monkeypatch, action):
    """Run ``action()`` after the folder was checked, while the data loads."""
    real = run_mod.build_federations

    def slow(*a, **k):
        feds = real(*a, **k)
        action()
        return feds

    monkeypatch.setattr(run_mod, "build_federations", slow)


def _snapshot(d):
    """Every file under ``d`` but the lock file (each run that takes the lock writes its pid there)."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file() and p.name != LOCK}


def test_files_put_in_the_run_folder_while_the_data_loads_are_never_deleted(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    out = tmp_path / "run"
    assert _run(cfg, "--out", out).exit_code == 0
    before = _snapshot(out)
    outside = tmp_path / "thesis"
    outside.mkdir()
    (outside / "chapter1.tex").write_text("years of work\n")

    def meddle():
        (out / "notes.txt").write_text("mine\n")
        (out / "mean").symlink_to(outside, target_is_directory=True)  # named like a variant

    _while_loading(monkeypatch, meddle)
    r = _run(cfg, "--out", out, "--overwrite")
    assert r.exit_code == 2 and len(_errors(r)) == 1, r.output
    assert "notes.txt" in r.output and "mean" in r.output and "did not write" in r.output
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (outside / "chapter1.tex").read_text() == "years of work\n" and (out / "mean").is_symlink()
    assert {k: v for k, v in _snapshot(out).items() if k != "notes.txt" and not k.startswith("mean/")} == before


def test_a_folder_that_was_empty_at_the_check_and_is_not_any_more_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    _while_loading(monkeypatch, lambda: (out / "config.toml").write_text("my own config\n"))
    r = _run(_cfg(tmp_path), "--out", out)
    assert r.exit_code == 2 and "not empty" in r.output, r.output
    assert (out / "config.toml").read_text() == "my own config\n" and not (out / MARKER).exists()


def test_clearing_a_run_folder_never_follows_or_removes_symbolic_links(tmp_path):
    elsewhere = tmp_path / "elsewhere"  # a marked run folder outside: the old code emptied it
    elsewhere.mkdir()
    for name in (MARKER, "metrics.jsonl", "config.toml"):
        (elsewhere / name).write_text("keep\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("keep\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / MARKER).write_text("{}")
    (out / "config.toml").write_text("x")
    (out / "variant").symlink_to(elsewhere, target_is_directory=True)
    (out / "metrics.jsonl").symlink_to(secret)
    clear(out, RUN)
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted([MARKER, "metrics.jsonl", "config.toml"])
    assert secret.read_text() == "keep\n"
    assert (out / "variant").is_symlink() and (out / "metrics.jsonl").is_symlink()
    assert not (out / "config.toml").exists() and (out / MARKER).exists()


HOLD = textwrap.dedent("""
    import sys, time
    from fedsafe.engine.outdir import DirLock
    with DirLock(sys.argv[1], "--out", "run"):
        print("locked", flush=True)
        time.sleep(120)
""")


@pytest.fixture
def holder():
    """``start(folder)``: another process that holds ``folder``'s lock as ``fedsafe run`` does."""
    procs = []

    def start(folder):
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_second_run_into_a_locked_folder_is_refused_naming_the_holder(tmp_path, monkeypatch, holder):
    import socket

    cfg = _cfg(tmp_path)
    out = tmp_path / "run"
    assert _run(cfg, "--out", out).exit_code == 0
    before = _snapshot(out)

    other = holder(out)
    r = _run(cfg, "--out", out, "--overwrite")  # refused at once, before the data loads
    assert r.exit_code == 2 and len(_errors(r)) == 1, r.output
    line = _errors(r)[0]
    assert "in use by another fedsafe run" in line and f"pid {other.pid}" in line
    assert f"host {socket.gethostname()}" in line and "started 20" in line
    r = _run("--resume", out)
    assert r.exit_code == 2 and f"pid {other.pid}" in r.output, r.output

    # The lock dies with its process, however it dies: then the run goes ahead.
    other.send_signal(signal.SIGKILL)
    other.wait()
    assert _run(cfg, "--out", out, "--overwrite").exit_code == 0
    assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()

    # Another run that takes the folder while this one loads its data: refused under the lock,
    # with nothing of the earlier run replaced.
    before = _snapshot(out)
    late = []
    _while_loading(monkeypatch, lambda: late.append(holder(out)))
    r = _run(cfg, "--out", out, "--overwrite", "--set", "rounds=2")
    assert r.exit_code == 2 and f"pid {late[0].pid}" in r.output, r.output
    assert _snapshot(out) == before


def test_a_report_inside_a_run_folder_is_fedsafe_output_and_does_not_block_overwrite(tmp_path):
    cfg = _cfg(tmp_path)
    out = tmp_path / "run"
    assert _run(cfg, "--out", out).exit_code == 0
    r = runner.invoke(app, ["report", str(out), "--out", str(out / "report")])
    assert r.exit_code == 0, r.output
    # make run: fedsafe run --out runs/default --overwrite, after fedsafe report into it
    r = _run(cfg, "--out", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert not (out / "report").exists()  # it described the run that was replaced

    # So is one written before report folders were marked (only the report's files in it).
    assert runner.invoke(app, ["report", str(out), "--out", str(out / "report")]).exit_code == 0
    (out / "report" / REPORT_MARKER).unlink()
    r = _run(cfg, "--out", out, "--overwrite")
    assert r.exit_code == 0 and not (out / "report").exists(), r.output

    # A report folder holding the user's files is the user's: refused, naming them.
    assert runner.invoke(app, ["report", str(out), "--out", str(out / "report")]).exit_code == 0
    (out / "report" / "notes.txt").write_text("mine\n")
    r = _run(cfg, "--out", out, "--overwrite")
    assert r.exit_code == 2 and "report/notes.txt" in r.output, r.output
    assert (out / "report" / "notes.txt").read_text() == "mine\n" and (out / "report" / "summary.csv").exists()
