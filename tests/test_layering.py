"""The architecture's layering (docs/architecture.md): a module imports only modules of its own
layer or lower ones, at module level or inside functions alike, and the packages import one
another without a cycle. Read off the source with ast, so a lazy import cannot hide an upward
dependency.

What counts as an import of a module:

- an ``import`` / ``from ... import`` statement, anywhere in the source;
- a string naming it: ``importlib.import_module("fedsafe.x")`` (or ``import_module`` /
  ``__import__``), ``Registry.register_lazy(name, "fedsafe.x:attr")``, the targets of a
  package's ``lazy_exports(__name__, {...})`` and the new homes a package's
  ``moved_modules(__name__, {...})`` names (its old paths, kept for one release);
- a name taken from a package with lazy exports: ``from fedsafe.audit import AuditPlugin`` imports
  the submodule that defines ``AuditPlugin``; ``fedsafe.Experiment`` imports ``fedsafe.api``.

The top package ``fedsafe`` exports layer 5 (the Python API), so ``import fedsafe`` counts as an
import of layer 5; only ``from fedsafe import __version__``, a constant of the package's own
``__init__``, is free to every layer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A module belongs to the longest prefix listed; the top package "fedsafe" itself
# is matched exactly (it exports the Python API, layer 5), never as a prefix, so a new top-level
# module without a layer is reported.
LAYERS: dict[str, int] = {
    "fedsafe": 5,  # the package: __version__ and the lazy exports of the Python API (layer 5)
    "fedsafe.core": 0,
    "fedsafe.data": 1,
    "fedsafe.models": 1,
    "fedsafe.robust": 1,
    "fedsafe.privacy": 2,
    "fedsafe.protocols": 2,
    "fedsafe.audit": 2,
    "fedsafe.zo": 2,
    "fedsafe.config": 3,
    "fedsafe.catalog": 3,
    "fedsafe.engine": 4,
    "fedsafe.report": 5,
    "fedsafe.api": 5,
    "fedsafe.cli": 5,
    "fedsafe.__main__": 5,
    "fedsafe.flower": 5,
}

# Names of the top package's own __init__ that import nothing: taking them is not an import of
# the package's (layer-5) exports.
LIGHT_TOP_NAMES = frozenset({"__version__"})

# The one deliberate exception to the layer rule: a registry in layer 0 naming built-in entries
# implemented in higher layers, with register_lazy. ExperimentConfig (layer 3) validates
# `protocol` and `clients.algorithm` against PROTOCOLS and CLIENT_ALGORITHMS, and the engine
# (layer 4) runs the ROUND_PLUGINS, so each registry must sit at or below the layers that read it;
# the built-ins must still be known (listed, validated) without importing them. The module of a
# lazy entry is imported only when Registry.entry(name) is called, and by then the layers that
# call it (engine, layer 4) are loaded anyway. Each pair is listed; any other upward string is
# caught. These edges are left out of the package-cycle check (they point the other way by
# design).
ALLOWED_LAZY_REGISTRATIONS: dict[tuple[str, str], str] = {
    ("fedsafe.core.protocol", "fedsafe.protocols.secagg.protocol"): "PROTOCOLS' built-in secagg",
    ("fedsafe.core.protocol", "fedsafe.protocols.he.protocol"): "PROTOCOLS' built-in he",
    ("fedsafe.core.protocol", "fedsafe.protocols.tee.protocol"): "PROTOCOLS' built-in tee",
    ("fedsafe.core.plugins", "fedsafe.privacy.dp.config"): "ROUND_PLUGINS' dp",
    ("fedsafe.core.plugins", "fedsafe.privacy.inherent.config"): "ROUND_PLUGINS' inherent",
    ("fedsafe.core.plugins", "fedsafe.audit.config"): "ROUND_PLUGINS' audit",
    ("fedsafe.core.plugins", "fedsafe.robust.crfl_config"): "ROUND_PLUGINS' crfl",
    ("fedsafe.core.clients", "fedsafe.engine.algorithms"): "CLIENT_ALGORITHMS' dsgd and fedavg",
    ("fedsafe.core.clients", "fedsafe.privacy.inherent.clients"): "CLIENT_ALGORITHMS' inherent",
    ("fedsafe.core.clients", "fedsafe.zo.algorithms"): "CLIENT_ALGORITHMS' zeroth-order dsgd and fedavg",
}

# Modules that import a module whose name is computed at run time (not a string in the source).
# Each is the machinery itself or imports a user's module, never a fedsafe module of a higher
# layer; any other computed import is refused, since the check cannot see where it goes.
ALLOWED_COMPUTED_IMPORTS: dict[str, str] = {
    "fedsafe.core.lazy": "lazy_exports: each package's targets are checked where lazy_exports is called",
    "fedsafe.core.registry": "Registry.entry imports a register_lazy target: checked where register_lazy is called",
    "fedsafe.models.build": "model.name = 'package.module:Factory', the user's own factory",
    "fedsafe.engine.sweep": "fedsafe --import: the user's module registering rules, attacks, datasets",
    "fedsafe.catalog": "the registries of catalog.SOURCES (layers 0 and 1), see test_catalog_sources_are_lower",
}

COMPUTED = "<computed>"  # an import whose target is not a string in the source


@dataclass(frozen=True)
class Import:
    target: str  # a module name (may name an attribute too: callers keep the known modules)
    how: str  # "statement", "string", "register_lazy", "lazy_exports", "package attribute"
    line: int


def layer(module: str) -> int:
    if module == "fedsafe":
        return LAYERS["fedsafe"]
    parts = module.split(".")
    for k in range(len(parts), 1, -1):
        prefix = ".".join(parts[:k])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise KeyError(module)


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "fedsafe").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _string(node: ast.AST | None, names: dict[str, ast.AST]) -> str | None:
    """The constant text of ``node``: a string, a name bound to one, or the constant start of an
    f-string up to its first ``:`` (enough for a ``"module:attr"`` target)."""
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        head = ""
        for part in node.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            head += part.value
        if ":" in head:
            return head
    return None


def _exports_of(call: ast.Call, names: dict[str, ast.AST]) -> dict[str, str] | None:
    """The ``{name: submodule}`` table of a ``lazy_exports(__name__, table)`` call."""
    table = call.args[1] if len(call.args) > 1 else None
    if isinstance(table, ast.Name):
        table = names.get(table.id)
    if not isinstance(table, ast.Dict):
        return None
    out = {}
    for k, v in zip(table.keys, table.values):
        key, value = _string(k, {}), _string(v, {})
        if key is None or value is None:
            return None
        out[key] = value
    return out


def _called(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def find_imports(module: str, source: str, *, is_package: bool = False) -> list[Import]:
    """Every import ``module`` makes (see the module docstring), read off ``source``."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    # module-level constants (strings, dicts) a call may name instead of writing them inline
    names: dict[str, ast.AST] = {}
    for st in tree.body:
        targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and st.value is not None:
                names[t.id] = st.value
    found: list[Import] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [Import(a.name, "statement", line) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            exported = LAZY_EXPORTS.get(base, {})
            for a in node.names:
                if base == "fedsafe" and a.name in LIGHT_TOP_NAMES:
                    continue
                found.append(Import(f"{base}.{a.name}", "statement", line))
                if a.name in exported:
                    found.append(Import(exported[a.name], "lazy_exports", line))
            if base != "fedsafe" or any(a.name not in LIGHT_TOP_NAMES for a in node.names):
                found.append(Import(base, "statement", line))
        elif isinstance(node, ast.Call):
            what = _called(node)
            if what in ("import_module", "__import__"):
                text = _string(node.args[0], names) if node.args else None
                if text is not None and text.startswith("."):
                    text = None  # relative to a computed package
                found.append(Import(text if text is not None else COMPUTED, "string", line))
            elif what == "register_lazy":
                target = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "target"), None
                )
                text = _string(target, names)
                found.append(Import(text.partition(":")[0] if text else COMPUTED, "register_lazy", line))
            elif what == "lazy_exports":
                first = node.args[0] if node.args else None
                owner = module if isinstance(first, ast.Name) and first.id == "__name__" else _string(first, names)
                table = _exports_of(node, names)
                if owner is None or table is None:
                    found.append(Import(COMPUTED, "lazy_exports", line))
                else:
                    found += [Import(f"{owner}.{sub}", "lazy_exports", line) for sub in table.values()]
            elif what == "moved_modules":
                table = _exports_of(node, names)
                if table is None:
                    found.append(Import(COMPUTED, "moved_modules", line))
                else:
                    found += [Import(new, "moved_modules", line) for new in table.values()]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fedsafe":
            target = LAZY_EXPORTS.get("fedsafe", {}).get(node.attr)
            if target is not None:
                found.append(Import(target, "package attribute", line))
    return [i for i in found if i.target == COMPUTED or i.target == "fedsafe" or i.target.startswith("fedsafe.")]


