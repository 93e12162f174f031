"""``fedsafe check`` (issue #26 item 10): every problem of a config in one call, one ``error:``
line each naming its key; ``fedsafe run`` refuses with the same lines before it touches its
output folder, and runs on the data the check loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app

runner = CliRunner()

SMALL = """
rounds = 1
checkpoint_every = 0
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
"""

# Four settings that cannot run together, each found by a different stage: an unknown key
# (pydantic), DP's central placement with a robust rule (between sections), secagg with a
# rule other than the mean (the protocol's check at set-up), and Krum with too few clients
# (the rule's n >= 2f + 3 at the configured round size).
INCOMPATIBLE = """
protocol = "secagg"
[data]
name = "digits"
bogus = 1
[model]
name = "logreg"
[clients]
num_clients = 4
[robust]
rule = "krum"
[attack]
name = "alie"
f = 1
[dp]
enabled = true
placement = "central"
"""


def _write(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _errors(output: str) -> list[str]:
    return [line.removeprefix("error: ") for line in output.splitlines() if line.startswith("error: ")]


def test_every_problem_is_reported_in_one_call(tmp_path):
    r = runner.invoke(app, ["check", str(_write(tmp_path, INCOMPATIBLE))])
    assert r.exit_code == 2, r.output
    errors = _errors(r.output)
    assert any(e.startswith("data.bogus: unknown key") for e in errors), errors
    assert any(e.startswith("dp.enabled with dp.placement = 'central' needs robust.rule = 'mean'") for e in errors)
    assert any(e.startswith("protocol: secure aggregation reveals only the sum") and "'krum'" in e for e in errors)
    assert "robust: krum requires n >= 2f + 3, got n=4, f=1 (with 4 participants per round)" in errors
    assert len(errors) == len(set(errors)) == 5, errors  # and secagg with central DP, once each
    assert "ok:" not in r.output


def test_a_good_config_is_ok(tmp_path):
    path = _write(tmp_path, SMALL)
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"ok: {path} (no variants)"
    r = runner.invoke(app, ["check"])  # the embedded default, with its two variants
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "ok: the default config (2 variants)"


def test_run_lists_every_problem_at_once_and_writes_nothing(tmp_path):
    path = _write(tmp_path, INCOMPATIBLE)
    checked = _errors(runner.invoke(app, ["check", str(path)]).output)
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", str(path), "--out", str(out)])
    assert r.exit_code == 2
    assert _errors(r.output) == checked
    assert not out.exists()
    # a folder that cannot take the run is one more line of the same refusal, and is left alone
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    r = runner.invoke(app, ["run", str(path), "--out", str(out)])
    assert r.exit_code == 2
    assert _errors(r.output)[:-1] == checked
    assert _errors(r.output)[-1].startswith(f"--out {out}: directory is not empty")
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_override_problems_are_listed_together():
    r = runner.invoke(app, ["check", "--set", "nonsense", "--set", "=1", "--set", "rounds=0"])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert len(errors) == 2 and "expected section.key=value" in errors[0] and "empty key" in errors[1], errors


def test_variants_are_checked_each_and_prefixed(tmp_path):
    path = _write(tmp_path, SMALL + """
[attack]
name = "alie"
f = 2
[variants.krum]
"robust.rule" = "krum"
[variants.tee]
protocol = "tee"
"robust.rule" = "krum"
"tee.bogus" = 3
[variants.mean]
"robust.rule" = "mean"
[variants.bad_data]
"data.max_train" = 3
"robust.rule" = "krum"
""")
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert any(e.startswith("variants.tee: tee.bogus: unknown key") for e in errors), errors
    # one problem of several variants is one line naming them; bad_data's data did not load, and
    # its rule was still checked
    assert ("variants.krum, variants.tee, variants.bad_data: robust: krum requires n >= 2f + 3, got n=5, f=2 "
            "(with 5 participants per round)") in errors
    assert any(e.startswith("variants.bad_data: data: num_clients=5 exceeds the 3 training samples") for e in errors)
    assert not any("variants.mean" in e for e in errors)
    assert len(errors) == 3, errors
    # with --variant, every variant is still validated (fedsafe run loads them all), and only the
    # selected ones are set up
    r = runner.invoke(app, ["check", str(path), "--variant", "mean", "--variant", "nope"])
    assert _errors(r.output) == [
        "--variant nope: no such variant; valid: base, krum, tee, mean, bad_data", errors[0]
    ], r.output
    r = runner.invoke(app, ["check", str(path), "--variant", "mean", "--set", "variants.tee={}"])
    assert r.exit_code == 0 and r.output.strip() == f"ok: {path} (1 variant)", r.output


def test_a_value_set_back_to_its_default_raises_no_problem_of_its_own(tmp_path):
    # clients.sampling and clients.num_clients are refused: with their defaults, sample_size
    # would be "only for fixed sampling" and attack.f = 25 "not below num_clients = 20";
    # neither is reported, since neither is a problem of this config
    r = runner.invoke(app, ["check", "--variant", "base", "--set", "clients.sampling=fixd", "--set", "clients.sample_size=3",
                            "--set", "attack.f=25", "--set", "clients.num_clients=\"x\""])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert len(errors) == 2, errors
    assert errors[0].startswith("clients.num_clients: Input should be a valid integer")
    assert errors[1].startswith("clients.sampling: Input should be 'all', 'fixed' or 'poisson'")


def test_without_the_data_the_checks_on_its_shape_still_run(tmp_path):
    # MNIST's files are missing; its 28x28 images resized to 2x2 give logreg 4 * 10 + 10 = 50
    # parameters, fewer than the 60 clients the TEE encodes per round (N <= d), and cnn_fmnist
    # needs images of at least 16x16
    text = f"""
