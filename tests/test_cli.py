import json

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app

runner = CliRunner()

SMALL = """
rounds = 3
eval_every = 1
checkpoint_every = 1
[data]
name = "digits"
[model]
name = "logreg"
[clients]
num_clients = 5
"""


def test_bad_config_exits_2_with_one_line_per_problem_and_writes_nothing(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("rounds = 0\n[data]\nbogus = 1\n[clients]\nbatch_size = 'x'\n[robust]\nrule = 'krumm'\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out)])
    assert r.exit_code == 2
    lines = [l for l in r.output.splitlines() if l.startswith("error:")]
    assert len(lines) == 4, r.output
    text = "\n".join(lines)
    assert "rounds:" in text and "greater than or equal to 1" in text
    assert "data.bogus: unknown key; valid keys here:" in text and "partition" in text
    assert "clients.batch_size:" in text
    assert "robust.rule: unknown aggregation rule 'krumm'; valid:" in text
    assert not out.exists()


def test_bad_override_and_cross_field_errors(tmp_path):
    r = runner.invoke(app, ["run", "--set", "clients.sampling=fixed", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "clients.sample_size is required" in r.output
    r = runner.invoke(app, ["run", "--set", "attack.f=20", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "attack.f=20 must be < clients.num_clients=20" in r.output
    r = runner.invoke(app, ["run", "--set", "nonsense", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "expected section.key=value" in r.output
    r = runner.invoke(app, ["run", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_run_resume_and_report(tmp_path):
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--set", "seed=4", "-q"])
    assert r.exit_code == 0, r.output
    assert "final acc" in r.output
    resolved = (out / "config.toml").read_text()
    assert "seed = 4" in resolved and "num_clients = 5" in resolved
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3

    # Re-running into a used directory is refused; --resume of a finished run is a no-op.
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out)])
    assert r.exit_code == 2 and "--resume" in r.output
    r = runner.invoke(app, ["run", "--resume", str(out), "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["run", "--resume", str(out), "--set", "seed=1"])
    assert r.exit_code == 2

    figs = tmp_path / "figs"
    r = runner.invoke(app, ["report", str(out), "--out", str(figs)])
    assert r.exit_code == 0, r.output
    assert (figs / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (figs / "summary.csv").exists()


def test_privacy_epsilon_prints_dp_accounting_values():
    import dp_accounting as dpa

    r = runner.invoke(app, ["privacy", "epsilon", "--z", "1.0", "--q", "0.01", "--rounds", "1000", "--delta", "1e-5"])
    assert r.exit_code == 0, r.output
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 1000)
    rdp = dpa.rdp.RdpAccountant()
    rdp.compose(event)
    assert f"RDP: epsilon = {rdp.get_epsilon(1e-5):.4f}" in r.output
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4)  # near converged (1e-5 adds 1e-5)
    pld.compose(event)
    # Same event, fresh PLD accountant: fedsafe's printed PLD ε is an upper bound within 1% of it.
    printed = float(r.output.split("PLD: epsilon = ")[1].split()[0])
    ref = pld.get_epsilon(1e-5)
    assert ref - 1e-4 <= printed <= 1.01 * ref


def test_privacy_calibrate_and_bad_input():
    r = runner.invoke(app, ["privacy", "calibrate", "--eps", "1", "--q", "0.01", "--rounds", "1000", "--delta", "1e-5"])
    assert r.exit_code == 0 and r.output.startswith("z = 1.41")
    r = runner.invoke(app, ["privacy", "epsilon", "--z", "1", "--q", "2", "--rounds", "10", "--delta", "1e-5"])
    assert r.exit_code == 2 and "must be in (0, 1]" in r.output


def test_privacy_spectrum_writes_png(tmp_path):
    r = runner.invoke(app, ["privacy", "spectrum", "--out", str(tmp_path / "s.png"), "--sigma2", "0.01"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_spectrum_curves_lift_only_below_floor():
    import numpy as np
    import torch

    from fedsafe.privacy.inherent.figures import spectrum_curves

    g = torch.randn(5, 40, dtype=torch.float64)
    c = spectrum_curves(g, 2, 0.05)
    ref = np.sort(np.linalg.eigvalsh(g.numpy().T @ g.numpy() / 10))[::-1]
    np.testing.assert_allclose(c["sampling only"], np.clip(ref, 0, None), atol=1e-10)
    np.testing.assert_allclose(c["water-filled (WF-NA)"], np.maximum(c["sampling only"], 0.05))
    np.testing.assert_allclose(c["isotropic"], c["sampling only"] + 0.05)


# --- what users expect of a command-line tool ------------------------------------------------


def _fedsafe(*args):
    """The real command, as the console script runs it."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "fedsafe", *args], capture_output=True, text=True)


def test_version_and_flags_shown_as_flags():
    import fedsafe

    r = _fedsafe("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"fedsafe {fedsafe.__version__}"
    for args in (["--help"], ["run", "--help"], ["sweep", "--help"], ["privacy", "epsilon", "--help"]):
        r = _fedsafe(*args)
        assert r.returncode == 0 and "<bool>" not in r.stdout, (args, r.stdout)
    r = _fedsafe("run", "--help")
    assert "--quiet" in r.stdout and "KEY=VALUE" in r.stdout


def test_cli_start_up_imports_no_subsystem():
    import subprocess
    import sys

    code = (
        "import sys, fedsafe.cli; heavy = [m for m in ('torch', 'numpy', 'scipy', 'matplotlib', 'numba', "
        "'fedsafe.config', 'fedsafe.engine') if m in sys.modules]; print(heavy)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout


@pytest.mark.parametrize("kind, needle", [
    ("rules", "trimmed_mean"), ("rules", "pre-aggregator"), ("attacks", "alie"), ("protocols", "secagg"), ("models", "lenet"),
    ("datasets", "cifar10"), ("partitions", "dirichlet"), ("keys", "dp.noise_multiplier"),
])
def test_list_shows_registered_names_with_descriptions(kind, needle):
    r = runner.invoke(app, ["list", kind])
    assert r.exit_code == 0 and needle in r.output, r.output
    from fedsafe.catalog import items

    for item in items(kind):
        assert item.name in r.output


def test_list_unknown_kind_is_one_error():
    r = runner.invoke(app, ["list", "gizmos"])
    assert r.exit_code == 2 and "valid: rules, attacks, protocols, models, datasets, partitions, keys" in r.output


def test_errors_keep_bracketed_section_names(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[clients]\nalgorithm = "inherent"\n')
    r = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "the [inherent] section" in r.output, r.output


def test_binary_config_is_one_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    r = runner.invoke(app, ["run", str(cfg)])
    assert r.exit_code == 2 and "not a TOML text file" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["run", str(tmp_path)])
    assert r.exit_code == 2 and "cannot read" in r.output


@pytest.mark.parametrize("value, needle", [("100000", "less than or equal to 4096"), ("4000", "GiB")])
def test_huge_resize_is_refused(tmp_path, value, needle):
    r = runner.invoke(app, ["run", "--variant", "mean", "--set", f"data.resize={value}", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and needle in r.output and "data.resize" in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_malicious_cifar_pickle_is_one_error(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo pwned",))

    d = tmp_path / "cifar"
    d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (d / name).write_bytes(pickle.dumps(Evil()))
    r = runner.invoke(app, ["run", "--variant", "mean", "--set", "data.name=cifar10", "--set", f"data.path='{d}'",
                            "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "Traceback" not in r.output and "pwned" not in r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("os.system" in errors[0] or "posix.system" in errors[0]), r.output


@pytest.mark.parametrize("override, key", [
    ("server.lr=inf", "server.lr"),
    ("server.lr=nan", "server.lr"),
    ("clients.lr=inf", "clients.lr"),
    ("dp.noise_multiplier=inf", "dp.noise_multiplier"),
])
def test_non_finite_numbers_are_refused_naming_the_key(tmp_path, override, key):
    # server.lr = inf used to be accepted: every update became non-finite and every round was
    # skipped, so the run "succeeded" at chance accuracy.
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", str(cfg), "--set", override, "--out", str(out)])
    assert r.exit_code == 2, r.output
    lines = [l for l in r.output.splitlines() if l.startswith("error:")]
    assert lines and lines[0].startswith(f"error: {key}:") and "finite" in lines[0], r.output
    assert not out.exists()


def test_tee_with_more_clients_than_coordinates_is_refused_before_any_round(tmp_path):
    # 2 synthetic features, 2 classes: logistic regression has 6 parameters, fewer than the 8
    # clients; the enclave's noise cannot be drawn, so every round would be skipped.
    cfg = tmp_path / "tee.toml"
    cfg.write_text(
        'rounds = 2\nprotocol = "tee"\n[data]\nname = "synthetic"\nsynthetic_dim = 2\nsynthetic_classes = 2\n'
        '[model]\nname = "logreg"\n[clients]\nnum_clients = 8\n[robust]\nrule = "multi_krum"\n'
        '[tee]\nprocesses = false\n'
    )
    out = tmp_path / "out"
    r = runner.invoke(app, ["run", str(cfg), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "error: protocol: tee: 8 clients per round but messages of only 6 coordinates" in r.output
    assert "N <= d" in r.output
    assert not out.exists()
