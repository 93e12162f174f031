"""protocol = "tee" inside the engine: same model as plaintext Multi-Krum under ALIE."""

import pytest
import torch

from fedsafe.config import ConfigError, apply_overrides, validate
from fedsafe.engine.federation import Federation


def cfg(**over):
    raw = {
        "seed": 0, "rounds": 4, "eval_every": 4,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": 8, "batch_size": 16},
        "robust": {"rule": "multi_krum"}, "attack": {"name": "alie", "f": 1},
        "tee": {"clip": 10.0, "processes": False},
    }
    return validate(apply_overrides(raw, over))


def test_tee_matches_plaintext_multi_krum_with_phase_timings_and_leakage():
    plain = Federation(cfg())
    tee = Federation(cfg(protocol="tee"))
    plain.run(), tee.run()
    torch.testing.assert_close(tee.state.params, plain.state.params, rtol=1e-6, atol=1e-7)
    assert tee.rows[-1]["test_accuracy"] == plain.rows[-1]["test_accuracy"]
    row = tee.rows[-1]
    assert row["mi_bound_bits"] > 0 and row["selected"] == 7 and row["client_work_seconds"] > 0
    assert any(k.endswith("_seconds") and "accel" in k for k in row)


def test_tee_refuses_coordinate_wise_rules():
    with pytest.raises(ConfigError, match="tee"):
        Federation(cfg(protocol="tee", **{"robust.rule": "trimmed_mean"}))