def _lazy_exports() -> dict[str, dict[str, str]]:
    """package -> {exported name: the module defining it}, for every package using lazy_exports."""
    out = {}
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        consts = {t.id: st.value for st in tree.body if isinstance(st, ast.Assign) for t in st.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) == "lazy_exports":
                table = _exports_of(node, consts)
                if table:
                    out[name] = {k: f"{name}.{v}" for k, v in table.items()}
    return out


LAZY_EXPORTS = _lazy_exports()
MODULES = modules()


def imports(module: str, path: Path) -> set[str]:
    """Every fedsafe module ``module`` imports, anywhere in its source."""
    return {i.target for i in find_imports(module, path.read_text(), is_package=path.name == "__init__.py")}


IMPORTS: dict[str, list[Import]] = {
    m: find_imports(m, p.read_text(), is_package=p.name == "__init__.py") for m, p in MODULES.items()
}


def upward(module: str, found: list[Import], known: dict[str, object] = MODULES) -> list[str]:
    """The imports of ``found`` that break the layer rule, as readable lines."""
    mine = layer(module)
    bad = []
    for i in found:
        if i.target == COMPUTED:
            if module not in ALLOWED_COMPUTED_IMPORTS:
                bad.append(f"line {i.line}: {i.how} import of a computed name (the check cannot see where it goes)")
        elif i.target in known and layer(i.target) > mine:
            if i.how == "register_lazy" and (module, i.target) in ALLOWED_LAZY_REGISTRATIONS:
                continue
            bad.append(f"line {i.line}: {i.how} import of {i.target} (layer {layer(i.target)})")
    return sorted(set(bad))


