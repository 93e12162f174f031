"""Renamed config keys: the old name stays accepted for one release as a deprecated alias.

A config section that renamed a key subclasses :class:`RenamingSection` and lists its
:class:`Rename` entries in ``renames``. Then, for one release:

- the old key is accepted and mapped to the new one (an old *value* too, where the vocabulary
  of values changed: ``secagg.placement = "local"`` is ``secagg.execution = "serial"``), with a
  :class:`ConfigDeprecationWarning` (a ``FutureWarning``) that names both
  (``"he.delta is deprecated: use he.bits"``), given where the key enters: a TOML file (an
  experiment, a saved run's ``config.toml``), ``--set``, the Python API (``fedsafe.Experiment``)
  or a section built directly (``HEConfig(delta=3)``). ``fedsafe.config.validate`` itself maps
  quietly (it re-validates what fedsafe already read). ``fedsafe check`` and ``fedsafe run``
  print each as one ``warning: ...`` line;
- setting the old and the new key together is an error naming both;
- the model holds, dumps and writes (``ExperimentConfig.to_toml``) only the new key;
- reading the old name as an attribute (``cfg.he.delta``) warns and returns the value
  (:func:`deprecated_alias`, a read-only property), in the old vocabulary of values;
- messages about a key name it as the user wrote it (:meth:`RenamingSection.key_name`), so a
  config written with the old key reads its own key back in its errors and warnings.

This module is layer 0: it knows nothing of the sections; each section declares its renames.
"""

from __future__ import annotations

import contextvars
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, PrivateAttr, ValidationInfo, model_validator


#: Validation context key: rename old keys without warning (``fedsafe.config.validate``: the
#: warning was given where the key entered, a file, ``--set`` or the Python API).
QUIET = "quiet_renames"


class ConfigDeprecationWarning(FutureWarning):
    """A config key (or value, or command-line value) that was renamed and is still accepted."""


@dataclass(frozen=True)
class Rename:
    """``old`` is now ``new``; ``values`` maps old values to new ones (applies to the old key)."""

    old: str
    new: str
    values: Mapping[Any, Any] = field(default_factory=dict)

    def new_value(self, value: Any) -> Any:
        try:
            return self.values.get(value, value)
        except TypeError:  # an unhashable value (a list): not one of the old values
            return value

    def old_value(self, value: Any) -> Any:
        for old, new in self.values.items():
            if new == value:
                return old
        return value


def deprecation_message(section: str, rename: Rename, value: Any = None) -> str:
    """``"he.delta is deprecated: use he.bits"`` (with the values where they were renamed)."""
    old, new = f"{section}.{rename.old}", f"{section}.{rename.new}"
    mapped = rename.new_value(value)
    if value is not None and mapped != value:
        return f"{old} = {value!r} is deprecated: use {new} = {mapped!r}"
    return f"{old} is deprecated: use {new}"


def warn_renamed(message: str) -> None:
    # one place: the same key met twice on one path (a file, then the API over it) shows once
    warnings.warn(message, ConfigDeprecationWarning, stacklevel=1)


def rename_keys(section: str, renames: tuple[Rename, ...], data: dict[str, Any], *, warn: bool = True) -> dict[str, Any]:
    """``data`` (one section's raw table) with its old keys renamed: a copy, warned about
    (``warn``). Both spellings of one key: ``ValueError`` naming both."""
    if not any(r.old in data for r in renames):
        return data
    out = dict(data)
    for r in renames:
        if r.old not in out:
            continue
        if r.new in out:
            raise ValueError(
                f"{section}.{r.old} and {section}.{r.new} are the same setting ({section}.{r.old} is the "
                f"deprecated name): set only {section}.{r.new}"
            )
        value = out.pop(r.old)
        if warn:
            warn_renamed(deprecation_message(section, r, value))
        out[r.new] = r.new_value(value)
    return out


# The old names the section being validated was given (set by the before-validator, read by the
# validators and the after-validator of the same model, which run right after it).
_OLD_NAMES: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("fedsafe_old_names", default=frozenset())


class RenamingSection(BaseModel):
    """A config section with renamed keys (see the module docstring)."""

    section: ClassVar[str] = ""
    renames: ClassVar[tuple[Rename, ...]] = ()
    _written_old: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or not cls.renames:
            return data
        _OLD_NAMES.set(frozenset(r.old for r in cls.renames if r.old in data))
        quiet = bool((info.context or {}).get(QUIET))
        return _json_arrays_as_tuples(cls, rename_keys(cls.section, cls.renames, data, warn=not quiet))

    @model_validator(mode="after")
    def _remember_old_names(self) -> Any:
        if self.renames:
            self._written_old = _OLD_NAMES.get() & {r.old for r in self.renames}
        return self

    @classmethod
    def _key_being_validated(cls, new: str) -> str:
        """In a validator of the model (field or model): the dotted key of field ``new`` as the config being validated
        wrote it."""
        for r in cls.renames:
            if r.new == new and r.old in _OLD_NAMES.get():
                return f"{cls.section}.{r.old}"
        return f"{cls.section}.{new}"

    def key_name(self, new: str) -> str:
        """The dotted key of field ``new`` as this config was written (old or new name)."""
        for r in self.renames:
            if r.new == new and r.old in self._written_old:
                return f"{self.section}.{r.old}"
        return f"{self.section}.{new}"


def _is_tuple(annotation: Any) -> bool:
    return typing.get_origin(annotation) is tuple or any(_is_tuple(a) for a in typing.get_args(annotation))


def _json_arrays_as_tuples(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """A before-validator hands on Python values: under strict validation of JSON input (as
    ``fedsafe.config`` validates), an array then no longer fills a tuple field. Turn the lists
    of tuple fields into tuples, as JSON validation would have."""
    fix = [k for k, f in model.model_fields.items() if isinstance(data.get(k), list) and _is_tuple(f.annotation)]
    if not fix:
        return data
    return {**data, **{k: tuple(data[k]) for k in fix}}


def deprecated_alias(rename: Rename, section: str) -> property:
    """A read-only property ``rename.old`` that warns and returns ``rename.new``'s value (in the
    old vocabulary of values)."""

    def get(self: Any) -> Any:
        warn_renamed(f"{section}.{rename.old} is deprecated: use {section}.{rename.new}")
        return rename.old_value(getattr(self, rename.new))

    get.__name__ = rename.old
    get.__doc__ = f"Deprecated: ``{section}.{rename.new}`` (read-only)."
    return property(get)
