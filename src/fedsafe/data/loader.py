"""``load_federated``: read a dataset, subset it, split it over clients, resize and standardise.

Pipeline (each random step from its own named stream, so the same seed gives the same result):

1. read the raw splits — digits: stratified split by ``test_fraction`` (``"data.split"``);
   synthetic: each generator client split by ``test_fraction`` (``"data.split", k``), the test
   parts pooled; mnist / fashion_mnist / cifar10: the official train and test files;
2. keep a uniformly random ``max_train`` / ``max_test`` subset (``"data.subset", 0`` / ``1``;
   for ``natural`` the subset keeps at least one sample of every client);
3. partition the training labels over ``num_clients`` (``"data.partition"``), or keep the
   generator's clients for ``natural``;
4. images: pixels to [0, 1] (uint8 / 255, digits / 16), bilinear resize if ``resize`` is set,
   then x ← (x − mean_c) / std_c with the per-channel mean and population std of the (subset,
   resized) training split, applied to train and test alike. Synthetic features are left as
   generated.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsafe.core.streams import numpy_stream
from fedsafe.data.cifar import load_cifar10
from fedsafe.data.config import DATASETS, IMAGE_DATASETS, DataConfig
from fedsafe.data.dataset import FederatedDataset
from fedsafe.data.digits import NUM_CLASSES as DIGITS_CLASSES
from fedsafe.data.digits import load_digits_images
from fedsafe.data.idx import load_mnist_idx
from fedsafe.data.partition import partition
from fedsafe.data.split import (
    random_subset,
    split_count,
    stratified_split,
    subset_keeping_groups,
)
from fedsafe.data.synthetic import generate_synthetic
from fedsafe.data.transforms import channel_stats, resize_images, standardise


@dataclass
class _Raw:
    x_train: np.ndarray  # uint8 or float32 in [0, 1] (images), float32 (synthetic)
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    scale: float  # divide x by this to reach [0, 1]; 1 when already there / not images
    natural: list[np.ndarray] | None = None  # generator clients, indices into x_train


# Resized images live in memory as float32; larger requests are refused before any work.
MAX_RESIZED_BYTES = 8 * 2**30

Reader = Callable[..., _Raw]
# A dataset reader, reader(cfg, num_clients, seed, **cfg.params), returns the raw train/test
# splits. The built-in ones below are registered (lazily) in fedsafe.data.config.DATASETS.


def _digits(cfg: DataConfig, num_clients: int, seed: int) -> _Raw:
    """scikit-learn's bundled handwritten digits: 1,797 images of 8×8 pixels, 10 classes
    (no download); a stratified test split of ``data.test_fraction``."""
    x, y = load_digits_images()
    train, test = stratified_split(y, cfg.test_fraction, numpy_stream(seed, "data.split"))
    return _Raw(x[train], y[train], x[test], y[test], DIGITS_CLASSES, 1.0)


def _synthetic(cfg: DataConfig, num_clients: int, seed: int) -> _Raw:
    """synthetic(α, β) of Li et al. (FedProx): 60 features, 10 classes, one generator per
    client (``data.partition = "natural"`` keeps them)."""
    gen = generate_synthetic(
        num_clients, seed, alpha=cfg.synthetic_alpha, beta=cfg.synthetic_beta,
        dim=cfg.synthetic_dim, num_classes=cfg.synthetic_classes,
        mean_samples=cfg.synthetic_samples,
    )
    train_parts, test_parts = [], []
    for k, idx in enumerate(gen.indices()):
        perm = numpy_stream(seed, "data.split", k).permutation(idx)
        n_test = split_count(idx.size, cfg.test_fraction)
        test_parts.append(np.sort(perm[:n_test]))
        train_parts.append(np.sort(perm[n_test:]))
    train, test = np.concatenate(train_parts), np.concatenate(test_parts)
    ends = np.cumsum([p.size for p in train_parts])
    natural = [np.arange(e - p.size, e, dtype=np.int64) for p, e in zip(train_parts, ends, strict=True)]
    return _Raw(gen.x[train], gen.y[train], gen.x[test], gen.y[test], cfg.synthetic_classes, 1.0, natural)


def _mnist(cfg: DataConfig, num_clients: int, seed: int) -> _Raw:
    """MNIST, 28×28 grey digits: ``mnist.pkl.gz`` in fedsafe's data directory when
    ``data.path`` is not set (``make data`` puts it there); else ``data.path`` is that file, a
    directory holding it, or a directory of the four IDX files (optionally .gz)."""
    return _Raw(*read_mnist(cfg.path), num_classes=10, scale=255.0)


def read_mnist(path: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST's (x_train, y_train, x_test, y_test) from ``path`` (see :func:`_mnist`)."""
    from fedsafe.data.mnist_pickle import PICKLE_NAME, load_mnist_pickle
    from fedsafe.data.store import DATA_ENV, stored_path

    if path is None:
        stored = stored_path("mnist")
        if not stored.is_file():
            raise FileNotFoundError(
                f"data.name='mnist' without data.path reads {stored}, which is not there: run `make data` "
                f"(or `fedsafe data fetch mnist`) first, set {DATA_ENV} to the data directory that holds "
                f"mnist/{PICKLE_NAME}, or set data.path to MNIST's IDX files"
            )
        return load_mnist_pickle(stored)
    where = Path(path)
    if where.is_file():
        return load_mnist_pickle(where)
    if where.is_dir() and (where / PICKLE_NAME).is_file() and not any(where.glob("train-images-idx3-ubyte*")):
        return load_mnist_pickle(where / PICKLE_NAME)
    return load_mnist_idx(where, "mnist")


