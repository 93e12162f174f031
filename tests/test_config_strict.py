"""Strict config values (issue #26 item 5): no bool/int/str coercion, finite numbers in every
``params`` table, and the int -> float widening that TOML and ``--set`` rely on still works."""

from __future__ import annotations

import math
import re

import pytest

from fedsafe.config import ConfigError, load, parse_toml, validate
from fedsafe.core.registry import ParamValueError, Registry, RegistryError


def _errors(raw):
    with pytest.raises(ConfigError) as e:
        validate(raw)
    return e.value.problems


# --- no coercion between bool, int and str ----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"rounds": True}, "rounds"),
        ({"rounds": "5"}, "rounds"),
        ({"rounds": 5.0}, "rounds"),
        ({"dp": {"enabled": "yes"}}, "dp.enabled"),
        ({"dp": {"enabled": 1}}, "dp.enabled"),
        ({"secure_randomness": "false"}, "secure_randomness"),
        ({"server": {"lr": True}}, "server.lr"),
        ({"server": {"lr": "0.1"}}, "server.lr"),
        ({"clients": {"num_clients": False}}, "clients.num_clients"),
        ({"name": 5}, "name"),
    ],
)
def test_coercions_are_errors_naming_the_key(raw, key):
    problems = _errors(raw)
    assert len(problems) == 1 and problems[0].startswith(f"{key}: "), problems


def test_toml_booleans_and_strings_are_refused_as_typed():
    # The reported cases, written as a user would in the file.
    with pytest.raises(ConfigError, match=r"^rounds: .*valid integer"):
        validate(parse_toml("rounds = true"))
    with pytest.raises(ConfigError, match=r"^dp\.enabled: .*valid boolean"):
        validate(parse_toml('[dp]\nenabled = "yes"'))


def test_int_widens_to_float_and_tuples_come_from_toml_arrays():
    cfg = validate(parse_toml("[server]\nlr = 1\noptimizer = 'adam'\nbetas = [0, 0.5]\n[clients]\nweight_decay = 0"))
    assert cfg.server.lr == 1.0 and isinstance(cfg.server.lr, float)
    assert cfg.server.betas == (0.0, 0.5) and cfg.clients.weight_decay == 0.0
    cfg = validate({"ray": {"fail": [[1, 2]]}, "execution": "serial"})
    assert cfg.ray.fail == [(1, 2)]


def test_set_overrides_still_parse():
    cfg = load(None, ["rounds=5", "server.lr=1", "dp.enabled=false", "name=abc", "attack.params={}"])
    assert cfg.rounds == 5 and cfg.server.lr == 1.0 and cfg.dp.enabled is False and cfg.name == "abc"
    with pytest.raises(ConfigError, match=r"dp\.enabled"):
        load(None, ["dp.enabled=yes"])  # a bare word is a string, not a boolean
    with pytest.raises(ConfigError, match=r"^rounds: "):
        load(None, ["rounds=true"])


def test_dates_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^rounds: a TOML date/time"):
        validate(parse_toml("rounds = 1979-05-27"))


def test_python_values_an_api_user_passes_still_validate(tmp_path):
    import numpy as np

    cfg = validate({"server": {"optimizer": "adam", "betas": (0.9, 0.95), "lr": np.float64(0.01)}, "seed": np.int64(4)})
    assert cfg.server.betas == (0.9, 0.95) and cfg.server.lr == 0.01 and cfg.seed == 4
    with pytest.raises(ConfigError, match=r"^seed: .*valid integer"):
        validate({"seed": np.bool_(True)})
    with pytest.raises(ConfigError, match=r"^attack\.params\.z: .*object"):
        validate({"attack": {"name": "alie", "f": 1, "params": {"z": object()}}})


def test_variants_are_strict_too():
    problems = _errors({"variants": {"v": {"rounds": True}}})
    assert problems == [problems[0]] and problems[0].startswith("variants.v: rounds: "), problems


# --- finite numbers in params tables ----------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[attack]\nname = 'gaussian'\nf = 1\nparams = { std = inf }", "attack.params.std: must be a finite number, got inf"),
        ("[attack]\nname = 'alie'\nf = 1\nparams = { z = nan }", "attack.params.z: must be a finite number, got nan"),
        ("[attack]\nname = 'alie'\nf = 1\nparams = { z = -inf }", "attack.params.z: must be a finite number, got -inf"),
        ("[robust]\nrule = 'centered_clipping'\nparams = { tau = inf }", "robust.params.tau: must be a finite number, got inf"),
        ("[robust]\npre = [{ name = 'bucketing', params = { s = nan } }]", "robust.pre[0].params.s: must be a finite number, got nan"),
        ("[variants.v]\n'attack.name' = 'alie'\n'attack.f' = 1\n'attack.params' = { z = inf }",
         "variants.v: attack.params.z: must be a finite number, got inf"),
    ],
)
def test_nonfinite_params_are_refused_with_the_full_key(toml, message):
    problems = _errors(parse_toml(toml))
    assert message in problems, problems


def test_finite_params_pass():
    cfg = validate(parse_toml("[attack]\nname = 'alie'\nf = 1\nparams = { z = 1.5 }"))
    assert cfg.attack.params == {"z": 1.5}


def _reg():
    reg = Registry("thing")

    @reg.register("w")
    def w(x, *, weights=None, scale=1.0):
        return x

    return reg


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"scale": math.inf}, "cfg.params.scale"),
        ({"weights": [1.0, math.nan]}, "cfg.params.weights[1]"),
        ({"weights": {"a": [0, {"b": -math.inf}]}}, "cfg.params.weights.a[1].b"),
        ({"weights": (1.0, math.inf)}, "cfg.params.weights[1]"),
    ],
)
def test_registry_check_params_walks_lists_and_tables(params, key):
    reg = _reg()
    with pytest.raises(ParamValueError, match=rf"^{re.escape(key)}: must be a finite number, got "):
        reg.check_params("w", params, where="cfg.params")
    with pytest.raises(RegistryError, match=r"thing 'w' parameter"):  # the default names the entry
        reg.get("w", params)


def test_registry_accepts_finite_nested_params_and_numpy_numbers():
    import numpy as np

    reg = _reg()
    reg.check_params("w", {"weights": [1, 2.5, {"a": [True, "x", None]}], "scale": np.float32(2)})
    with pytest.raises(ParamValueError, match=r"scale: must be a finite number, got nan"):
        reg.check_params("w", {"scale": np.float32("nan")}, where="p")
