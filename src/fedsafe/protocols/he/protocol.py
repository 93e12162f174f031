"""``protocol = "he"``: SABLE's homomorphic trimmed mean / median as a fedsafe protocol.

One round (Algorithm 1 of Choffrut et al.): every node quantizes its own message (clamp to
[-C, C], times Q = (2^(delta-1) - 1)/C, round), splits it into digits and encrypts it in blocks
of N slots under the key the nodes share; the server -- holding only public and
relinearisation keys -- optionally subsamples 2f+1 uploads, runs HTS (trimmed_mean) or HMED
(median) on the ciphertexts and returns one ciphertext per block; a node decrypts, divides by
the number of selected values and by Q. The engine's client momentum and server step complete
the SABLE loop (``clients.algorithm = "dsgd"``, server SGD).

``backend = "emulator"`` runs the identical circuit on integers mod p without encryption
(bit-for-bit the values BFV would decrypt), for long accuracy runs.

**Digit check** (``he.check_digits``, on by default; :mod:`fedsafe.protocols.he.validity`):
before HTS the server checks every upload homomorphically, a node decrypts one valid/invalid
bit per node, and HTS runs over the valid uploads only (the excluded nodes count as dropouts:
``Aggregate.included`` lists the aggregated nodes). Without it one node that encrypts
out-of-range digits makes the nodes zero almost every coordinate (a veto over the round).

**Attack ``he_invalid_digits``** (:func:`fedsafe.robust.attacks.he_invalid_digits`): the
protocol emulates every node's encoding, so it also emulates this attack, which acts below
the message level: built from a config whose ``attack.name`` is ``he_invalid_digits``
(``invalid_digits`` = its ``fraction``), it replaces the digit planes of the round's Byzantine
participants (the last ``ctx.num_byzantine`` of ``ctx.participants``) on that fraction of their
coordinates by residues outside each digit's range, uniform, from the stream
``("he.invalid_digits", round, client id)``; their other coordinates encode the message the
attack returned. The engine refuses the attack under any other protocol.

Per-round metrics besides costs (see :meth:`HEProtocol.aggregate`):

* ``he_check_digits``: 1 when the digit check ran; ``he_excluded_invalid``: nodes it excluded;
  ``he_check_products_per_block``: its ciphertext products per block of N coordinates, over
  all n nodes (compare ``he_products_per_block``, HTS's); cost ``he_check_seconds``.
* ``he_out_of_range`` / ``he_out_of_range_fraction``: coordinates of the decrypted trimmed sum
  outside the bound in-range uploads cannot exceed (:meth:`Quantizer.sum_bound`); they come
  from a node that encrypted out-of-range digits and are set to 0
  (:meth:`Quantizer.screen_sums` states what that does and does not guarantee).
* ``he_clipped_fraction`` / ``he_zeroed_fraction``: of the honest nodes' nonzero coordinates, those
  clipped by the clamp and those erased by rounding (:meth:`Quantizer.loss_fractions`);
  ``he_quantization_warning`` is 1 in a round where they make the aggregate meaningless
  (:func:`quantization_destroys_signal`); ``QUANTIZATION_PATIENCE`` such rounds in a row
  warn, once per run, naming ``he.range`` and the value ``"auto"`` would take (as does the end
  of a shorter run whose every round was such a round).
* ``he_range``: the round's C. ``he.range = "auto"`` (the default) resolves it every round
  (:meth:`HEProtocol.resolve_quantizer`, :mod:`fedsafe.protocols.autorange`): 3x the messages'
  root-mean-square coordinate, from DP's clip and noise when a DP plugin declares the messages
  (public), otherwise the median over the nodes of each node's own RMS (one scalar per round
  revealed, robust to a Byzantine minority).
"""

from __future__ import annotations

import functools
import secrets
import time
import warnings
from typing import Any

import numpy as np
import torch