def _fashion_mnist(cfg: DataConfig, num_clients: int, seed: int) -> _Raw:
    """Fashion-MNIST from its IDX files (optionally .gz) in ``data.path``: 28×28 grey clothes."""
    assert cfg.path is not None
    return _Raw(*load_mnist_idx(cfg.path, "fashion_mnist"), num_classes=10, scale=255.0)


def _cifar10(cfg: DataConfig, num_clients: int, seed: int) -> _Raw:
    """CIFAR-10 from the python pickle batches in ``data.path`` (read by a restricted
    unpickler: no code runs): 32×32 colour images, 10 classes."""
    assert cfg.path is not None
    return _Raw(*load_cifar10(cfg.path), num_classes=10, scale=255.0)


def _partition_params(cfg: DataConfig) -> dict[str, Any]:
    return {
        "iid": {},
        "dirichlet": {"alpha": cfg.alpha},
        "shards": {"shards_per_client": cfg.shards_per_client},
        "gamma": {"gamma": cfg.gamma},
    }[cfg.partition]


#: The loads :func:`shared_loads` keeps while in effect (None: every call loads).
_SHARED: contextvars.ContextVar[dict[str, tuple[FederatedDataset, tuple[float, ...]]] | None] = contextvars.ContextVar(
    "fedsafe_shared_loads", default=None
)
#: How many loaded datasets :func:`shared_loads` keeps (a sweep's seeds each partition anew).
SHARED_LOADS = 4


def _fingerprint(data: FederatedDataset) -> tuple[float, ...]:
    # sums of the tensors a run reads: a run that changed them in place changes these
    return (float(data.x_train.sum(dtype=torch.float64)), float(data.x_test.sum(dtype=torch.float64)),
            int(data.y_train.sum()), int(data.y_test.sum()), *(int(i.sum()) for i in data.client_indices))


