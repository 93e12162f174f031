"""Name -> implementation registries used by the config.

A registry rejects unknown names and unknown or missing parameters with the list of valid
ones, so a typo in a config fails at load time instead of silently changing an experiment, and
any number in the parameters (nested lists and tables included) that is not finite.
Parameters are read off the implementation's signature: keyword-only parameters (after ``*``)
that are not listed in ``reserved`` are the user-settable ones.

An entry may be registered lazily, as ``"module:attribute"``: its name is known (and listed,
and validated) at once, and the module is imported the first time the entry is used. The
built-in protocols and round plugins are registered that way, so naming them costs nothing
and the foundation layer imports none of the subsystems it lists.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fedsafe.core.errors import FedsafeError

T = TypeVar("T", bound=Callable[..., Any])


class RegistryError(FedsafeError, ValueError):
    """An unknown name or parameter in a registry lookup."""


class ParamValueError(RegistryError):
    """A parameter value no implementation may receive: a non-finite number (``inf``, ``nan``)
    anywhere in ``params``, nested lists and tables included. The message starts with the
    parameter's full key (``attack.params.std: must be a finite number, got inf``)."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    impl: T
    params: dict[str, inspect.Parameter]  # user-settable keyword-only parameters
    doc: str
    tags: frozenset[str] = frozenset()  # capabilities other layers look up (Registry.tagged)
    meta: Mapping[str, Any] = field(default_factory=dict)  # what goes with a tag (e.g. a rule's split)


class Registry(Generic[T]):
    def __init__(self, kind: str, reserved: Iterable[str] = ()) -> None:
        self.kind = kind
        self.reserved = frozenset(reserved)
        self._entries: dict[str, Entry[T]] = {}
        self._lazy: dict[str, tuple[str, str]] = {}  # name -> ("module:attribute", summary)
        self._order: list[str] = []  # registration order (names() is sorted)

    def _claim(self, key: str) -> None:
        if key in self._entries or key in self._lazy:
            raise RegistryError(f"{self.kind} {key!r} registered twice")
        self._order.append(key)

    def _entry_of(self, key: str, impl: T) -> Entry[T]:
        sig = inspect.signature(impl)
        params = {
            p.name: p
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in self.reserved
        }
        doc = inspect.getdoc(impl) or ""
        return Entry(key, impl, params, doc.split("\n\n")[0])

    def register(self, name: str | None = None, *, tags: Iterable[str] = (), **meta: Any) -> Callable[[T], T]:
        """Decorator registering ``impl`` under ``name`` (default its ``__name__``), with
        ``tags`` and ``meta`` that other layers read without knowing the implementation (the
        TEE looks up the rules tagged ``"distance_split"`` and their ``split``)."""

        def deco(impl: T) -> T:
            key = name or impl.__name__
            self._claim(key)
            entry = self._entry_of(key, impl)
            self._entries[key] = Entry(key, impl, entry.params, entry.doc, frozenset(tags), dict(meta))
            return impl

        return deco

    def tagged(self, tag: str) -> list[str]:
        """Names of the (eagerly registered) entries carrying ``tag``, sorted."""
        return sorted(k for k, e in self._entries.items() if tag in e.tags)

    def register_lazy(self, name: str, target: str, summary: str = "") -> None:
        """Register ``name`` as ``target`` = ``"package.module:attribute"``, imported on first use.
        ``summary`` is the one-line description listed before the module is loaded."""
        if target.count(":") != 1:
            raise RegistryError(f"{self.kind} {name!r}: target must be 'module:attribute', got {target!r}")
        self._claim(name)
        self._lazy[name] = (target, summary)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (e.g. a plugin registered for one experiment or test)."""
        if name not in self:
            raise RegistryError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}")
        self._entries.pop(name, None)
        self._lazy.pop(name, None)
        self._order.remove(name)

    def summary(self, name: str) -> str:
        """The entry's one-line description, without importing a lazy entry."""
        if name in self._lazy:
            return self._lazy[name][1]
        return self.entry(name).doc

    def names(self) -> list[str]:
        return sorted(self._order)

    def ordered(self) -> list[str]:
        """Names in registration order."""
        return list(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def entry(self, name: str) -> Entry[T]:
        if name in self._lazy:
            target, summary = self._lazy.pop(name)
            module, attr = target.split(":")
            impl = getattr(importlib.import_module(module), attr)
            entry = self._entry_of(name, impl)
            self._entries[name] = Entry(name, impl, entry.params, entry.doc or summary)
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}"
            ) from None

    def check_params(self, name: str, params: Mapping[str, Any], *, where: str | None = None) -> None:
        """Raise RegistryError if ``params`` has unknown keys or lacks required ones, and
        :class:`ParamValueError` if any number in it, at any depth, is not finite.

        ``where`` is the config key of the table (``"attack.params"``), so the error names the
        full key of the bad value (``attack.params.std``); by default it names the entry.
        """
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
        for key, value in params.items():
            check_finite(value, f"{where}.{key}" if where else f"{self.kind} {name!r} parameter {key}")

    def get(self, name: str, params: Mapping[str, Any] | None = None) -> T:
        """The implementation with ``params`` bound (checked first)."""
        params = dict(params or {})
        self.check_params(name, params)
        impl = self.entry(name).impl
        if not params:
            return impl
        bound = _partial(impl, params)
        return bound  # type: ignore[return-value]


def check_finite(value: Any, key: str) -> None:
    """Raise :class:`ParamValueError` naming the full key (``key.a[2].b``) of the first number
    in ``value`` (a table, list or tuple, walked recursively, or a number) that is not finite.
    Booleans, strings and other values pass: their own parameter checks them."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_finite(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{key}[{i}]")
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, int)):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):  # an exotic Real that float() refuses
            raise ParamValueError(f"{key}: must be a finite number, got {value!r}") from None
        if not math.isfinite(number):
            raise ParamValueError(f"{key}: must be a finite number, got {number!r}")


def _partial(impl: Callable[..., Any], params: dict[str, Any]) -> Callable[..., Any]:
    import functools

    p = functools.partial(impl, **params)
    functools.update_wrapper(p, impl)
    return p