from fedsafe.core.errors import ProtocolError
from fedsafe.core.streams import numpy_stream
from fedsafe.core.types import Aggregate, Message, RoundContext, stack_messages
from fedsafe.protocols.he.config import HEConfig
from fedsafe.protocols.he.encoding import Quantizer
from fedsafe.protocols.he.params import HEParameterError, HEParams, HEPlan, band, plan_hts, plan_subset
from fedsafe.robust.pipeline import record_aggregate, spec_of

SUPPORTED_RULES = ("trimmed_mean", "median")  # HEProtocol.performs()

# A round whose honest coordinates are this erased or this clipped carries no usable direction
# (thresholds measured on digits, see quantization_destroys_signal).
ZEROED_WARN_FRACTION = 0.99
CLIPPED_WARN_FRACTION = 0.9
# consecutive such rounds before the run warns: client momentum starts at 0 and grows over the
# first ~1/(1 - beta) rounds (10 for beta = 0.9), so early messages are small and mostly erased
QUANTIZATION_PATIENCE = 10


def quantization_destroys_signal(clipped: float, zeroed: float) -> bool:
    """True when QUA leaves the honest messages meaningless: more than
    ``ZEROED_WARN_FRACTION`` (99%) of their coordinates round to 0 (the clamp C is too large
    for the messages: the aggregate is almost all zero, training stalls), or more than
    ``CLIPPED_WARN_FRACTION`` (90%) are clipped to +-C (C is too small: the aggregate is
    nearly a sign vector times C, magnitudes gone, steps of at most C). NaN fractions (no
    honest coordinate) never count.

    The thresholds are deliberately extreme: losing most coordinates is normal and harmless,
    because the few that survive are the large ones. Measured (digits, MLP 64-100-10, 5
    nodes, ALIE, momentum 0.9, delta 4, 100 rounds, emulator; plaintext 95.8%): C = 0.05 and
    0.01 reach 95.8% with 61-98% and 18-64% of coordinates zeroed; C = 0.3 reaches 93.0% at
    96-100% zeroed; C = 1.0 reaches 32.9% at 99.5-100% zeroed; C = 0.001 reaches 91.1% at
    24-79% clipped, C = 1e-4 14.5% at 84-97% clipped."""
    return bool(zeroed > ZEROED_WARN_FRACTION or clipped > CLIPPED_WARN_FRACTION)




class HEProtocolError(ProtocolError):
    """A round the HE protocol cannot run; ``client_id`` is set when one node's upload is at fault."""

    def __init__(self, message: str, client_id: int | None = None) -> None:
        super().__init__(message)
        self.client_id = client_id