def node_of(module: str) -> str:
    """The package a module belongs to, for the cycle check: its own package (a top-level module
    such as fedsafe.config is a node of its own)."""
    path_is_package = module in LAZY_EXPORTS or (module in MODULES and MODULES[module].name == "__init__.py")
    if path_is_package or module.count(".") == 1:
        return module
    return module.rpartition(".")[0]


def package_edges(found: dict[str, list[Import]], known: dict[str, object] = MODULES) -> dict[tuple[str, str], str]:
    """(importing package, imported package) -> one module-level example, allowed lazy
    registrations left out."""
    edges: dict[tuple[str, str], str] = {}
    for module, imps in found.items():
        for i in imps:
            if i.target not in known or (module, i.target) in ALLOWED_LAZY_REGISTRATIONS:
                continue
            a, b = node_of(module), node_of(i.target)
            if a != b:
                edges.setdefault((a, b), f"{module} -> {i.target} (line {i.line})")
    return edges


def cycles(edges: dict[tuple[str, str], str]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# --- the rules, over src/fedsafe ------------------------------------------------------------


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _safe_layer(m) is None] == []


def _safe_layer(m: str) -> int | None:
    try:
        return layer(m)
    except KeyError:
        return None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    bad = upward(module, IMPORTS[module])
    assert bad == [], f"{module} (layer {layer(module)}) imports higher layers: {bad}"


def test_no_package_cycle():
    edges = package_edges(IMPORTS)
    found = cycles(edges)
    detail = [
        [edges[(a, b)] for a in comp for b in comp if (a, b) in edges] for comp in found
    ]
    assert found == [], f"package cycles: {detail}"


def test_allowed_exceptions_are_still_needed():
    # an allowance nobody uses any more is removed, so it cannot silently cover a new import
    lazy = {(m, i.target) for m, imps in IMPORTS.items() for i in imps if i.how == "register_lazy"}
    assert sorted(set(ALLOWED_LAZY_REGISTRATIONS) - lazy) == []
    for pair in ALLOWED_LAZY_REGISTRATIONS:
        assert pair[0].startswith("fedsafe.core."), pair  # only the layer-0 registries
    computed = {m for m, imps in IMPORTS.items() for i in imps if i.target == COMPUTED}
    assert sorted(set(ALLOWED_COMPUTED_IMPORTS) - computed) == []


def test_catalog_sources_are_lower():
    from fedsafe.catalog import SOURCES

    for entries in SOURCES.values():
        for module, *_ in entries:
            assert module in MODULES and layer(module) <= layer("fedsafe.catalog"), module


