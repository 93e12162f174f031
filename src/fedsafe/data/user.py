"""A user's own data as a :class:`FederatedDataset`, and user datasets named from TOML.

:func:`federated_data` takes what users hold — tensors or arrays ``(x, y)``, a
``torch.utils.data.Dataset`` of ``(x, y)`` samples, or a Hugging Face ``datasets.Dataset`` /
``DatasetDict`` (loaded from local files; the ``datasets`` package is the optional extra
``fedsafe[hf]``) — and splits it over clients with fedsafe's partitioners or the caller's own
per-client index lists.

:func:`register_dataset` names a function returning such data, so that ``data.name`` in a
TOML file (and ``fedsafe run --import your_module``) loads it through the same pipeline as the
built-in datasets: ``max_train``/``max_test`` subsets, the partition, ``test_fraction``.

Conventions (the same for both ways in):

* inputs become float32 tensors as given: fedsafe neither rescales nor standardises a user's
  data (the built-in image datasets are standardised per channel; do the equivalent yourself);
* labels must be integers in ``[0, C)`` (a classification task); ``C`` is ``num_classes`` when
  given, else the largest label seen plus one;
* without a test split, a stratified ``test_fraction`` of the training data is held out
  (stream ``"data.split"`` of the seed), as for scikit-learn's digits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fedsafe.core.streams import numpy_stream
from fedsafe.data.config import DATASETS
from fedsafe.data.dataset import FederatedDataset
from fedsafe.data.loader import _Raw
from fedsafe.data.partition import PARTITIONERS, partition
from fedsafe.data.split import stratified_split

__all__ = ["as_arrays", "federated_data", "register_dataset"]


def _to_numpy(value: Any, what: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as e:  # an object numpy cannot read: say which one
        raise TypeError(f"{what}: cannot read {type(value).__name__} as an array ({e})") from None


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets`` Dataset or DatasetDict."""
    return type(obj).__module__.split(".")[0] == "datasets" and hasattr(obj, "column_names")


