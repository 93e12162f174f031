"""Tampered checkpoints: every case is refused by ``fedsafe run --resume`` with one line naming
the problem (exit 2), never a traceback, never a silently accepted state. Each edit is tried as
saved (the checksums catch it) and re-sealed as a forger would (the semantic checks catch it)."""

import pickle

import pytest
import torch
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.engine.state import with_checksums

runner = CliRunner()

CONFIG = """
name = "ck"
rounds = 4
eval_every = 2
checkpoint_every = 2
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
momentum = 0.9
[server]
momentum = 0.5
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    cfg = root / "c.toml"
    cfg.write_text(CONFIG)
    out = root / "run"
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--set", "rounds=2", "-q"])
    assert r.exit_code == 0, r.output
    # Continue to 4 rounds from this checkpoint: extend the resolved config.
    text = (out / "config.toml").read_text().replace("rounds = 2", "rounds = 4")
    (out / "config.toml").write_text(text)
    (out / "summary.json").unlink()
    return out


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def _blob(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)


def _edit(**changes):
    def f(b):
        b.update(changes)
        return b

    return f


def _nested(key, value):
    def f(b):
        b[key] = value(b[key])
        return b

    return f


CASES = {
    "empty file": b"",
    "random bytes": bytes(range(256)) * 4,
    "a pickle running code": pickle.dumps(_Evil()),
    "not a dict": lambda b: [1, 2, 3],
    "unknown format": _edit(format=99),
    "missing params": lambda b: {k: v for k, v in b.items() if k != "params"},
    "negative round": _edit(round=-1),
    "round beyond the run": _edit(round=10000),
    "round as float": _edit(round=2.0),
    "NaN parameters": _nested("params", lambda p: torch.full_like(p, float("nan"))),
    "infinite parameters": _nested("params", lambda p: p.clone().index_fill_(0, torch.tensor([0]), float("inf"))),
    "wrong parameter count": _nested("params", lambda p: p[:-1].clone()),
    "integer parameters": _nested("params", lambda p: p.long()),
    "2-D parameters": _nested("params", lambda p: p.reshape(1, -1).clone()),
    "momentum of another population": _nested("momentum", lambda m: {"ids": m["ids"] + 1000, "rows": m["rows"]}),
    "momentum of another model": _nested("momentum", lambda m: {"ids": m["ids"], "rows": m["rows"][:, :-1].clone()}),
    "momentum ids repeat": _nested("momentum", lambda m: {"ids": torch.zeros_like(m["ids"]), "rows": m["rows"]}),
    "momentum rows NaN": _nested("momentum", lambda m: {"ids": m["ids"], "rows": torch.full_like(m["rows"], float("nan"))}),
    "momentum missing": _edit(momentum=None),
    "server buffer wrong size": _nested("server_buf", lambda s: s[:3].clone()),
    "server buffer NaN": _nested("server_buf", lambda s: torch.full_like(s, float("nan"))),
    "extra not a table": _edit(extra=[1]),
    "attack state not a table": _edit(attack_state="x"),
    "previous aggregate a matrix": _edit(previous=torch.zeros(2, 2)),
}


SEALED = [(c, False) for c in CASES] + [(c, True) for c, v in CASES.items() if callable(v) and c != "not a dict"]


@pytest.mark.parametrize(("case", "resealed"), SEALED, ids=[f"{c}{' (resealed)' if s else ''}" for c, s in SEALED])
def test_tampered_checkpoint_is_one_clear_error(finished, tmp_path, case, resealed):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    change = CASES[case]
    path = out / "checkpoint.pt"
    if isinstance(change, bytes):
        path.write_bytes(change)
    else:
        blob = change(_blob(out))
        torch.save(with_checksums(blob) if resealed else blob, path)
    r = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 2, (case, r.output)
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "checkpoint" in errors[0], (case, r.output)
    if resealed:  # the checksums match: a semantic check refused it
        assert "checksum" not in errors[0], (case, errors[0])
    assert "Traceback" not in r.output and "pwned" not in r.output
    assert not (out / "summary.json").exists()


def test_untampered_checkpoint_resumes(finished, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    r = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 0, r.output
