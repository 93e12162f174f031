"""What fedsafe's ServerApp and ClientApp put in Flower messages, and how it is read back.

Every message carries records only: arrays (``ArrayRecord``, numpy), numbers and strings
(``ConfigRecord``, ``MetricRecord``), and the secure-aggregation parties' wire bytes. Nothing is
pickled: the experiment travels as its TOML text and is validated again on the node.

Importing this module imports no torch (torch is imported where a tensor is made): a deployed
SuperNode starts a fresh ClientApp process for every message, and the secure-aggregation
stages' processes need no torch at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedsafe.core.errors import FedsafeError

if TYPE_CHECKING:
    from torch import Tensor

# Message types (Flower routes "<category>.<action>" to the ClientApp function registered for it).
HELLO = "query.fedsafe_hello"  # which fedsafe client does this node hold?
TRAIN = "train.fedsafe"  # one round of local work
SECAGG = "query.fedsafe_secagg"  # one stage of secure aggregation

CONF = "fedsafe"  # the ConfigRecord of every fedsafe message
PARAMS = "params"  # the ArrayRecord of the global model (flat)
UPDATE = "update"  # the ArrayRecord of a client's message and its momentum
METRICS = "metrics"  # the MetricRecord of a reply

# Node config keys, as Flower's simulation sets them and ``flower-supernode --node-config`` takes them.
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"


class FlowerError(FedsafeError, RuntimeError):
    """A fedsafe run over Flower cannot go on (nodes missing, a malformed reply)."""


def to_array(x: Tensor | np.ndarray) -> Any:
    """A tensor as a Flower ``Array`` (numpy, row-major)."""
    from flwr.app import Array

    a = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)  # a tensor, or array-like
    return Array(np.ascontiguousarray(a))


def array_record(**arrays: Tensor | np.ndarray | None) -> Any:
    """An ``ArrayRecord`` of the given arrays (None values are left out)."""
    from flwr.app import ArrayRecord

    rec = ArrayRecord()
    for k, v in arrays.items():
        if v is not None:
            rec[k] = to_array(v)
    return rec


def read_tensor(record: Any, key: str, *, what: str, shape: tuple[int, ...] | None = None) -> Tensor:
    """Array ``key`` of an ``ArrayRecord`` as a float tensor, checked: a finite-or-not float array of
    ``shape`` (when given). A malformed array raises :class:`FlowerError` naming ``what``."""
    import torch

    if key not in record:
        raise FlowerError(f"{what}: no array {key!r}")
    a = record[key].numpy()
    if a.dtype.kind != "f":
        raise FlowerError(f"{what}: array {key!r} has dtype {a.dtype}, expected a float array")
    if shape is not None and tuple(a.shape) != shape:
        raise FlowerError(f"{what}: array {key!r} has shape {tuple(a.shape)}, expected {shape}")
    return torch.from_numpy(np.array(a, copy=True))


def config_value(record: Any, key: str, kind: type | tuple[type, ...], *, what: str) -> Any:
    """``record[key]``, which must be of ``kind``; else :class:`FlowerError` naming the field."""
    if key not in record:
        raise FlowerError(f"{what}: field {key!r} is missing")
    v = record[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))):
        raise FlowerError(f"{what}: field {key!r} has type {type(v).__name__}")
    return v


def flatten_arrays(record: Any) -> tuple[Tensor, list[tuple[str, tuple[int, ...], np.dtype]]]:
    """The floating-point arrays of an ``ArrayRecord`` (a model) as one flat float tensor, and
    the layout ``[(key, shape, dtype)]`` of every array (float or not) in record order. The flat
    dtype is float64 if any array is, else float32."""
    import torch

    layout, parts = [], []
    for key, arr in record.items():
        a = arr.numpy()
        layout.append((key, tuple(a.shape), a.dtype))
        if a.dtype.kind == "f":
            parts.append(np.asarray(a).reshape(-1))
    dtype = np.float64 if any(p.dtype == np.float64 for p in parts) else np.float32
    flat = np.concatenate([p.astype(dtype) for p in parts]) if parts else np.zeros(0, dtype)
    return torch.from_numpy(flat), layout


def unflatten_arrays(flat: Tensor, template: Any) -> Any:
    """An ``ArrayRecord`` like ``template`` whose float arrays are read, in order, from ``flat``;
    other arrays (integer counters such as BatchNorm's) are copied from ``template``."""
    from flwr.app import Array, ArrayRecord

    values = flat.detach().cpu().numpy()
    out, at = ArrayRecord(), 0
    for key, arr in template.items():
        a = arr.numpy()
        if a.dtype.kind == "f":
            out[key] = Array(values[at : at + a.size].reshape(a.shape).astype(a.dtype))
            at += a.size
        else:
            out[key] = Array(np.array(a, copy=True))
    if at != values.size:
        raise FlowerError(f"{values.size} values for {at} floating-point model coordinates")
    return out


def check_like(record: Any, layout: list[tuple[str, tuple[int, ...], np.dtype]], *, what: str) -> None:
    """``record`` must hold the same arrays as ``layout`` (keys, order, shapes, float or not)."""
    keys = list(record.keys())
    if keys != [k for k, _, _ in layout]:
        raise FlowerError(f"{what}: arrays {keys[:5]} do not match the global model's {[k for k, _, _ in layout][:5]}")
    for key, shape, dtype in layout:
        a = record[key].numpy()
        if tuple(a.shape) != shape or (a.dtype.kind == "f") != (np.dtype(dtype).kind == "f"):
            raise FlowerError(f"{what}: array {key!r} has shape {tuple(a.shape)} and dtype {a.dtype}, "
                              f"the global model's has {shape} and {np.dtype(dtype)}")
