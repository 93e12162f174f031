"""``fedsafe sweep --out``: a folder of the user's is never written into without --overwrite,
and then only fedsafe's own outputs are replaced; a sweep folder is resumed, or rerun whole with
--overwrite; one sweep at a time; an output path that cannot be written is one ``error:`` line."""

import subprocess
import sys
import textwrap

from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.engine.sweep import SWEEP_MARKER

BASE = """rounds = 1
[data]
name = "digits"
max_train = 200
[model]
name = "logreg"
[clients]
num_clients = 5
"""

CELL = "robust.rule=mean"


def _sweep(tmp_path, out, *args):
    base = tmp_path / "base.toml"
    base.write_text(BASE)
    return CliRunner().invoke(app, ["sweep", str(base), "--grid", "robust.rule=mean", "--out", str(out), *args])


def _errors(r):
    return [line for line in r.output.splitlines() if line.startswith("error:")]


def test_a_users_folder_is_refused_and_overwrite_keeps_the_users_files(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "sweep.csv").write_text("my own table\n")
    r = _sweep(tmp_path, out)
    assert r.exit_code == 2 and len(_errors(r)) == 1 and "not a sweep folder" in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "sweep.csv"]

    r = _sweep(tmp_path, out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "notes.txt").read_text() == "mine\n" and (out / SWEEP_MARKER).is_file()
    assert (out / "sweep.csv").read_text().startswith("robust.rule,")


def test_a_sweep_folder_is_resumed_or_rerun_with_overwrite_and_may_hold_a_report(tmp_path):
    out = tmp_path / "s"
    assert _sweep(tmp_path, out).exit_code == 0
    first = (out / CELL / "metrics.jsonl").stat().st_mtime_ns
    r = CliRunner().invoke(app, ["report", str(out / CELL), "--out", str(out / "report")])
    assert r.exit_code == 0, r.output
    r = _sweep(tmp_path, out)
    assert r.exit_code == 0 and "1 reused" in r.stderr, r.output
    assert (out / CELL / "metrics.jsonl").stat().st_mtime_ns == first
    r = _sweep(tmp_path, out, "--overwrite")
    assert r.exit_code == 0 and "0 reused" in r.stderr, r.output
    assert (out / CELL / "metrics.jsonl").stat().st_mtime_ns != first
    assert not (out / "report").exists()  # fedsafe's output about the replaced cells


def test_a_sweep_folder_in_use_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "s"
    hold = textwrap.dedent("""
        import sys, time
        from fedsafe.engine.outdir import DirLock
        with DirLock(sys.argv[1], "--out", "sweep"):
            print("locked", flush=True)
            time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        r = _sweep(tmp_path, out)
        assert r.exit_code == 2 and f"in use by another fedsafe sweep (pid {p.pid}" in r.output, r.output
    finally:
        p.kill()
        p.wait()
    assert not (out / CELL).exists()


def test_unwritable_sweep_outputs_are_one_error_line(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out in (a_file, a_file / "sub"):
        r = _sweep(tmp_path, out)
        assert r.exit_code == 2 and len(_errors(r)) == 1 and "Traceback" not in r.output, r.output
        assert str(out) in _errors(r)[0]
    assert a_file.read_text() == "x"
