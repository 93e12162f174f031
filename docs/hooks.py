"""MkDocs hook: make the repository README, included as the site's home page, link correctly;
and (``SphinxRoles``, a griffe extension) render the docstrings' Sphinx roles as code and links.

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

Sphinx roles. fedsafe's docstrings cross-reference with Sphinx roles (``:func:`load_model```,
``:class:`~fedsafe.core.errors.ConfigError```), which mkdocstrings, rendering docstrings as
Markdown, would print as they are. ``SphinxRoles`` is a griffe extension (registered in
``mkdocs.yml`` under the Python handler's ``extensions``): once griffe has loaded the package,
it rewrites every role in every docstring into an optional autorefs cross-reference around the
name in code, so the name links to its entry in the API reference where that entry is rendered
and is plain code where it is not (an optional reference never fails the strict build).
Relative names are resolved as Sphinx resolves them, from the innermost scope outwards (the
object, its class, its module, ...); ``~`` shows the last component only; ``title <target>``
shows the title.

Registered in ``mkdocs.yml`` under ``hooks:``; excluded from the built site by ``exclude_docs``.
"""

from __future__ import annotations

import html
import posixpath
import re
import xml.etree.ElementTree as etree
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import griffe
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


# --- Sphinx roles in docstrings (a griffe extension, see the module docstring) -------------------

#: ``:role:`text``` (also ``:py:role:``) for the Python-domain roles fedsafe's docstrings use.
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|type):`([^`]+)`")


def _lookup(pkg: Any, path: str) -> bool:
    """Whether ``path`` (dotted, from the package's name) names an object griffe loaded."""
    head, _, rest = path.partition(".")
    if head != pkg.name:
        return False
    if not rest:
        return True
    try:
        pkg[rest]
    except Exception:  # KeyError, or an alias whose target lies outside the package
        return False
    return True


def resolve(obj: Any, target: str, defined: dict[str, list[str]] | None = None) -> str:
    """The full path ``target`` names in ``obj``'s docstring: as given when it starts with the
    package's name and exists, else the first of ``obj.target``, ``obj.parent.target``, ...
    that exists. A name a package re-exports lazily (``fedsafe.models.check_model``, found by
    ``__getattr__``, which griffe cannot follow) is the one object of that name defined under
    that package (``defined``: name -> paths of the objects defined with it). Otherwise
    ``target`` itself (the reference then renders as plain code)."""
    pkg = obj.package
    if target.split(".")[0] == pkg.name:
        if _lookup(pkg, target):
            return target
        prefix, _, name = target.rpartition(".")
        under = [p for p in (defined or {}).get(name, []) if p.startswith(prefix + ".")]
        return under[0] if len(under) == 1 else target
    scope = obj
    while scope is not None:
        candidate = f"{scope.path}.{target}"
        if _lookup(pkg, candidate):
            return candidate
        scope = scope.parent
    return target


def render_roles(text: str, obj: Any, defined: dict[str, list[str]] | None = None) -> str:
    """``text`` with every Sphinx role replaced by an optional autorefs cross-reference."""

    def one(match: re.Match) -> str:
        body = match.group(1).strip()
        titled = re.fullmatch(r"(.*?)\s*<([^<>]+)>", body)
        if titled:
            title, target = titled.group(1), titled.group(2).strip()
        else:
            target = body
            title = None
        short = target.startswith("~")
        target = target.lstrip("~.").removesuffix("()")
        if title is None:
            title = target.rsplit(".", 1)[-1] if short else target
        ident = html.escape(resolve(obj, target, defined), quote=True)
        return f'<autoref identifier="{ident}" optional><code>{html.escape(title)}</code></autoref>'

    return ROLE.sub(one, text)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring in the loaded package (see the module
    docstring). Aliases are skipped: their docstring is their target's, rewritten there."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        objects, stack = [], [pkg]
        while stack:
            obj = stack.pop()
            objects.append(obj)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
        defined: dict[str, list[str]] = {}
        for obj in objects:
            defined.setdefault(obj.name, []).append(obj.path)
        for obj in objects:
            if obj.docstring is not None and ROLE.search(obj.docstring.value):
                obj.docstring.value = render_roles(obj.docstring.value, obj, defined)
