"""Mutable federation state and its checkpoint file.

Random streams are pure functions of (seed, name, round, ...), so the state below is all a run
needs to continue exactly where it stopped: no generator state is saved.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedsafe.core.errors import CheckpointError

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_TMP = "checkpoint.tmp"
_FORMAT = 1
_KEYS = ("format", "round", "params", "server_buf", "momentum", "previous", "attack_state", "extra")


@dataclass
class FederationState:
    round: int  # rounds completed
    params: Tensor  # flat global model
    server_buf: Any = None  # the server step's state: SGD momentum, Adam's {m, v, t}, or decoded momentum's
    momentum: Tensor | None = None  # (num_clients, d) dsgd client momentum
    previous: Tensor | None = None  # the robust pipeline's previous aggregate
    attack_state: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # observers' state (accountants, canary trackers)


def save_checkpoint(state: FederationState, out_dir: Path) -> Path:
    """Write ``out_dir/checkpoint.pt`` atomically (a killed write never leaves a torn file)."""
    path = Path(out_dir) / CHECKPOINT
    tmp = Path(out_dir) / CHECKPOINT_TMP
    torch.save(
        {
            "format": _FORMAT,
            "round": state.round,
            "params": state.params,
            "server_buf": state.server_buf,
            "momentum": state.momentum,
            "previous": state.previous,
            "attack_state": state.attack_state,
            "extra": state.extra,
        },
        tmp,
    )
    os.replace(tmp, path)
    return path


def load_checkpoint(out_dir: Path) -> FederationState:
    """Read and check ``out_dir/checkpoint.pt``; :class:`CheckpointError` names what is wrong.

    The file is loaded with ``weights_only=True`` (tensors and plain containers only: nothing
    executable is unpickled) and its structure is checked here; :meth:`Federation.restore`
    checks it against the run's config (shapes, round range).
    """
    path = Path(out_dir) / CHECKPOINT
    try:
        blob = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no checkpoint") from None
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ... on bad bytes
        code = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        why = f"it asks to load {code.group(1)}, which is refused" if code else f"damaged or not fedsafe's: {type(e).__name__}"
        raise CheckpointError(f"{path}: not a readable fedsafe checkpoint ({why})") from None
    if not isinstance(blob, dict) or blob.get("format") != _FORMAT:
        got = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise CheckpointError(f"{path}: unsupported checkpoint format {got!r} (expected {_FORMAT})")
    missing = [k for k in _KEYS if k not in blob]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    rnd = blob["round"]
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        raise CheckpointError(f"{path}: round must be an integer >= 0, got {rnd!r}")
    for key in ("params", "momentum", "previous"):  # server_buf: the optimizer checks its own
        _check_tensor(path, key, blob[key], required=key == "params")
    for key in ("attack_state", "extra"):
        if not isinstance(blob[key], dict):
            raise CheckpointError(f"{path}: {key} must be a table, got {type(blob[key]).__name__}")
    return FederationState(
        round=rnd,
        params=blob["params"],
        server_buf=blob["server_buf"],
        momentum=blob["momentum"],
        previous=blob["previous"],
        attack_state=blob["attack_state"],
        extra=blob["extra"],
    )


def _check_tensor(path: Path, key: str, value: object, *, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, Tensor):
        raise CheckpointError(f"{path}: {key} must be a tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise CheckpointError(f"{path}: {key} must hold floating-point numbers, got {value.dtype}")
    if not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"{path}: {key} holds NaN or infinite values")


def checkpoint_round(out_dir: Path) -> int:
    """Rounds completed by ``out_dir``'s checkpoint (0 when there is none or it is unreadable)."""
    try:
        return load_checkpoint(out_dir).round
    except CheckpointError:
        return 0
