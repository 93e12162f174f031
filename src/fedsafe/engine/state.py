"""Mutable federation state and its checkpoint file.

Random streams are pure functions of (seed, name, round, ...), so the state below is all a run
needs to continue exactly where it stopped: no generator state is saved.

**Integrity.** A checkpoint carries a SHA-256 checksum of every tensor (over its dtype, shape
and bytes), the identity of the run that wrote it (its config, :func:`run_identity`) and a seal:
one SHA-256 over the format, the round, the run identity, every tensor checksum and every
non-tensor value of the state. :func:`load_checkpoint` recomputes them and refuses a file
where anything differs, naming what. This guards against corruption (flipped bytes on a disk or
in a copy), accidental edits (a hand-edited round, rescaled parameters) and a checkpoint of
another run copied into this run's folder. It does **not** guard against a forger with write
access: anyone can recompute the checksums (they are not keyed). The semantic checks below
still apply to such a file: the round is not ahead of the metrics rows written before it, the
engine's tensors and numbers are finite, shapes match the run (checked by
:meth:`Federation.restore`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.errors import CheckpointError
from fedsafe.engine.metrics import METRICS, read_metrics

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_TMP = "checkpoint.tmp"
_FORMAT = 2  # 2: checksums and run identity; 1 (before them) is refused
_STATE = ("params", "server_buf", "momentum", "previous", "attack_state", "extra")
_KEYS = ("format", "round", "run", *_STATE, "integrity")

#: Config keys that may differ between the run that wrote a checkpoint and the run resuming it,
#: so they are left out of :func:`run_identity`: ``rounds`` (a run may be extended; the round is
#: checked against it on restore), where the same computation runs (``execution``, ``ray``), and
#: ``variants`` (a job's config has none; its variant's overrides are already applied).
RESUMABLE_KEYS = ("rounds", "execution", "ray", "variants")


def state_nbytes(value: Any) -> int:
    """Bytes of the arrays in ``value``: tensors, numpy arrays and :class:`ClientRows`, inside
    dicts, lists and tuples at any depth (other values count 0). What the engine's state across
    rounds weighs, counted structurally (the cross-device benchmark and tests)."""
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.numel()
    if isinstance(value, (np.ndarray, ClientRows)):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(state_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_nbytes(v) for v in value)
    return 0


class ClientRows:
    """One row of ``dim`` numbers per client (dsgd's client momentum), kept only for the clients
    that have taken part: its memory grows with the clients seen, never with the population
    (``clients.num_clients``). A client never seen reads as zeros, which is what its row would
    hold in a dense (num_clients, dim) matrix of zeros.

    Rows live in one (capacity, dim) tensor, a client's row at the slot it got the first time it
    was stored (capacity doubles as clients arrive). When every stored client takes part, in
    slot order (``clients.sampling = "all"``), :meth:`gather` returns the storage itself and
    :meth:`scatter` keeps the new rows as the storage: no copy per round.
    """

    def __init__(self, dim: int, dtype: torch.dtype = torch.float32) -> None:
        self.dim = int(dim)
        self._slot: dict[int, int] = {}
        self._ids: list[int] = []  # client id of each slot, in slot order
        self._rows = torch.zeros((0, self.dim), dtype=dtype)

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def dtype(self) -> torch.dtype:
        return self._rows.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the stored rows (capacity included): what the clients' state costs."""
        return self._rows.element_size() * self._rows.numel()

    def ids(self) -> np.ndarray:
        """The stored clients' ids, in slot order."""
        return np.asarray(self._ids, dtype=np.int64)

    def _in_order(self, ids: np.ndarray) -> bool:
        n = len(self._ids)
        return len(ids) == n and n > 0 and self._rows.shape[0] == n and bool((ids == self.ids()).all())

    def gather(self, ids: np.ndarray) -> Tensor:
        """The rows of clients ``ids`` (n, dim): zeros for a client never stored."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._in_order(ids):
            return self._rows
        slots = [self._slot.get(int(c), -1) for c in ids]
        out = self._rows.new_zeros((len(ids), self.dim))
        have = [i for i, s in enumerate(slots) if s >= 0]
        if have:
            out[torch.tensor(have)] = self._rows[torch.tensor([slots[i] for i in have])]
        return out

    def scatter(self, ids: np.ndarray, rows: Tensor) -> None:
        """Store ``rows`` (n, dim) as the rows of clients ``ids`` (distinct)."""
        ids = np.asarray(ids, dtype=np.int64)
        if tuple(rows.shape) != (len(ids), self.dim):
            raise ValueError(f"client rows: expected shape {(len(ids), self.dim)}, got {tuple(rows.shape)}")
        if self._in_order(ids):
            self._rows = rows.to(self.dtype)  # nothing modifies a round's rows in place afterwards
            return
        new = [int(c) for c in ids if int(c) not in self._slot]
        if new:
            need = len(self._ids) + len(new)
            if need > self._rows.shape[0]:
                grown = self._rows.new_zeros((max(need, 2 * self._rows.shape[0]), self.dim))
                grown[: len(self._ids)] = self._rows[: len(self._ids)]
                self._rows = grown
            for c in new:
                self._slot[c] = len(self._ids)
                self._ids.append(c)
        slots = torch.tensor([self._slot[int(c)] for c in ids], dtype=torch.int64)
        self._rows[slots] = rows.to(self.dtype)

    def to_dense(self, num_clients: int) -> Tensor:
        """The (num_clients, dim) matrix these rows stand for (zeros for the clients not stored)."""
        out = self._rows.new_zeros((num_clients, self.dim))
        if self._ids:
            out[torch.from_numpy(self.ids())] = self._rows[: len(self._ids)]
        return out

    def state_dict(self) -> dict[str, Tensor]:
        """What a checkpoint stores: the stored clients' ids and their rows (no spare capacity)."""
        n = len(self._ids)
        return {"ids": torch.from_numpy(self.ids()), "rows": self._rows[:n].clone()}

    @classmethod
    def from_state(cls, state: Any, *, dim: int | None = None, num_clients: int | None = None) -> ClientRows:
        """Rows from :meth:`state_dict`, or from a dense (num_clients, dim) matrix (a checkpoint
        written before the rows were sparse). ``ValueError`` naming what does not fit ``dim``
        or ``num_clients``."""
        if isinstance(state, Tensor):  # the old dense matrix: every client's row
            if state.dim() != 2:
                raise ValueError(f"client rows: a dense matrix must be 2-D, got shape {tuple(state.shape)}")
            ids, rows = torch.arange(state.shape[0], dtype=torch.int64), state
        elif isinstance(state, dict) and set(state) == {"ids", "rows"}:
            ids, rows = state["ids"], state["rows"]
        else:
            raise ValueError("client rows: expected {'ids', 'rows'} or a dense matrix")
        if not isinstance(ids, Tensor) or ids.dtype != torch.int64 or ids.dim() != 1:
            raise ValueError("client rows: ids must be a 1-D int64 tensor")
        if not isinstance(rows, Tensor) or not rows.is_floating_point() or rows.dim() != 2 or rows.shape[0] != ids.numel():
            raise ValueError(f"client rows: rows must be a float ({ids.numel()}, dim) tensor")
        if dim is not None and rows.shape[1] != dim:
            raise ValueError(f"client rows have {rows.shape[1]} columns, this run's model has {dim}")
        if ids.numel():
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or (num_clients is not None and high >= num_clients):
                raise ValueError(f"client rows name client ids {low}..{high}, outside this run's 0..{(num_clients or 0) - 1}")
            if torch.unique(ids).numel() != ids.numel():
                raise ValueError("client rows repeat a client id")
        out = cls(rows.shape[1], rows.dtype)
        out.scatter(ids.numpy(), rows)
        return out


@dataclass
class FederationState:
    round: int  # rounds completed
    params: Tensor  # flat global model
    server_buf: Any = None  # the server step's state: SGD momentum, Adam's {m, v, t}, or decoded momentum's
    momentum: ClientRows | None = None  # dsgd client momentum, rows of the clients seen
    previous: Tensor | None = None  # the robust pipeline's previous aggregate
    attack_state: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # observers' state (accountants, canary trackers)


def run_identity(cfg: Any) -> str:
    """The identity of the run ``cfg`` (an ``ExperimentConfig``) describes, as stored in its
    checkpoints: its resolved config as canonical JSON, without :data:`RESUMABLE_KEYS`."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_KEYS}
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=True)


def save_checkpoint(state: FederationState, out_dir: Path, run: str) -> Path:
    """Write ``out_dir/checkpoint.pt`` atomically (a killed write never leaves a torn file),
    with the checksums and ``run`` (:func:`run_identity` of the run's config)."""
    path = Path(out_dir) / CHECKPOINT
    tmp = Path(out_dir) / CHECKPOINT_TMP
    blob = {
        "format": _FORMAT,
        "round": state.round,
        "run": run,
        "params": state.params,
        "server_buf": state.server_buf,
        "momentum": _momentum_blob(state.momentum),
        "previous": state.previous,
        "attack_state": state.attack_state,
        "extra": state.extra,
    }
    torch.save(with_checksums(blob), tmp)
    os.replace(tmp, path)
    return path


def _momentum_blob(momentum: ClientRows | Tensor | None) -> dict[str, Tensor] | Tensor | None:
    if isinstance(momentum, ClientRows):
        return momentum.state_dict()
    return momentum  # None, or a dense matrix handed in directly


def with_checksums(blob: dict[str, Any]) -> dict[str, Any]:
    """``blob`` (a checkpoint's dict) with its ``integrity`` record computed: what
    :func:`save_checkpoint` writes. Anyone can call this: the checksums detect corruption and
    accidental edits, not a deliberate forgery (see the module docstring)."""
    tensors = {p: _digest(t) for p, t in _tensors(blob)}
    return {**blob, "integrity": {"tensors": tensors, "seal": _seal(blob, tensors)}}


def load_checkpoint(out_dir: Path, run: str | None = None) -> FederationState:
    """Read and check ``out_dir/checkpoint.pt``; :class:`CheckpointError` names what is wrong.

    The file is loaded with ``weights_only=True`` (tensors and plain containers only: nothing
    executable is unpickled). Then, in order: its structure; every tensor against its checksum
    and the whole against the seal; its run identity against ``run`` (:func:`run_identity` of
    the resuming run's config; None skips this check); and its meaning: the round is an integer
    not ahead of ``metrics.jsonl`` (rows 1..round are written before the checkpoint), every
    tensor and number of the engine's state is finite, and plugin state holds no NaN (a
    plugin may keep an infinity, e.g. the audit's running maximum before its first round, and
    checks its own state when it loads it). :meth:`Federation.restore` then checks it against
    the run's config (shapes, round range, each plugin's state).
    """
    path = Path(out_dir) / CHECKPOINT
    try:
        blob = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no checkpoint") from None
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ... on bad bytes
        why = describe_refusal(e, path)
        raise CheckpointError(f"{path}: not a readable fedsafe checkpoint ({why})") from None
    if not isinstance(blob, dict) or blob.get("format") != _FORMAT:
        got = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        why = " (written without checksums by an older fedsafe: start the run again)" if got == 1 else ""
        raise CheckpointError(f"{path}: unsupported checkpoint format {got!r} (expected {_FORMAT}){why}")
    missing = [k for k in _KEYS if k not in blob]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    _check_integrity(path, blob)
    if run is not None and blob["run"] != run and _renamed_identity(blob["run"]) != run:
        raise CheckpointError(f"{path}: written by another run: {_config_difference(blob['run'], run)}")
    rnd = blob["round"]
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        raise CheckpointError(f"{path}: round must be an integer >= 0, got {rnd!r}")
    for key in ("params", "previous"):  # server_buf: the optimizer checks its own
        _check_tensor(path, key, blob[key], required=key == "params")
    momentum = blob["momentum"]
    if momentum is not None:
        if isinstance(momentum, dict):
            _check_tensor(path, "momentum.rows", momentum.get("rows"), required=True)
        else:
            _check_tensor(path, "momentum", momentum, required=True)
        try:
            momentum = ClientRows.from_state(momentum)
        except ValueError as e:
            raise CheckpointError(f"{path}: momentum: {e}") from None
    for key in ("attack_state", "extra"):
        if not isinstance(blob[key], dict):
            raise CheckpointError(f"{path}: {key} must be a table, got {type(blob[key]).__name__}")
    _check_finite(path, blob)
    _check_metrics(path, Path(out_dir), rnd)
    return FederationState(
        round=rnd,
        params=blob["params"],
        server_buf=blob["server_buf"],
        momentum=momentum,
        previous=blob["previous"],
        attack_state=blob["attack_state"],
        extra=blob["extra"],
    )


def checkpoint_round(out_dir: Path) -> int:
    """Rounds completed by ``out_dir``'s checkpoint (0 when there is none or it is unreadable)."""
    try:
        return load_checkpoint(out_dir).round
    except CheckpointError:
        return 0


# --- checks --------------------------------------------------------------------------------


def _check_tensor(path: Path, key: str, value: object, *, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, Tensor):
        raise CheckpointError(f"{path}: {key} must be a tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise CheckpointError(f"{path}: {key} must hold floating-point numbers, got {value.dtype}")
    if not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"{path}: {key} holds NaN or infinite values")


def _check_integrity(path: Path, blob: dict[str, Any]) -> None:
    rec, run = blob["integrity"], blob["run"]
    if (
        not isinstance(rec, dict) or not isinstance(rec.get("tensors"), dict) or not isinstance(rec.get("seal"), str)
        or not isinstance(run, str)
    ):
        raise CheckpointError(f"{path}: its integrity record (checksums, run identity) is malformed")
    stored: dict[Any, Any] = rec["tensors"]
    found: dict[str, str] = {}
    for p, t in _tensors(blob):
        try:
            found[p] = _digest(t)
        except RuntimeError as e:  # a layout with no plain bytes (sparse, ...)
            raise CheckpointError(f"{path}: tensor {p} cannot be checked ({e})") from None
        if stored.get(p) != found[p]:
            raise CheckpointError(
                f"{path}: tensor {p} does not match its checksum (the file is corrupted or was edited)"
            )
    extra = sorted(str(p) for p in stored if p not in found)
    if extra:
        raise CheckpointError(f"{path}: tensor(s) {', '.join(extra[:5])} in the checksums are missing from the file")
    if rec["seal"] != _seal(blob, found):
        raise CheckpointError(
            f"{path}: the round, run identity or non-tensor state does not match the checksum "
            "(the file is corrupted or was edited)"
        )


def _check_finite(path: Path, blob: dict[str, Any]) -> None:
    """Every float tensor and number of the engine's state is finite; plugin state (``extra``
    entries not starting with ``_``) holds no NaN."""
    parts = [(key, blob[key], False) for key in _STATE if key != "extra"]
    parts += [
        (_join("extra", name), v, not (isinstance(name, str) and name.startswith("_")))
        for name, v in blob["extra"].items()
    ]
    for where, value, plugin in parts:
        for p, v in _walk(value, where):
            if isinstance(v, Tensor):
                if not (v.is_floating_point() or v.is_complex()):
                    continue
                bad = torch.isnan(v).any() if plugin else ~torch.isfinite(v).all()
            elif isinstance(v, float):
                bad = math.isnan(v) if plugin else not math.isfinite(v)
            else:
                continue
            if bool(bad):
                raise CheckpointError(f"{path}: {p} holds NaN{'' if plugin else ' or infinite'} values")


def _check_metrics(path: Path, out_dir: Path, rnd: int) -> None:
    """The metrics row of every round up to ``rnd`` was written before the checkpoint."""
    if rnd == 0:
        return
    metrics = out_dir / METRICS
    if not metrics.is_file():
        raise CheckpointError(
            f"{path}: round {rnd}, but {METRICS} is missing (each round's row is written before its checkpoint)"
        )
    try:
        rows = read_metrics(out_dir)
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path}: round {rnd} cannot be checked against {METRICS}: {e}") from None
    rounds = []
    for i, r in enumerate(rows, 1):
        got = r.get("round") if isinstance(r, dict) else None
        if isinstance(got, bool) or not isinstance(got, int):
            raise CheckpointError(f"{path}: round {rnd} cannot be checked: {METRICS} row {i} has no integer round")
        if got <= rnd:
            rounds.append(got)
    if rounds != list(range(1, rnd + 1)):
        ahead = rounds == list(range(1, len(rounds) + 1))
        held = f"rounds 1..{len(rounds)}" if ahead and rounds else ("no rounds" if not rounds else "other rounds")
        raise CheckpointError(
            f"{path}: round {rnd} is {'ahead of' if ahead else 'inconsistent with'} {METRICS}, which holds "
            f"{held} (rows 1..{rnd} are written before a round-{rnd} checkpoint)"
        )


def _renamed_identity(theirs: Any) -> Any:
    """A run identity written before keys were renamed (``he.delta``, ...), under the new names:
    the same run, so it resumes (``fedsafe.config.RENAMED_KEYS``)."""
    from fedsafe.config import rename_tree

    try:
        d = json.loads(theirs)
        return json.dumps(rename_tree(d), sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return theirs


def _config_difference(theirs: str, ours: str) -> str:
    try:
        a, b = _flat(json.loads(theirs)), _flat(json.loads(ours))
    except (ValueError, TypeError):
        return "its run identity is not this run's config"
    unset = "<unset>"
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, unset) != b.get(k, unset))
    if not keys:
        return "its run identity differs from this run's config"
    shown = [f"{k} (checkpoint: {a.get(k, unset)!r}, this run: {b.get(k, unset)!r})" for k in keys[:5]]
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return "its config differs in " + ", ".join(shown) + more


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix or "config": d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flat(v, key) if isinstance(v, dict) and v else {key: v})
    return out


