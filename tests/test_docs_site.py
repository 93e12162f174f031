"""The documentation site builds in strict mode, so the docs cannot rot unnoticed.

``mkdocs build --strict`` fails on any warning: a broken link or image (the README included as
the home page, the architecture document), a snippet that no longer exists (the recipes and the
example scripts are included verbatim), or an API object mkdocstrings can no longer collect.
Skipped when the ``docs`` extra (mkdocs, mkdocs-material, mkdocstrings[python]) is not installed.

The site is built once, for a sub-path deployment (``FEDSAFE_DOCS_URL``), and then checked: no
docstring shows a raw Sphinx role (``:func:`x```), the roles became links where their target
is rendered, every link of the 404 page (served at any depth) is absolute under the site's path
and reaches a built file, and the build helpers in docs/ are not published.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "/fedsafe/"  # the site's path when deployed as https://USER.github.io/fedsafe/
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj):(?:`|<code>)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    site = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        # no end-of-life banner in the output; a sub-path deployment, as on GitHub Pages
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "FEDSAFE_DOCS_URL": f"https://example.org{PREFIX}"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed (exit {proc.returncode}):\n{output}"
    return site, output


def test_docs_site_builds_strict(site: tuple[Path, str]) -> None:
    site, output = site

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


def test_docstrings_show_no_sphinx_roles(site: tuple[Path, str]) -> None:
    site, _ = site
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        raw = sorted({text[m.start():m.start() + 60] for m in ROLE.finditer(text)})
        assert not raw, f"{page.relative_to(site)} shows Sphinx roles as text: {raw[:5]}"
        assert "<autoref" not in text and "&lt;autoref" not in text, f"{page.relative_to(site)}: unresolved autoref tag"
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # fedsafe.api's docstrings say :func:`federated_data`, :class:`Result`, :func:`load_model`, ...:
    # relative names, resolved in the module and linked to the entries rendered on this page
    links = set(re.findall(r'<a class="autorefs autorefs-internal"[^>]*href="#(fedsafe\.[\w.]+)"', api))
    assert {"fedsafe.api.federated_data", "fedsafe.api.Result", "fedsafe.api.load_model"} <= links, sorted(links)
    # a lazily re-exported name (fedsafe.models.check_model) links to where it is defined
    assert "fedsafe.models.custom.check_model" in links
    for anchor in links:
        assert f'id="{anchor}"' in api, f"link to #{anchor}, which the page does not define"


def test_404_page_links_are_absolute_and_reach_built_files(site: tuple[Path, str]) -> None:
    site, _ = site
    page = (site / "404.html").read_text(encoding="utf-8")
    targets = re.findall(r'(?:href|src)="([^"]+)"', page)
    assert targets
    local = []
    for target in targets:
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # external (fonts, the theme's home page)
        # served at any depth (/fedsafe/no/such/page), so a relative link would resolve elsewhere
        assert parts.path.startswith(PREFIX), f"404.html links {target!r}, not under {PREFIX}"
        local.append(parts.path)
        path = site / parts.path[len(PREFIX):]
        path = path / "index.html" if parts.path.endswith(("/", "/.")) or path.is_dir() else path
        assert path.is_file(), f"404.html links {target!r}, which the site does not have"
    assert f"{PREFIX}api/" in local and any(p.endswith(".css") for p in local)
    config = re.search(r'<script id="__config" type="application/json">(.*?)</script>', page, re.S).group(1)
    assert f'"base": "{PREFIX}"' in config  # the theme's scripts (search) are found from any depth too


def test_build_helpers_are_not_published(site: tuple[Path, str]) -> None:
    site, _ = site
    for helper in ("hooks.py", "make_figures.py"):
        assert (ROOT / "docs" / helper).is_file()
        assert not list(site.rglob(helper)), f"docs/{helper} was copied into the site"
