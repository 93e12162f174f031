"""Every script under examples/ runs at reduced size (--quick), in its own process (they
register rules), and says what it is meant to say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(name: str) -> str:
    res = subprocess.run([sys.executable, str(EXAMPLES / name), "--quick"], capture_output=True, text=True,
                         timeout=600, cwd=EXAMPLES.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(
        ["custom_cnn.py", "dp_audit_custom_model.py", "custom_rule_sweep.py"]
    )


def test_custom_cnn():
    out = _run("custom_cnn.py")
    acc = dict(re.findall(r"^\s*(.+?): (?:final|test) accuracy ([\d.]+)%$", out, re.M))
    assert set(acc) == {"mean", "nnm + trimmed_mean", "reloaded model"}, out
    assert acc["reloaded model"] == acc["nnm + trimmed_mean"]  # the saved model is the trained one


def test_dp_audit_custom_model():
    out = _run("dp_audit_custom_model.py")
    eps = float(re.search(r"epsilon \(dp-accounting\) ([\d.]+)", out).group(1))
    lo = float(re.search(r"valid 95% lower bound (-?[\d.]+)", out).group(1))
    assert eps > 0 and lo <= eps, out


@pytest.mark.parametrize("script", ["custom_rule_sweep.py"])
def test_custom_rule_sweep(script):
    out = _run(script)
    rows = re.findall(r"^(\w+)\s+(\w+)\s+([\d.]+)%$", out, re.M)
    assert {(a, r) for a, r, _ in rows} == {
        (a, r) for a in ("gaussian", "sign_flip") for r in ("mean", "trimmed_mean", "norm_clipped_median")
    }, out
