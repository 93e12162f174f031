"""``protocol = "tee"``: the engine's view of the enclave + two accelerators.

A round (:meth:`TEEProtocol.aggregate`):

1. every client draws a fresh nonce, the enclave quotes over each (the host relays them), and
   each client verifies the quote over its own nonce and encrypts its update to the attested key;
2. the enclave decrypts, clips to ``clip``, draws fresh noise, and sends ``Y¹ = g + R`` to
   accelerator 1 and ``Y² = g − R`` to accelerator 2 over encrypted channels;
3. the accelerators compute Gram matrices of what they received, in parallel;
4. the enclave decodes exact distances / inner products, checks the decoded norms, selects
   with the rule and aggregates the selected plaintext updates.

Costs per phase go to ``Aggregate.cost`` (seconds and bytes, see :data:`COST_KEYS`), the
leakage bound and counts to ``Aggregate.metrics``, and what each party received to
``Aggregate.seen``. Rules: ``krum | multi_krum | bulyan | norm_filter | cosine_filter``;
anything else, and any pre-aggregator, is refused by :meth:`TEEProtocol.check` with the
reason.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from fedsafe.core.errors import ProtocolError
from fedsafe.core.types import Aggregate, Message, RoundContext
from fedsafe.protocols.tee import rules
from fedsafe.protocols.tee.attestation import AttestationError
from fedsafe.protocols.tee.channel import IntegrityError
from fedsafe.protocols.tee.client import TEEClient
from fedsafe.protocols.tee.config import TEEConfig
from fedsafe.protocols.tee.enclave import DecodeError
from fedsafe.protocols.tee.host import TEESession, checked
from fedsafe.protocols.tee.noise import NoiseError
from fedsafe.protocols.tee.numerics import (
    RELIABLE,
    estimated_relative_error,
    warn_if_unreliable,
)
from fedsafe.protocols.tee.wire import WireError, pack_parts
from fedsafe.robust.pipeline import record_aggregate, spec_of

# Aggregate.cost keys, all per round: seconds (…_seconds) and bytes (bytes_…).
COST_KEYS = (
    "client_encrypt_seconds",  # all clients: challenge, quote (enclave), verify the quote, encrypt
    "enclave_decrypt_seconds",  # enclave: authenticate and decrypt the uploads
    "enclave_encode_seconds",  # enclave: filter, clip, quantise, Y = g ± R, encrypt to accelerators
    "noise_seconds",  # enclave: this round's noise (unseal a precomputed block, or draw it online)
    "noise_precompute_seconds",  # offline phase run before this round (0 if none)
    "transfer_seconds",  # host: relaying and framing bytes between the parties (pipes)
    "accelerator_1_seconds", "accelerator_2_seconds",  # Gram computation on each accelerator
    "accelerator_seconds",  # the two run in parallel: the slower one
    "accelerator_crypto_seconds",  # channel decryption/encryption on the slower accelerator
    "decode_select_seconds",  # enclave: authenticate, decode G and D, check norms, select
    "enclave_aggregate_seconds",  # enclave: mean / Bulyan's trimmed mean of the selected
    "aggregate_seconds",  # the whole protocol round, host wall clock (offline phase excluded)
    "bytes_up",  # client ciphertexts to the enclave
    "bytes_to_accelerator_1", "bytes_to_accelerator_2",
    "bytes_from_accelerator_1", "bytes_from_accelerator_2",
)




def rule_params(pipeline: Any) -> dict[str, Any]:
    """The rule's configured parameters (``RobustPipeline.spec.params``)."""
    return dict(spec_of(pipeline).params)


