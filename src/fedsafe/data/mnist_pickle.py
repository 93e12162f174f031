"""MNIST from the classic ``mnist.pkl.gz`` (what ``make data`` fetches), read without running code.

The file is a gzipped Python 2 pickle of ``((x, y), (x, y), (x, y))``: 50,000 training,
10,000 validation and 10,000 test images, each ``x`` float32 of shape (n, 784) holding k/256
for the original 8-bit pixel k, each ``y`` int64 labels in 0..9. It is unpickled by
:class:`~fedsafe.data.cifar.RestrictedUnpickler` (numpy's array reconstruction only; anything
else is refused with :class:`~fedsafe.data.errors.UnsafePickleError` before it is called).

fedsafe uses MNIST's own split: the training and validation parts together are its 60,000
training images, the test part its 10,000 test images. Pixels go back to the uint8 k (exact:
k/256 is exact in float32), so the rest of the pipeline sees the same arrays as from the IDX
files (``load_mnist_idx``): (n, 1, 28, 28) uint8 images, int64 labels.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from fedsafe.data.cifar import restricted_load
from fedsafe.data.errors import DataFormatError

PICKLE_NAME = "mnist.pkl.gz"
SIDE = 28


def _part(name: str, part: object, which: str) -> tuple[np.ndarray, np.ndarray]:
    if not (isinstance(part, tuple) and len(part) == 2):
        raise DataFormatError(f"{name}: the {which} part is not an (images, labels) pair")
    x, y = part
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        raise DataFormatError(f"{name}: the {which} part holds {type(x).__name__}, {type(y).__name__}, not arrays")
    if x.ndim != 2 or x.shape[1] != SIDE * SIDE or x.dtype != np.float32:
        raise DataFormatError(
            f"{name}: {which} images are {x.dtype} {x.shape}, expected float32 (n, {SIDE * SIDE})"
        )
    if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise DataFormatError(f"{name}: {which} labels are {y.dtype} {y.shape}, expected integers ({x.shape[0]},)")
    if x.shape[0] == 0:
        raise DataFormatError(f"{name}: the {which} part holds no images")
    if y.size and (y.min() < 0 or y.max() > 9):
        bad = int(np.flatnonzero((y < 0) | (y > 9))[0])
        raise DataFormatError(f"{name}: {which} label {int(y[bad])} at position {bad} is outside 0..9")
    k = x * np.float32(256)
    pixels = np.rint(k)
    if not np.isfinite(x).all() or pixels.min() < 0 or pixels.max() > 255 or not np.array_equal(pixels, k):
        raise DataFormatError(f"{name}: {which} pixels are not k/256 for integers k in 0..255")
    return pixels.astype(np.uint8).reshape(-1, 1, SIDE, SIDE), y.astype(np.int64)


def load_mnist_pickle(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)`` from ``mnist.pkl.gz`` (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    name = str(path)
    data = restricted_load(path, encoding="latin1", what="mnist.pkl.gz", opener=gzip.open)
    if not (isinstance(data, tuple) and len(data) == 3):
        raise DataFormatError(f"{name}: expected a (train, validation, test) tuple, got {type(data).__name__}")
    (xa, ya), (xb, yb), (xt, yt) = (_part(name, p, w) for p, w in zip(data, ("training", "validation", "test")))
    return np.concatenate([xa, xb]), np.concatenate([ya, yb]), xt, yt


__all__ = ["PICKLE_NAME", "load_mnist_pickle"]
