"""The enclave: holds every key, decrypts updates, encodes them, decodes distances, selects,
aggregates.

All traffic is request/reply frames (``wire``) through :meth:`Enclave.handle`, whether the
enclave runs in its own OS process (``host.ProcessEndpoint``) or in-process for tests. Ops:

``attest``     one quote per nonce in ``nonces`` (the clients' own, relayed by the host), each over
               (measurement, the enclave's client key, that nonce)
``connect``    X25519 agreement with accelerator ``i`` (one key pair per channel)
``precompute`` draw noise blocks for rounds ahead (sealed on disk when ``sealed_dir`` is set)
``encode``     decrypt the round's client ciphertexts; drop rejected (failed authentication)
               and non-finite updates; clip to ``‖g‖ ≤ clip``; take fresh noise; send
               ``Y¹ = g + R`` and ``Y² = g − R`` encrypted to accelerators 1 and 2
``decode``     authenticate both Gram replies, decode ``G`` and ``D``, check the decoded norms
               against the updates, select with the rule, aggregate, return the aggregate
``shutdown``   drop precomputed noise

Updates and noise never leave: the only plaintext the enclave returns is the aggregate, the
selected positions and per-phase timings and counts.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from fedsafe.core.errors import FedsafeError
from fedsafe.protocols.crypto import x25519_private_key
from fedsafe.protocols.tee import rules
from fedsafe.protocols.tee.attestation import MIN_NONCE_BYTES, SimulatedPlatform, measure
from fedsafe.protocols.tee.channel import (
    ChannelEnd,
    IntegrityError,
    client_binding,
    digest,
    open_sealed,
    public_bytes,
)
from fedsafe.protocols.tee.leakage import (
    DEFAULT_NOISE_RATIO,
    auto_clip,
    mi_bound_bits,
    noise_constant,
    noise_ratio_for_bits,
)
from fedsafe.protocols.tee.noise import NoisePool
from fedsafe.protocols.tee.numerics import (
    decode_exact,
    decode_float64,
    estimated_abs_error,
    relative_to,
)
from fedsafe.protocols.tee.wire import WireError, error_frame, pack, pack_parts, unpack


class DecodeError(FedsafeError, ValueError):
    """The accelerators' results do not decode to the updates' own norms (a faulty or
    malicious accelerator, or mismatched rounds)."""


class Enclave:
    """``settings``: ``clip``, ``noise_ratio`` or ``target_bits``, ``arithmetic``,
    ``sealed_dir`` (the validated ``TEEConfig`` fields the enclave needs)."""

    def __init__(self, platform_secrets: bytes, settings: dict[str, Any]) -> None:
        self._platform = SimulatedPlatform.from_secrets(platform_secrets)
        self.measurement = measure()
        self._key = x25519_private_key()  # clients encrypt their updates to it
        # tee.clip = "auto": resolved from the first encoded round's update norms (auto_clip)
        self.clip: float | None = None if settings["clip"] == "auto" else float(settings["clip"])
        self._growth = float(settings.get("auto_growth", 1.0))  # public: see TEEProtocol(growth=...)
        self.arithmetic = str(settings.get("arithmetic", "exact"))
        self._ratio = settings.get("noise_ratio")
        self._bits = settings.get("target_bits")
        if self._ratio is None and self._bits is None:
            self._ratio = DEFAULT_NOISE_RATIO
        sealed_dir = settings.get("sealed_dir")
        self.pool = NoisePool(
            self._platform.sealing_key(self.measurement) if sealed_dir else None, sealed_dir
        )
        self._channels: dict[int, ChannelEnd] = {}
        self._state: dict[str, Any] | None = None
        self._last_round = -1
        # The last round's decoded (G, D), for in-process tests; never sent anywhere.
        self.last_decoded: tuple[torch.Tensor, torch.Tensor] | None = None

    # --- parameters ---------------------------------------------------------------------

    def noise_ratio(self, d: int) -> float:
        """ρ = σ²/Var for updates of dimension ``d`` (fixed, or from the bits target)."""
        return float(self._ratio) if self._ratio is not None else noise_ratio_for_bits(d, float(self._bits))

    def noise_c(self, d: int) -> float:
        if self.clip is None:
            raise ValueError("enclave: tee.clip = 'auto' is resolved in the first round, not yet")
        return noise_constant(self.clip, self.noise_ratio(d))

    # --- dispatch -----------------------------------------------------------------------

    def handle(self, request: bytes | bytearray | memoryview) -> bytes | list:
        try:
            head, _, blobs = unpack(request)
            op = head.get("op")
            if op == "attest":
                return self._attest([bytes.fromhex(n) for n in head["nonces"]])
            if op == "connect":
                i = int(head["accelerator"])
                if i not in (1, 2):
                    raise ValueError(f"accelerator index must be 1 or 2, got {i}")
                mine = x25519_private_key()
                self._channels[i] = ChannelEnd(mine, bytes.fromhex(head["public"]),
                                               name=f"accelerator-{i}", role="enclave")
                return pack({"public": public_bytes(mine).hex()})
            if op == "precompute":
                return self._precompute(int(head["n"]), int(head["d"]), int(head["count"]))
            if op == "encode":
                return self._encode(head, blobs)
            if op == "decode":
                return self._decode(head, blobs)
            if op == "shutdown":
                self.pool.discard()
                self._state = None
                return pack({"ok": True})
            raise ValueError(f"enclave: unknown op {op!r}")
        except Exception as e:  # reported to the host by type name and message only
            return error_frame(e)

    # --- ops ----------------------------------------------------------------------------

    def _attest(self, nonces: list[bytes]) -> bytes:
        """Quotes over the verifiers' nonces, in order (blobs ``q0``, ``q1``, …). The enclave
        only signs what it is given: freshness is the verifier's, who drew the nonce."""
        public = public_bytes(self._key)
        for k, nonce in enumerate(nonces):
            if not MIN_NONCE_BYTES <= len(nonce) <= 64:
                raise ValueError(f"attest: nonces[{k}] has {len(nonce)} bytes, expected {MIN_NONCE_BYTES} to 64")
        quotes = [self._platform.quote(measurement=self.measurement, enclave_public=public, nonce=nonce)
                  for nonce in nonces]
        return pack({}, blobs={f"q{k}": q.to_bytes() for k, q in enumerate(quotes)})

    def _precompute(self, n: int, d: int, count: int) -> bytes:
        t0 = time.perf_counter()
        if self.clip is None:  # "auto": the noise scale needs the clip, resolved in the first round
            return pack({"seconds": 0.0, "ahead": 0})
        self.pool.precompute(count, n, d, self.noise_c(d), self.clip, self.arithmetic)
        return pack({"seconds": time.perf_counter() - t0, "ahead": self.pool.ahead})

    def _encode(self, head: dict[str, Any], blobs: dict[str, memoryview]) -> list:
        if len(self._channels) != 2:
            raise IntegrityError("enclave: both accelerator channels must be connected before encoding")
        round_ = int(head["round"])
        if round_ <= self._last_round:
            raise IntegrityError(f"enclave: round {round_} is not after round {self._last_round}: noise is per round")
        ids = [int(c) for c in head["clients"]]
        dim = int(head["dim"])  # the model's dimension: uploads of another length are rejected
        t0 = time.perf_counter()
        rows, pos, rejected = [], [], 0
        for k, cid in enumerate(ids):
            try:
                chead, _, cblobs = unpack(blobs[f"c{k}"])
                if int(chead["round"]) != round_ or int(chead["client"]) != cid or int(chead["dim"]) != dim:
                    raise IntegrityError("client message labelled for another round, client or dimension")
                context, aad = client_binding(self.measurement, round_, cid, dim)
                plain = open_sealed(self._key, cblobs["sealed"], context=context, aad=aad)
                if len(plain) != 4 * dim:
                    raise IntegrityError("client message of the wrong length")
            except (IntegrityError, WireError, KeyError, ValueError, TypeError):
                rejected += 1  # the host may drop or corrupt a message; it cannot forge one
                continue
            rows.append(np.frombuffer(plain, dtype="<f4"))
            pos.append(k)
        if not rows:
            raise ValueError(f"round {round_}: no client update passed authentication")
        t1 = time.perf_counter()
        x = torch.from_numpy(np.stack(rows))  # (n, d) float32: what the rule aggregates
        finite = torch.isfinite(x.amax(dim=1)) & torch.isfinite(x.amin(dim=1))
        excluded = int((~finite).sum())
        if excluded:
            x, pos = x[finite], [p for p, ok in zip(pos, finite.tolist()) if ok]
        if x.shape[0] == 0:
            raise ValueError(f"round {round_}: every update was non-finite")
        norms = torch.linalg.vector_norm(x.double(), dim=1)
        if self.clip is None:
            self.clip = auto_clip(norms.tolist(), self._growth)
        over = norms > self.clip
        clipped = int(over.sum())
        if clipped:
            x = x.clone()
            x[over] = (x[over].double() * (self.clip / norms[over])[:, None]).float()
        n, d = x.shape
        g = x.double()  # the enclave's own copy: rounded to the grid in place below
        t2 = time.perf_counter()
        block = self.pool.take(n, d, self.noise_c(d), self.clip, self.arithmetic)
        t3 = time.perf_counter()
        if self.arithmetic == "exact":
            g.div_(block.q).round_().mul_(block.q)  # to the fixed-point grid (exact: q = 2^k)
        audit = bool(head.get("audit", False))
        out, sha = {}, {}
        y = torch.empty_like(g)
        for i, sign in ((1, 1.0), (2, -1.0)):
            torch.add(g, block.r, alpha=sign, out=y)  # exact in exact mode: one grid, < 2^53 q
            y_np = y.numpy()
            out[f"to_{i}"] = self._channels[i].seal(
                pack_parts({"round": round_, "arithmetic": self.arithmetic}, {"Y": y_np}), kind="encoded"
            )
            if audit:
                sha[i] = digest(memoryview(y_np).cast("B"))
        del y, y_np
        t4 = time.perf_counter()
        self._last_round = round_
        ratio = self.noise_ratio(d)
        self._state = {"round": round_, "x": x, "g": g, "pos": pos, "block": block}
        return pack_parts(
            {
                "decrypt_seconds": t1 - t0, "prepare_seconds": t2 - t1, "noise_seconds": t3 - t2,
                "encode_seconds": t4 - t3, "n": n, "d": d, "rejected": rejected, "excluded": excluded,
                "clipped": clipped, "clip": self.clip, "noise_ratio": ratio, "c": block.c, "q": block.q,
                "noise_online": block.seq < 0, "mi_bound_bits": mi_bound_bits(d, ratio),
                "sent_sha256": {str(k): v for k, v in sha.items()},
            },
            blobs=out,
        )

    def _decode(self, head: dict[str, Any], blobs: dict[str, memoryview]) -> bytes:
        st = self._state
        if st is None or int(head["round"]) != st["round"]:
            raise IntegrityError(f"enclave: no encoded round {head.get('round')} to decode")
        self._state = None  # whatever happens, this round's noise is not used again
        t0 = time.perf_counter()
        parts = []
        for i in (1, 2):
            rhead, arrays, _ = unpack(self._channels[i].open(blobs[f"from_{i}"], kind="gram"))
            if int(rhead["round"]) != st["round"]:
                raise IntegrityError(f"accelerator {i} answered for round {rhead['round']}, not {st['round']}")
            parts.append({k: torch.from_numpy(v.copy()) for k, v in arrays.items()})
        block, n, d = st["block"], st["x"].shape[0], st["x"].shape[1]
        for p in parts:
            for v in p.values():
                if tuple(v.shape) != (n, n):
                    raise DecodeError(f"accelerator result has shape {tuple(v.shape)}, expected {(n, n)}")
        if self.arithmetic == "exact":
            gram, dist = decode_exact((parts[0]["hi"], parts[0]["lo"]), (parts[1]["hi"], parts[1]["lo"]),
                                      (block.k_hi, block.k_lo))
        else:
            gram, dist = decode_float64(parts[0]["g"], parts[1]["g"], block.c)
        self.last_decoded = (gram, dist)
        abs_err = estimated_abs_error(block.c, d, self.arithmetic)
        # The enclave knows every ‖g_i‖² in O(nd): decoded norms that disagree expose a faulty
        # (or malicious) accelerator, which the honest-but-curious model otherwise assumes away.
        own = torch.linalg.vector_norm(st["g"], dim=1) ** 2
        deviation = (torch.diagonal(gram) - own).abs()
        if bool((deviation > 1e-6 * own + 100 * abs_err).any()):
            worst = int(torch.argmax(deviation / (own + abs_err)))
            raise DecodeError(
                f"decoded norm of update {worst} is {float(gram[worst, worst]):.6g}, the enclave's own "
                f"is {float(own[worst]):.6g}: the accelerators' Gram matrices are inconsistent"
            )
        f = int(head["f"])
        idx = rules.select(head["rule"], gram, dist, f, dict(head.get("params") or {}))
        t1 = time.perf_counter()
        vector = rules.combine(head["rule"], st["x"], idx, f)
        t2 = time.perf_counter()
        off = dist[~torch.eye(n, dtype=torch.bool)]
        med = float(off.median()) if off.numel() else 0.0
        return pack(
            {
                "decode_select_seconds": t1 - t0, "aggregate_seconds": t2 - t1,
                "selected": [st["pos"][int(i)] for i in idx],
                "decode_error_estimate": relative_to(abs_err, med),
                "norm_check": float((deviation / own.clamp_min(1e-300)).max()),
            },
            {"aggregate": vector.numpy()},
        )
