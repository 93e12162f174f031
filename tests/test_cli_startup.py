"""``fedsafe --help``, every command's ``--help`` and ``fedsafe list KIND`` import no torch
(issue #26 item 7): the command's imports are lazy, and ``list`` reads the registries off the
source while they are not imported. Checked on ``sys.modules`` in a fresh interpreter, not by
timing (timings belong in benchmarks)."""

import json
import subprocess
import sys
import textwrap

import pytest

from fedsafe import catalog

# Every command, in one interpreter: after each, torch must still be unimported.
PROBE = textwrap.dedent("""
    import sys
    from fedsafe.cli import command

    for argv in {commands!r}:
        try:
            command()(argv, prog_name="fedsafe", standalone_mode=True)
        except SystemExit as e:
            assert e.code in (0, None), (argv, e.code)
        heavy = sorted(m for m in ("torch", "numpy", "ray", "matplotlib") if m in sys.modules)
        print(" ".join(argv), "->", ",".join(heavy) or "none", file=sys.stderr, flush=True)
""")

COMMANDS = [
    ["--help"], ["run", "--help"], ["check", "--help"], ["sweep", "--help"], ["report", "--help"], ["list", "--help"],
    ["privacy", "--help"], ["privacy", "epsilon", "--help"], ["privacy", "spectrum", "--help"],
    ["audit", "--help"], ["audit", "gaussian", "--help"],
    ["flower", "--help"], ["flower", "run", "--help"],
    *[["list", kind] for kind in catalog.SOURCES],  # every KIND read off the source
    ["list", "keys"],  # the config's models: fedsafe.config imports no torch
]


def test_help_and_list_import_no_torch():
    r = subprocess.run([sys.executable, "-c", PROBE.format(commands=COMMANDS)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if " -> " in line]
    assert len(lines) == len(COMMANDS), r.stderr
    assert [line for line in lines if "torch" in line.split(" -> ")[1]] == [], r.stderr
    assert "bulyan" in r.stdout and "alie" in r.stdout and "dirichlet" in r.stdout  # the listings were printed
    assert "dp.noise_multiplier" in r.stdout


COMPARE = textwrap.dedent("""
    import dataclasses, json
    from fedsafe import catalog

    static = {k: [dataclasses.astuple(i) for i in catalog.static_items(k)] for k in catalog.SOURCES}
    live = {k: [dataclasses.astuple(i) for i in catalog.live_items(k)] for k in catalog.SOURCES}
    print(json.dumps([static, live]))
""")


def test_the_source_listing_is_the_registry_listing():
    # What `fedsafe list KIND` reads off the source equals what the imported registries say, in
    # a fresh process (in this one, other tests may have loaded lazy entries or registered more).
    r = subprocess.run([sys.executable, "-c", COMPARE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    static, live = json.loads(r.stdout)
    for kind in catalog.SOURCES:
        assert static[kind] == live[kind], kind
    assert len(static["rules"]) > 20 and len(static["attacks"]) > 10


def test_a_registration_the_source_reader_does_not_know_falls_back_to_the_registry(tmp_path, monkeypatch):
    import ast

    text = "from fedsafe.core.registry import Registry\nR = Registry('thing')\nfor n in names(): R.register(n)(f)\n"
    monkeypatch.setitem(catalog._PARSED, "fedsafe.fake_registry", ast.parse(text))
    monkeypatch.setitem(catalog.SOURCES, "fake", (("fedsafe.fake_registry", "R", "thing", True),))
    with pytest.raises(catalog._Unreadable):
        catalog.static_items("fake")
