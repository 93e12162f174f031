"""CIFAR-10 pickle batches, written here exactly like the real ones, and the restricted unpickler."""

from __future__ import annotations

import os
import pickle
import pickletools
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedsafe.data import DataConfig, DataFormatError, UnsafePickleError, load_federated
from fedsafe.data.cifar import (
    TEST_BATCH,
    TRAIN_BATCHES,
    load_cifar10,
    read_batch,
    restricted_load,
)

PER_BATCH = 20


def batch_dict(seed: int, n: int = PER_BATCH) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": f"batch {seed}".encode(),
        b"labels": [int(v) for v in rng.integers(0, 10, n)],
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{seed}_{i}.png".encode() for i in range(n)],
    }


def make_cifar(directory: Path, protocol: int = 2, subfolder: bool = False) -> dict[str, dict]:
    folder = directory / "cifar-10-batches-py" if subfolder else directory
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for seed, name in enumerate((*TRAIN_BATCHES, TEST_BATCH)):
        batches[name] = batch_dict(seed)
        with open(folder / name, "wb") as f:
            pickle.dump(batches[name], f, protocol=protocol)
    return batches


def pixel(row: np.ndarray, c: int, h: int, w: int) -> int:
    """The documented layout: 1024 red, then 1024 green, then 1024 blue values, row-major."""
    return int(row[c * 1024 + h * 32 + w])


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("subfolder", [False, True])
def test_reads_batches_in_the_documented_layout(tmp_path: Path, protocol: int, subfolder: bool) -> None:
    batches = make_cifar(tmp_path, protocol, subfolder)
    x_train, y_train, x_test, y_test = load_cifar10(tmp_path)
    assert x_train.shape == (5 * PER_BATCH, 3, 32, 32) and x_train.dtype == np.uint8
    assert y_train.dtype == np.int64
    assert np.array_equal(y_train, np.concatenate([batches[n][b"labels"] for n in TRAIN_BATCHES]))
    assert np.array_equal(y_test, batches[TEST_BATCH][b"labels"])
    rng = np.random.default_rng(0)
    for _ in range(200):
        b, i = rng.integers(5), rng.integers(PER_BATCH)
        c, h, w = rng.integers(3), rng.integers(32), rng.integers(32)
        row = batches[TRAIN_BATCHES[b]][b"data"][i]
        assert x_train[b * PER_BATCH + i, c, h, w] == pixel(row, c, h, w)


