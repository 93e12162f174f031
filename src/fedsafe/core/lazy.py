"""Lazy package exports (PEP 562): a package lists its public names and the submodule defining
each, and a name's submodule is imported on first use. Importing one light submodule (a config
section, say) then does not load the package's heavy machinery, and no import cycle can run
through a package's ``__init__``.

:func:`moved_modules` keeps the old import paths of modules that moved to another package for
one release: the old name gives the module imported under the new one, with a
``DeprecationWarning``."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose public name ``n`` is defined in the
    submodule ``exports[n]`` (relative to the package)."""
    names = sorted(exports)

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__


# --- modules that moved: the old import paths, kept for one release --------------------------

# old module name -> new module name, for every moved module or package (its submodules follow)
_MOVED: dict[str, str] = {}


def _moved_target(fullname: str) -> str | None:
    """The new name of ``fullname`` if it is, or lies under, a moved module; else None."""
    head, tail = fullname, ""
    while head:
        if head in _MOVED:
            return _MOVED[head] + tail
        head, _, last = head.rpartition(".")
        tail = f".{last}{tail}"
    return None


# frames skipped when a warning names the importer: importlib (frozen and its package) and this file
_IMPORT_MACHINERY = ("<frozen importlib", os.path.join(os.path.dirname(importlib.__file__), ""), __file__)


def _warn_from_importer(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the code that imported the old name (the first
    frame outside importlib and this module), as ``warnings.warn(stacklevel=...)`` would, so
    the usual filters (shown in ``__main__`` and under pytest) apply to it."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_IMPORT_MACHINERY):
        frame = frame.f_back
    g = frame.f_globals
    warnings.warn_explicit(
        message, DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
        module=g.get("__name__", "<unknown>"), registry=g.setdefault("__warningregistry__", {}),
    )


class _MovedLoader:
    """Loads an old name as the module imported under its new name: ``sys.modules`` then holds
    the very same object under both names, never a second copy of the module."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: Any) -> Any:
        _warn_from_importer(
            f"{self.old} has moved to {self.new}; import {self.new} instead "
            f"(the old path is kept for one release)"
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # the import system set the alias spec on the module: give it back its own
        module.__spec__ = self._spec


class _MovedFinder:
    """A meta-path finder for the old names of moved modules; first on ``sys.meta_path``, so an
    old name never reaches the path finder (which would load the file a second time)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = _moved_target(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None  # not moved, or no such module: the usual ModuleNotFoundError
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(fullname, new))


_FINDER = _MovedFinder()


def moved_modules(package: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """Keep the old import paths of modules that left ``package`` working for one release.

    ``moved`` maps a submodule's old name (relative to ``package``) to its new absolute name;
    the submodules of a moved package follow it. Importing an old name (``import
    package.old.x``, ``from package.old import x``, a pickle naming it) gives the very module
    object imported under the new name and warns once, with a ``DeprecationWarning`` naming the
    new path. Returns the package's ``__getattr__``, so ``package.old`` also works as an
    attribute. Nothing is imported until an old name is used."""
    _MOVED.update({f"{package}.{old}": new for old, new in moved.items()})
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)

    def __getattr__(name: str) -> Any:
        if name in moved:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