def as_arrays(data: Any, *, features: str | None = None, label: str = "label", what: str = "data") -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` numpy arrays from a pair ``(x, y)`` of tensors/arrays, a
    ``torch.utils.data.Dataset`` whose items are ``(x, y)`` pairs, or a Hugging Face
    ``datasets.Dataset`` (columns ``features`` — default: the only column besides ``label`` —
    and ``label``)."""
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return _to_numpy(data[0], f"{what}[0] (inputs)"), _to_numpy(data[1], f"{what}[1] (labels)")
    if is_hf_dataset(data):
        if hasattr(data, "keys") and not hasattr(data, "features"):
            raise TypeError(f"{what}: a DatasetDict; pass one split (e.g. ds['train'])")
        columns = list(data.column_names)
        if label not in columns:
            raise ValueError(f"{what}: no label column {label!r}; columns: {', '.join(columns)}")
        if features is None:
            rest = [c for c in columns if c != label]
            if len(rest) != 1:
                raise ValueError(
                    f"{what}: name the input column with features=...; columns besides {label!r}: {', '.join(rest)}"
                )
            features = rest[0]
        if features not in columns:
            raise ValueError(f"{what}: no input column {features!r}; columns: {', '.join(columns)}")
        table = data.with_format("numpy")
        return np.stack([np.asarray(v) for v in table[features]]), np.asarray(table[label])
    if isinstance(data, torch.utils.data.Dataset):
        try:
            n = len(data)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{what}: a torch Dataset needs __len__ (an IterableDataset is not supported)") from None
        if n == 0:
            raise ValueError(f"{what}: the dataset is empty")
        xs, ys = [], []
        for i in range(n):
            item = data[i]
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TypeError(f"{what}[{i}]: items must be (input, label) pairs, got {type(item).__name__}")
            xs.append(_to_numpy(item[0], f"{what}[{i}] input"))
            ys.append(_to_numpy(item[1], f"{what}[{i}] label"))
        return np.stack(xs), np.asarray(ys)
    raise TypeError(
        f"{what}: expected (x, y) tensors/arrays, a torch.utils.data.Dataset of (x, y) items or a "
        f"Hugging Face datasets.Dataset; got {type(data).__name__}"
    )


def _labels(y: np.ndarray, what: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.ndim != 1:
        raise ValueError(f"{what}: labels must be one integer per sample, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise ValueError(f"{what}: labels must be integers (class indices), got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise ValueError(f"{what}: labels must be >= 0, got {int(y.min())}")
    return y


def _inputs(x: np.ndarray, n: int, what: str) -> np.ndarray:
    if x.ndim < 2 or x.shape[0] != n:
        raise ValueError(f"{what}: inputs must have shape (samples, ...) with {n} samples (one per label), got {x.shape}")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise ValueError(f"{what}: inputs must be numeric, got dtype {x.dtype}")
    x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: inputs hold NaN or infinite values")
    return x


def _num_classes(num_classes: int | None, *labels: np.ndarray) -> int:
    seen = max((int(y.max()) + 1 for y in labels if y.size), default=0)
    if num_classes is None:
        if seen < 2:
            raise ValueError("labels: need at least two classes (labels 0 and 1)")
        return seen
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if seen > num_classes:
        raise ValueError(f"labels go up to {seen - 1}, outside 0..{num_classes - 1} (num_classes={num_classes})")
    return num_classes


def federated_data(
    train: Any,
    test: Any = None,
    *,
    num_clients: int | None = None,
    client_indices: Sequence[Sequence[int]] | None = None,
    partition_name: str = "iid",
    partition_params: dict[str, Any] | None = None,
    test_fraction: float = 0.2,
    num_classes: int | None = None,
    seed: int = 0,
    features: str | None = None,
    label: str = "label",
    name: str = "custom",
) -> FederatedDataset:
    """A :class:`FederatedDataset` from the caller's data.

    ``train`` / ``test``: ``(x, y)`` tensors or arrays, a ``torch.utils.data.Dataset`` of
    ``(x, y)`` items, or a Hugging Face ``datasets.Dataset`` (``features`` / ``label`` name its
    columns). A Hugging Face ``DatasetDict`` as ``train`` supplies both splits (``"train"`` and
    ``"test"``). Without ``test``, a stratified ``test_fraction`` of ``train`` is held out.

    The clients: either ``client_indices``, the caller's own split (one list of training-sample
    indices per client, pairwise disjoint and non-empty), or ``num_clients`` clients drawn
    by fedsafe's partitioner ``partition_name`` (``iid``, ``dirichlet``, ``shards``, ``gamma``)
    with ``partition_params`` (e.g. ``{"alpha": 0.1}``), from the stream ``"data.partition"``
    of ``seed``. Module docstring: conventions for inputs and labels."""
    if is_hf_dataset(train) and hasattr(train, "keys") and not hasattr(train, "features"):
        if test is None and "test" in train:
            test = train["test"]
        if "train" not in train:
            raise ValueError(f"train: a DatasetDict without a 'train' split (splits: {', '.join(train.keys())})")
        train = train["train"]
    x, y = as_arrays(train, features=features, label=label, what="train")
    y = _labels(y, "train")
    x = _inputs(x, y.size, "train")
    if test is None:
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
        if client_indices is not None:
            raise ValueError("client_indices: with your own split, pass the test set too (test=...)")
        tr, te = stratified_split(y, test_fraction, numpy_stream(seed, "data.split"))
        x, y, x_test, y_test = x[tr], y[tr], x[te], y[te]
    else:
        x_test, y_test = as_arrays(test, features=features, label=label, what="test")
        y_test = _labels(y_test, "test")
        x_test = _inputs(x_test, y_test.size, "test")
        if x_test.shape[1:] != x.shape[1:]:
            raise ValueError(f"test: inputs of shape {x_test.shape[1:]} but train has {x.shape[1:]}")
    if y_test.size == 0:
        raise ValueError("test: the test split is empty; fedsafe evaluates every run on it")
    c = _num_classes(num_classes, y, y_test)
    if client_indices is not None:
        if num_clients is not None and num_clients != len(client_indices):
            raise ValueError(f"num_clients={num_clients} but client_indices lists {len(client_indices)} clients")
        parts = [np.asarray(ix, dtype=np.int64).reshape(-1) for ix in client_indices]
    else:
        if num_clients is None:
            raise ValueError("pass num_clients (fedsafe partitions the data) or client_indices (your own split)")
        if isinstance(num_clients, bool) or not isinstance(num_clients, int) or not 1 <= num_clients <= y.size:
            raise ValueError(f"num_clients must be an integer in [1, {y.size}] (the training samples), got {num_clients!r}")
        if partition_name not in PARTITIONERS:
            raise ValueError(f"unknown partition {partition_name!r}; valid: {', '.join(PARTITIONERS.names())}")
        parts = partition(partition_name, y, num_clients, numpy_stream(seed, "data.partition"), **(partition_params or {}))
    return FederatedDataset(
        name=name,
        x_train=torch.from_numpy(np.ascontiguousarray(x)),
        y_train=torch.from_numpy(y),
        x_test=torch.from_numpy(np.ascontiguousarray(x_test)),
        y_test=torch.from_numpy(y_test),
        client_indices=parts,
        num_classes=c,
        input_shape=tuple(x.shape[1:]),
    )


def register_dataset(
    name: str, fn: Callable[..., Any] | None = None, *, num_classes: int | None = None, replace: bool = False
):
    """Register ``fn`` as the dataset ``name`` (decorator, or called with ``fn``), so that
    ``data.name = "name"`` loads it, from TOML too.

    ``fn(*, seed, **params)`` returns ``(x_train, y_train)`` (a stratified ``data.test_fraction``
    is held out) or ``(x_train, y_train, x_test, y_test)``, as tensors or arrays; its other
    keyword-only parameters are set in the config's ``data.params`` table and checked by name.
    Then fedsafe's pipeline runs as for the built-in datasets: ``data.max_train`` /
    ``data.max_test`` subsets, ``data.partition`` over ``clients.num_clients``. Inputs are
    used as given (module docstring). ``replace``: overwrite an earlier registration of
    ``name`` (re-running a notebook cell); the built-in datasets cannot be replaced."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        if "seed" not in sig.parameters:
            raise TypeError(f"register_dataset({name!r}): the function must take a keyword argument seed")
        kw = []
        for p in sig.parameters.values():
            if p.name == "seed":
                continue
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                raise TypeError(f"register_dataset({name!r}): name each parameter (no **kwargs), so configs are checked")
            if p.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise TypeError(
                    f"register_dataset({name!r}): parameter {p.name!r} must be keyword-only: def {fn.__name__}(*, seed, ...)"
                )
            kw.append(p)

        def reader(cfg: Any, num_clients: int, seed: int, **params: Any) -> _Raw:
            out = fn(seed=seed, **params)
            if not isinstance(out, (tuple, list)) or len(out) not in (2, 4):
                raise ValueError(f"dataset {name!r}: must return (x_train, y_train) or (x_train, y_train, x_test, y_test)")
            x, y = _to_numpy(out[0], f"dataset {name!r} x_train"), _labels(_to_numpy(out[1], "y"), f"dataset {name!r} y_train")
            x = _inputs(x, y.size, f"dataset {name!r} x_train")
            if len(out) == 2:
                tr, te = stratified_split(y, cfg.test_fraction, numpy_stream(seed, "data.split"))
                x, y, xt, yt = x[tr], y[tr], x[te], y[te]
            else:
                yt = _labels(_to_numpy(out[3], "y_test"), f"dataset {name!r} y_test")
                xt = _inputs(_to_numpy(out[2], "x_test"), yt.size, f"dataset {name!r} x_test")
            return _Raw(x, y, xt, yt, _num_classes(num_classes, y, yt), 1.0)

        reader.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(a, inspect.Parameter.POSITIONAL_OR_KEYWORD) for a in ("cfg", "num_clients", "seed")] + kw
        )
        reader.__doc__ = inspect.getdoc(fn) or f"user dataset {fn.__name__}"
        if name in DATASETS:
            from fedsafe.data.config import BUILTIN_DATASETS

            if name in BUILTIN_DATASETS or not replace:
                raise ValueError(
                    f"dataset {name!r} is already registered"
                    + ("" if name in BUILTIN_DATASETS else "; pass replace=True to overwrite it")
                )
            DATASETS.unregister(name)
        DATASETS.register(name)(reader)
        return fn

    return deco if fn is None else deco(fn)
