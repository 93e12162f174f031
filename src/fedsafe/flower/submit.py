"""``fedsafe flower run``: submit a Flower app, stream its progress, exit with its outcome.

``flwr run`` returns 0 once the SuperLink has accepted the run, even when the ServerApp then
fails, and shows nothing of the run itself. :func:`submit_and_follow` submits with
``flwr run ... --format json``, streams the run's log (``flwr log RUN_ID --stream``: fedsafe's
ServerApp prints a line per round there) and asks for the run's status (``flwr ls --run-id``)
every ``every`` seconds until it is finished. The outcome is the exit status:

- 0: the run finished with ``finished:completed``;
- 1: it finished otherwise (``finished:failed``, ``finished:stopped``): the last lines of its
  log say why;
- 2: it could not be submitted (``flwr`` missing, the SuperLink unreachable, an unknown
  connection, a bad app): ``flwr``'s own message is printed.

Ctrl-C stops following and leaves the run going on the SuperLink (the command says how to stop
it). Everything goes through Flower's own command-line tool, so the connection is whatever
``flwr`` makes of ``SUPERLINK`` (``$FLWR_HOME/config.toml``), TLS and authentication included.
This module imports neither torch nor Flower.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from fedsafe.core.errors import FedsafeError

COMPLETED = "finished:completed"


class SubmitError(FedsafeError):
    """The run could not be submitted or followed (exit status 2)."""


def flwr_executable() -> str:
    """``flwr`` from this Python's environment, else from ``PATH``."""
    here = Path(sys.executable).parent / "flwr"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("flwr")
    if found is None:
        raise SubmitError(
            "flwr: not found next to this Python or on PATH; install fedsafe[flower] and activate its "
            "environment (source .venv/bin/activate): the SuperLink also starts flower-superexec from PATH"
        )
    return found


def _json(flwr: str, args: Sequence[str], what: str) -> dict:
    try:
        r = subprocess.run([flwr, *args, "--format", "json"], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what}: flwr {' '.join(args)} did not answer in 300 s") from None
    try:
        out = json.loads(r.stdout)
    except json.JSONDecodeError:
        out = None
    if r.returncode != 0 or not isinstance(out, dict) or out.get("success") is False:
        msg = (out or {}).get("error-message") if isinstance(out, dict) else None
        text = " ".join((msg or r.stdout + "\n" + r.stderr).split()) or f"exit status {r.returncode}"
        raise SubmitError(f"{what}: {text}")
    return out


def run_status(flwr: str, run_id: int, superlink: str | None) -> str:
    """The run's status as ``flwr ls`` gives it, e.g. ``running`` or ``finished:failed``."""
    out = _json(flwr, ["ls", *([superlink] if superlink else []), "--run-id", str(run_id)], f"run {run_id}")
    runs = out.get("runs") or []
    if not runs:
        raise SubmitError(f"run {run_id}: the SuperLink does not know it")
    return str(runs[0].get("status", "unknown"))


def submit(flwr: str, app: str, superlink: str | None, run_config: Sequence[str],
           federation_config: Sequence[str]) -> int:
    """``flwr run``; returns the run id."""
    args = ["run", app, *([superlink] if superlink else [])]
    for rc in run_config:
        args += ["--run-config", rc]
    for fc in federation_config:
        args += ["--federation-config", fc]
    out = _json(flwr, args, f"flwr run {app}")
    if "run-id" not in out:
        raise SubmitError(f"flwr run {app}: no run id in {out}")
    return int(out["run-id"])


class _LogStream:
    """``flwr log RUN_ID --stream``, copied line by line to ``sink``; the last lines are kept."""

    def __init__(self, flwr: str, run_id: int, superlink: str | None, sink: TextIO) -> None:
        self.tail: deque[str] = deque(maxlen=40)
        self.sink = sink
        self.proc = subprocess.Popen(
            [flwr, "log", str(run_id), *([superlink] if superlink else []), "--stream"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            print(line, end="", file=self.sink, flush=True)

    def close(self, drain: float) -> None:
        self.thread.join(drain)  # the last lines of a finished run are still on their way
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(1)


def submit_and_follow(
    app: str,
    superlink: str | None = None,
    *,
    run_config: Sequence[str] = (),
    federation_config: Sequence[str] = (),
    every: float = 2.0,
    drain: float = 3.0,
    timeout: float | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Submit ``app`` and follow it to the end (see the module docstring); returns the exit
    status. ``timeout``: seconds to follow before giving up (status 1, the run goes on)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if not every > 0:
        raise SubmitError(f"--every must be > 0 seconds, got {every}")
    flwr = flwr_executable()
    run_id = submit(flwr, app, superlink, run_config, federation_config)
    where = f" {superlink}" if superlink else ""
    print(f"fedsafe: run {run_id} submitted; following its log (Ctrl-C stops following, not the run)",
          file=err, flush=True)
    stream = _LogStream(flwr, run_id, superlink, out)
    start = time.monotonic()
    status = "unknown"
    try:
        while True:
            status = run_status(flwr, run_id, superlink)
            if status.startswith("finished"):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                print(f"error: run {run_id} still {status} after {timeout:g} s; it goes on "
                      f"(flwr log {run_id}{where}, flwr stop {run_id}{where})", file=err, flush=True)
                return 1
            sleep(every)
    except KeyboardInterrupt:
        print(f"fedsafe: stopped following run {run_id}, which goes on "
              f"(flwr log {run_id}{where} to follow it, flwr stop {run_id}{where} to stop it)", file=err, flush=True)
        return 130
    finally:
        stream.close(drain if status.startswith("finished") else 0.0)
    if status == COMPLETED:
        print(f"fedsafe: run {run_id} {status}", file=err, flush=True)
        return 0
    print(f"error: run {run_id} {status}; the end of its log is above (flwr log {run_id}{where} --show)",
          file=err, flush=True)
    return 1


__all__ = ["SubmitError", "flwr_executable", "run_status", "submit", "submit_and_follow"]
