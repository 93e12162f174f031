"""Every recipe under recipes/ is a valid experiment, and the docs site has a section for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsafe.config import load

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_is_a_valid_experiment(path):
    cfg = load(path, [], [])
    assert cfg.name == path.stem
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(f"recipes/{path.name}" in line for line in header), "the header names the command that runs it"


def test_every_recipe_has_a_docs_section():
    page = (ROOT / "docs" / "recipes.md").read_text()
    for path in RECIPES:
        assert f'--8<-- "recipes/{path.name}"' in page, path.name


MNIST_RECIPES = [p for p in RECIPES if p.stem.startswith("mnist_")]


@pytest.mark.parametrize("path", MNIST_RECIPES, ids=[p.stem for p in MNIST_RECIPES])
def test_mnist_recipe_validates_without_the_data(path, tmp_path, monkeypatch):
    # `make test` never needs MNIST: the config is checked, the file is read only when a run starts.
    monkeypatch.setenv("FEDSAFE_DATA", str(tmp_path / "empty"))
    cfg = load(path, [], [])
    assert cfg.data.name == "mnist"
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert "make data" in header, "the header says to fetch MNIST first"
