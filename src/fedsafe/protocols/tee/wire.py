"""Explicit byte formats for everything that crosses a party boundary (no pickle).

A *frame* is::

    b"FSTE" | version (1 byte) | header length (uint32, little endian) | header | payload

The header is UTF-8 JSON: caller fields plus ``"_arrays"`` and ``"_blobs"``, which describe
slices of the payload. An array entry is ``[name, dtype, shape, offset]`` with ``dtype`` one of a
small allowlist of little-endian numpy type strings; a blob entry is ``[name, offset, length]``.
Decoding checks every slice lies inside the payload and that an array's byte length equals
``prod(shape) * itemsize``, so a malformed frame is an error, never an arbitrary object.

Arrays come back as numpy views of the received buffer (no copy), writable when the buffer is
(a ``bytearray``), read-only otherwise. ``pack_parts`` gives a frame as a list of buffers so that
large arrays are written or encrypted without being copied into one ``bytes`` first.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedsafe.core.errors import FedsafeError

MAGIC = b"FSTE"
VERSION = 1
_PREFIX = struct.Struct("<4sBI")
_MAX_HEADER = 1 << 20
# The only element types a frame may carry: float64, float32, int64, uint8 (little endian).
_DTYPES = {"<f8": np.float64, "<f4": np.float32, "<i8": np.int64, "|u1": np.uint8}


class WireError(FedsafeError, ValueError):
    """A frame that does not follow the format (truncated, unknown type, slice out of range)."""


def pack_parts(
    header: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray] | None = None,
    blobs: Mapping[str, bytes | bytearray | memoryview] | None = None,
) -> list[bytes | memoryview]:
    """A frame as a list of buffers (prefix and header, then each array's and blob's bytes),
    without copying the arrays or blobs: for writing to a pipe or encrypting piecewise."""
    head = dict(header)
    if "_arrays" in head or "_blobs" in head:
        raise WireError("header keys '_arrays' and '_blobs' are reserved")
    parts: list[bytes | memoryview] = []
    offset = 0
    arr_meta = []
    for name, a in (arrays or {}).items():
        a = np.ascontiguousarray(a)
        dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        key = dt.str if dt.str in _DTYPES else None
        if key is None:
            raise WireError(f"array {name!r}: dtype {a.dtype} is not one of {sorted(_DTYPES)}")
        a = a.astype(dt, copy=False)
        buf = memoryview(a).cast("B")
        arr_meta.append([name, key, list(a.shape), offset])
        parts.append(buf)
        offset += buf.nbytes
    blob_meta = []
    for name, b in (blobs or {}).items():
        mv = memoryview(b).cast("B")
        blob_meta.append([name, offset, mv.nbytes])
        parts.append(mv)
        offset += mv.nbytes
    head["_arrays"] = arr_meta
    head["_blobs"] = blob_meta
    hbytes = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    if len(hbytes) > _MAX_HEADER:
        raise WireError(f"header of {len(hbytes)} bytes exceeds {_MAX_HEADER}")
    return [_PREFIX.pack(MAGIC, VERSION, len(hbytes)) + hbytes, *parts]


def pack(
    header: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray] | None = None,
    blobs: Mapping[str, bytes | bytearray | memoryview] | None = None,
) -> bytes:
    """One frame holding ``header`` (JSON-serialisable), numpy ``arrays`` and raw ``blobs``."""
    return b"".join(pack_parts(header, arrays, blobs))


def frame_with_slots(header: Mapping[str, Any], lengths: Mapping[str, int]) -> tuple[bytearray, dict[str, memoryview]]:
    """A frame whose blobs of the given lengths are left to be written in place: returns the
    buffer and a writable view of each blob's slot (e.g. for ``AESGCM.encrypt_into``)."""
    head = pack_parts(header, blobs={name: b"" for name in lengths})[0]
    meta = json.loads(head[_PREFIX.size :])
    offset = 0
    for entry in meta["_blobs"]:  # recompute offsets with the real lengths
        entry[1], entry[2] = offset, int(lengths[entry[0]])
        offset += entry[2]
    hbytes = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    prefix = _PREFIX.pack(MAGIC, VERSION, len(hbytes)) + hbytes
    buf = bytearray(len(prefix) + offset)
    buf[: len(prefix)] = prefix
    mv = memoryview(buf)
    return buf, {e[0]: mv[len(prefix) + e[1] : len(prefix) + e[1] + e[2]] for e in meta["_blobs"]}


def join(frame: bytes | bytearray | memoryview | list) -> bytes | bytearray | memoryview:
    """A frame given as a list of buffers, as one buffer (one copy); a buffer as is."""
    return b"".join(frame) if isinstance(frame, list) else frame


def unpack(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, memoryview]]:
    """``(header, arrays, blobs)`` of a frame; arrays and blobs are views of ``data``."""
    mv = memoryview(data).cast("B")
    if mv.nbytes < _PREFIX.size:
        raise WireError(f"frame of {mv.nbytes} bytes is shorter than its {_PREFIX.size}-byte prefix")
    magic, version, hlen = _PREFIX.unpack_from(mv, 0)
    if magic != MAGIC or version != VERSION:
        raise WireError(f"not a fedsafe TEE frame (magic {bytes(magic)!r}, version {version})")
    if hlen > _MAX_HEADER or _PREFIX.size + hlen > mv.nbytes:
        raise WireError(f"header length {hlen} does not fit in a {mv.nbytes}-byte frame")
    try:
        head = json.loads(bytes(mv[_PREFIX.size : _PREFIX.size + hlen]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"header is not JSON: {e}") from None
    if not isinstance(head, dict):
        raise WireError("header must be a JSON object")
    payload = mv[_PREFIX.size + hlen :]
    arrays: dict[str, np.ndarray] = {}
    for entry in head.pop("_arrays", []):
        try:
            name, key, shape, off = entry
            shape = tuple(int(s) for s in shape)
            off = int(off)
        except (TypeError, ValueError):
            raise WireError(f"malformed array entry {entry!r}") from None
        if key not in _DTYPES or any(s < 0 for s in shape) or off < 0:
            raise WireError(f"array {name!r}: bad dtype {key!r} or shape {shape}")
        dt = np.dtype(_DTYPES[key]).newbyteorder("<") if key != "|u1" else np.dtype(np.uint8)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if off + nbytes > payload.nbytes:
            raise WireError(f"array {name!r} ({nbytes} bytes at {off}) overruns the payload")
        arrays[name] = np.frombuffer(payload[off : off + nbytes], dtype=dt).reshape(shape)
    blobs: dict[str, memoryview] = {}
    for entry in head.pop("_blobs", []):
        try:
            name, off, length = entry
            off, length = int(off), int(length)
        except (TypeError, ValueError):
            raise WireError(f"malformed blob entry {entry!r}") from None
        if off < 0 or length < 0 or off + length > payload.nbytes:
            raise WireError(f"blob {name!r} ({length} bytes at {off}) overruns the payload")
        blobs[name] = payload[off : off + length]
    return head, arrays, blobs


def error_frame(exc: BaseException) -> bytes:
    """A reply frame reporting ``exc`` by class name and message (never the object)."""
    return pack({"error": type(exc).__name__, "message": str(exc)})
