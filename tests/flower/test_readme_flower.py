"""The README's Flower commands, read as written (``readme.py``): every ``flwr run`` there must
configure an experiment the shipped app (``examples/flower_app``) can run on the SuperNodes the
README starts. Fast: the engine's set-up refuses what a deployment would only refuse after
starting (``test_deployment.py`` runs the commands for real)."""

from __future__ import annotations

import pytest

from fedsafe.config import ConfigError

from . import readme


def configure(cmd: readme.Command, num_nodes: int) -> None:
    """What fedsafe's ServerApp does with the run config before it contacts a node, and the
    engine's set-up (which checks the rule's (n, f) requirement on a round of the configured size)."""
    from fedsafe.engine.federation import Federation
    from fedsafe.flower.server import _config, check_config

    app, rc = readme.run_config(cmd)
    cfg = _config(None, rc, (), app / "fedsafe_app")  # server_app(app_dir=...) of the shipped app
    check_config(cfg)
    assert cfg.clients.num_clients == num_nodes, (
        f"{' '.join(cmd.argv)}: {cfg.clients.num_clients} clients, but the README starts {num_nodes} SuperNodes"
    )
    Federation(cfg).close()


def test_readme_flwr_runs_configure_experiments_the_shipped_app_can_run() -> None:
    cmds = readme.flower_commands(readme.README.read_text())
    assert cmds.runs[0].positional[0] == "examples/flower_app"
    for cmd in cmds.runs:
        configure(cmd, cmds.num_nodes)


def test_a_rule_the_shipped_app_cannot_run_is_refused() -> None:
    # The README once said robust.rule=krum: Krum needs n >= 2f + 3, the shipped app has 4 clients
    # and f = 1. The check above must catch that kind of example.
    krum = readme.Command(["flwr", "run", "examples/flower_app", "my-superlink",
                           "--run-config", 'fedsafe-set="robust.rule=krum; rounds=20"'])
    with pytest.raises(ConfigError, match=r"krum requires n >= 2f \+ 3"):
        configure(krum, 4)


SHELL = """
export A=1 B="two words"
flower-superlink --insecure --host 0.0.0.0 --port 9100 \\
    --disable-runtime-dependency-installation        # a comment
C=3 flower-supernode --insecure --superlink SERVER:9100 --port 9200 \\
    --node-config "partition-id=0 num-partitions=4"  # one per client
flwr run examples/flower_app conn --run-config 'fedsafe-set="rounds=3" fedsafe-out="runs/x"'
fedsafe report runs/x
"""
TOML = '[superlink.conn]\naddress = "SERVER:9100"\ninsecure = true\n'


def _readme(shell: str = SHELL, toml: str = TOML) -> str:
    return f"# x\n\n{readme.SECTION} (`fedsafe.flower`)\n\n```bash\n{shell}```\n\n```toml\n{toml}```\n\n## Next\n"


def test_readme_parser_reads_exports_prefixes_continuations_and_quotes() -> None:
    cmds = readme.flower_commands(_readme())
    assert cmds.superlink.argv == ["flower-superlink", "--insecure", "--host", "0.0.0.0", "--port", "9100",
                                   "--disable-runtime-dependency-installation"]
    assert cmds.superlink.env == {"A": "1", "B": "two words"}
    assert cmds.supernode.env == {"A": "1", "B": "two words", "C": "3"}
    assert cmds.supernode.option("--node-config") == "partition-id=0 num-partitions=4"
    assert cmds.runs[0].argv[-1] == 'fedsafe-set="rounds=3" fedsafe-out="runs/x"'
    assert [c.argv for c in cmds.after] == [["fedsafe", "report", "runs/x"]]
    assert (cmds.num_nodes, cmds.port) == (4, 9100)
    link, nodes, conn = readme.localize(cmds, 4000, [4001, 4002, 4003, 4004])
    assert link[2:6] == ["--host", "127.0.0.1", "--port", "4000"]
    assert nodes[3][3:9] == ["127.0.0.1:4000", "--port", "4004", "--node-config", "partition-id=3 num-partitions=4",
                             "--host"]
    assert 'address = "127.0.0.1:4000"' in conn


def test_readme_parser_reads_fedsafe_flower_run_as_a_run() -> None:
    shell = SHELL.replace("flwr run examples/flower_app conn", "fedsafe flower run examples/flower_app conn --every 1")
    cmds = readme.flower_commands(_readme(shell))
    assert cmds.runs[0].follows and cmds.runs[0].positional == ["examples/flower_app", "conn"]
    assert [c.argv for c in cmds.after] == [["fedsafe", "report", "runs/x"]]
    assert readme.run_config(cmds.runs[0])[1]["fedsafe-out"] == "runs/x"


@pytest.mark.parametrize(("shell", "toml", "match"), [
    (SHELL.replace("SERVER:9100", "SERVER:9101"), TOML, "not the SuperLink's --port 9100"),
    (SHELL, TOML.replace("9100", "9101"), "is not the SuperLink's port 9100"),
    (SHELL.replace(" conn ", " other "), TOML, "uses connection 'other'"),
    (SHELL.replace("flwr run", "echo"), TOML, "needs one flower-superlink, one flower-supernode and a flwr run"),
])
def test_readme_commands_that_could_not_work_as_written_are_refused(shell: str, toml: str, match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        readme.flower_commands(_readme(shell, toml))
