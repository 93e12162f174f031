"""The composition matrix at toy size (issue #29 item 2): every protocol (plain, secagg, he on
the emulator, tee in process) x DP placement (off, central, local, distributed) x client kind
(backprop, zeroth-order) x attack (none, sign flip), each with its protocol's default settings.

Each cell either ends above chance level, or warns naming the setting to change; no default
configuration quantizes the messages away (the counters of the protocols stay healthy); and a
cell the config refuses is refused with a message naming the keys involved.
"""

from __future__ import annotations

import itertools
import re
import warnings

import pytest

from fedsafe.config import validate
from fedsafe.core.errors import ConfigError

PROTOCOLS = ("plain", "secagg", "he", "tee")
DP = ("off", "central", "local", "distributed")
GRADIENTS = ("backprop", "zeroth_order")
ATTACKS = ("none", "sign_flip")
ROUNDS = 4
CLIENTS = 6
CHANCE = 1.5 / 10  # digits: 10 classes (fedsafe.engine.metrics.CHANCE_FACTOR / num_classes)

#: the rule each protocol is run with: its default where it performs the default rule ("mean"),
#: otherwise the first rule it performs
RULES = {"plain": "mean", "secagg": "mean", "he": "trimmed_mean", "tee": "multi_krum"}

#: a dotted config key in a warning: what the user is told to change
SETTING = re.compile(r"\b(he|secagg|tee|dp|robust|clients|server|attack|zo)\.[a-z_]+\b")


def cell_config(protocol: str, dp: str, gradient: str, attack: str) -> dict:
    raw: dict = {
        "name": "cell", "seed": 0, "rounds": ROUNDS, "eval_every": ROUNDS, "execution": "serial",
        "data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 16},
        "clients": {"num_clients": CLIENTS, "batch_size": 16, "gradient": gradient},
        "protocol": protocol, "robust": {"rule": RULES[protocol]},
    }
    if gradient == "zeroth_order":
        raw["zo"] = {"k": 20}  # toy size: 20 forward differences instead of 100 (the scale of a message is K's)
    if protocol == "he":
        raw["he"] = {"backend": "emulator"}  # the same circuit as BFV, bit for bit (tests/protocols/he)
    if protocol == "tee":
        raw["tee"] = {"processes": False}
    if dp != "off":
        raw["dp"] = {"enabled": True, "placement": dp}
    if attack != "none":
        raw["attack"] = {"name": attack, "f": 1}
    return raw


CELLS = list(itertools.product(PROTOCOLS, DP, GRADIENTS, ATTACKS))


@pytest.fixture(autouse=True)
def _one_thread():
    """Toy models: one torch thread is fastest (and fair to the other processes on the machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(raw: dict):
    from fedsafe.engine.federation import Federation

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed = Federation(validate(raw))
        summary = fed.run()
    messages = [str(w.message) for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    return fed, summary, messages


def _refusal(raw: dict) -> str | None:
    """The config's refusal of a cell (validation, then set-up), or None when it runs."""
    from fedsafe.engine.check import setup_problems

    try:
        cfg = validate(raw)
    except ConfigError as e:
        return "; ".join(e.problems)
    problems = setup_problems(cfg)
    return "; ".join(problems) if problems else None


#: what fedsafe refuses, and the keys its message must name
REFUSED = {
    ("secagg", "central"): ("dp.placement", "distributed"),
    ("he", "central"): ("dp.placement", "robust.rule"),
    ("he", "distributed"): ("dp.placement", "robust.rule"),
    ("tee", "central"): ("dp.placement", "robust.rule"),
    ("tee", "distributed"): ("dp.placement", "robust.rule"),
}


