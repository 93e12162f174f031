"""``fedsafe flower run`` (``fedsafe.flower.submit``) against a stand-in ``flwr``: a script that
answers ``run``, ``ls`` and ``log`` as Flower 1.42's ``flwr ... --format json`` does, from a
scenario file. The real SuperLink path is run by ``test_deployment.py``."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.flower import submit
from fedsafe.flower.submit import SubmitError, submit_and_follow

FAKE = r'''#!{python}
import json, os, sys, time
from pathlib import Path
state = Path({state!r})
s = json.loads(state.read_text())
args = sys.argv[1:]
(state.parent / "calls.txt").open("a").write(" ".join(args) + "\n")
if args[0] == "run":
    print(json.dumps(s["run"]))
elif args[0] == "ls":
    statuses = s["statuses"]
    status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
    # atomically: `log` runs beside `ls` and must never read a half-written file
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps(s))
    os.replace(tmp, state)
    print(json.dumps({{"success": True, "runs": [{{"run-id": 7, "status": status}}]}}))
elif args[0] == "log":
    for line in s["log"]:
        print(line, flush=True)
    time.sleep(30)  # --stream: until it is ended
'''


def fake_flwr(tmp_path: Path, monkeypatch, *, run: dict, statuses: list[str], log: list[str]) -> Path:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"run": run, "statuses": statuses, "log": log}))
    exe = tmp_path / "flwr"
    exe.write_text(FAKE.format(python=sys.executable, state=str(state)))
    exe.chmod(0o755)
    monkeypatch.setattr(submit, "flwr_executable", lambda: str(exe))
    return tmp_path / "calls.txt"


LOG = ["fedsafe round 1/2  acc 40.1% loss 1.9000  3.1s", "fedsafe round 2/2  acc 60.2% loss 1.2000  6.0s"]


def follow(**kw):
    out, err = io.StringIO(), io.StringIO()
    code = submit_and_follow("examples/flower_app", "my-superlink", run_config=['fedsafe-set="rounds=2"'],
                             every=0.01, drain=1.0, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


def test_a_completed_run_streams_its_rounds_and_exits_0(tmp_path, monkeypatch):
    calls = fake_flwr(tmp_path, monkeypatch, run={"success": True, "run-id": 7},
                      statuses=["starting", "running", "running", "finished:completed"], log=LOG)
    code, out, err = follow()
    assert code == 0
    assert out.splitlines() == LOG
    assert "run 7 submitted" in err and "run 7 finished:completed" in err
    lines = calls.read_text().splitlines()
    assert lines[0] == 'run examples/flower_app my-superlink --run-config fedsafe-set="rounds=2" --format json'
    assert "log 7 my-superlink --stream" in lines
    assert lines.count("ls my-superlink --run-id 7 --format json") == 4


@pytest.mark.parametrize("status", ["finished:failed", "finished:stopped"])
def test_a_run_that_fails_after_flwr_run_accepted_it_exits_1(tmp_path, monkeypatch, status):
    # flwr run itself returns 0 here: the SuperLink accepted the run, and the ServerApp then failed.
    fake_flwr(tmp_path, monkeypatch, run={"success": True, "run-id": 7}, statuses=["running", status],
              log=["error: robust.rule: krum requires n >= 2f + 3 (n = 4, f = 1)"])
    code, out, err = follow()
    assert code == 1
    assert "krum requires n >= 2f + 3" in out
    assert f"error: run 7 {status}" in err and "flwr log 7 my-superlink --show" in err


def test_a_run_that_cannot_be_submitted_names_flwrs_reason(tmp_path, monkeypatch):
    fake_flwr(tmp_path, monkeypatch, statuses=["running"], log=[], run={
        "success": False,
        "error-message": "\nConnection to the SuperLink is unavailable. Please check your network connection.",
    })
    with pytest.raises(SubmitError, match=r"^flwr run examples/flower_app: Connection to the SuperLink is unavailable"):
        follow()


def test_following_gives_up_after_the_timeout_and_says_the_run_goes_on(tmp_path, monkeypatch):
    fake_flwr(tmp_path, monkeypatch, run={"success": True, "run-id": 7}, statuses=["running"], log=LOG[:1])
    code, out, err = follow(timeout=0.2)
    assert code == 1 and "run 7 still running after 0.2 s; it goes on" in err and "flwr stop 7 my-superlink" in err


def test_cli_exit_status_is_the_runs_outcome(tmp_path, monkeypatch):
    fake_flwr(tmp_path, monkeypatch, run={"success": True, "run-id": 7}, statuses=["finished:failed"], log=[])
    r = CliRunner().invoke(app, ["flower", "run", "examples/flower_app", "my-superlink", "--every", "0.01"])
    assert r.exit_code == 1, r.output


def test_missing_flwr_says_to_activate_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SubmitError, match=r"flwr: not found .* activate its environment"):
        submit.flwr_executable()
    r = CliRunner().invoke(app, ["flower", "run", "examples/flower_app"])
    assert r.exit_code == 2 and "error: flwr: not found" in r.output
