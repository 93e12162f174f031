"""protocol = "secagg" inside the engine: refused rules, accuracy vs plaintext, dropouts."""

import pytest
import torch

from fedsafe.config import ConfigError, apply_overrides, validate
from fedsafe.engine.federation import Federation


def cfg(**over):
    raw = {
        "seed": 2, "rounds": 8, "eval_every": 4,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": 8, "batch_size": 16},
        "secagg": {"clip": 1.0},
    }
    return validate(apply_overrides(raw, over))


def test_secagg_matches_plaintext_up_to_quantization():
    plain = Federation(cfg())
    sec = Federation(cfg(protocol="secagg"))
    plain.run(), sec.run()
    torch.testing.assert_close(plain.state.params, sec.state.params, atol=1e-3, rtol=0)
    assert abs(plain.rows[-1]["test_accuracy"] - sec.rows[-1]["test_accuracy"]) < 0.02
    row = sec.rows[-1]
    assert row["secagg_survivors"] == 8 and row["secagg_dropouts"] == 0
    assert row["secagg_mask_seconds"] > 0 and row["bytes_up"] > 0


def test_rules_needing_individual_updates_are_refused():
    with pytest.raises(ConfigError, match="sum"):
        Federation(cfg(protocol="secagg", **{"robust.rule": "krum", "attack.f": 1}))


def test_dropouts_and_skipped_rounds():
    fed = Federation(cfg(protocol="secagg", **{"secagg.dropout": 0.05, "clients.num_clients": 12}))
    fed.run()
    done = [r for r in fed.rows if "skipped" not in r]
    assert any(r["secagg_dropouts"] > 0 for r in done)  # exact sums over survivors
    for r in done:
        assert r["secagg_survivors"] + r["secagg_dropouts"] == 12
    # Rounds the protocol had to abort are skipped, with the reason, and the run goes on.
    assert len(fed.rows) == 8
    for r in fed.rows:
        if "skipped" in r:
            assert "threshold" in r["skipped"]


def test_central_dp_refused_with_secagg_and_distributed_runs():
    with pytest.raises(ConfigError, match="distributed"):
        cfg(protocol="secagg", **{"dp.enabled": True, "clients.sampling": "all"})
    fed = Federation(cfg(protocol="secagg", **{"dp.enabled": True, "dp.placement": "distributed",
                                                "dp.noise_multiplier": 0.5, "dp.clip": 0.5, "rounds": 3,
                                                "secagg.clip": 2.0}))
    fed.run()
    assert fed.rows[-1]["epsilon"] > 0


def test_thresholds_of_at_most_half_a_share_group_are_refused_naming_the_key():
    for t in (2, 4, 0.34):
        with pytest.raises(ConfigError, match=r"secagg\.threshold"):
            cfg(protocol="secagg", **{"secagg.threshold": t})
    cfg(protocol="secagg", **{"secagg.threshold": 5})  # 5 of 8: a strict majority


def test_active_adversary_variant_trains_the_same_model():
    semi = Federation(cfg(protocol="secagg", rounds=3))
    active = Federation(cfg(protocol="secagg", rounds=3, **{"secagg.adversary": "active"}))
    semi.run(), active.run()
    assert torch.equal(semi.state.params, active.state.params)  # the masks cancel exactly either way
    row = active.rows[-1]
    assert row["secagg_consistency_seconds"] > 0 and row["bytes_down"] > semi.rows[-1]["bytes_down"]
