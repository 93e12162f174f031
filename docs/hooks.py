"""MkDocs hook: make the repository README, included as the site's home page, link correctly.

``docs/index.md`` includes ``README.md`` with the snippets syntax (``--8<-- "README.md"``), so the
README's links are written relative to the repository root (``docs/figures/x.png``,
``docs/architecture.md``) while the page lives at the root of ``docs_dir``. Snippets are expanded
inside Markdown's own preprocessing, after ``on_page_markdown``, so the rewrite cannot be done on
the page's source text; it is done on the parsed tree instead, by a tree processor that runs just
before MkDocs' own link resolution and validation (priority 0), and only on the home page:

- ``docs/...`` (or ``./docs/...``): the prefix is dropped, so MkDocs resolves and validates the
  target as a documentation file (a missing figure still fails ``mkdocs build --strict``);
- ``recipes/NAME.toml``: points at that recipe's section of ``recipes.md``;
- ``README.md``: points at the home page itself;
- any other relative link to a file that exists in the repository (``src/...``, ``Makefile``):
  GitHub resolves it but the site cannot, so the link is turned into plain text;
- a relative link to a path that does not exist anywhere is left untouched, so MkDocs reports it
  and the strict build fails: a broken README link is rot, not something to hide.

Registered in ``mkdocs.yml`` under ``hooks:``; excluded from the built site by ``exclude_docs``.
"""

from __future__ import annotations

import posixpath
import re
import xml.etree.ElementTree as etree
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from markdown import Extension, Markdown
from markdown.treeprocessors import Treeprocessor

HOME = "index.md"
_current_page: str | None = None
_repo_root: Path | None = None
_docs_dir: Path | None = None
_RECIPE = re.compile(r"^recipes/([A-Za-z0-9_.-]+)\.toml$")


def _rewrite(target: str) -> str | None:
    """The new target for a README link, ``""`` to drop the link, ``None`` to leave it as is."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None  # external URL, in-page anchor, or absolute path: not the README's business
    path = posixpath.normpath(parts.path)
    if path.startswith("docs/"):
        return urlunsplit(("", "", path[len("docs/"):], parts.query, parts.fragment))
    match = _RECIPE.match(path)
    if match and _repo_root is not None and (_repo_root / path).is_file():
        return f"recipes.md#{match.group(1)}"
    if path == "README.md":
        return urlunsplit(("", "", HOME, "", parts.fragment))
    if _docs_dir is not None and (_docs_dir / path).exists():
        return None
    if _repo_root is not None and (_repo_root / path).exists():
        return ""
    return None


class _ReadmeLinks(Treeprocessor):
    def run(self, root: etree.Element) -> None:
        if _current_page != HOME:
            return
        for parent in root.iter():
            for i, el in enumerate(list(parent)):
                attr = {"a": "href", "img": "src"}.get(el.tag)
                if attr is None or el.get(attr) is None:
                    continue
                new = _rewrite(el.get(attr))
                if new is None:
                    continue
                if new:
                    el.set(attr, new)
                    continue
                # A repository file the site does not carry: keep the text, drop the link.
                if el.tag == "a":
                    el.tag = "span"
                    el.attrib.pop("href", None)
                    el.attrib.pop("title", None)
                else:
                    span = etree.Element("em")
                    span.text = el.get("alt") or el.get("src")
                    span.tail = el.tail
                    parent[i] = span


class _ReadmeLinksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # MkDocs registers its link resolver ("relpath") at priority 0; run just before it.
        md.treeprocessors.register(_ReadmeLinks(md), "fedsafe_readme_links", 1)


def on_config(config, **kwargs):
    global _repo_root, _docs_dir
    _docs_dir = Path(config["docs_dir"]).resolve()
    _repo_root = Path(config["config_file_path"]).resolve().parent
    config["markdown_extensions"].append(_ReadmeLinksExtension())
    return config


def on_page_markdown(markdown, page, **kwargs):
    global _current_page
    _current_page = page.file.src_uri
    return markdown