def _healthy_quantization(rows: list[dict]) -> list[str]:
    """Protocol counters that say the default encoding destroyed the messages (none expected)."""
    late = rows[len(rows) // 2 :]
    bad = []
    for key, limit in (("he_zeroed_fraction", 0.9), ("he_clipped_fraction", 0.5), ("secagg_clipped_fraction", 0.1)):
        vals = [r[key] for r in late if r.get(key) is not None]
        if vals and sum(vals) / len(vals) > limit:
            bad.append(f"{key} = {sum(vals) / len(vals):.2f}")
    tee = [r["clipped"] / r["participants"] for r in late if "tee_clip" in r]
    if tee and sum(tee) / len(tee) > 0.9:
        bad.append(f"tee clipped {sum(tee) / len(tee):.2f}")
    return bad


@pytest.mark.parametrize("protocol,dp,gradient,attack", CELLS, ids=["-".join(c) for c in CELLS])
def test_cell_trains_or_names_the_setting_to_change(protocol, dp, gradient, attack):
    raw = cell_config(protocol, dp, gradient, attack)
    refused = _refusal(raw)
    if (protocol, dp) in REFUSED:
        assert refused is not None, f"{protocol} x dp {dp} should be refused"
        for key in REFUSED[(protocol, dp)]:
            assert key in refused, refused
        return
    assert refused is None, refused
    fed, summary, messages = _run(raw)
    assert not _healthy_quantization(fed.rows), _healthy_quantization(fed.rows)
    acc = summary["final_accuracy"]
    if acc <= CHANCE:
        named = [m for m in messages if SETTING.search(m)]
        assert named, f"{protocol}/{dp}/{gradient}/{attack} ended at {acc:.1%} with no warning naming a setting: {messages}"
    if protocol == "he":
        assert "he_range" in summary and summary["he_range"] > 0
    if protocol == "tee":
        assert "tee_clip" in summary and summary["tee_clip"] > 0


# --- the end-of-run diagnosis (fedsafe.engine.metrics) -----------------------------------------


def _rows(n=6, **per_round):
    return [{"round": t, "participants": 6, **per_round, "test_accuracy": None} for t in range(1, n + 1)]


def test_resolved_settings_report_the_last_value_and_the_spread():
    from fedsafe.engine.metrics import resolved_settings, summarize

    rows = [{"round": 1, "he_range": 0.1}, {"round": 2, "he_range": 0.3}, {"round": 3, "he_range": 0.2, "tee_clip": 4.0}]
    assert resolved_settings(rows) == {"he_range": 0.2, "he_range_min": 0.1, "he_range_max": 0.3, "tee_clip": 4.0}
    assert summarize(rows)["he_range"] == 0.2


def test_chance_level_names_the_counter_that_points_to_the_culprit():
    from fedsafe.engine.metrics import chance_level_message

    cfg = validate({"protocol": "he", "robust": {"rule": "trimmed_mean"}, "clients": {"gradient": "zeroth_order"}})
    rows = _rows(he_zeroed_fraction=1.0, he_clipped_fraction=0.0, he_range=0.05)
    rows[-1]["test_accuracy"] = 0.12
    msg = chance_level_message(cfg, rows, 10)
    assert msg.startswith("the run ended at chance level: final accuracy 12.0%")
    assert "he.range = 0.05 rounds 100% of the honest coordinates to 0" in msg and "he.range = 'auto'" in msg
    rows[-1]["test_accuracy"] = 0.16  # above 1.5 / 10: no warning
    assert chance_level_message(cfg, rows, 10) is None

    dp = validate({"clients": {"gradient": "zeroth_order"}, "dp": {"enabled": True, "placement": "central"}})
    rows = _rows(clipped_fraction=0.0)
    rows[-1]["test_accuracy"] = 0.1
    msg = chance_level_message(dp, rows, 10, dim=100)
    assert "dp.clip = 1 is above 100% of the clients' message norms" in msg and "zeroth-order" in msg
    assert "dp.noise_multiplier x dp.clip x sqrt(d)" in msg  # 1 x sqrt(100) / 6 = 1.7 > 1
    assert "sqrt(d)" not in chance_level_message(dp, rows, 10, dim=25)  # 1 x 5 / 6 < 1

    attacked = validate({"attack": {"name": "sign_flip", "f": 2}})
    rows = _rows()
    rows[-1]["test_accuracy"] = 0.05
    assert "robust.rule = 'mean' does not resist attack.name = 'sign_flip'" in chance_level_message(attacked, rows, 10)
    assert "check server.lr" in chance_level_message(validate({}), rows, 10)


def test_the_old_defaults_fail_the_health_check_and_warn_naming_the_setting():
    """The guard above can fail: zeroth-order + he at the former he.range = 0.05 erases every
    scalar, and the run warns naming he.range."""
    raw = cell_config("he", "off", "zeroth_order", "none")
    raw["he"]["range"] = 0.05
    fed, summary, messages = _run(raw)
    assert _healthy_quantization(fed.rows) == ["he_zeroed_fraction = 1.00"]
    assert any("he.range = 0.05 rounds 100.0%" in m and "set he.range = 'auto'" in m for m in messages)
