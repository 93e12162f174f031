"""protocol = "he" inside the engine: BFV and the emulator train identically; refusals."""

import pytest
import torch

pytest.importorskip("tenseal")

from fedsafe.config import ConfigError, apply_overrides, validate  # noqa: E402
from fedsafe.engine.federation import Federation  # noqa: E402


def cfg(**over):
    raw = {
        "seed": 0, "rounds": 2, "eval_every": 2,
        "data": {"name": "digits", "max_train": 300}, "model": {"name": "logreg"},
        "clients": {"num_clients": 4, "batch_size": 16},
        "robust": {"rule": "trimmed_mean"}, "attack": {"name": "sign_flip", "f": 1},
        "protocol": "he", "he": {"delta": 2, "clamp": 0.05},
    }
    return validate(apply_overrides(raw, over))


def test_encrypted_training_equals_emulator_bit_for_bit():
    bfv = Federation(cfg())
    emu = Federation(cfg(**{"he.backend": "emulator"}))
    bfv.run(), emu.run()
    assert torch.equal(bfv.state.params, emu.state.params)
    assert bfv.rows[-1]["he_hts_seconds"] > 0 and bfv.rows[-1]["bytes_up"] > 0


def test_he_refuses_rules_it_cannot_compute():
    with pytest.raises(ConfigError, match="coordinate-wise"):
        Federation(cfg(**{"robust.rule": "krum"}))
    with pytest.raises(ConfigError, match="pre-aggregators"):
        Federation(cfg(**{"robust.pre": ["nnm"]}))
