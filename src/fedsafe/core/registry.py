"""Name -> implementation registries used by the config.

A registry rejects unknown names and unknown or missing parameters with the list of valid
ones, so a typo in a config fails at load time instead of silently changing an experiment.
Parameters are read off the implementation's signature: keyword-only parameters (after ``*``)
that are not listed in ``reserved`` are the user-settable ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Callable[..., Any])


class RegistryError(ValueError):
    """An unknown name or parameter in a registry lookup."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    impl: T
    params: dict[str, inspect.Parameter]  # user-settable keyword-only parameters
    doc: str


class Registry(Generic[T]):
    def __init__(self, kind: str, reserved: Iterable[str] = ()) -> None:
        self.kind = kind
        self.reserved = frozenset(reserved)
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        def deco(impl: T) -> T:
            key = name or impl.__name__
            if key in self._entries:
                raise RegistryError(f"{self.kind} {key!r} registered twice")
            sig = inspect.signature(impl)
            params = {
                p.name: p
                for p in sig.parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in self.reserved
            }
            doc = inspect.getdoc(impl) or ""
            self._entries[key] = Entry(key, impl, params, doc.split("\n\n")[0])
            return impl

        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}"
            ) from None

    def check_params(self, name: str, params: Mapping[str, Any]) -> None:
        """Raise RegistryError if ``params`` has unknown keys or lacks required ones."""
        entry = self.entry(name)
        unknown = sorted(set(params) - set(entry.params))
        if unknown:
            valid = ", ".join(sorted(entry.params)) or "none"
            raise RegistryError(
                f"unknown parameter(s) {', '.join(unknown)} for {self.kind} {name!r}; valid: {valid}"
            )
        missing = sorted(
            p.name for p in entry.params.values()
            if p.default is inspect.Parameter.empty and p.name not in params
        )
        if missing:
            raise RegistryError(f"{self.kind} {name!r} needs parameter(s): {', '.join(missing)}")

    def get(self, name: str, params: Mapping[str, Any] | None = None) -> T:
        """The implementation with ``params`` bound (checked first)."""
        params = dict(params or {})
        self.check_params(name, params)
        impl = self.entry(name).impl
        if not params:
            return impl
        bound = _partial(impl, params)
        return bound  # type: ignore[return-value]


def _partial(impl: Callable[..., Any], params: dict[str, Any]) -> Callable[..., Any]:
    import functools

    p = functools.partial(impl, **params)
    functools.update_wrapper(p, impl)
    return p
