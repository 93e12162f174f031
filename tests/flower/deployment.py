"""A Flower deployment on this machine for tests: one SuperLink and N SuperNodes, each a
separate process group on 127.0.0.1 (free ports), and ``flwr run`` submitting an app. Flower's
own state (``FLWR_HOME``, the SuperLink's database, the installed app bundles) stays in a
temporary directory; :meth:`Deployment.close` ends every process group."""

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
    def __init__(self, workdir: Path, num_nodes: int) -> None:
        self.dir = Path(workdir)
        self.home = self.dir / "flwr_home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.num_nodes = num_nodes
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

    def start(self, timeout: float = 60.0) -> None:
        self._spawn("superlink", [
            str(BIN / "flower-superlink"), "--insecure", "--isolation", "subprocess",
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.dir / "state.db"),
        ])
        for i in range(self.num_nodes):
            self._spawn(f"supernode{i}", [
                str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                "--host", "127.0.0.1", "--port", str(self.node_ports[i]),
                "--node-config", f"partition-id={i} num-partitions={self.num_nodes}",
            ])
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
            time.sleep(0.5)

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

    def submit(self, app: Path, run_config: str) -> int:
        return int(self.flwr("run", str(app), CONNECTION, "--run-config", run_config)["run-id"])

    def status(self, run_id: int) -> str:
        return self.flwr("ls", CONNECTION, "--run-id", str(run_id))["runs"][0]["status"]

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
