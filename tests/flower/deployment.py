"""A Flower deployment on this machine for tests: one SuperLink and N SuperNodes, each a
separate process group on 127.0.0.1 (free ports), and ``flwr run`` submitting an app. With
``simulation=True`` the SuperLink runs Flower's simulation runtime instead (``--simulation``: a
run's ClientApps are Ray actors, ``--federation-config "num-supernodes=N"``) and no SuperNode
is started: the current way to run a simulation (``flwr.simulation.run_simulation`` is
deprecated in Flower 1.42). Flower's
own state (``FLWR_HOME``, the SuperLink's database, the installed app bundles) stays in a
temporary directory; :meth:`Deployment.close` ends every process group.

Every process gets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (``task_poll`` seconds, Flower's default
1 s): how often the SuperExec of each SuperNode (and of the SuperLink) looks for a message to
start a ClientApp (ServerApp) process for. Flower starts one process per message, so this wait
is paid at every exchange of every round."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode, flwr, flwr-serverapp, flwr-clientapp
CONNECTION = "fedsafe-test"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Deployment:
    def __init__(self, workdir: Path, num_nodes: int, *, task_poll: float | None = 0.25, simulation: bool = False) -> None:
        self.dir = Path(workdir)
        self.home = self.dir / "flwr_home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.num_nodes = 0 if simulation else num_nodes
        self.simulation = simulation
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # Flower starts its executables by name
            "FLWR_HOME": str(self.home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",  # no request to api.flower.ai from each process
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # the app runs in this environment
            "OMP_NUM_THREADS": "1",
        }
        if task_poll is not None:
            self.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(task_poll)
        ports = _free_ports(1 + num_nodes)
        self.port, self.node_ports = ports[0], ports[1:]
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.dir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir,
            )

    def superlink_command(self) -> list[str]:
        return [
            "flower-superlink", "--insecure", "--isolation", "subprocess",
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.dir / "state.db"), *(["--simulation"] if self.simulation else []),
        ]

    def supernode_command(self, i: int) -> list[str]:
        return [
            "flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
            "--host", "127.0.0.1", "--port", str(self.node_ports[i]),
            "--node-config", f"partition-id={i} num-partitions={self.num_nodes}",
        ]

    def start(
        self, timeout: float = 60.0, *, superlink: list[str] | None = None, supernodes: list[list[str]] | None = None,
    ) -> None:
        """Start the SuperLink and the SuperNodes (``superlink``/``supernodes``: their command
        lines instead of :meth:`superlink_command`/:meth:`supernode_command`; a Flower
        executable is run from this environment) and wait until all of them are up."""
        self._spawn("superlink", self._resolve(superlink or self.superlink_command()))
        for i in range(self.num_nodes):
            self._spawn(f"supernode{i}", self._resolve(supernodes[i] if supernodes else self.supernode_command(i)))
        deadline = time.monotonic() + timeout
        while not self._healthy():
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the SuperLink did not come up in {timeout:g} s: {self.log('superlink')[-2000:]}")
            time.sleep(0.2)
        while len(self.online_nodes()) < self.num_nodes:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.online_nodes())} of {self.num_nodes} SuperNodes came online")
            time.sleep(1.0)

    @staticmethod
    def _resolve(cmd: list[str]) -> list[str]:
        return [str(BIN / cmd[0]) if (BIN / cmd[0]).is_file() else cmd[0], *cmd[1:]]

    def cli(self, cmd: list[str], *, cwd: Path, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run a command line (``flwr``, ``fedsafe``, ...: from this environment) with this
        deployment's environment in ``cwd``; its output is captured."""
        return subprocess.run(self._resolve(cmd), env=self.env, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, stdin=subprocess.DEVNULL)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None and not name.startswith("killed"):
                raise RuntimeError(f"{name} exited with {p.returncode}: {self.log(name)[-2000:]}")

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def flwr(self, *args: str) -> dict:
        r = subprocess.run([str(BIN / "flwr"), *args, "--format", "json"], env=self.env, capture_output=True,
                           text=True, timeout=120, cwd=self.dir)
        if r.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} exited with {r.returncode}: {r.stdout}\n{r.stderr}")
        return json.loads(r.stdout)

    def online_nodes(self) -> list[dict]:
        return [n for n in self.flwr("supernode", "ls", CONNECTION)["nodes"] if n["status"] == "online"]

    def submit(self, app: Path, run_config: str, federation_config: str | None = None) -> int:
        extra = [] if federation_config is None else ["--federation-config", federation_config]
        return int(self.flwr("run", str(app), CONNECTION, "--run-config", run_config, *extra)["run-id"])

    def status(self, run_id: int) -> str:
        return self.flwr("ls", CONNECTION, "--run-id", str(run_id))["runs"][0]["status"]

    def wait(self, run_id: int, limit: float, *, every: float = 5.0, poll: Any = None, done: Any = None) -> str:
        """Wait until run ``run_id`` finishes (at most ``limit`` seconds: then TimeoutError) and
        return its status. The status is asked for (``flwr ls``, a process of its own) every
        ``every`` seconds, and at once when ``done()`` (a cheap check, e.g. for a file the run
        writes last) first holds; ``poll()`` is called every 0.5 s in between."""
        deadline = time.monotonic() + limit
        while True:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            next_ask = time.monotonic() + every
            while time.monotonic() < next_ask:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run {run_id} still {status} after {limit:g} s: {self.log('superlink')[-3000:]}")
                if poll is not None:
                    poll()
                if done is not None and done():
                    done = None  # ask now; the run may still be writing its last files
                    time.sleep(0.5)
                    break
                time.sleep(0.5)

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by this deployment's processes: the SuperLink,
        the SuperNodes and everything they started (SuperExecs, ServerApp and ClientApp
        processes, ended ones included: a reaped child's time is its parent's). Linux only."""
        groups = {p.pid for p in self.procs.values()}
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[2]) in groups:  # the process group: each of ours leads its own
                total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        return total / os.sysconf("SC_CLK_TCK")

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and its ClientApp processes, as a machine that dies."""
        p = self.procs.pop(f"supernode{i}")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        self.procs[f"killed{i}"] = p

    def close(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever is left of the group
            except ProcessLookupError:
                pass
            p.wait()
