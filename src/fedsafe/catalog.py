"""What fedsafe offers, for ``fedsafe list``: every registered rule, pre-aggregator, attack,
protocol, model, dataset and partition with its parameters and description, and every config key with
its type, default and description. All of it is read off the registries and the config
models, so the listing cannot drift from what a config accepts.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

KINDS = ("rules", "attacks", "protocols", "models", "datasets", "partitions", "keys")


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
    """The catalogue of one kind (see :data:`KINDS`)."""
    if kind == "rules":
        from fedsafe.robust.aggregators import AGGREGATORS
        from fedsafe.robust.preaggregators import PREAGGREGATORS

        return _registry_items(AGGREGATORS, "rule") + _registry_items(PREAGGREGATORS, "pre-aggregator")
    if kind == "attacks":
        from fedsafe.robust.attacks import ATTACKS

        return _registry_items(ATTACKS, "attack")
    if kind == "protocols":  # settings are config sections ([secagg], [he], [tee]): `list keys`
        from fedsafe.core.protocol import PROTOCOLS

        return _registry_items(PROTOCOLS, "protocol", load=False)
    if kind == "models":
        from fedsafe.models import MODELS

        return _registry_items(MODELS, "model")
    if kind == "datasets":
        from fedsafe.data.config import DATASETS

        return _registry_items(DATASETS, "dataset")
    if kind == "partitions":
        from fedsafe.data.partition import PARTITIONERS

        return _registry_items(PARTITIONERS, "partition")
    if kind == "keys":
        from fedsafe.config import ExperimentConfig

        return list(_config_keys(ExperimentConfig, ""))
    raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")


def _model_of(annotation: Any) -> type[BaseModel] | None:
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


def _config_keys(model: type[BaseModel], prefix: str):
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
