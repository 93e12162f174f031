"""Lazy package exports (PEP 562): a package lists its public names and the submodule defining
each, and a name's submodule is imported on first use. Importing one light submodule (a config
section, say) then does not load the package's heavy machinery, and no import cycle can run
through a package's ``__init__``."""

from __future__ import annotations

import importlib
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
