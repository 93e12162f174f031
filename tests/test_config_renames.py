"""Renamed config keys (issue #27 item 4, one vocabulary): each new key works; each old key is a
deprecated alias for one release (same validated config, one FutureWarning naming both,
to_toml writes only the new key); both together is a ConfigError; attribute access by the old
name warns and returns the value; a run directory saved with the old keys resumes."""

from __future__ import annotations

import json
import tomllib
import warnings

import pytest
import torch

from fedsafe.config import RENAMED_KEYS, ExperimentConfig, apply_overrides, load, read_toml, validate, variant_config
from fedsafe.core.errors import ConfigError
from fedsafe.core.renames import ConfigDeprecationWarning
from fedsafe.engine.metrics import read_metrics
from fedsafe.engine.run import load_run_config, run_experiment

INHERENT = {
    "clients": {"num_clients": 4, "algorithm": "inherent", "batch_size": 8},
    "inherent": {"row": "sgd_iid+isotropic", "sigma2": 1.0},
}

# (section, old key, new key, value under the old key, the same value under the new key, base)
CASES = [
    ("he", "delta", "bits", 3, 3, {}),
    ("he", "clamp", "range", 0.1, 0.1, {}),
    ("secagg", "clip", "range", 2.0, 2.0, {}),
    ("secagg", "clip_probability", "range_probability", 1e-12, 1e-12, {}),
    ("secagg", "placement", "execution", "local", "serial", {}),
    ("secagg", "placement", "execution", "ray", "ray", {}),
    ("tee", "accelerators", "execution", "same", "serial", {}),
    ("tee", "accelerators", "execution", "ray", "ray", {}),
    ("inherent", "clip", "example_clip", 5.0, 5.0, INHERENT),
]
IDS = [f"{c[0]}.{c[1]}={c[3]}" for c in CASES]


def _raw(base, section, key, value):
    raw = json.loads(json.dumps(base))
    raw.setdefault(section, {})[key] = value
    return raw


def _renamed_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.parametrize("section,old,new,old_value,new_value,base", CASES, ids=IDS)
def test_the_new_key_works_without_a_warning(section, old, new, old_value, new_value, base):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = validate(_raw(base, section, new, new_value))
    assert getattr(getattr(cfg, section), new) == new_value
    assert _renamed_warnings(caught) == []


@pytest.mark.parametrize("section,old,new,old_value,new_value,base", CASES, ids=IDS)
def test_the_old_key_is_an_alias_that_warns_once_and_is_saved_under_the_new_name(
    tmp_path, section, old, new, old_value, new_value, base
):
    want = validate(_raw(base, section, new, new_value))
    import tomli_w

    path = tmp_path / "old.toml"
    path.write_text(tomli_w.dumps(_raw(base, section, old, old_value)))
    plain = tmp_path / "plain.toml"
    plain.write_text(tomli_w.dumps(base))
    entries = {  # where a user's keys enter fedsafe: each warns once
        "file": lambda: load(path),
        "--set": lambda: load(plain, [f"{section}.{old}={json.dumps(old_value)}"]),
        "section": lambda: validate({**want.to_dict(), section: type(getattr(want, section))(**_raw(base, section, old, old_value)[section]).model_dump()}),
    }
    for where, make in entries.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = make()
        got = _renamed_warnings(caught)
        assert len(got) == 1, (where, got)
        assert f"{section}.{old}" in got[0] and f"{section}.{new}" in got[0] and "deprecated" in got[0]
        assert issubclass(caught[0].category, ConfigDeprecationWarning)
        assert getattr(getattr(cfg, section), new) == new_value, where
    cfg = validate(_raw(base, section, old, old_value))  # fedsafe's own re-validation: quiet, same config
    assert cfg.to_dict() == want.to_dict()
    saved = tomllib.loads(cfg.to_toml())[section]
    assert old not in saved and saved[new] == new_value
    assert RENAMED_KEYS[f"{section}.{old}"] == f"{section}.{new}"


@pytest.mark.parametrize("section,old,new,old_value,new_value,base", CASES, ids=IDS)
def test_the_old_and_the_new_key_together_are_refused(section, old, new, old_value, new_value, base):
    raw = _raw(_raw(base, section, old, old_value), section, new, new_value)
    with pytest.raises(ConfigError) as e:
        validate(raw)
    assert f"{section}.{old}" in str(e.value) and f"{section}.{new}" in str(e.value)


