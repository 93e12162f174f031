"""Output folders that are fedsafe's own: which entries fedsafe wrote, removing only those, and
one writer at a time.

Three kinds of folder are fedsafe's output: a run (``fedsafe run``), a sweep (``fedsafe
sweep``) and a report (``fedsafe report``). Each is marked by a file fedsafe writes when it
creates the folder (:attr:`OutputKind.marker`) and holds a known set of file names
(:attr:`OutputKind.files`) and sub-folders of known kinds (a run's variants, a sweep's cells, a
report written into either). Everything else — a file or folder a user put there, and every
symbolic link, whatever its name — is *foreign*: :func:`foreign` lists it, and :func:`clear`
never removes it and never follows a link.

:class:`DirLock` is an OS lock (``fcntl.flock``) on :data:`LOCK` in the folder: a second
fedsafe process writing to the same folder is refused with the holder's pid, host and start
time; the OS releases the lock when its process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedsafe.core.errors import RunDirError

#: The lock file in a folder fedsafe writes to (kept after the run: it is only locked, never
#: removed, so two processes can never lock two different files of that name).
LOCK = ".fedsafe-lock"


@dataclass(frozen=True)
class OutputKind:
    """A kind of folder fedsafe writes: its marker, its own file names, the kinds of its
    sub-folders, and how to recognise one (default: its marker file is there)."""

    what: str  # "run", "sweep", "report": for messages
    marker: str
    files: frozenset[str]
    children: tuple[OutputKind, ...] = ()
    nests: bool = False  # may hold folders of its own kind (a run's variants)
    recognise: Callable[[Path], bool] | None = field(default=None, compare=False)

    def owns(self, path: Path) -> bool:
        """Whether ``path`` (a real directory) is a folder of this kind."""
        if self.recognise is not None:
            return self.recognise(path)
        m = path / self.marker
        return m.is_file() and not m.is_symlink()


#: A report folder (``fedsafe report --out``): figures and summary.csv.
REPORT_MARKER = ".fedsafe-report"
REPORT_FILES = frozenset({
    REPORT_MARKER, "accuracy.png", "test_loss.png", "attack_success_rate.png", "epsilon.png",
    "accuracy_vs_epsilon.png", "summary.csv",
})


def _is_report(path: Path) -> bool:
    # Marked; or written before reports were marked: only report files, accuracy.png and
    # summary.csv (which every report writes) among them.
    marker = path / REPORT_MARKER
    if marker.is_file() and not marker.is_symlink():
        return True
    found = entries(path)
    names = {e.name for e in found}
    return (all(e.name in REPORT_FILES and e.is_file() and not e.is_symlink() for e in found)
            and {"accuracy.png", "summary.csv"} <= names)


REPORT = OutputKind("report", REPORT_MARKER, REPORT_FILES, recognise=_is_report)


def _is_real_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def entries(path: Path) -> list[Path]:
    """The folder's entries, sorted by name, without the lock file (a folder holding only a
    lock file is as good as empty)."""
    return sorted((e for e in Path(path).iterdir() if e.name != LOCK), key=lambda e: e.name)


def _child_kind(entry: Path, kind: OutputKind) -> OutputKind | None:
    if not _is_real_dir(entry):
        return None
    kinds = (kind, *kind.children) if kind.nests else kind.children
    return next((k for k in kinds if k.owns(entry)), None)


def foreign(path: Path, kind: OutputKind) -> list[str]:
    """Entries of a ``kind`` folder that fedsafe did not write, recursively (``sub/name``):
    names fedsafe does not use, symbolic links, and folders of no known kind."""
    out: list[str] = []
    for entry in entries(path):
        if entry.is_symlink():
            out.append(entry.name)
        elif entry.is_dir():
            sub = _child_kind(entry, kind)
            if sub is None:
                out.append(f"{entry.name}/")
            else:
                out += [f"{entry.name}/{x}" for x in foreign(entry, sub)]
        elif entry.name not in kind.files:
            out.append(entry.name)
    return out


def clear(path: Path, kind: OutputKind, *, keep_marker: bool = True) -> None:
    """Remove fedsafe's own entries of a ``kind`` folder: its files and its sub-folders of
    known kinds (recursively, then the emptied folder). Symbolic links are never followed nor
    removed, foreign entries are left where they are, and the lock file stays."""
    for entry in entries(path):
        if entry.is_symlink():
            continue
        if entry.is_dir():
            sub = _child_kind(entry, kind)
            if sub is not None:
                holder = lock_holder(entry)
                if holder is not None:
                    raise RunDirError(f"{entry}: in use by {holder}; wait for it to finish")
                clear(entry, sub, keep_marker=False)
                try:
                    entry.rmdir()
                except OSError as e:  # something foreign appeared in it meanwhile: it stays
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
        elif entry.name in kind.files and not (keep_marker and entry.name == kind.marker):
            entry.unlink()
    if not keep_marker:  # a sub-folder being removed: its lock too (nobody held it, checked above)
        lock = Path(path) / LOCK
        if lock.is_file() and not lock.is_symlink():
            lock.unlink()


def describe_os_error(e: OSError, what: str) -> str:
    """One line for an OSError met while writing run outputs."""
    if e.errno == errno.ENOSPC:
        reason = "no space left on the device"
    elif e.errno in (errno.EACCES, errno.EPERM):
        reason = "permission denied"
    elif e.errno == errno.EROFS:
        reason = "read-only file system"
    elif e.errno == errno.ENOTDIR:
        reason = "a path component is a file, not a directory"
    else:
        reason = e.strerror or str(e)
    where = f" ({e.filename})" if e.filename else ""
    return f"{what}: {reason}{where}"


def shown(names: list[str], limit: int = 5) -> str:
    """``a, b, c`` with at most ``limit`` names, then ``and N more``."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_folder(path: Path, kind: OutputKind, flag: str, *, overwrite: bool,
                 legacy: Callable[[Path], bool] | None = None) -> bool:
    """Refuse a folder fedsafe may not write ``kind``'s outputs into; True when it is a
    ``kind`` folder of fedsafe's own (marked, or ``legacy(path)``: one written before markers).

    A non-empty folder that is not fedsafe's needs ``overwrite``, and then only the names
    fedsafe writes are replaced in it. A symbolic link or a folder in the place of one of those
    names is refused whatever ``overwrite`` says: nothing is written through a link.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{flag} {path}: exists and is not a directory")
    if not path.exists():
        return False
    found = entries(path)
    odd = [e.name for e in found if e.name in kind.files and (e.is_symlink() or not e.is_file())]
    if odd:
        raise RunDirError(
            f"{flag} {path}: {shown(odd)} is a symbolic link or not a plain file, where fedsafe writes its "
            f"{kind.what} output; fedsafe does not write through links: move it away or choose another {flag}"
        )
    if kind.owns(path) or (legacy is not None and legacy(path)):
        return True
    if found and not overwrite:
        raise RunDirError(
            f"{flag} {path}: not empty and not a {kind.what} folder fedsafe created (no {kind.marker} marker); "
            f"choose another {flag}, or add --overwrite to write into it (fedsafe then replaces only the files "
            f"it writes there: {shown(sorted(kind.files - {kind.marker}), 10)})"
        )
    return False


# --- one writer per folder ---------------------------------------------------------------

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

# Folders this process holds a lock on (realpath -> [fd, depth]): a process may enter a folder
# it already holds (``fedsafe sweep`` and its cells' summary figures) without locking itself out.
_HELD: dict[str, list[int]] = {}


def _holder(lock: Path) -> str:
    try:
        info = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another fedsafe process (it has not written its details yet)"
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    cmd = f"fedsafe {info['command']}" if info.get("command") else "fedsafe"
    return f"another {cmd} (pid {info.get('pid')} on host {info.get('host', '?')}, started {when})"


def lock_holder(folder: Path) -> str | None:
    """Who holds ``folder``'s lock now (pid, host, start time), or None when nobody does.
    Only reads: nothing is created, so it may run before any check passes."""
    lock = Path(folder) / LOCK
    if fcntl is None or not lock.is_file() or lock.is_symlink():
        return None
    key = os.path.realpath(folder)
    if key in _HELD:
        return None
    try:
        fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _holder(lock)
    finally:
        os.close(fd)  # closing releases what was taken
    return None


class DirLock:
    """``with DirLock(folder, flag, command):`` — create ``folder`` if needed and hold an
    exclusive lock on its :data:`LOCK` file; :class:`RunDirError` ``"{flag} {folder}: in use
    by another fedsafe ... (pid, host, started)"`` when another process holds it."""

    def __init__(self, folder: Path, flag: str, command: str) -> None:
        self.folder = Path(folder)
        self.flag = flag
        self.command = command
        self._key: str | None = None

    def __enter__(self) -> DirLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.folder)
        if key in _HELD:
            _HELD[key][1] += 1
            self._key = key
            return self
        if fcntl is None:  # pragma: no cover - not POSIX: no locking
            _HELD[key] = [-1, 1]
            self._key = key
            return self
        lock = self.folder / LOCK
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise RunDirError(
                    f"{self.flag} {self.folder}: in use by {_holder(lock)}; wait for it to finish or choose "
                    f"another {self.flag.split()[0]}"
                ) from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                raise
            # A file system without locks (some network mounts): go on unlocked, as before locks.
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": self.command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        _HELD[key] = [fd, 1]
        self._key = key
        return self

    def __exit__(self, *exc: object) -> None:
        if self._key is None:
            return
        held = _HELD[self._key]
        held[1] -= 1
        if held[1] == 0:
            del _HELD[self._key]
            if held[0] >= 0:
                os.close(held[0])  # releases the lock; the file stays (see LOCK)
        self._key = None


@contextlib.contextmanager
def fresh_output(out: Path, kind: OutputKind, *, overwrite: bool) -> Iterator[Path]:
    """``with fresh_output(out, kind, overwrite=...) as folder:`` — the folder a command writes
    afresh (a report, a frontier): refused when another fedsafe process holds it, or (without
    ``overwrite``) when it holds files that are not this kind's; then, under its lock, checked
    again, cleared of the earlier output of this kind (a file the new one lacks must not stay)
    and marked. An ``OSError`` while writing becomes a :class:`RunDirError` naming the folder."""
    out = Path(out)
    if out.is_dir() and (holder := lock_holder(out)) is not None:
        raise RunDirError(f"--out {out}: in use by {holder}; wait for it to finish or choose another --out")
    check_folder(out, kind, "--out", overwrite=overwrite)
    try:
        with DirLock(out, "--out", kind.what):
            check_folder(out, kind, "--out", overwrite=overwrite)  # again, under the lock
            clear(out, kind)
            (out / kind.marker).write_text(json.dumps({"fedsafe": kind.what, "created": time.time()}) + "\n")
            yield out
    except RunDirError:
        raise
    except OSError as e:
        raise RunDirError(describe_os_error(e, f"--out {out}: cannot write")) from None
