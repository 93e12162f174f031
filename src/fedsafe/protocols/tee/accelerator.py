"""An untrusted accelerator: receives encoded updates over its channel, returns their Gram matrix.

It sees one of ``Y¹ = g + R`` or ``Y² = g − R`` per round, never ``g``. It computes in float64
on CUDA when present (``device = "auto"``), else on the CPU:

* exact arithmetic: the split Gram ``(hi, lo)`` (``numerics.split_gram``, 3 GEMMs);
* float64 arithmetic: the plain Gram ``Y Yᵀ`` (1 GEMM), the paper's computation.

The Gram rather than the distance matrix: distances follow from it in the enclave and the
norm/cosine filters need it. Requests and replies are frames (``wire``); the payload crosses
the channel encrypted. ``last_received`` keeps the last decrypted matrix for in-process tests
and audits of what an accelerator learns (``threats``) when ``keep_received`` is set.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedsafe.protocols.crypto import x25519_private_key
from fedsafe.protocols.tee.channel import ChannelEnd, IntegrityError, digest, public_bytes
from fedsafe.protocols.tee.numerics import plain_gram, split_gram
from fedsafe.protocols.tee.wire import error_frame, pack, pack_parts, unpack


def resolve_device(device: str, index: int = 0) -> torch.device:
    """``auto``: CUDA (accelerator ``index`` on GPU ``index mod count``) when available."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("device = 'cuda' but torch sees no CUDA device")
    return torch.device("cuda", index % torch.cuda.device_count())


class Accelerator:
    def __init__(self, index: int, device: str = "auto", *, keep_received: bool = False) -> None:
        self.index = index
        self.keep_received = keep_received
        self.device = resolve_device(device, index - 1)
        self._key = x25519_private_key()
        self._channel: ChannelEnd | None = None
        self.last_received: np.ndarray | None = None

    def handle(self, request: bytes | bytearray | memoryview) -> bytes | list:
        try:
            head, _, blobs = unpack(request)
            op = head.get("op")
            if op == "public":
                return pack({"public": public_bytes(self._key).hex(), "device": str(self.device)})
            if op == "connect":
                self._channel = ChannelEnd(self._key, bytes.fromhex(head["enclave_public"]),
                                           name=f"accelerator-{self.index}", role="accelerator")
                return pack({"ok": True})
            if op == "gram":
                return self._gram(blobs["data"], audit=bool(head.get("audit", False)))
            if op == "shutdown":
                return pack({"ok": True})
            raise ValueError(f"accelerator: unknown op {op!r}")
        except Exception as e:  # reported to the host by type name and message
            return error_frame(e)

    def _gram(self, ciphertext: memoryview, *, audit: bool) -> bytes:
        if self._channel is None:
            raise IntegrityError("accelerator: no channel to the enclave yet")
        t0 = time.perf_counter()
        plain = self._channel.open(ciphertext, kind="encoded")
        head, arrays, _ = unpack(plain)
        y_np = arrays["Y"]  # a writable view of the decrypted buffer: no copy
        t1 = time.perf_counter()
        y = torch.from_numpy(y_np).to(self.device)
        if head["arithmetic"] == "exact":
            hi, lo = split_gram(y)
            out = {"hi": hi.cpu().numpy(), "lo": lo.cpu().numpy()}
        else:
            out = {"g": plain_gram(y).cpu().numpy()}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        reply = self._channel.seal(pack_parts({"round": head["round"]}, out), kind="gram")
        t3 = time.perf_counter()
        if self.keep_received:
            self.last_received = y_np
        info = {"compute_seconds": t2 - t1, "crypto_seconds": (t1 - t0) + (t3 - t2), "busy_seconds": t3 - t0,
                "shape": list(y_np.shape), "device": str(self.device)}
        if audit:  # what this accelerator saw, as a hash (for Aggregate.seen)
            info["received_sha256"] = digest(memoryview(y_np).cast("B"))
        return pack_parts(info, blobs={"result": reply})