@pytest.mark.parametrize("section,old,new,old_value,new_value,base", CASES, ids=IDS)
def test_the_old_attribute_name_warns_and_returns_the_value(section, old, new, old_value, new_value, base):
    sec = getattr(validate(_raw(base, section, new, new_value)), section)
    with pytest.warns(FutureWarning, match=rf"{section}\.{old}.*{section}\.{new}"):
        assert getattr(sec, old) == old_value  # in the old vocabulary of values ('local', 'same')
    with pytest.raises(AttributeError):
        setattr(sec, old, old_value)  # read-only


@pytest.mark.parametrize("section,old,new,old_value,new_value,base", CASES, ids=IDS)
def test_overrides_and_variants_take_either_name(section, old, new, old_value, new_value, base):
    # --set by the old name replaces the new key of the file (and the other way round)
    for file_key, set_key in ((new, old), (old, new)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            raw = apply_overrides(_raw(base, section, file_key, new_value), {f"{section}.{set_key}": old_value if set_key == old else new_value})
            assert getattr(getattr(validate(raw), section), new) == new_value
    # a variant's table by the old name: stored, and written, under the new one
    raw = {**json.loads(json.dumps(base)), "variants": {"v": {f"{section}.{old}": old_value}}}
    with pytest.warns(FutureWarning, match=rf"{section}\.{old}"):
        ExperimentConfig.model_validate(raw)  # a variant's table built in Python warns
    cfg = validate(raw)
    assert cfg.variants == {"v": {f"{section}.{new}": new_value}}
    assert getattr(getattr(variant_config(cfg, "v"), section), new) == new_value
    assert f"{section}.{old}" not in cfg.to_toml()


def test_he_protocol_keyword_arguments_take_either_name():
    from fedsafe.protocols.he.config import HEConfig
    from fedsafe.protocols.he.protocol import HEProtocol

    with pytest.warns(FutureWarning, match="he.delta"):
        assert HEProtocol(HEConfig(bits=4), delta=3).config.bits == 3
    assert HEProtocol(HEConfig(bits=4), bits=2).config.bits == 2


def test_messages_name_the_key_as_written():
    from fedsafe.protocols.he.config import HEConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match="exceeds he.delta"):
            HEConfig(delta=3, digits=4)
    with pytest.raises(ValueError, match="exceeds he.bits"):
        HEConfig(bits=3, digits=4)


# --- a run directory saved with the old keys resumes ------------------------------------------

OLD_KEYS_RUN = {
    "seed": 1, "rounds": 4, "eval_every": 2, "checkpoint_every": 2,
    "data": {"name": "digits", "max_train": 200}, "model": {"name": "logreg"},
    "clients": {"num_clients": 4, "batch_size": 8},
    "he": {"delta": 3, "clamp": 0.1},
    "secagg": {"clip": 2.0, "clip_probability": 1e-12, "placement": "local"},
    "tee": {"accelerators": "same"},
}
OLD_KEYS_INHERENT = {
    "seed": 1, "rounds": 4, "eval_every": 2, "checkpoint_every": 2,
    "data": {"name": "digits", "max_train": 200}, "model": {"name": "logreg"},
    "clients": {"num_clients": 4, "batch_size": 8, "algorithm": "inherent"},
    "inherent": {"row": "sgd_iid+isotropic", "sigma2": 1.0, "clip": 5.0},
    "secure_randomness": False,
}


def _old_identity(identity: str) -> str:
    """A run identity as fedsafe wrote it before the renames (old keys and values)."""
    d = json.loads(identity)
    for old, new in RENAMED_KEYS.items():
        section, new_key = new.split(".")
        sec = d.get(section)
        if isinstance(sec, dict) and new_key in sec:
            value = sec.pop(new_key)
            sec[old.split(".")[1]] = {"serial": "local" if section == "secagg" else "same"}.get(value, value)
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=True)