@contextlib.contextmanager
def shared_loads() -> Iterator[None]:
    """While in effect (in this thread or task), :func:`load_federated` calls with the same
    ``data`` section, client count and seed share one loaded dataset instead of reading and
    partitioning it again (a sweep's runs in one process; MNIST: about 2 s of a 5 s run). The
    load is deterministic in those three, so a shared copy is what the call would have loaded;
    before each reuse the tensors' sums are compared with those at loading, and a copy that a
    run changed in place is loaded afresh. The last :data:`SHARED_LOADS` loads are kept."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def load_federated(cfg: DataConfig | Mapping[str, Any], num_clients: int, seed: int) -> FederatedDataset:
    """Load ``cfg.name`` and partition its training split over ``num_clients`` clients.

    Deterministic in (cfg, num_clients, seed). Raises FileNotFoundError (naming ``data.path``
    and the expected files) for missing files, :class:`~fedsafe.data.errors.DataFormatError`
    for malformed ones, and ValueError for impossible requests (e.g. more clients than
    training samples). See the module docstring for the pipeline; inside :func:`shared_loads`,
    a repeated call returns the dataset already loaded.
    """
    if not isinstance(cfg, DataConfig):
        cfg = DataConfig.model_validate(cfg)
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    num_clients, seed = int(num_clients), int(seed)
    cache = _SHARED.get()
    if cache is None:
        return _load(cfg, num_clients, seed)
    key = json.dumps([cfg.model_dump(mode="json"), num_clients, seed], sort_keys=True)
    hit = cache.pop(key, None)
    if hit is None or _fingerprint(hit[0]) != hit[1]:
        hit = (data := _load(cfg, num_clients, seed), _fingerprint(data))
    while len(cache) >= SHARED_LOADS:  # the least recently used goes first
        cache.pop(next(iter(cache)))
    cache[key] = hit
    return hit[0]


def _load(cfg: DataConfig, num_clients: int, seed: int) -> FederatedDataset:
    raw = DATASETS.entry(cfg.name).impl(cfg, num_clients, seed, **cfg.params)

    if raw.natural is not None and cfg.partition == "natural":
        keep = subset_keeping_groups(raw.natural, cfg.max_train, numpy_stream(seed, "data.subset", 0))
    else:
        keep = random_subset(raw.y_train.size, cfg.max_train, numpy_stream(seed, "data.subset", 0))
    keep_test = random_subset(raw.y_test.size, cfg.max_test, numpy_stream(seed, "data.subset", 1))
    y_train, y_test = raw.y_train[keep], raw.y_test[keep_test]

    if cfg.partition == "natural":
        assert raw.natural is not None  # DataConfig refuses natural for other datasets
        position = np.full(raw.y_train.size, -1, dtype=np.int64)
        position[keep] = np.arange(keep.size)
        clients = [position[idx][position[idx] >= 0] for idx in raw.natural]
    else:
        if num_clients > y_train.size:
            raise ValueError(
                f"num_clients={num_clients} exceeds the {y_train.size} training samples of "
                f"data.name={cfg.name!r}"
                + (f" (data.max_train={cfg.max_train})" if cfg.max_train else "")
                + "; every client needs at least one sample"
            )
        clients = partition(cfg.partition, y_train, num_clients,
                            numpy_stream(seed, "data.partition"), **_partition_params(cfg))

    if cfg.resize is not None and cfg.name in IMAGE_DATASETS:
        channels = raw.x_train.shape[1]
        need = (keep.size + keep_test.size) * channels * cfg.resize**2 * 4
        if need > MAX_RESIZED_BYTES:
            raise ValueError(
                f"data.resize = {cfg.resize} would hold {keep.size + keep_test.size} images of "
                f"{channels}x{cfg.resize}x{cfg.resize} float32 in memory ({need / 2**30:.1f} GiB, limit "
                f"{MAX_RESIZED_BYTES / 2**30:.0f} GiB); use a smaller data.resize or data.max_train/max_test"
            )
    x_train = torch.from_numpy(np.ascontiguousarray(raw.x_train[keep])).float()
    x_test = torch.from_numpy(np.ascontiguousarray(raw.x_test[keep_test])).float()
    mean = std = None
    if cfg.name in IMAGE_DATASETS:
        if raw.scale != 1.0:
            x_train.div_(raw.scale)
            x_test.div_(raw.scale)
        if cfg.resize is not None:
            x_train = resize_images(x_train, cfg.resize)
            x_test = resize_images(x_test, cfg.resize)
        mean_t, std_t = channel_stats(x_train)
        x_train = standardise(x_train, mean_t, std_t)
        x_test = standardise(x_test, mean_t, std_t)
        mean, std = tuple(mean_t.tolist()), tuple(std_t.tolist())

    return FederatedDataset(
        name=cfg.name,
        x_train=x_train,
        y_train=torch.from_numpy(np.ascontiguousarray(y_train, dtype=np.int64)),
        x_test=x_test,
        y_test=torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        client_indices=[np.asarray(c, dtype=np.int64) for c in clients],
        num_classes=raw.num_classes,
        input_shape=tuple(x_train.shape[1:]),
        pixel_mean=mean,
        pixel_std=std,
    )