# --- checksums -----------------------------------------------------------------------------


def _digest(t: Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes."""
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy())
    return h.hexdigest()


def _join(path: str, key: Any) -> str:
    if isinstance(key, str) and key and not any(c in key for c in ".[]"):
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every node under ``value`` as ``(path, node)``, containers before their items."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, _join(path, k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


def _tensors(blob: dict[str, Any]) -> Iterator[tuple[str, Tensor]]:
    for key in _STATE:
        for p, v in _walk(blob.get(key), key):
            if isinstance(v, Tensor):
                yield p, v


def _seal(blob: dict[str, Any], digests: dict[str, str]) -> str:
    """SHA-256 over the format, round, run identity and the whole state: each tensor by its
    checksum, each container by its type and size, each other value by its type and repr."""
    h = hashlib.sha256(b"fedsafe checkpoint\n")
    for key in ("format", "round", "run"):
        h.update(f"{key}\t{type(blob.get(key)).__name__}\t{blob.get(key)!r}\n".encode())
    for key in _STATE:
        for p, v in _walk(blob.get(key), key):
            if isinstance(v, Tensor):
                line = f"{p}\ttensor\t{digests[p]}"
            elif isinstance(v, (dict, list, tuple)):
                line = f"{p}\t{type(v).__name__}\t{len(v)}"
            else:
                line = f"{p}\t{type(v).__name__}\t{v!r}"
            h.update(line.encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()


# --- what the weights-only loader refused ---------------------------------------------------

_REFUSED = (  # torch's wordings, old and new, of a global it will not load
    r"Unsupported global: GLOBAL ([\w.]+)",
    r"unsupported GLOBAL ([\w.]+) whose module",
    r"call reduce for unrecognized function ([\w.<>]+)",
)


def describe_refusal(e: Exception, path: Path) -> str:
    """Why ``torch.load(path, weights_only=True)`` raised ``e``, in a few words: which code the
    file asks to load when torch names it, or when a scan of its pickle (read as data by
    ``pickletools``, never run) finds globals outside torch's allowlist; else what broke."""
    text = str(e)
    for pattern in _REFUSED:
        m = re.search(pattern, text)
        if m:
            return f"it asks to load {m.group(1)}, which is refused"
    names = _refused_globals(path)
    if names:
        return f"it asks to load {', '.join(names)}, which is refused"
    m = re.search(r"Unsupported operand (\d+)", text)
    if m and names is not None:  # a well-formed pickle, of a kind torch does not read
        return f"a pickle using opcode {m.group(1)}, which the weights-only loader refuses"
    return f"damaged or not fedsafe's: {type(e).__name__}"


def _refused_globals(path: Path, limit: int = 1 << 26) -> list[str] | None:
    """The globals (``module.name``) a checkpoint's pickle names that torch's weights-only
    loader does not allow, read with ``pickletools.genops`` (parsing only); None when the file
    is not a well-formed pickle (or too large to scan)."""
    import io
    import pickletools
    import zipfile

    try:
        if Path(path).stat().st_size > limit:
            return None
        raw = Path(path).read_bytes()
        if zipfile.is_zipfile(io.BytesIO(raw)):  # torch.save's format: the pickle is */data.pkl
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
                raw = z.read(name) if name else b""
        try:
            from torch._weights_only_unpickler import _get_allowed_globals

            allowed = set(_get_allowed_globals())
        except Exception:  # noqa: BLE001 - a private helper: without it, report every global
            allowed = set()
        found: list[str] = []
        strings: list[str] = []
        memo: dict[int, str] = {}
        for op, arg, _ in pickletools.genops(raw):
            if op.name == "GLOBAL":
                found.append(".".join(str(arg).split(" ", 1)))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str) and ("UNICODE" in op.name or op.name.endswith("STRING")):
                strings.append(str(arg))
            elif op.name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                memo[int(arg)] = strings[-1]
            elif op.name in ("BINGET", "LONG_BINGET", "GET") and int(arg) in memo:
                strings.append(memo[int(arg)])
    except Exception:  # noqa: BLE001 - damaged bytes: nothing more to say than torch's error
        return None
    return list(dict.fromkeys(n for n in found if n not in allowed))