protocol = "tee"
[data]
name = "mnist"
path = "{tmp_path / 'missing'}"
resize = 2
[model]
name = "logreg"
[clients]
num_clients = 60
[robust]
rule = "krum"
"""
    r = runner.invoke(app, ["check", str(_write(tmp_path, text))])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert len(errors) == 2, errors
    assert errors[0].startswith("data: data.path=") and "is not a directory" in errors[0]
    assert errors[1].startswith("protocol: tee: 60 clients per round but messages of only 50 coordinates")
    r = runner.invoke(app, ["check", str(_write(tmp_path, text.replace('"logreg"', '"cnn_fmnist"')))])
    errors = _errors(r.output)
    assert errors[1].startswith("model: model.name = 'cnn_fmnist' needs images of at least 16x16; got input shape (1, 2, 2)")


def test_the_stand_in_shape_is_the_loaded_shape():
    from fedsafe.data import load_federated
    from fedsafe.data.config import DataConfig
    from fedsafe.engine.check import nominal_shape

    for cfg in (DataConfig(), DataConfig(resize=12), DataConfig(name="synthetic", synthetic_dim=7, synthetic_classes=3)):
        data = load_federated(cfg, 3, 0)
        assert nominal_shape(cfg) == (data.input_shape, data.num_classes)


def test_flower_adds_what_the_server_app_refuses(tmp_path):
    # secure aggregation against an active server, with emulated attackers: fedsafe's engine runs
    # both; over Flower there is no PKI, and the server cannot see the updates to emulate from
    path = _write(tmp_path, 'protocol = "secagg"\n' + SMALL + """
[secagg]
adversary = "active"
[attack]
name = "alie"
f = 1
""")
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["check", str(path), "--flower", "--nodes", "4"])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert len(errors) == 3, errors
    assert errors[0].startswith("secagg.adversary = 'active' needs a PKI")
    assert errors[1].startswith("attack 'alie': fedsafe emulates Byzantine clients at the server")
    assert errors[2] == ("--nodes 4: fedsafe's ServerApp needs one SuperNode per client (partition-id 0..4), "
                         "and clients.num_clients = 5")
    r = runner.invoke(app, ["check", str(_write(tmp_path, SMALL, "small.toml")), "--flower", "--nodes", "5"])
    assert r.exit_code == 0 and "ok:" in r.output and "Flower ServerApp" in r.output, r.output


def test_flower_strategy_reports_what_the_strategy_refuses(tmp_path):
    text = SMALL + """
