"""What fedsafe offers, for ``fedsafe list``: every registered rule, pre-aggregator, attack,
protocol, model, dataset and partition with its parameters and description, and every config key with
its type, default and description. All of it is read off the registries and the config
models, so the listing cannot drift from what a config accepts.

The registries' modules import torch (seconds), so while a registry's module is not imported
yet, its listing is read off the source instead (:func:`static_items`): the module-level
registrations in the registry's module and the fedsafe modules it imports, with each entry's
keyword-only parameters, defaults and docstring — exactly what importing would give (a test
compares the two), in milliseconds. Anything the source reader does not recognise makes it
import the registry after all. Once a registry's module is imported (a user's ``--import``
module registered something into it), the live registry is listed.
"""

from __future__ import annotations

import ast
import inspect
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("rules", "attacks", "protocols", "models", "datasets", "partitions", "keys")

#: Each kind's registries: (defining module, registry variable, group, load). ``load=False``
#: lists lazy entries by their registered summary, unimported (protocols: their settings are
#: config sections, listed by ``fedsafe list keys``).
SOURCES: dict[str, tuple[tuple[str, str, str, bool], ...]] = {
    "rules": (("fedsafe.robust.aggregators", "AGGREGATORS", "rule", True),
              ("fedsafe.robust.preaggregators", "PREAGGREGATORS", "pre-aggregator", True)),
    "attacks": (("fedsafe.robust.attacks", "ATTACKS", "attack", True),),
    "protocols": (("fedsafe.core.protocol", "PROTOCOLS", "protocol", False),),
    "models": (("fedsafe.models.build", "MODELS", "model", True),),
    "datasets": (("fedsafe.data.config", "DATASETS", "dataset", True),),
    "partitions": (("fedsafe.data.partition", "PARTITIONERS", "partition", True),),
}


@dataclass(frozen=True)
class Item:
    group: str  # e.g. "rule" / "pre-aggregator", or a config section
    name: str
    params: str  # parameters with defaults, or a config key's type and default
    description: str


def _registry_items(registry: Any, group: str, *, load: bool = True) -> list[Item]:
    """One item per entry; ``load=False`` lists lazy entries by their summary, unimported."""
    items = []
    for name in registry.names():
        if not load:
            items.append(Item(group, name, "", " ".join(registry.summary(name).split())))
            continue
        entry = registry.entry(name)
        params = ", ".join(
            p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            for p in entry.params.values()
        )
        items.append(Item(group, name, params, " ".join(entry.doc.split())))
    return items


def items(kind: str) -> list[Item]:
    """The catalogue of one kind (see :data:`KINDS`): read off the source while the kind's
    registries are not imported (see the module docstring), else off the live registries."""
    if kind in SOURCES and not any(module in sys.modules for module, *_ in SOURCES[kind]):
        try:
            return static_items(kind)
        except _Unreadable:
            pass  # something the source reader does not know: import the registries
    return live_items(kind)


def live_items(kind: str) -> list[Item]:
    """The catalogue of one kind from the imported registries (and config models)."""
    if kind == "keys":
        from fedsafe.config import ExperimentConfig

        return list(_config_keys(ExperimentConfig, ""))
    if kind not in SOURCES:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")
    import importlib

    out: list[Item] = []
    for module, var, group, load in SOURCES[kind]:
        out += _registry_items(getattr(importlib.import_module(module), var), group, load=load)
    return out


# --- the registries read off the source ---------------------------------------------------


class _Unreadable(Exception):
    """The source holds a registration the static reader does not recognise."""


def static_items(kind: str) -> list[Item]:
    """The catalogue of a registry kind read off fedsafe's source files, importing nothing:
    :class:`_Unreadable` where that cannot be done exactly (then :func:`live_items`)."""
    if kind not in SOURCES:
        raise ValueError(f"no source listing for {kind!r}; valid: {', '.join(SOURCES)}")
    out: list[Item] = []
    for module, var, group, load in SOURCES[kind]:
        reg = _StaticRegistry(module, var)
        for name in sorted(reg.entries):
            target, summary = reg.entries[name]
            if not load and summary is not None:
                out.append(Item(group, name, "", " ".join(summary.split())))
                continue
            params, doc = reg.describe(target)
            doc = doc or (summary or "")
            out.append(Item(group, name, "" if not load else params, " ".join(doc.split())))
    return out


_ROOT = Path(__file__).resolve().parent  # the fedsafe package


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "fedsafe":
        return None
    base = _ROOT.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


_PARSED: dict[str, ast.Module] = {}


