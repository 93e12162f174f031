"""[audit] canaries inside a DP-FedAvg run."""

import json

import pytest
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.config import ConfigError, validate
from fedsafe.engine.run import run_experiment
from fedsafe.report import find_runs
from fedsafe.report.table import summary_table


def cfg(z, **over):
    raw = {
        "seed": 0, "rounds": 6, "eval_every": 6,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": 20, "algorithm": "fedavg", "local_steps": 1, "lr": 0.5},
        "server": {"lr": 1.0},
        "dp": {"enabled": True, "clip": 1.0, "noise_multiplier": z},
        "audit": {"canaries": 40, "unobserved": 40},
    }
    raw.update(over)
    return validate(raw)


def test_audit_reports_estimates_and_they_fall_with_noise(tmp_path):
    s_low = run_experiment(cfg(0.3), tmp_path / "low", quiet=True)["experiment"]
    s_high = run_experiment(cfg(3.0), tmp_path / "high", quiet=True)["experiment"]
    for s in (s_low, s_high):
        for k in ("eps_est_final", "eps_est_all", "eps_lo_final", "eps_lo_all", "eps_analytical"):
            assert k in s
        for k in ("eps_est_final_fitted", "eps_est_all_fitted", "eps_lo_valid_final", "eps_lo_valid_all"):
            assert isinstance(s[k], float) and s[k] >= 0, k
    assert s_low["eps_est_final"] > s_high["eps_est_final"]
    assert s_low["eps_est_all"] >= s_low["eps_est_final"] * 0.5
    saved = json.loads((tmp_path / "low" / "summary.json").read_text())
    assert saved["eps_est_final"] == pytest.approx(s_low["eps_est_final"])
    assert (tmp_path / "low" / "audit_final.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "low" / "audit_all.png").exists()
    # `fedsafe report` shows the valid bound beside the paper's ε_lo.
    cols = {c.header: list(c.cells) for c in summary_table(find_runs([tmp_path / "low"])).columns}
    assert cols["ε_lo final"] == [format(s_low["eps_lo_final"], ".3g")]
    assert cols["95% lo final"] == [format(s_low["eps_lo_valid_final"], ".3g")]
    assert cols["95% lo all"] == [format(s_low["eps_lo_valid_all"], ".3g")]


def test_audit_needs_dp_fedavg():
    with pytest.raises(ConfigError, match="audit.canaries needs dp.enabled"):
        validate({"clients": {"algorithm": "dsgd"}, "audit": {"canaries": 10}})


def test_audit_enabled_is_the_switch_and_a_count_alone_still_turns_it_on():
    from fedsafe.config import variant_config
    from fedsafe.core.plugins import section_enabled

    base = {"dp": {"enabled": True}, "clients": {"algorithm": "fedavg"}}
    for audit, on in (({}, False), ({"canaries": 4}, True), ({"enabled": True, "canaries": 4}, True),
                      ({"enabled": False, "canaries": 4}, False)):
        cfg = validate({**base, "audit": audit})
        assert cfg.audit.enabled is on and section_enabled(cfg, "audit") is on, audit
        assert validate(cfg.model_dump()).audit == cfg.audit  # what a saved config.toml reads back
    with pytest.raises(ConfigError, match=r"audit.enabled = true needs audit.canaries >= 2"):
        validate({**base, "audit": {"enabled": True}})
    # a variant (or a --set on a saved config) that sets canaries = 0 turns it off, as before the key
    cfg = validate({**base, "audit": {"enabled": True, "canaries": 4}, "variants": {"off": {"audit.canaries": 0}}})
    assert variant_config(cfg, "off").audit.enabled is False


def test_audit_gaussian_cli_small():
    r = CliRunner().invoke(app, ["audit", "gaussian", "--dim", "20000", "--canaries", "200", "--eps", "3",
                                 "--trials", "3", "--delta", "1e-5"])
    assert r.exit_code == 0, r.output
    assert "target" in r.output and "3" in r.output
