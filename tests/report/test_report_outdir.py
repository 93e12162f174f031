"""``fedsafe report --out``: a folder of the user's is never written into without --overwrite,
only the report's own files are ever replaced, nothing is written through a symbolic link, and
an output path that cannot be written is one ``error:`` line, never a traceback."""

from __future__ import annotations

import errno
import json

from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.engine.outdir import REPORT_MARKER

runner = CliRunner()


def _run_dir(tmp_path, eps=False):
    d = tmp_path / "run"
    d.mkdir()
    rows = [{"round": t, "train_loss": 1.0, "test_loss": 0.5, "test_accuracy": 0.5 + 0.1 * t,
             **({"epsilon": 0.5 * t} if eps else {})} for t in (1, 2)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _report(*args):
    return runner.invoke(app, ["report", *map(str, args)])


def _errors(r):
    return [line for line in r.output.splitlines() if line.startswith("error:")]


def test_a_users_folder_is_refused_and_overwrite_replaces_only_the_reports_files(tmp_path):
    run = _run_dir(tmp_path)
    figs = tmp_path / "paper"
    figs.mkdir()
    (figs / "notes.txt").write_text("mine\n")
    (figs / "summary.csv").write_text("my own table\n")
    r = _report(run, "--out", figs)
    assert r.exit_code == 2 and len(_errors(r)) == 1 and "--overwrite" in r.output, r.output
    assert sorted(p.name for p in figs.iterdir()) == ["notes.txt", "summary.csv"]
    assert (figs / "summary.csv").read_text() == "my own table\n"

    r = _report(run, "--out", figs, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (figs / "notes.txt").read_text() == "mine\n"  # not the report's: kept
    assert (figs / "summary.csv").read_text().startswith("run,")  # the report's name: replaced
    assert (figs / "accuracy.png").exists() and (figs / REPORT_MARKER).exists()


def test_a_report_folder_is_replaced_whole_stale_figures_included(tmp_path):
    out = tmp_path / "report"
    assert _report(_run_dir(tmp_path, eps=True), "--out", out).exit_code == 0
    assert (out / "epsilon.png").exists() and (out / "accuracy_vs_epsilon.png").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.7, "test_loss": 0.3}) + "\n")
    (out / "notes.txt").write_text("mine\n")
    r = _report(other, "--out", out)  # fedsafe's own report folder: no --overwrite needed
    assert r.exit_code == 0, r.output
    assert not (out / "epsilon.png").exists() and not (out / "accuracy_vs_epsilon.png").exists()
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "accuracy.png").exists()


def test_a_symbolic_link_in_place_of_a_figure_is_never_written_through(tmp_path):
    run = _run_dir(tmp_path)
    out = tmp_path / "report"
    assert _report(run, "--out", out).exit_code == 0
    precious = tmp_path / "precious.png"
    precious.write_bytes(b"do not touch")
    (out / "accuracy.png").unlink()
    (out / "accuracy.png").symlink_to(precious)
    for extra in ([], ["--overwrite"]):
        r = _report(run, "--out", out, *extra)
        assert r.exit_code == 2 and "accuracy.png" in r.output and "link" in r.output, r.output
        assert precious.read_bytes() == b"do not touch" and (out / "accuracy.png").is_symlink()


def test_unwritable_report_outputs_are_one_error_line(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out in (a_file, a_file / "sub"):
        r = _report(run, "--out", out)
        assert r.exit_code == 2 and len(_errors(r)) == 1 and "Traceback" not in r.output, r.output
        assert str(out) in _errors(r)[0]
    assert a_file.read_text() == "x"

    import fedsafe.report.write as write

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "ro" / "accuracy.png"))

    monkeypatch.setattr(write, "plot_accuracy", refuse)
    r = _report(run, "--out", tmp_path / "ro")
    assert r.exit_code == 2 and _errors(r) == [
        f"error: --out {tmp_path / 'ro'}: cannot write: permission denied ({tmp_path / 'ro' / 'accuracy.png'})"
    ], r.output
