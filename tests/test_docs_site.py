"""The documentation site builds in strict mode, so the docs cannot rot unnoticed.

``mkdocs build --strict`` fails on any warning: a broken link or image (the README included as
the home page, the architecture document), a snippet that no longer exists (the recipes and the
example scripts are included verbatim), or an API object mkdocstrings can no longer collect.
Skipped when the ``docs`` extra (mkdocs, mkdocs-material, mkdocstrings[python]) is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # no end-of-life banner in the output
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed (exit {proc.returncode}):\n{output}"

    index = site / "index.html"
    api = site / "api" / "index.html"
    recipes = site / "recipes" / "index.html"
    for page in (index, api, recipes, site / "architecture" / "index.html", site / "examples" / "index.html"):
        assert page.is_file(), f"{page.relative_to(site)} was not built:\n{output}"

    api_html = api.read_text(encoding="utf-8")
    assert "Experiment" in api_html
    assert "federated_data" in api_html
    # ... and they come from mkdocstrings' rendering of fedsafe.api, not from the page's prose.
    start = api_html.find('id="fedsafe.api"')
    assert start >= 0, "the ::: fedsafe.api block was not rendered"
    end = api_html.find('id="fedsafe.config"', start)
    api_block = api_html[start:end if end > 0 else None]
    for name in ("Experiment", "federated_data", "register_rule", "load_model"):
        assert name in api_block, f"fedsafe.api.{name} is missing from the rendered API reference"
    assert "sable_encrypted" in recipes.read_text(encoding="utf-8")