class TEEProtocol:
    """The TEE offload as an engine protocol (``name = "tee"``). The enclave and accelerators
    start on the first round (or :meth:`prepare`) and stop on :meth:`close` (also a context
    manager; a finalizer stops them if the protocol is garbage-collected)."""

    name = "tee"
    reveals_messages = False  # the host relays ciphertexts; only the enclave sees updates

    def __init__(self, config: TEEConfig | None = None, *, audit: bool = True, growth: float = 1.0) -> None:
        """``growth``: how much the clients' messages may grow after the first round, a public
        factor that ``tee.clip = "auto"`` multiplies the enclave's first-round calibration by
        (``1 / (1 - β)`` for client momentum β, which starts at 0: :func:`from_config`)."""
        if not (math.isfinite(growth) and growth >= 1.0):
            raise ValueError(f"growth must be a finite number >= 1, got {growth!r}")
        self.growth = float(growth)
        self.config = config or TEEConfig()
        self.audit = audit  # hash what each accelerator got (seen); keep Y in-process
        self._session: TEESession | None = None
        self._d: int | None = None
        self._ahead = 0
        self._warned = False
        self._declares: list[Any] = []  # plugins declaring message_ranges (DP), bind_plugins
        # tee.clip as resolved: the number, DP's bound, or the enclave's first-round "auto" value
        self.resolved_clip: float | None = None if self.config.clip == "auto" else float(self.config.clip)
        self.clip_source = "config" if self.config.clip != "auto" else "calibrated"

    # --- engine interface -----------------------------------------------------------------

    def performs(self) -> tuple[str, ...]:
        """The robust rules this protocol performs itself, in the pipeline's place: those that
        select on pairwise distances or inner products (:func:`.rules.tee_rules`)."""
        return tuple(rules.tee_rules())

    def bind_plugins(self, plugins: Any) -> None:
        """The engine's round plugins: one that declares ``message_ranges(dim)`` (DP) makes
        ``tee.clip = "auto"`` the DP clip plus a tail bound on the norm of the clients' noise
        (:func:`fedsafe.protocols.autorange.dp_norm_bound`) instead of the enclave's calibration."""
        self._declares = [p for p in plugins if callable(getattr(p, "message_ranges", None))]

    def enclave_settings(self, d: int) -> dict[str, Any]:
        """The enclave's settings for messages of ``d`` coordinates, ``clip`` resolved as far as
        the host can: a number (the config's, DP's bound, or the value an earlier session of
        this run resolved), or ``"auto"`` for the enclave to resolve from the first round."""
        settings = self.config.enclave_settings()
        if self.resolved_clip is None and self._declares:
            from fedsafe.protocols.autorange import dp_norm_bound

            self.resolved_clip = dp_norm_bound(self._declares[0].message_ranges(d))
            self.clip_source = "dp"
        if self.resolved_clip is not None:
            settings["clip"] = self.resolved_clip
        else:
            settings["auto_growth"] = self.growth
        return settings

    def check(self, pipeline: Any) -> None:
        spec = spec_of(pipeline)
        if spec.rule not in self.performs():
            raise ProtocolError(rules.refusal(spec.rule))
        if spec.pre:
            names = ", ".join(spec.pre)
            raise ProtocolError(
                f"pre-aggregators ({names}) cannot run with protocol 'tee': they transform the "
                "individual updates before the rule (NNM mixes them, bucketing averages them, "
                "clipping/ARC rescale them), so the rule would need distances of vectors the "
                "accelerators never received; only the enclave holds the updates and would have to "
                "run them on plaintext. Set robust.pre = []"
            )
        try:
            rules.check_params(spec.rule, dict(spec.params))
        except ValueError as e:
            raise ProtocolError(str(e)) from None

    def preflight(self, n: int, pipeline: Any, *, dim: int) -> None:
        """Config-time check for rounds of ``n`` messages of ``dim`` coordinates: the rule, and
        N <= d — the enclave's noise vectors R_i are pairwise equidistant, built from N orthogonal
        directions of R^d, so a round with more clients than coordinates cannot be encoded and
        would be skipped (raises ProtocolError naming both)."""
        self.check(pipeline)
        if n > dim:
            raise ProtocolError(
                f"tee: {n} clients per round but messages of only {dim} coordinates; the enclave's noise "
                f"needs N <= d (N orthogonal directions in R^d). Use a model with at least {n} parameters "
                "or fewer clients per round"
            )

    def aggregate(self, messages: list[Message], pipeline: Any, ctx: RoundContext) -> Aggregate:
        self.check(pipeline)
        spec = spec_of(pipeline)
        if not messages:
            raise ValueError("no messages to aggregate")
        d = messages[0].vector.numel()
        try:
            session = self._ensure(len(messages), d)
            offline, self._offline_seconds = self._offline_seconds, 0.0
            t_round = time.perf_counter()

            t = time.perf_counter()
            clients = [TEEClient(m.client_id, verification_key=session.verification_key) for m in messages]
            quotes = session.attest([c.challenge() for c in clients])  # every client's own nonce
            uploads = {f"c{k}": c.encrypt(m.vector, ctx.round, quote=q)
                       for k, (c, m, q) in enumerate(zip(clients, messages, quotes))}
            client_seconds = time.perf_counter() - t
            bytes_up = float(sum(len(b) for b in uploads.values()))

            enc, _, to_acc = session.call(
                session.enclave,
                {"op": "encode", "round": ctx.round, "dim": d, "clients": [m.client_id for m in messages],
                 "audit": self.audit},
                blobs=uploads,
            )
            del uploads
            self.resolved_clip = float(enc["clip"])  # fixed for the run, also across session restarts
            if not enc["noise_online"]:
                self._ahead = max(0, self._ahead - 1)

            sent = {i: len(to_acc[f"to_{i}"]) for i in (1, 2)}
            for i, acc in enumerate(session.accelerators, 1):  # both compute at once
                acc.submit(pack_parts({"op": "gram", "audit": self.audit}, blobs={"data": to_acc[f"to_{i}"]}))
            replies = [checked(acc.result(session.timeout)) for acc in session.accelerators]
            del to_acc
            acc_heads = [r[0] for r in replies]
            results = {f"from_{i}": r[2]["result"] for i, r in enumerate(replies, 1)}

            dec, arrays, _ = session.call(
                session.enclave,
                {"op": "decode", "round": ctx.round, "rule": spec.rule, "f": spec.f,
                 "params": dict(spec.params)},
                blobs=results,
            )
            vector = torch.from_numpy(arrays["aggregate"].copy())
            record_aggregate(pipeline, vector)  # what pipeline(...) would have remembered
            total = time.perf_counter() - t_round

            if dec["decode_error_estimate"] > RELIABLE and not self._warned:
                self._warned = warn_if_unreliable(dec["decode_error_estimate"], f"round {ctx.round}")
        except NoiseError as e:  # N > d: this round cannot be encoded; the session is intact
            raise ProtocolError(str(e)) from None
        except (IntegrityError, DecodeError, WireError, AttestationError, ProtocolError) as e:
            # A failed authentication, a bad decode or a dead party leaves the channels out of
            # step: drop the session; the next round starts and attests a fresh one.
            self.close()
            raise ProtocolError(f"tee: round {ctx.round}: {e}; the enclave session was closed and restarts next round") from e

        enclave_busy = (enc["decrypt_seconds"] + enc["prepare_seconds"] + enc["noise_seconds"] + enc["encode_seconds"]
                        + dec["decode_select_seconds"] + dec["aggregate_seconds"])
        mi = float(enc["mi_bound_bits"])
        cost = {
            "client_encrypt_seconds": client_seconds,
            "enclave_decrypt_seconds": enc["decrypt_seconds"],
            "enclave_encode_seconds": enc["prepare_seconds"] + enc["encode_seconds"],
            "noise_seconds": enc["noise_seconds"],
            "noise_precompute_seconds": offline,
            # everything the host spends moving and framing bytes (uploads to the enclave, Y to
            # and from the accelerators, replies): the round's wall time not spent computing
            "transfer_seconds": max(0.0, total - client_seconds - enclave_busy
                                    - max(h["busy_seconds"] for h in acc_heads)),
            "accelerator_1_seconds": acc_heads[0]["compute_seconds"],
            "accelerator_2_seconds": acc_heads[1]["compute_seconds"],
            "accelerator_seconds": max(h["compute_seconds"] for h in acc_heads),
            "accelerator_crypto_seconds": max(h["crypto_seconds"] for h in acc_heads),
            "decode_select_seconds": dec["decode_select_seconds"],
            "enclave_aggregate_seconds": dec["aggregate_seconds"],
            "aggregate_seconds": total,
            "bytes_up": bytes_up,
            "bytes_to_accelerator_1": float(sent[1]),
            "bytes_to_accelerator_2": float(sent[2]),
            "bytes_from_accelerator_1": float(len(results["from_1"])),
            "bytes_from_accelerator_2": float(len(results["from_2"])),
        }
        metrics = {
            "mi_bound_bits": mi,
            "mi_bound_bits_total": mi * ctx.round,  # fresh noise each round: bits add up
            "noise_ratio": float(enc["noise_ratio"]),
            "selected": float(len(dec["selected"])),
            "excluded_nonfinite": float(enc["excluded"]),
            "rejected_ciphertexts": float(enc["rejected"]),
            "clipped": float(enc["clipped"]),
            "tee_clip": float(enc["clip"]),
            "decode_error_estimate": float(dec["decode_error_estimate"]),
            "noise_online": float(bool(enc["noise_online"])),
        }
        seen: dict[str, Any] = {
            "host": "ciphertexts only (client uploads, channel messages) and the aggregate",
            "enclave": "individual updates, decrypted inside the enclave",
            "selected_clients": [messages[p].client_id for p in dec["selected"]],
        }
        for i, (h, acc) in enumerate(zip(acc_heads, session.accelerators), 1):
            entry: dict[str, Any] = {
                "received": f"encoded updates Y{i} = g {'+' if i == 1 else '-'} R (float64)",
                "shape": tuple(h["shape"]),
                "sha256": h.get("received_sha256"),
                "device": h["device"],
            }
            if self.audit:
                entry["matches_enclave"] = enc["sent_sha256"].get(str(i)) == h["received_sha256"]
                received = getattr(getattr(acc, "handler", None), "last_received", None)
                if received is not None:
                    entry["Y"] = torch.from_numpy(received)
            seen[f"accelerator_{i}"] = entry
        return Aggregate(vector=vector, count=int(enc["n"]), cost=cost, seen=seen, metrics=metrics)

    # --- lifecycle ------------------------------------------------------------------------

    _offline_seconds = 0.0

    def prepare(self, n: int, d: int) -> None:
        """Start the parties and run the offline phase for rounds of ``n`` participants with
        updates of dimension ``d``: draw ``precompute_rounds`` noise blocks. Idempotent until
        those are used up."""
        self._ensure(n, d)

    def _ensure(self, n: int, d: int) -> TEESession:
        cfg = self.config
        if self._session is None or not self._session.alive:
            self._session = TEESession(
                self.enclave_settings(d), processes=cfg.processes, device=cfg.device,
                timeout=cfg.timeout_s, keep_received=self.audit and not cfg.processes,
                execution=cfg.execution, accelerator_gpus=cfg.accelerator_gpus,
            )
            self._ahead = 0
        if self._d is None:
            self._d = d
            ratio = cfg.resolved_noise_ratio(d)
            if not math.isfinite(ratio) or ratio <= 0:
                raise ProtocolError(f"tee: noise ratio {ratio} for d={d} is not usable")
            self._warned = warn_if_unreliable(estimated_relative_error(ratio, d, cfg.arithmetic), "configuration")
        if cfg.precompute_rounds and self._ahead == 0:
            head = self._session.call(
                self._session.enclave, {"op": "precompute", "n": n, "d": d, "count": cfg.precompute_rounds}
            )[0]
            self._ahead = int(head["ahead"])
            self._offline_seconds += float(head["seconds"])
        return self._session

    @property
    def session(self) -> TEESession | None:
        return self._session

    def close(self) -> None:
        """Stop the enclave and accelerators (idempotent)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> TEEProtocol:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def from_config(cfg: Any) -> TEEProtocol:
    """``protocol = "tee"``: the protocol built from the experiment's ``[tee]`` section. Clients
    that send their momentum (``dsgd`` with backpropagation and ``clients.momentum`` β > 0) start
    from m = 0 and send ``(1 - β) g`` in the first round, up to ``1 / (1 - β)`` times less than
    later: that public factor widens ``tee.clip = "auto"``'s first-round calibration."""
    c = cfg.clients
    growth = 1.0
    if c.algorithm == "dsgd" and c.gradient == "backprop" and c.momentum:
        growth = 1.0 / (1.0 - float(c.momentum))
    return TEEProtocol(cfg.tee, growth=growth)