class HEProtocol:
    """Coordinate-wise trimmed mean / median over BFV ciphertexts (SABLE's HTS / HMED).

    Threat model and what the server learns: see :mod:`fedsafe.protocols.he`."""

    name = "he"
    reveals_messages = False  # the server holds only ciphertexts

    def __init__(
        self, config: HEConfig | dict[str, Any] | None = None, *, invalid_digits: float = 0.0, **kwargs: Any
    ) -> None:
        """``invalid_digits``: the fraction of their coordinates on which the round's Byzantine
        participants encrypt out-of-range digits (the attack ``he_invalid_digits``; 0: none)."""
        if not 0.0 <= float(invalid_digits) <= 1.0:
            raise ValueError(f"invalid_digits must be a fraction in [0, 1], got {invalid_digits!r}")
        self.invalid_digits = float(invalid_digits)
        if config is None:
            config = HEConfig(**kwargs)
        elif isinstance(config, dict):
            config = HEConfig(**{**config, **kwargs})
        elif kwargs:
            # validated, and an old name in kwargs (he.delta) replaces its new one (he.bits)
            kept = config.model_dump(exclude={r.new for r in config.renames if r.old in kwargs})
            config = type(config)(**{**kept, **kwargs})
        self.config = config
        # with he.range = "auto" the quantizer is resolved each round (resolve_quantizer); None
        # until the first round
        self.quantizer: Quantizer | None = (
            None if config.range == "auto" else Quantizer(config.bits, float(config.range))
        )
        self.range_source = "config" if config.range != "auto" else "calibrated"
        self._declares: list[Any] = []  # plugins declaring message_ranges (DP), bind_plugins
        self._parties: dict[HEParams, tuple[Any, Any]] = {}
        self._setup_reported: set[HEParams] = set()
        self._warned: set[str] = set()  # warnings already given in this run
        self._useless_streak = 0  # consecutive rounds quantization_destroys_signal held
        self._rounds_seen = 0
        self._pending_warning: str | None = None  # the quantization warning, should the run end first

    # ------------------------------------------------------------------ engine interface

    def bind_plugins(self, plugins: Any) -> None:
        """The engine's round plugins: one that declares ``message_ranges(dim)`` (DP) makes
        ``he.range = "auto"`` derive C from its clip norm and noise instead of calibrating it."""
        self._declares = [p for p in plugins if callable(getattr(p, "message_ranges", None))]

    def resolve_quantizer(self, x: np.ndarray) -> Quantizer:
        """This round's quantizer for the messages ``x`` (n, d): the configured ``he.range``, or
        with ``"auto"`` :data:`~fedsafe.protocols.autorange.HE_RANGE_FACTOR` times the messages'
        root-mean-square coordinate: DP's bound ``sqrt(C²/d + σ²)`` when a DP plugin declares
        the messages (public), else the median over the nodes of each node's own RMS (the one
        scalar per round that the calibration reveals; :mod:`fedsafe.protocols.autorange`)."""
        cfg = self.config
        if cfg.range != "auto":
            self.range_source = "config"
            return Quantizer(cfg.bits, float(cfg.range))
        from fedsafe.protocols.autorange import HE_RANGE_FACTOR, calibrated_range, dp_rms_bound

        if self._declares:
            runs = self._declares[0].message_ranges(int(x.shape[1]))
            self.range_source = "dp"
            return Quantizer(cfg.bits, HE_RANGE_FACTOR * dp_rms_bound(runs))
        self.range_source = "calibrated"
        return Quantizer(cfg.bits, calibrated_range(x, HE_RANGE_FACTOR)[0])

    def performs(self) -> tuple[str, ...]:
        """The robust rules this protocol performs itself, in the pipeline's place, over the
        ciphertexts: the coordinate-wise trimmed mean (HTS) and median (HMED)."""
        return SUPPORTED_RULES

    def check(self, pipeline: Any) -> None:
        spec = spec_of(pipeline)
        rule = spec.rule
        if rule not in self.performs():
            raise ProtocolError(
                f"protocol 'he' computes only coordinate-wise rules homomorphically ({', '.join(SUPPORTED_RULES)}); "
                f"rule {rule!r} needs the individual updates, which the server only holds encrypted"
            )
        pre = spec.pre
        if pre:
            raise ProtocolError(
                f"protocol 'he' cannot run pre-aggregators ({', '.join(pre)}): they transform individual updates, "
                "which the server only holds encrypted; remove robust.pre"
            )
        if self.config.backend == "bfv":
            from fedsafe.protocols.he.bfv import require_seal

            try:
                require_seal()
            except HEParameterError as exc:
                raise ProtocolError(str(exc)) from None

    def plan(self, n: int, rule: str, f: int, *, nodes: int | None = None) -> HEPlan:
        """The parameters and circuit for n inputs (raises ProtocolError if none is safe), for
        a round of ``nodes`` uploads (default n). With the digit check the parameters also cover
        the check, and HTS over the inputs left when it excludes up to f of the nodes."""
        nodes = n if nodes is None else nodes
        try:
            lo, hi = band(n, rule, f)
            subsets: tuple[tuple[int, int, int], ...] = ()
            if self.config.check_digits:
                sizes = sorted({min(n, nodes - k) for k in range(1, f + 1)} - {n}, reverse=True)
                subsets = tuple((m, *band(m, rule, f)) for m in sizes if m >= 1 and (rule != "trimmed_mean" or m > 2 * f))
            return _plan(
                n, lo, hi, self.config.bits, self.config.digits, self.config.poly_modulus_degree,
                self.config.noise_margin_bits, self.config.check_digits, subsets,
            )
        except HEParameterError as exc:
            raise HEProtocolError(f"he: {exc}") from None

    def preflight(self, n: int, pipeline: Any, *, dim: int | None = None) -> HEPlan:
        """Config-time check for rounds of n messages: the rule, and that 128-bit-secure
        parameters with enough noise budget exist (raises ProtocolError with the reason). The
        message dimension ``dim`` does not matter here (it only sets the ciphertext count)."""
        self.check(pipeline)
        spec = spec_of(pipeline)
        f = spec.f
        inputs = 2 * f + 1 if self.config.subsample and 2 * f + 1 < n else n
        if spec.rule == "trimmed_mean" and not inputs > 2 * f:
            raise HEProtocolError(f"he: trimmed_mean needs more than 2f={2 * f} inputs, got {inputs}")
        return self.plan(inputs, spec.rule, f, nodes=n)

    def subsample(self, n: int, f: int, ctx: RoundContext) -> list[int]:
        """Positions (into the round's messages) the server aggregates: all, or 2f+1 drawn
        uniformly without replacement from the stream ("he.subsample", round)."""
        if not self.config.subsample or 2 * f + 1 >= n:
            return list(range(n))
        rng = numpy_stream(ctx.seed, "he.subsample", ctx.round)
        return sorted(int(i) for i in rng.choice(n, size=2 * f + 1, replace=False))

    def aggregate(self, messages: list[Message], pipeline: Any, ctx: RoundContext) -> Aggregate:
        """One round: every node encodes and uploads; with ``he.check_digits`` the server runs
        the digit check on every upload and a node tells it which fail; the server runs HTS /
        HMED over the valid ones (a subsample of them with ``he.subsample``); the nodes decrypt,
        screen and dequantize."""
        self.check(pipeline)
        updates = stack_messages(messages)
        spec = spec_of(pipeline)
        n, f, rule = len(messages), spec.f, spec.rule
        inputs = len(self.subsample(n, f, ctx))  # what the uploads are planned for
        if rule == "trimmed_mean" and not inputs > 2 * f:
            raise HEProtocolError(f"he: trimmed_mean needs more than 2f={2 * f} inputs, got {inputs}")
        plan = self.plan(inputs, rule, f, nodes=n)
        x = updates.detach().to("cpu", torch.float64).numpy()
        nonfinite = int((~np.isfinite(x)).sum())
        self.quantizer = self.resolve_quantizer(x)
        attackers = self._invalid_digit_uploaders(messages, ctx)
        if self.config.backend == "emulator":
            sums, plan, chosen, invalid, cost, seen, extra = self._emulated(messages, x, plan, rule, f, ctx, attackers)
        else:
            sums, plan, chosen, invalid, cost, seen, extra = self._encrypted(messages, x, plan, rule, f, ctx, attackers)
        count = plan.spec.selected
        t0 = time.perf_counter()
        sums, out_of_range = self.quantizer.screen_sums(sums, count)
        mean = self.quantizer.dequantize(sums, count)
        vector = torch.from_numpy(mean).to(dtype=updates.dtype, device=updates.device)
        cost["he_decrypt_seconds"] = cost.get("he_decrypt_seconds", 0.0) + time.perf_counter() - t0
        record_aggregate(pipeline, vector)  # what pipeline(...) would have remembered
        if invalid:
            self._warn_once(
                "excluded_invalid",
                f"he: the digit check excluded node(s) {[messages[i].client_id for i in invalid]} in round {ctx.round}: "
                "their uploads carry digits outside the allowed range; the round aggregated the other nodes "
                "(metric he_excluded_invalid; the nodes learn one valid/invalid bit per node, nothing else)",
            )
        flagged = int(out_of_range.sum())
        if flagged:
            self._warn_once(
                "out_of_range",
                f"he: {flagged} of {out_of_range.size} coordinates of the decrypted trimmed sum in round {ctx.round} "
                f"exceed the bound {self.quantizer.sum_bound(count)} that in-range uploads cannot (a node encrypted "
                "out-of-range digits); they were set to 0. Coordinates the attack left inside the bound are not "
                "caught: only range proofs on the ciphertexts would (see the metric he_out_of_range"
                + ("; he.check_digits = true excludes such nodes instead)." if not self.config.check_digits else ")."),
            )
        clipped, zeroed = self.quantizer.loss_fractions(x[honest_rows(messages, ctx)])
        useless = quantization_destroys_signal(clipped, zeroed)
        self._useless_streak = self._useless_streak + 1 if useless else 0
        self._rounds_seen += 1
        self._pending_warning = None
        if useless and "quantization" not in self._warned:
            message = self.quantization_message(x, messages, ctx, clipped, zeroed)
            if self._useless_streak >= QUANTIZATION_PATIENCE:
                self._warn_once("quantization", message)
            elif self._useless_streak == self._rounds_seen:
                self._pending_warning = message  # every round so far: warned at close() if the run ends now
        metrics = {
            "he_inputs": float(len(chosen)),
            "he_selected": float(count),
            "he_digits": float(plan.digits.digits),
            "he_poly_modulus_degree": float(plan.params.poly_modulus_degree),
            "he_products_per_block": float(plan.products),
            "he_check_digits": float(self.config.check_digits),
            "he_excluded_invalid": float(len(invalid)),
            "he_check_products_per_block": float(n * plan.check_products) if self.config.check_digits else 0.0,
            "he_nonfinite_values": float(nonfinite),
            "he_out_of_range": float(flagged),
            "he_out_of_range_fraction": flagged / out_of_range.size if out_of_range.size else 0.0,
            "he_clipped_fraction": clipped,
            "he_zeroed_fraction": zeroed,
            "he_quantization_warning": float(useless),
            "he_range": float(self.quantizer.clamp),
            **extra,
        }
        # count: the uploads the aggregate stands for (every valid one, subsampled or not), so
        # DP's sum = vector x count holds as under the plain protocol's robust rules
        return Aggregate(
            vector=vector, count=n - len(invalid), cost=cost, seen=seen, metrics=metrics,
            included=tuple(int(messages[i].client_id) for i in chosen),
        )

    def quantization_message(
        self, x: np.ndarray, messages: list[Message], ctx: RoundContext, clipped: float, zeroed: float
    ) -> str:
        """The warning of a run whose quantization leaves the honest messages meaningless: it
        names ``he.range`` and ``he.bits`` and the value ``"auto"`` would take this round."""
        from fedsafe.protocols.autorange import HE_RANGE_FACTOR, calibrated_range

        rng, bits = self.config.key_name("range"), self.config.key_name("bits")
        q = self.quantizer
        assert q is not None
        auto = calibrated_range(x[honest_rows(messages, ctx)], HE_RANGE_FACTOR)[0]
        if zeroed > ZEROED_WARN_FRACTION:
            what = f"{rng} = {q.clamp:.3g} rounds {zeroed:.1%} of the honest messages' coordinates to 0"
            fix = f"set {rng} = 'auto' (here about {auto:.3g}), or <= {auto:.3g}, or raise {bits}"
        else:
            what = f"{rng} = {q.clamp:.3g} clips {clipped:.1%} of the honest messages' coordinates"
            fix = f"set {rng} = 'auto' (here about {auto:.3g}), or >= {auto:.3g}"
        return (
            f"he: for {self._useless_streak} rounds up to round {ctx.round} the quantization left the honest "
            f"messages meaningless: {what} ({bits} = {self.config.bits}; a coordinate x survives when "
            f"C/{2 * q.offset} < |x| <= C, C = {rng}); {fix}. The metrics he_zeroed_fraction and "
            "he_clipped_fraction track it per round."
        )

    def _invalid_digit_uploaders(self, messages: list[Message], ctx: RoundContext) -> frozenset[int]:
        """Client ids whose uploads this round carry out-of-range digits (attack he_invalid_digits)."""
        if self.invalid_digits <= 0 or ctx.num_byzantine <= 0:
            return frozenset()
        byz = set(ctx.participants[len(ctx.participants) - ctx.num_byzantine :])
        return frozenset(int(m.client_id) for m in messages if m.client_id in byz)

    def _invalid_planes(self, plan: HEPlan, planes: np.ndarray, client_id: int, ctx: RoundContext) -> np.ndarray:
        """A Byzantine node's digit planes with ``invalid_digits`` of its coordinates replaced, in
        every digit plane, by residues outside the digit's range (uniform in D_k+1..p-1), from the
        stream ("he.invalid_digits", round, client id). It holds the key, so it can encrypt them."""
        rng = numpy_stream(ctx.seed, "he.invalid_digits", ctx.round, int(client_id))
        out = np.array(planes, dtype=np.int64)
        d = out.shape[1]
        if d == 0:
            return out
        m = d if self.invalid_digits >= 1.0 else max(1, int(round(self.invalid_digits * d)))
        cols = np.arange(d) if m == d else np.sort(rng.choice(d, size=m, replace=False))
        for k, dmax in enumerate(plan.digits.digit_max):
            out[k, cols] = rng.integers(dmax + 1, plan.spec.p, size=cols.size)
        return out

    def _select(self, n: int, invalid: list[int], plan: HEPlan, rule: str, f: int, ctx: RoundContext, ids: list[int]):
        """Positions HTS aggregates -- the valid uploads, or a subsample of 2f+1 of them -- and
        the plan for that many inputs under the parameters the uploads were made for."""
        bad = set(invalid)
        valid = [i for i in range(n) if i not in bad]
        why = ""
        if invalid:
            why = (
                f"the digit check excluded {len(invalid)} node(s) {[ids[i] for i in invalid]} "
                "(digits outside their range); "
            )
        if not valid:
            raise HEProtocolError(f"he: {why}no valid upload is left")
        chosen = [valid[j] for j in self.subsample(len(valid), f, ctx)]
        if rule == "trimmed_mean" and not len(chosen) > 2 * f:
            raise HEProtocolError(f"he: {why}trimmed_mean needs more than 2f={2 * f} inputs, got {len(chosen)}")
        if len(chosen) == plan.spec.n:
            return chosen, plan
        try:
            return chosen, plan_subset(plan, len(chosen), *band(len(chosen), rule, f))
        except HEParameterError as exc:
            raise HEProtocolError(f"he: {why}{exc}") from None

    def _check_rng(self, ctx: RoundContext) -> np.random.Generator:
        """The server's randomness for the digit check (multipliers, masks): fresh from the OS
        every round, drawn *after* the uploads arrive, never from the public seed -- a node that
        could predict it could craft residues that pass. Runs stay reproducible all the same:
        the check's verdict on an upload does not depend on it (up to the 1/(p-1) false
        accept), and the aggregate is exact."""
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    # ------------------------------------------------------------------ backends

    def _emulated(self, messages, x, plan: HEPlan, rule: str, f: int, ctx: RoundContext, attackers: frozenset[int]):
        from fedsafe.protocols.he.emulator import emulate_digit_planes
        from fedsafe.protocols.he.validity import emulate_digit_check, groups, slot_sums

        t0 = time.perf_counter()
        n, d = x.shape
        p = plan.spec.p
        # int32 holds any residue (the emulator needs p < 2^31) at half the memory of int64
        planes = np.empty((n, plan.digits.digits, d), dtype=np.int32)
        for i, m in enumerate(messages):
            pl = self._digit_planes(plan, m.client_id, x[i])
            if m.client_id in attackers:
                pl = self._invalid_planes(plan, pl, m.client_id, ctx)
            planes[i] = np.asarray(pl, dtype=np.int64) % p
        t1 = time.perf_counter()
        invalid: list[int] = []
        if self.config.check_digits:
            masked = emulate_digit_check(planes, plan.check, plan.slots, self._check_rng(ctx))
            invalid = [int(i) for i in np.flatnonzero(slot_sums(masked, p))]
        t2 = time.perf_counter()
        chosen, hts = self._select(n, invalid, plan, rule, f, ctx, [m.client_id for m in messages])
        sums = emulate_digit_planes(planes[chosen], hts.spec)
        t3 = time.perf_counter()
        blocks = max(-(-d // plan.slots), 1)
        # what BFV would move: seeded ciphertexts ~ N * log2(q_data) / 8 bytes up, a result at the
        # lowest level down (modelled; the bfv backend reports measured sizes)
        ct_up = plan.slots * plan.params.data_bits / 8
        ct_down = 2 * plan.slots * plan.params.coeff_bits[0] / 8
        check_down = n * groups(blocks) * ct_down if self.config.check_digits else 0.0
        cost = {
            "he_encrypt_seconds": t1 - t0,
            "he_check_seconds": t2 - t1,
            "he_hts_seconds": t3 - t2,
            "he_decrypt_seconds": 0.0,
            "bytes_up": float(n * blocks * plan.digits.digits * ct_up),
            "bytes_down": float(n * blocks * ct_down + check_down),
        }
        seen = {
            "server": {
                "received": "nothing (emulator: the HTS circuit on plaintext residues mod p, no encryption)",
                "subsample": list(chosen) if len(chosen) < n - len(invalid) else None,
                "excluded_invalid": [int(messages[i].client_id) for i in invalid],
            },
            "decryptor": _DECRYPTOR_SEES if self.config.check_digits else "the aggregate",
        }
        return sums, hts, chosen, invalid, cost, seen, {"he_bytes_modelled": 1.0}

    def _parties_for(self, params: HEParams):
        got = self._parties.get(params)
        if got is None:
            from fedsafe.protocols.he.bfv import HEServer, NodeKeyring

            keyring = NodeKeyring(params)  # the nodes' shared key, generated among the nodes
            server = HEServer(keyring.server_keys(), workers=self.config.workers)
            got = (keyring, server)
            self._parties[params] = got
        return got

    def _encrypted(self, messages, x, plan: HEPlan, rule: str, f: int, ctx: RoundContext, attackers: frozenset[int]):
        from fedsafe.protocols.he.bfv import HENode, MalformedUploadError

        keyring, server = self._parties_for(plan.params)
        node = HENode(keyring, plan, self.quantizer)
        n = len(messages)
        t0 = time.perf_counter()
        uploads = []
        for m, row in zip(messages, x):
            if m.client_id in attackers:
                planes = self._invalid_planes(plan, self._digit_planes(plan, m.client_id, row), m.client_id, ctx)
                uploads.append(node.encrypt_digit_planes(m.client_id, planes))
            else:
                uploads.append(self._encrypt(node, m.client_id, row))
        t1 = time.perf_counter()
        check = None
        invalid: list[int] = []
        try:
            server.validate(uploads, plan)
            t2 = time.perf_counter()
            if self.config.check_digits:
                check = server.digit_check(uploads, plan, self._check_rng(ctx), validated=True)
            t3 = time.perf_counter()
            if check is not None:
                invalid = [int(i) for i in np.flatnonzero(node.check_sums(check))]
            t4 = time.perf_counter()
            chosen, hts = self._select(n, invalid, plan, rule, f, ctx, [m.client_id for m in messages])
            result = server.trimmed_sum([uploads[i] for i in chosen], hts, validated=True)
        except MalformedUploadError as exc:
            raise HEProtocolError(f"he: rejected upload of {exc}", client_id=exc.client_id) from exc
        t5 = time.perf_counter()
        sums = (node if hts is plan else HENode(keyring, hts, self.quantizer)).decrypt(result)
        t6 = time.perf_counter()
        setup = 0.0
        if plan.params not in self._setup_reported:
            self._setup_reported.add(plan.params)
            setup = float(server.keys.nbytes)
        per_node = [u.nbytes for u in uploads]
        cost = {
            "he_encrypt_seconds": t1 - t0,
            "he_check_seconds": t3 - t2,
            "he_hts_seconds": (t2 - t1) + (t5 - t4),
            "he_decrypt_seconds": (t4 - t3) + (t6 - t5),
            "bytes_up": float(sum(per_node)),
            "bytes_down": float(result.nbytes * n + (check.nbytes if check is not None else 0)),
            "he_setup_bytes": setup,
        }
        seen = {
            "server": {
                "received": "BFV ciphertexts only (one per block of N coordinates and digit plane, per node)",
                "keys": "public key and relinearisation keys; no secret key",
                "parameters": plan.params.describe(),
                "uploads": len(uploads),
                "coordinates": int(result.length),
                "ciphertexts_per_node": len(uploads[0].ciphertexts) * plan.digits.digits if uploads else 0,
                "bytes_per_node": per_node,
                "subsample": list(chosen) if len(chosen) < n - len(invalid) else None,
                "excluded_invalid": [int(messages[i].client_id) for i in invalid],
            },
            "decryptor": _DECRYPTOR_SEES if check is not None else "the aggregate",
        }
        extra = {
            "he_model_budget_bits": float(result.stats.get("model_budget_bits", float("nan"))),
            "he_products": float(result.stats.get("products", 0.0)),
        }
        if check is not None:
            extra["he_check_products"] = float(check.stats.get("products", 0.0))
            extra["he_check_model_budget_bits"] = float(check.stats.get("model_budget_bits", float("nan")))
        return sums, hts, chosen, invalid, cost, seen, extra

    def _encrypt(self, node: Any, client_id: int, row: np.ndarray):
        """One node's quantize-split-encrypt (a seam for tests that tamper with an upload)."""
        return node.encrypt(client_id, row)

    def _digit_planes(self, plan: HEPlan, client_id: int, row: np.ndarray) -> np.ndarray:
        """One node's quantize-split: the (digits, d) residues it would encrypt (the emulator's
        :meth:`_encrypt`, and its seam for tests that tamper with an upload)."""
        return np.stack(plan.digits.split(self.quantizer.shifted(row)))

    def close(self) -> None:
        """Release the BFV server's workers. A run shorter than ``QUANTIZATION_PATIENCE`` rounds
        whose every round was left meaningless by the quantization gets its warning now."""
        if self._pending_warning is not None and "quantization" not in self._warned:
            self._warn_once("quantization", self._pending_warning)
        self._pending_warning = None
        for _, server in self._parties.values():
            server.close()


def honest_rows(messages: list[Message], ctx: RoundContext) -> list[int]:
    """Positions of the honest participants' messages (``ctx.participants`` lists the honest
    ones first, the ``num_byzantine`` Byzantine ones last; other messages, e.g. canaries, are
    not honest nodes' updates). A simulation diagnostic: each node could compute its own share
    before encrypting; the server learns none of it."""
    honest = set(ctx.participants[: len(ctx.participants) - ctx.num_byzantine])
    return [i for i, m in enumerate(messages) if m.client_id in honest]


_DECRYPTOR_SEES = (
    "the aggregate; and, from the digit check, per node one ciphertext per group of blocks whose slots are "
    "masked by the server: their sum is 0 iff the node's digits are all in range (one bit per node)"
)


@functools.lru_cache(maxsize=64)
def _plan(
    n: int, lo: int, hi: int, delta: int, digits: int | None, ring: int | None, margin: float,
    check: bool = False, subsets: tuple[tuple[int, int, int], ...] = (),
) -> HEPlan:
    return plan_hts(n, lo, hi, delta, digits=digits, poly_modulus_degree=ring, margin_bits=margin, check=check, subsets=subsets)


def from_config(cfg: Any) -> HEProtocol:
    """``protocol = "he"``: the protocol built from the experiment's ``[he]`` section (and, for
    ``attack.name = "he_invalid_digits"``, the attack's fraction, which it emulates)."""
    fraction = 0.0
    attack = getattr(cfg, "attack", None)
    if attack is not None and attack.name == "he_invalid_digits":
        from fedsafe.robust.attacks import invalid_digit_fraction

        fraction = invalid_digit_fraction(attack.params)
    return HEProtocol(cfg.he, invalid_digits=fraction)
