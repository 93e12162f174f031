"""CIFAR-10 from its "python version" pickle batches, read with a restricted unpickler.

Each of ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` is a pickled dict with
``b"data"``: a uint8 array (n, 3072) whose row is the R, then G, then B plane of a 32 x 32 image
in row-major order, and ``b"labels"``: a list of n ints in 0..9. The batches live in
``data.path`` itself or in its ``cifar-10-batches-py`` subfolder (how the archive unpacks).

Pickle can execute arbitrary code through the globals it names, so :class:`RestrictedUnpickler`
resolves only the few numpy callables needed to rebuild arrays and dtypes (plus
``_codecs.encode`` restricted to latin-1, which Python 3 uses to pickle bytes under protocols
0-2) and refuses everything else with :class:`UnsafePickleError` before anything is called.
"""

from __future__ import annotations

import codecs
import gzip
import io
import os
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from fedsafe.data.errors import DataFormatError, UnsafePickleError

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
SUBFOLDER = "cifar-10-batches-py"
NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)


def _latin1_encode(obj: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if codecs.lookup(encoding).name != "iso8859-1":
        raise UnsafePickleError(
            f"pickle called _codecs.encode with encoding {encoding!r}; only latin-1 is allowed"
        )
    if not isinstance(obj, str):
        raise UnsafePickleError(f"pickle called _codecs.encode on a {type(obj).__name__}, not str")
    return obj.encode("latin-1", errors)


def _allowed_globals() -> dict[tuple[str, str], Any]:
    # Take the callables from numpy's own reduce output rather than importing numpy.core by
    # name: numpy 2 moved it to numpy._core (pickles name either), and this works on both.
    reconstruct = np.zeros(1).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    scalar = np.int64(0).__reduce__()[0]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for module in ("numpy.core", "numpy._core"):
        allowed[(f"{module}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{module}.multiarray", "scalar")] = scalar
        allowed[(f"{module}.numeric", "_frombuffer")] = frombuffer
    return allowed


_ALLOWED = _allowed_globals()


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` resolves only the globals in ``_ALLOWED``.

    Allowed: ``numpy.ndarray``, ``numpy.dtype``, ``numpy[._]core.multiarray._reconstruct`` and
    ``.scalar``, ``numpy[._]core.numeric._frombuffer`` (protocol-5 arrays), and
    ``_codecs.encode`` for latin-1 only. Anything else (``os.system``, ``builtins.eval``,
    ``subprocess.Popen``, ...) raises :class:`UnsafePickleError` naming the global and the file.
    """

    def __init__(
        self, file: io.BufferedIOBase, *, source: str = "<pickle>", encoding: str = "bytes",
        what: str = "a CIFAR batch",
    ) -> None:
        # encoding: how Python 2 str objects are read ("bytes" for CIFAR's dict keys, "latin1"
        # for numpy arrays pickled by Python 2, as mnist.pkl.gz's are)
        super().__init__(file, encoding=encoding)
        self.source = source
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            allowed = ", ".join(sorted(f"{m}.{n}" for m, n in _ALLOWED))
            raise UnsafePickleError(
                f"{self.source}: refusing to load global {module}.{name}; {self.what} may only "
                f"reference {allowed}"
            ) from None


def restricted_load(
    path: str | os.PathLike[str], *, encoding: str = "bytes", what: str = "a CIFAR batch", opener: Any = open
) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler` (``encoding="bytes"``, as CIFAR needs;
    ``opener``: e.g. ``gzip.open`` for a compressed pickle)."""
    name = str(path)
    with opener(path, "rb") as f:
        try:
            return RestrictedUnpickler(f, source=name, encoding=encoding, what=what).load()
        except UnsafePickleError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
                IndexError, KeyError, MemoryError, gzip.BadGzipFile, zlib.error) as e:
            raise DataFormatError(f"{name}: not a valid pickle: {type(e).__name__}: {e}") from e


def _field(batch: dict[Any, Any], key: str, name: str) -> Any:
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise DataFormatError(
        f"{name}: batch dict lacks {key.encode()!r}; keys present: {sorted(map(repr, batch))}"
    )


def read_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """One batch as (images uint8 (n, 3, 32, 32), labels int64 (n,)), validated."""
    name = str(path)
    batch = restricted_load(path)
    if not isinstance(batch, dict):
        raise DataFormatError(f"{name}: expected a pickled dict, got {type(batch).__name__}")
    data = _field(batch, "data", name)
    raw_labels = _field(batch, "labels", name)
    width = int(np.prod(IMAGE_SHAPE))
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == width):
        desc = (f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray)
                else type(data).__name__)
        raise DataFormatError(f"{name}: b'data' must be a uint8 array (n, {width}), got {desc}")
    if not isinstance(raw_labels, (list, tuple, np.ndarray)):
        raise DataFormatError(f"{name}: b'labels' must be a list of ints, got {type(raw_labels).__name__}")
    labels = np.asarray(raw_labels)
    if labels.ndim != 1 or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
        raise DataFormatError(
            f"{name}: b'labels' must be a flat list of ints, got dtype {labels.dtype} "
            f"shape {labels.shape}"
        )
    if labels.size != data.shape[0]:
        raise DataFormatError(
            f"{name}: {data.shape[0]} images in b'data' but {labels.size} entries in b'labels'"
        )
    bad = (labels < 0) | (labels >= NUM_CLASSES)
    if bad.any():
        raise DataFormatError(
            f"{name}: label {int(labels[bad][0])} at position {int(np.flatnonzero(bad)[0])} is "
            f"outside 0..{NUM_CLASSES - 1}"
        )
    return data.reshape((-1, *IMAGE_SHAPE)), labels.astype(np.int64)


def find_batches(directory: str | os.PathLike[str]) -> Path:
    """The folder holding all six batches: ``directory`` or ``directory/cifar-10-batches-py``."""
    directory = Path(directory)
    names = (*TRAIN_BATCHES, TEST_BATCH)
    expected = ", ".join(names)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"data.path={str(directory)!r} is not a directory; for data.name='cifar10' it must hold "
            f"{expected} (directly or in a {SUBFOLDER}/ subfolder)"
        )
    for candidate in (directory, directory / SUBFOLDER):
        if all((candidate / n).is_file() for n in names):
            return candidate
    missing = [n for n in names if not (directory / n).is_file()]
    raise FileNotFoundError(
        f"data.path={str(directory)!r} lacks {', '.join(missing)} (looked in it and in its "
        f"{SUBFOLDER}/ subfolder); data.name='cifar10' needs {expected}"
    )


def load_cifar10(directory: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: uint8 images (n, 3, 32, 32), int64 labels (n,)."""
    folder = find_batches(directory)
    train = [read_batch(folder / n) for n in TRAIN_BATCHES]
    x_test, y_test = read_batch(folder / TEST_BATCH)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    if x_train.shape[0] == 0 or x_test.shape[0] == 0:
        raise DataFormatError(f"{folder}: the train or test batches hold no images")
    return x_train, y_train, x_test, y_test