def _parse(module: str) -> ast.Module:
    if module not in _PARSED:
        path = _module_file(module)
        if path is None:
            raise _Unreadable(module)
        _PARSED[module] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return _PARSED[module]


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements run on import: the module body, and the bodies of top-level if/try/with."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        st = todo.pop(0)
        out.append(st)
        if isinstance(st, (ast.If, ast.Try, ast.With)):
            todo[:0] = [*st.body, *getattr(st, "orelse", []), *getattr(st, "finalbody", []),
                        *[s for h in getattr(st, "handlers", []) for s in h.body]]
    return out


def _imports(module: str, tree: ast.Module) -> list[str]:
    """The fedsafe modules ``module`` imports at import time (with their packages)."""
    package = module if _module_file(module) and _module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []
    for st in _top_level(tree):
        if isinstance(st, ast.Import):
            found += [a.name for a in st.names]
        elif isinstance(st, ast.ImportFrom):
            base = st.module or ""
            if st.level:
                pkg = package.split(".")[: len(package.split(".")) - st.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            found.append(base)
            found += [f"{base}.{a.name}" for a in st.names if _module_file(f"{base}.{a.name}")]
    out = []
    for m in found:
        if not m.startswith("fedsafe"):
            continue
        parts = m.split(".")
        out += [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return [m for m in dict.fromkeys(out) if _module_file(m)]


def _literal(node: ast.expr, env: dict[str, Any]) -> Any:
    """A constant expression's value: literals, names bound in ``env`` and f-strings of them."""
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and v.conversion == -1 and v.format_spec is None:
                parts.append(str(_literal(v.value, env)))
            else:
                raise _Unreadable(ast.unparse(node))
        return "".join(parts)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise _Unreadable(ast.unparse(node)) from None


class _StaticRegistry:
    """One registry as its source defines it: ``entries`` maps each name to (target, summary),
    a target being (module, attribute) of the implementation, or None for a lazy entry listed
    by its summary alone."""

    def __init__(self, module: str, var: str) -> None:
        self.module, self.var = module, var
        self.reserved: frozenset[str] = frozenset()
        self.entries: dict[str, tuple[tuple[str, str], str | None]] = {}
        self._read_definition()
        seen: set[str] = set()
        todo = [module]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            tree = _parse(m)
            self._read_registrations(m, tree)
            todo += _imports(m, tree)

    def _read_definition(self) -> None:
        for st in _top_level(_parse(self.module)):
            target = st.target if isinstance(st, ast.AnnAssign) else (st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id == self.var and isinstance(st.value, ast.Call):
                for kw in st.value.keywords:
                    if kw.arg == "reserved":
                        self.reserved = frozenset(_literal(kw.value, {}))
                return
        raise _Unreadable(f"{self.module}.{self.var}: no definition")

    def _aliases(self, module: str, tree: ast.Module) -> set[str]:
        names = {self.var} if module == self.module else set()
        for st in _top_level(tree):
            if isinstance(st, ast.ImportFrom) and st.module == self.module:
                names |= {a.asname or a.name for a in st.names if a.name == self.var}
        return names

    def _is_call_on(self, node: ast.AST, names: set[str], attr: str) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
                and isinstance(node.func.value, ast.Name) and node.func.value.id in names)

    def _add(self, name: Any, target: tuple[str, str] | None, summary: str | None) -> None:
        if not isinstance(name, str) or name in self.entries:
            raise _Unreadable(f"{self.var}: entry {name!r}")
        self.entries[name] = (target, summary)  # type: ignore[assignment]

    def _register_name(self, call: ast.Call, default: str | None, env: dict[str, Any]) -> str:
        if call.args:
            return _literal(call.args[0], env)
        for kw in call.keywords:
            if kw.arg == "name":
                return _literal(kw.value, env)
        if default is None:
            raise _Unreadable(ast.unparse(call))
        return default

    def _read_registrations(self, module: str, tree: ast.Module) -> None:
        names = self._aliases(module, tree)
        if not names:
            return
        handled: set[int] = set()

        def lazy(call: ast.Call, env: dict[str, Any]) -> None:
            args = [_literal(a, env) for a in call.args] + [_literal(k.value, env) for k in call.keywords]
            if len(args) not in (2, 3) or not isinstance(args[1], str) or args[1].count(":") != 1:
                raise _Unreadable(ast.unparse(call))
            mod, attr = args[1].split(":")
            self._add(args[0], (mod, attr), args[2] if len(args) == 3 else "")
            handled.add(id(call.func))

        for st in _top_level(tree):
            if isinstance(st, (ast.FunctionDef, ast.ClassDef)):
                for i, dec in enumerate(st.decorator_list):
                    call = dec if isinstance(dec, ast.Call) else None
                    if call is not None and self._is_call_on(call, names, "register"):
                        if i != len(st.decorator_list) - 1:
                            raise _Unreadable(f"{module}.{st.name}: decorated below its registration")
                        self._add(self._register_name(call, st.name, {}), (module, st.name), None)
                        handled.add(id(call.func))
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                outer = st.value
                if self._is_call_on(outer.func, names, "register") and len(outer.args) == 1 and isinstance(outer.args[0], ast.Name):
                    fn = outer.args[0].id
                    self._add(self._register_name(outer.func, fn, {}), self._resolve(module, tree, fn), None)
                    handled.add(id(outer.func.func))
                elif self._is_call_on(outer, names, "register_lazy"):
                    lazy(outer, {})
            elif isinstance(st, ast.For) and isinstance(st.target, (ast.Tuple, ast.Name)):
                calls = [s.value for s in st.body if isinstance(s, ast.Expr) and self._is_call_on(s.value, names, "register_lazy")]
                if not calls:
                    continue
                if len(calls) != len(st.body) or st.orelse:
                    raise _Unreadable(f"{module}: a loop registering into {self.var}")
                targets = [t.id for t in (st.target.elts if isinstance(st.target, ast.Tuple) else [st.target])
                           if isinstance(t, ast.Name)]
                for values in _literal(st.iter, {}):
                    env = dict(zip(targets, values if isinstance(st.target, ast.Tuple) else [values]))
                    for call in calls:
                        lazy(call, env)
        # Any other use of the registry's registration methods at import time is unknown here.
        for st in _top_level(tree):
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nodes = list(st.decorator_list)
            elif isinstance(st, ast.ClassDef):
                nodes = list(st.decorator_list)
            else:
                nodes = [st]
            for top in nodes:
                for node in ast.walk(top):
                    if (isinstance(node, ast.Attribute) and node.attr in ("register", "register_lazy", "unregister")
                            and isinstance(node.value, ast.Name) and node.value.id in names and id(node) not in handled):
                        raise _Unreadable(f"{module}: {ast.unparse(node)}")

    def _resolve(self, module: str, tree: ast.Module, name: str) -> tuple[str, str]:
        """Where ``name`` (used in ``module``) is defined: (module, attribute)."""
        for st in _top_level(tree):
            if isinstance(st, (ast.FunctionDef, ast.ClassDef)) and st.name == name:
                return module, name
            if isinstance(st, ast.ImportFrom) and st.module and not st.level:
                for a in st.names:
                    if (a.asname or a.name) == name:
                        return self._resolve(st.module, _parse(st.module), a.name)
        raise _Unreadable(f"{module}.{name}: not found")

    def describe(self, target: tuple[str, str]) -> tuple[str, str]:
        """(parameters as ``fedsafe list`` shows them, first paragraph of the docstring)."""
        module, attr = target
        tree = _parse(module)
        node = next((st for st in _top_level(tree) if isinstance(st, (ast.FunctionDef, ast.ClassDef)) and st.name == attr), None)
        if node is None:
            raise _Unreadable(f"{module}.{attr}: not found")
        doc = inspect.cleandoc(ast.get_docstring(node, clean=False) or "").split("\n\n")[0] if ast.get_docstring(node) else ""
        if isinstance(node, ast.ClassDef):
            if node.bases or node.keywords:
                raise _Unreadable(f"{module}.{attr}: a class with bases")  # inherited __init__ / __doc__
            init = next((st for st in node.body if isinstance(st, ast.FunctionDef) and st.name == "__init__"), None)
            if init is None:
                return "", doc
            fn = init
        else:
            fn = node
        consts = self._constants(tree)
        params = []
        for arg, default in zip(fn.args.kwonlyargs, fn.args.kw_defaults):
            if arg.arg in self.reserved:
                continue
            if default is None:
                params.append(arg.arg)
            else:
                params.append(f"{arg.arg}={_literal(default, consts)!r}")
        return ", ".join(params), doc

    @staticmethod
    def _constants(tree: ast.Module) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for st in _top_level(tree):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                try:
                    out[st.targets[0].id] = ast.literal_eval(st.value)
                except (ValueError, TypeError, SyntaxError):
                    pass
        return out


def _model_of(annotation: Any) -> Any:
    from pydantic import BaseModel

    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))


def _config_keys(model: Any, prefix: str):
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _model_of(field.annotation)
        if sub is not None and typing.get_origin(field.annotation) not in (list, dict):
            yield Item(prefix.rstrip(".") or "(top level)", key, "section", " ".join((sub.__doc__ or "").split()))
            yield from _config_keys(sub, key + ".")
            continue
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None else f" = {default!r}"
        yield Item(prefix.rstrip(".") or "(top level)", key, f"{_type_name(field.annotation)}{shown}",
                   " ".join((field.description or "").split()))