def test_load_federated_standardises_each_channel(tmp_path: Path) -> None:
    batches = make_cifar(tmp_path)
    ds = load_federated(DataConfig(name="cifar10", path=str(tmp_path), partition="dirichlet"), 5, 0)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    raw = np.concatenate([batches[n][b"data"] for n in TRAIN_BATCHES]).reshape(-1, 3, 1024) / 255
    mean, std = raw.mean(axis=(0, 2)), raw.std(axis=(0, 2))
    assert np.allclose(ds.pixel_mean, mean) and np.allclose(ds.pixel_std, std)
    x = ds.x_train.numpy().astype(np.float64)
    assert np.allclose(x.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    assert np.allclose(x.std(axis=(0, 2, 3)), 1, atol=1e-5)
    test_raw = batches[TEST_BATCH][b"data"].reshape(-1, 3, 32, 32) / 255
    expected = (test_raw - mean[None, :, None, None]) / std[None, :, None, None]
    assert np.allclose(ds.x_test.numpy(), expected, atol=1e-5)


def test_resize_downsamples(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    ds = load_federated(DataConfig(name="cifar10", path=str(tmp_path), resize=16), 4, 0)
    assert ds.x_train.shape == (100, 3, 16, 16) and ds.input_shape == (3, 16, 16)


def _py2_str(b: bytes) -> bytes:
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b


def _py2_int(v: int) -> bytes:
    return b"J" + struct.pack("<i", v)


def py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled the way the distributed files are (Python 2 cPickle, protocol 2, numpy 1):
    py2 ``str`` (BINSTRING) keys and array buffer, globals named ``numpy.core.multiarray``."""
    s, i = _py2_str, _py2_int
    dtype = (b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R"
             + b"(" + i(3) + s(b"|") + b"NNN" + i(-1) + i(-1) + i(0) + b"tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + i(0) + b"\x85"
             + s(b"b") + b"\x87R" + b"(" + i(1) + i(data.shape[0]) + i(data.shape[1]) + b"\x86"
             + dtype + b"\x89" + s(data.tobytes()) + b"tb")
    label_list = b"](" + b"".join(i(v) for v in labels) + b"e"
    return b"\x80\x02}(" + s(b"data") + array + s(b"labels") + label_list + b"u."


def test_reads_python2_numpy1_batches_without_warnings(tmp_path: Path) -> None:
    batches = {name: batch_dict(seed) for seed, name in enumerate((*TRAIN_BATCHES, TEST_BATCH))}
    for name, batch in batches.items():
        (tmp_path / name).write_bytes(py2_batch(batch[b"data"], batch[b"labels"]))
    assert pickle.loads((tmp_path / TEST_BATCH).read_bytes(), encoding="bytes")[b"labels"] == (
        batches[TEST_BATCH][b"labels"])  # the hand-made pickle is valid for the stock unpickler
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy 2 warns when numpy.core is imported by name
        x_train, y_train, x_test, y_test = load_cifar10(tmp_path)
    assert np.array_equal(x_test.reshape(-1, 3072), batches[TEST_BATCH][b"data"])
    assert np.array_equal(y_train, np.concatenate([batches[n][b"labels"] for n in TRAIN_BATCHES]))


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


@pytest.mark.parametrize("payload", ["system", "eval", "nested"])
def test_malicious_pickles_are_refused_before_running(tmp_path: Path, payload: str) -> None:
    marker = tmp_path / "pwned"
    obj = {
        "system": _Exploit(marker),
        "eval": _Eval(),
        "nested": {b"data": np.zeros((1, 3072), np.uint8), b"labels": [_Exploit(marker)]},
    }[payload]
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(UnsafePickleError, match="refusing to load global (posix|os|nt|builtins|__builtin__)\\."):
        restricted_load(path)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # UnsafePickleError is an UnpicklingError
        read_batch(path)


def test_codecs_encode_is_limited_to_latin1(tmp_path: Path) -> None:
    # Protocol 2 pickles bytes as _codecs.encode(str, "latin1"); another codec is refused.
    data = pickle.dumps(b"\x00\xff", protocol=2)
    assert b"latin1" in data
    path = tmp_path / "p"
    path.write_bytes(data)
    assert restricted_load(path) == b"\x00\xff"
    path.write_bytes(data.replace(b"latin1", b"rot_13"))
    with pytest.raises(UnsafePickleError, match="only latin-1"):
        restricted_load(path)


def test_only_the_expected_globals_are_named() -> None:
    # A real-format batch pickle references only numpy's array-rebuilding globals.
    for protocol in (2, 5):
        ops = [arg for op, arg, _ in pickletools.genops(pickle.dumps(batch_dict(0), protocol))
               if op.name == "GLOBAL"]
        assert all(g.split()[0] in {"numpy", "numpy._core.multiarray", "numpy.core.multiarray",
                                    "_codecs"} for g in ops)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update({b"data": d[b"data"].astype(np.float32)}), "must be a uint8 array"),
        (lambda d: d.update({b"data": d[b"data"][:, :1000]}), r"\(n, 3072\)"),
        (lambda d: d.update({b"labels": d[b"labels"][:-1]}), "20 images in b'data' but 19 entries"),
        (lambda d: d[b"labels"].__setitem__(3, 10), r"label 10 at position 3 is outside 0\.\.9"),
        (lambda d: d.pop(b"labels"), "lacks b'labels'"),
        (lambda d: d.update({b"labels": "abc"}), "must be a list of ints"),
    ],
)
def test_malformed_batches_are_refused_naming_the_file(tmp_path: Path, mutate, match: str) -> None:
    batch = batch_dict(0)
    mutate(batch)
    path = tmp_path / "data_batch_3"
    path.write_bytes(pickle.dumps(batch))
    with pytest.raises(DataFormatError, match=f"data_batch_3.*{match}"):
        read_batch(path)


def test_garbage_and_non_dict_are_format_errors(tmp_path: Path) -> None:
    path = tmp_path / "test_batch"
    path.write_bytes(b"definitely not a pickle")
    with pytest.raises(DataFormatError, match="test_batch: not a valid pickle"):
        read_batch(path)
    path.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(DataFormatError, match="expected a pickled dict, got list"):
        read_batch(path)


def test_missing_batches_are_listed(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    (tmp_path / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks data_batch_4 .*cifar-10-batches-py.*needs "
                       r"data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, test_batch"):
        load_federated(DataConfig(name="cifar10", path=str(tmp_path)), 2, 0)
