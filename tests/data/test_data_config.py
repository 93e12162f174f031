"""DataConfig: defaults, single-field ranges (reported by pydantic) and cross-field rules."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import ValidationError

from fedsafe.data import DataConfig


def _error(**kwargs: object) -> str:
    with pytest.raises(ValidationError) as exc:
        DataConfig(**kwargs)
    return str(exc.value)


def test_defaults() -> None:
    cfg = DataConfig()
    assert (cfg.name, cfg.partition, cfg.alpha, cfg.shards_per_client, cfg.gamma) == (
        "digits", "iid", 0.5, 2, 0.5)
    assert (cfg.test_fraction, cfg.resize, cfg.max_train, cfg.max_test, cfg.path) == (
        0.2, None, None, None, None)
    assert (cfg.synthetic_alpha, cfg.synthetic_beta, cfg.synthetic_dim, cfg.synthetic_classes,
            cfg.synthetic_samples) == (1.0, 1.0, 60, 10, 100)


def test_from_toml_section() -> None:
    doc = tomllib.loads(
        '[data]\nname = "synthetic"\npartition = "natural"\nsynthetic_alpha = 0.5\n'
        "synthetic_beta = 0.5\nmax_train = 100\n"
    )
    cfg = DataConfig.model_validate(doc["data"])
    assert cfg.name == "synthetic" and cfg.partition == "natural" and cfg.max_train == 100


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("alpha", 0.0, "greater than 0"),
        ("alpha", -1.0, "greater than 0"),
        ("alpha", float("inf"), "finite"),
        ("alpha", float("nan"), "finite"),
        ("shards_per_client", 0, "greater than or equal to 1"),
        ("gamma", 1.5, "less than or equal to 1"),
        ("gamma", -0.1, "greater than or equal to 0"),
        ("test_fraction", 0.0, "greater than 0"),
        ("test_fraction", 1.0, "less than 1"),
        ("resize", 0, "greater than or equal to 1"),
        ("max_train", 0, "greater than or equal to 1"),
        ("max_test", 0, "greater than or equal to 1"),
        ("synthetic_alpha", -0.5, "greater than or equal to 0"),
        ("synthetic_beta", -0.5, "greater than or equal to 0"),
        ("synthetic_dim", 0, "greater than or equal to 1"),
        ("synthetic_classes", 1, "greater than or equal to 2"),
        ("synthetic_samples", 1, "greater than or equal to 2"),
    ],
)
def test_out_of_range_fields_name_field_and_range(field: str, value: object, expected: str) -> None:
    message = _error(**{field: value})
    assert field in message and expected in message


def test_unknown_names_list_the_valid_ones() -> None:
    message = _error(name="imagenet")
    assert "name" in message and "unknown dataset 'imagenet'" in message
    assert "valid: cifar10, digits, fashion_mnist, mnist, synthetic" in message
    message = _error(partition="pathological")
    assert "partition" in message and "'dirichlet'" in message and "'natural'" in message


def test_unknown_key_is_refused() -> None:
    message = _error(alhpa=0.1)
    assert "alhpa" in message and "Extra inputs are not permitted" in message


@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10"])
def test_file_datasets_need_a_path(name: str) -> None:
    message = _error(name=name)
    assert "data.path is required" in message and name in message
    assert DataConfig(name=name, path="/somewhere").path == "/somewhere"


def test_mnist_needs_no_path_make_data_puts_it_in_the_data_directory() -> None:
    assert DataConfig(name="mnist").path is None
    assert DataConfig(name="mnist", path="/somewhere").path == "/somewhere"


@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_path_is_refused_where_unused(name: str) -> None:
    message = _error(name=name, path="/x")
    assert "data.path is not used" in message and name in message


@pytest.mark.parametrize("name", ["digits", "mnist", "cifar10"])
def test_natural_partition_only_for_synthetic(name: str) -> None:
    path = None if name == "digits" else "/x"
    message = _error(name=name, path=path, partition="natural")
    assert "data.partition='natural'" in message and "synthetic" in message
    assert DataConfig(name="synthetic", partition="natural").partition == "natural"


def test_resize_refused_for_synthetic() -> None:
    message = _error(name="synthetic", resize=28)
    assert "data.resize" in message and "synthetic" in message
    assert DataConfig(name="digits", resize=28).resize == 28
