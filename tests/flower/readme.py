"""The shell commands of the README's "Flower deployment" section, read for the tests that run
them as written (``test_readme_flower.py``, ``test_deployment.py``).

The section's fenced ``bash`` blocks hold the commands: ``export VAR=value`` lines (and
``VAR=value`` prefixes) set the environment of the commands after them, ``\\`` continues a
line and ``#`` starts a comment; its fenced ``toml`` block holding ``[superlink.<name>]`` is the
``flwr`` connection. Only what says *where* is replaced to run it on this machine
(:func:`localize`): the SuperLink's and SuperNodes' ``--host`` and ``--port``, the ``SERVER``
address and the port in ``--superlink`` and the connection's ``address``, and the SuperNode's
``partition-id``. The README's own numbers must agree with each other (the SuperLink's port
in every ``--superlink`` and ``address``, ``num-partitions`` clients), else the commands could
not work as written and :func:`flower_commands` says so.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## Flower deployment"
TOOLS = ("flower-superlink", "flower-supernode", "flwr", "fedsafe")


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # the exports and VAR=value prefixes before it

    def option(self, name: str) -> str | None:
        """The value of ``--name value`` (None if absent)."""
        return next((self.argv[i + 1] for i, a in enumerate(self.argv[:-1]) if a == name), None)

    @property
    def follows(self) -> bool:
        """``fedsafe flower run`` (waits for the run; its exit status is the outcome), not ``flwr run``."""
        return self.argv[:3] == ["fedsafe", "flower", "run"]

    @property
    def positional(self) -> list[str]:
        """APP and SUPERLINK of a run command (``flwr run`` or ``fedsafe flower run``)."""
        rest = self.argv[3:] if self.follows else self.argv[2:]
        out = []
        for a in rest:
            if a.startswith("-"):
                break
            out.append(a)
        return out


@dataclass
class FlowerCommands:
    superlink: Command
    supernode: Command
    runs: list[Command]  # flwr run ... or fedsafe flower run ...
    after: list[Command]  # other fedsafe commands (on the server, after the runs)
    connection: str  # the [superlink.<name>] TOML
    num_nodes: int  # num-partitions: one SuperNode per client
    port: int  # the SuperLink's port, as the README has it

    @property
    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in (self.superlink, self.supernode, *self.runs, *self.after):
            out.update(c.env)
        return out


def section(text: str, heading: str = SECTION) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def blocks(text: str, lang: str) -> list[str]:
    """The fenced code blocks of language ``lang`` in ``text``."""
    return re.findall(rf"^```{lang}[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def commands(block: str) -> list[Command]:
    """The commands of a shell block (see the module docstring)."""
    out, env = [], {}
    for line in re.sub(r"\\\n", " ", block).splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env.update(w.split("=", 1) for w in words[1:])
            continue
        own = dict(env)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            k, v = words.pop(0).split("=", 1)
            own[k] = v
        if words:
            out.append(Command(words, own))
    return out


def flower_commands(text: str) -> FlowerCommands:
    """The Flower section's commands; AssertionError naming what is missing or inconsistent."""
    sec = section(text)
    cmds = [c for b in blocks(sec, "bash") for c in commands(b) if c.argv[0] in TOOLS]
    links = [c for c in cmds if c.argv[0] == "flower-superlink"]
    nodes = [c for c in cmds if c.argv[0] == "flower-supernode"]
    runs = [c for c in cmds if c.argv[:2] == ["flwr", "run"] or c.follows]
    after = [c for c in cmds if c.argv[0] == "fedsafe" and not c.follows]
    assert len(links) == 1 and len(nodes) == 1 and runs, (
        f"the README's {SECTION!r} section needs one flower-superlink, one flower-supernode and a flwr run "
        f"or fedsafe flower run "
        f"command in ```bash blocks; found {[' '.join(c.argv[:2]) for c in cmds]}"
    )
    conns = [b for b in blocks(sec, "toml") if "[superlink." in b]
    assert len(conns) == 1, f"the README's {SECTION!r} section needs one ```toml block with [superlink.<name>]"
    port = int(links[0].option("--port") or 9091)
    superlink = nodes[0].option("--superlink") or ""
    assert superlink.rsplit(":", 1)[-1] == str(port), (
        f"flower-supernode --superlink {superlink}: not the SuperLink's --port {port}"
    )
    address = re.search(r'address\s*=\s*"([^"]+)"', conns[0])
    assert address and address.group(1).rsplit(":", 1)[-1] == str(port), (
        f"the connection's address {address and address.group(1)!r} is not the SuperLink's port {port}"
    )
    for run in runs:
        name = run.positional[1] if len(run.positional) > 1 else None
        assert name and f"[superlink.{name}]" in conns[0], f"{' '.join(run.argv[:3])} uses connection {name!r}, not the README's"
    config = dict(kv.split("=", 1) for kv in shlex.split(nodes[0].option("--node-config") or ""))
    return FlowerCommands(links[0], nodes[0], runs, after, conns[0], int(config["num-partitions"]), port)


def run_config(cmd: Command) -> tuple[Path, dict]:
    """The app directory of a ``flwr run`` command and the run config Flower gives its ServerApp
    (the app's defaults, fused with ``--run-config`` exactly as Flower fuses them)."""
    from flwr.common.config import flatten_dict, fuse_dicts, get_project_config, parse_config_args

    app = REPO / cmd.positional[0]  # the run command is run from the repository
    overrides = [v for a, v in zip(cmd.argv, cmd.argv[1:]) if a in ("--run-config", "-c")]
    defaults = flatten_dict(get_project_config(app)["tool"]["flwr"]["app"]["config"])
    return app, fuse_dicts(defaults, parse_config_args(overrides))


def localize(cmds: FlowerCommands, port: int, node_ports: list[int]) -> tuple[list[str], list[list[str]], str]:
    """The SuperLink's and each SuperNode's command line and the connection TOML, listening
    on 127.0.0.1 at the given ports (SuperNode i holding partition i); all else as written."""

    def replace(argv: list[str], values: dict[str, str]) -> list[str]:
        out = list(argv)
        for i, a in enumerate(out[:-1]):
            if a in values:
                out[i + 1] = values[a]
        return out

    link = replace(cmds.superlink.argv, {"--host": "127.0.0.1", "--port": str(port)})
    nodes = []
    for i, node_port in enumerate(node_ports):
        conf = re.sub(r"partition-id=\d+", f"partition-id={i}", cmds.supernode.option("--node-config") or "")
        argv = replace(cmds.supernode.argv, {
            "--superlink": f"127.0.0.1:{port}", "--port": str(node_port), "--node-config": conf,
        })
        nodes.append(argv if "--host" in argv else [*argv, "--host", "127.0.0.1"])
    conn = re.sub(r'address\s*=\s*"[^"]+"', f'address = "127.0.0.1:{port}"', cmds.connection)
    return link, nodes, conn