def test_the_foundation_imports_no_subsystem_at_run_time():
    import subprocess
    import sys

    code = (
        "import sys, fedsafe.core.plugins, fedsafe.core.protocol, fedsafe.core.clients, fedsafe.core.registry; "
        "print(sorted(m for m in sys.modules if m.startswith('fedsafe') and not m.startswith('fedsafe.core') "
        "and m != 'fedsafe'))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]", res.stdout


# --- the checker can fail: synthetic sources showing each case is caught ----------------------


def _bad(module: str, source: str, *, is_package: bool = False) -> list[str]:
    return upward(module, find_imports(module, source, is_package=is_package))


def test_the_check_sees_an_upward_import(tmp_path):
    # the test itself must be able to fail: a core module importing the engine is caught
    fake = tmp_path / "bad.py"
    fake.write_text("def f():\n    from fedsafe.engine.federation import Federation\n")
    assert "fedsafe.engine.federation" in imports("fedsafe.core.bad", fake)
    assert layer("fedsafe.engine.federation") > layer("fedsafe.core.bad")
    assert _bad("fedsafe.core.bad", fake.read_text()) != []


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\ndef f():\n    return importlib.import_module('fedsafe.engine.federation')\n",
        "from importlib import import_module\nM = 'fedsafe.engine.federation'\nimport_module(M)\n",
        "__import__('fedsafe.engine.federation')\n",
    ],
)
def test_the_check_sees_a_string_import(source):
    assert any("fedsafe.engine.federation" in b for b in _bad("fedsafe.core.bad", source))


def test_the_check_sees_a_computed_import():
    source = "import importlib\ndef f(name):\n    return importlib.import_module(name)\n"
    assert any("computed" in b for b in _bad("fedsafe.core.bad", source))
    assert _bad("fedsafe.engine.sweep", source) == []  # a listed user-module import


@pytest.mark.parametrize(
    "source",
    [
        "import fedsafe\n",
        "def f():\n    import fedsafe as fs\n",
        "from fedsafe import Experiment\n",
        "import fedsafe.core.errors\ndef f():\n    return fedsafe.Experiment\n",
    ],
)
def test_the_check_sees_the_top_package_from_a_lower_layer(source):
    assert _bad("fedsafe.core.bad", source) != []


def test_the_top_package_version_is_free():
    assert _bad("fedsafe.core.bad", "from fedsafe import __version__\n") == []


def test_the_check_sees_a_lazy_registration_into_a_higher_layer():
    source = (
        "from fedsafe.core.registry import Registry\nR = Registry('x')\n"
        "R.register_lazy('dsgd', 'fedsafe.engine.algorithms:DSGD', 'summary')\n"
        "for n in ('a',):\n    R.register_lazy(n, f'fedsafe.audit.plugin:_{n}')\n"
    )
    bad = _bad("fedsafe.core.bad", source)
    assert any("fedsafe.engine.algorithms" in b for b in bad), bad
    assert any("fedsafe.audit.plugin" in b for b in bad), bad
    # the allowance is per (module, target): the same line in an allowed module passes
    assert _bad("fedsafe.core.clients", source.replace("fedsafe.audit.plugin", "fedsafe.core.types")) == []


def test_the_check_sees_lazy_export_targets():
    # the top package's exports are layer 5: a package __init__ at layer 0 exporting them is caught
    source = "from fedsafe.core.lazy import lazy_exports\n_E = {'Experiment': 'api'}\n" \
             "__getattr__, __dir__ = lazy_exports('fedsafe', _E)\n"
    assert any("fedsafe.api" in b for b in _bad("fedsafe.core", source, is_package=True))
    # a name taken from a lazy package imports the module defining it
    found = {i.target for i in find_imports("fedsafe.core.bad", "from fedsafe.audit import CanaryAudit\n")}
    assert LAZY_EXPORTS["fedsafe.audit"]["CanaryAudit"] in found


def test_the_check_sees_a_package_cycle():
    fake = {
        "fedsafe.privacy.dp.plugin": find_imports("fedsafe.privacy.dp.plugin", "from fedsafe.audit.observer import CanaryAudit\n"),
        "fedsafe.audit.observer": find_imports(
            "fedsafe.audit.observer", "import importlib\nimportlib.import_module('fedsafe.privacy.dp.mechanisms')\n"
        ),
    }
    assert cycles(package_edges(fake)) == [["fedsafe.audit", "fedsafe.privacy.dp"]]
    # one direction alone is no cycle
    assert cycles(package_edges({"fedsafe.privacy.dp.plugin": fake["fedsafe.privacy.dp.plugin"]})) == []


def test_the_check_sees_moved_module_targets():
    # a package keeping old paths for modules that moved imports their new homes
    source = "from fedsafe.core.lazy import moved_modules\n_M = {'fed': 'fedsafe.engine.federation'}\n" \
             "__getattr__ = moved_modules(__name__, _M)\n"
    assert any("fedsafe.engine.federation" in b for b in _bad("fedsafe.core", source, is_package=True))
    found = {i.target for i in IMPORTS["fedsafe.privacy"]}
    assert {"fedsafe.protocols.secagg", "fedsafe.protocols.he", "fedsafe.protocols.tee",
            "fedsafe.protocols.crypto"} <= found