[robust]
rule = "fltrust"
[attack]
name = "alie"
f = 1
"""
    r = runner.invoke(app, ["check", str(_write(tmp_path, text)), "--flower-strategy", "--nodes", "3",
                            "--set", "clients.algorithm=dsgd"])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert errors == [
        "clients.algorithm = 'dsgd': your ClientApps send trained models, whose deltas are FedAvg's messages; "
        "leave it unset (fedavg)",
        "attack: with your own ClientApps the attackers are real clients; set robust.f to the number of Byzantine "
        "clients the rule must tolerate instead",
        "robust.rule = 'fltrust' needs fedsafe's own ServerApp (a root dataset or client histories)",
        "--nodes 3: FedsafeStrategy's population is the first clients.num_clients = 5 nodes to connect",
    ]
    # the same config under fedsafe's own engine and ServerApp: FLTrust and the attack run there
    r = runner.invoke(app, ["check", str(tmp_path / "exp.toml"), "--flower"])
    assert r.exit_code == 0, r.output
    ok = _write(tmp_path, SMALL + "[robust]\nrule = \"median\"\nf = 1\n", "ok.toml")
    r = runner.invoke(app, ["check", str(ok), "--flower-strategy", "--nodes", "8"])
    assert r.exit_code == 0 and r.output.strip() == f"ok: {ok} (FedsafeStrategy)", r.output


def test_flower_options_need_each_other_right():
    assert _errors(runner.invoke(app, ["check", "--flower", "--flower-strategy"]).output)[0].startswith("--flower and")
    assert _errors(runner.invoke(app, ["check", "--nodes", "3"]).output) == [
        "--nodes applies to --flower and --flower-strategy"
    ]
    assert _errors(runner.invoke(app, ["check", "--flower-strategy", "--variant", "mean"]).output) == [
        "--variant: FedsafeStrategy runs one experiment, without variants"
    ]


def test_run_loads_its_data_once_in_the_check(tmp_path, monkeypatch):
    import fedsafe.engine.federation as federation
    from fedsafe.data import loader

    calls = []
    real = loader.load_federated

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    def never(*args, **kwargs):
        raise AssertionError("Federation loaded the data again")

    monkeypatch.setattr(loader, "load_federated", counted)
    monkeypatch.setattr(federation, "load_federated", never)
    path = _write(tmp_path, SMALL + '[variants.a]\n"robust.rule" = "median"\n[variants.b]\n"robust.rule" = "mean"\n')
    r = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "run"), "-q"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1  # the two variants share their data
    assert (tmp_path / "run" / "a" / "summary.json").is_file() and (tmp_path / "run" / "b" / "summary.json").is_file()


@pytest.mark.parametrize("text", ["rounds = 0\n", '[data]\nname = "nope"\n'])
def test_a_problem_the_engine_would_meet_first_is_still_one_line(tmp_path, text):
    r = runner.invoke(app, ["check", str(_write(tmp_path, text))])
    assert r.exit_code == 2 and len(_errors(r.output)) == 1, r.output


def test_a_config_with_a_plugin_that_transforms_no_client_row_is_checked(tmp_path):
    # The audit is a server transform and an observer only (no message_dim): the check sizes the
    # messages over the client transforms, as the engine does.
    path = _write(tmp_path, SMALL + "algorithm = \"fedavg\"\n[dp]\nenabled = true\n[audit]\ncanaries = 4\n")
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"ok: {path} (no variants)"


def test_both_flower_paths_report_example_level_dp_and_crfl_certification(tmp_path):
    # DP-SGD runs in fedsafe's client work (the engine's, or its ClientApp's on each node), not in
    # your own ClientApps; the strategy cannot certify CRFL (the ServerApp can): each refusal names
    # the setting, before anything runs
    dpsgd = _write(tmp_path, SMALL + '[dp]\nenabled = true\nunit = "example"\nplacement = "local"\n', "dpsgd.toml")
    for flags in ([], ["--flower"]):
        r = runner.invoke(app, ["check", str(dpsgd), *flags])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["check", str(dpsgd), "--flower-strategy"])
    assert r.exit_code == 2 and _errors(r.output)[0].startswith("dp.unit = 'example'"), r.output
    crfl = _write(tmp_path, SMALL + "[crfl]\nenabled = true\nattackers = 1\npoison_fraction = 0.5\n", "crfl.toml")
    assert runner.invoke(app, ["check", str(crfl), "--flower"]).exit_code == 0
    r = runner.invoke(app, ["check", str(crfl), "--flower-strategy"])
    assert r.exit_code == 2 and _errors(r.output) == [
        "crfl.certify: FedsafeStrategy holds neither the model nor test data, so it cannot certify the smoothed "
        "model; set crfl.certify = false (each round's clipping and noise still run), or use fedsafe's own "
        "ServerApp (fedsafe.flower.server_app), which certifies"
    ]
    r = runner.invoke(app, ["check", str(crfl), "--flower-strategy", "--set", "crfl.certify=false"])
    assert r.exit_code == 0, r.output


def test_crfl_without_a_threat_is_reported_once(tmp_path):
    # the config's cross-section check and the plugin factory refuse with the same lines
    r = runner.invoke(app, ["check", str(_write(tmp_path, SMALL + "[crfl]\nenabled = true\n"))])
    assert r.exit_code == 2
    errors = _errors(r.output)
    assert len(errors) == 2 and errors[0].startswith("crfl.attackers:") and errors[1].startswith("crfl.poison_fraction:")
