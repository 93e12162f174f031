"""The architecture's layering (docs/architecture.md): a module imports only modules of its own
layer or lower ones, at module level or inside functions alike. Read off the source with ast, so
a lazy import cannot hide an upward dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A module belongs to the longest prefix listed.
LAYERS: dict[str, int] = {
    "fedsafe": 0,  # the package itself holds only __version__
    "fedsafe.core": 0,
    "fedsafe.data": 1,
    "fedsafe.models": 1,
    "fedsafe.robust": 1,
    "fedsafe.privacy": 2,
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


def layer(module: str) -> int:
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
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


def imports(module: str, path: Path) -> set[str]:
    """Every fedsafe module ``module`` imports, anywhere in its source."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m == "fedsafe" or m.startswith("fedsafe.")}


MODULES = modules()


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _safe_layer(m) is None] == []


def _safe_layer(m: str) -> int | None:
    try:
        return layer(m)
    except KeyError:
        return None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    mine = layer(module)
    upward = sorted(m for m in imports(module, MODULES[module]) if m in MODULES and layer(m) > mine)
    assert upward == [], f"{module} (layer {mine}) imports higher layers: {upward}"


def test_the_check_sees_an_upward_import(tmp_path):
    # the test itself must be able to fail: a core module importing the engine is caught
    fake = tmp_path / "bad.py"
    fake.write_text("def f():\n    from fedsafe.engine.federation import Federation\n")
    assert "fedsafe.engine.federation" in imports("fedsafe.core.bad", fake)
    assert layer("fedsafe.engine.federation") > layer("fedsafe.core.bad")


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