@pytest.mark.parametrize("raw", [OLD_KEYS_RUN, OLD_KEYS_INHERENT], ids=["protocols", "inherent"])
def test_a_run_saved_with_the_old_keys_resumes(tmp_path, raw):
    from fedsafe.engine.federation import Federation
    from fedsafe.engine.state import CHECKPOINT, with_checksums

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cfg = validate(raw)
    full = tmp_path / "full"
    run_experiment(cfg, full, quiet=True)

    killed = tmp_path / "killed"
    killed.mkdir()
    import tomli_w

    (killed / "config.toml").write_text(tomli_w.dumps(raw))  # as an older fedsafe saved it
    fed = Federation(cfg, out_dir=killed)
    for _ in range(3):  # checkpoint after round 2, round 3 written, then the process "dies"
        fed.run_round()
    del fed
    # the checkpoint's run identity as the older fedsafe wrote it
    blob = torch.load(killed / CHECKPOINT, weights_only=True)
    blob["run"] = _old_identity(blob["run"])
    assert any(f'"{old.split(".")[1]}"' in blob["run"] for old in RENAMED_KEYS)
    torch.save(with_checksums(blob), killed / CHECKPOINT)

    saved = read_toml(killed / "config.toml")
    assert any(k in saved.get(s, {}) for s, k in (x.split(".") for x in RENAMED_KEYS))
    with pytest.warns(FutureWarning, match="deprecated"):
        resumed = load_run_config(killed)
    assert resumed.to_dict() == cfg.to_dict()
    run_experiment(resumed, killed, resume=True, quiet=True)

    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]  # noqa: E731
    assert strip(read_metrics(killed)) == strip(read_metrics(full))


# --- the command line ---------------------------------------------------------------------------

OLD_KEYS_TOML = """
rounds = 1
checkpoint_every = 0
[data]
name = "digits"
max_train = 200
[model]
name = "logreg"
[clients]
num_clients = 4
[he]
delta = 3
[secagg]
placement = "local"
"""


def test_check_and_run_print_each_renamed_key_as_one_warning_line(tmp_path):
    from typer.testing import CliRunner

    from fedsafe.cli import app

    path = tmp_path / "old.toml"
    path.write_text(OLD_KEYS_TOML)
    runner = CliRunner()
    want = [
        "warning: he.delta is deprecated: use he.bits",
        "warning: secagg.placement = 'local' is deprecated: use secagg.execution = 'serial'",
    ]
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 0, res.output
    assert sorted(line for line in res.stderr.splitlines() if "deprecated" in line) == want
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", str(path), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert sorted(line for line in res.stderr.splitlines() if "deprecated" in line) == want
    saved = (out / "config.toml").read_text()
    assert "bits = 3" in saved and "delta" not in saved.split("[he]")[1].split("[")[0]
    assert 'execution = "serial"' in saved and "placement" not in saved.split("[secagg]")[1].split("[")[0]


def test_privacy_sampling_is_all_and_none_is_a_deprecated_alias():
    from typer.testing import CliRunner

    from fedsafe.cli import app

    runner = CliRunner()
    args = ["privacy", "epsilon", "--z", "1", "--rounds", "10", "--delta", "1e-5", "--sampling"]
    new = runner.invoke(app, [*args, "all"])
    assert new.exit_code == 0, new.output
    assert "sampling=all" in new.stdout and "deprecated" not in new.stderr
    old = runner.invoke(app, [*args, "none"])
    assert old.exit_code == 0 and old.stdout == new.stdout
    assert old.stderr.strip() == "warning: --sampling none is deprecated: use --sampling all"
    bad = runner.invoke(app, [*args, "every"])
    assert bad.exit_code == 2 and "valid: poisson, fixed, all" in bad.stderr
    assert "poisson | fixed | all" in runner.invoke(app, ["privacy", "epsilon", "--help"]).stdout


def test_a_renaming_section_still_fills_tuples_from_toml_arrays():
    # the renaming before-validator hands on Python values: strict validation must still take
    # a TOML array for a tuple field (secagg.dropout_stages)
    assert validate({"secagg": {"dropout_stages": ["mask"]}}).secagg.dropout_stages == ("mask",)
    with pytest.raises(ConfigError, match="secagg.dropout_stages"):
        validate({"secagg": {"dropout_stages": "mask"}})
