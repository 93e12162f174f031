"""``protocol = "secagg"``: the engine-facing secure aggregation protocol.

Each round runs the full multi-party protocol (:func:`session.run_round`) among one client party
per message and a server party, over an in-memory transport that counts bytes. The server ends
with the exact integer sum of the survivors' quantized updates and nothing else; the aggregate
is that sum decoded and divided by the number of survivors (the ``mean`` rule over survivors).

Encoding ranges (``secagg.range``, see :mod:`.config` and :mod:`.ranges`): the engine hands the
protocol its round plugins (:meth:`SecAggProtocol.bind_plugins`); one that declares
``message_ranges(dim)`` (DP) says, per run of coordinates, the bounds of an honest message and
the std of each client's noise on it, and with ``range = "auto"`` every round's ranges are
derived from that declaration (at the plugin's current clip norm) with the tail bound
``secagg.range_probability``. The same ranges go to the parties over Flower
(:class:`fedsafe.flower.secagg.FlowerSecAgg` is this protocol).

Clipping, and what the accountant credits. Every round reports ``secagg_clipped_clients`` and
``secagg_clipped_coordinates`` (sums of two more masked words per client: the server learns
nothing per client), ``secagg_clipped_fraction`` and, with a declaration,
``secagg_clip_probability`` (the a-priori bound for the ranges used). With ranges that meet the
tail bound, clipping an honest client's noise is an event of probability at most
``range_probability`` for every dataset, paid for in δ (:mod:`.ranges`), so every honest share
stays credited; a clip the count still shows then comes from a message outside the declared
bounds (a Byzantine client's), which carries no credited noise anyway. With ranges that do not
meet it (an explicit ``secagg.range``, warned about), the clients that clipped are reported as
``secagg_uncredited_shares``, and the DP plugin does not credit that many honest noise shares.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.errors import ProtocolError
from fedsafe.core.streams import numpy_stream
from fedsafe.core.types import Aggregate, Message, RoundContext
from fedsafe.protocols.secagg import crypto, fixedpoint
from fedsafe.protocols.secagg.config import SecAggConfig
from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.pki import Enrolment
from fedsafe.protocols.secagg.ranges import NoisyRun, as_runs, clip_probability, derive

#: a round whose encoding clips more than this fraction of the coordinates warns (once per run)
CLIPPED_WARN_FRACTION = 0.1
from fedsafe.protocols.secagg.session import RoundOutcome, run_round, seeded_randomness
from fedsafe.robust.pipeline import RobustPipeline, record_aggregate, spec_of


class SecAggProtocol:
    """Bonawitz et al. secure aggregation (SecAgg+ with ``graph = "k_regular"``).

    ``key_seed`` makes every key, seed and session id a function of ``(key_seed, round, party)``:
    **for tests only** (anyone knowing the seed can unmask). Without it keys come from the OS;
    the aggregate is the same either way, since the masks cancel exactly.
    ``client_transform(message, ctx)``, when given, maps a client's vector before it is
    quantized — the hook for client-side (distributed) DP noise.

    Message weights are ignored, as by the ``mean`` rule. A client whose update is not finite
    withholds it (a dropout at the first stage, counted in ``excluded_nonfinite``).

    With ``adversary = "active"``, :attr:`enrolment` is the simulated PKI: each client is
    enrolled (a long-term Ed25519 key) the first time it takes part and keeps its key across
    rounds; the server party only ever sees the directory of verification keys.
    """

    name = "secagg"
    reveals_messages = False  # the server sees only the sum: no server-side per-message transforms

    def __init__(
        self,
        config: SecAggConfig | None = None,
        *,
        key_seed: int | None = None,
        client_transform: Callable[[Message, RoundContext], Tensor] | None = None,
    ) -> None:
        self.config = config if config is not None else SecAggConfig()
        self.key_seed = key_seed
        self.client_transform = client_transform
        self.last_outcome: RoundOutcome | None = None
        self.enrolment: Enrolment | None = None
        self._declares: list[Any] = []  # plugins declaring message_ranges (bind_plugins)
        self._warned = False
        self._warned_destroyed: set[str] = set()  # _warn_destroyed's warnings given in this run
        if self.config.adversary == "active":
            seeded = key_seed is not None
            self.enrolment = Enrolment(
                (lambda cid: crypto.SeededRandomness(key_seed, f"enrol/{cid}")) if seeded else None
            )

    def performs(self) -> tuple[str, ...]:
        """The robust rules this protocol performs itself, in the pipeline's place: the mean
        (of the survivors), the only one the sum gives."""
        return ("mean",)

    def check(self, pipeline: RobustPipeline) -> None:
        """Secure aggregation reveals only the sum, so only the plain mean can run on it."""
        spec = spec_of(pipeline)
        problems = []
        if spec.rule not in self.performs():
            problems.append(f"rule {spec.rule!r}")
        if spec.pre:
            problems.append("pre-aggregators " + ", ".join(repr(name) for name in spec.pre))
        if problems:
            raise ProtocolError(
                f"secure aggregation reveals only the sum of the updates, never an individual one, so "
                f"{' and '.join(problems)} (which need individual updates) cannot run on it; use "
                f"robust.rule = 'mean' with no pre-aggregators, or protocol = 'plain'"
            )

    def quantization_error_bound(self, num_clients: int, ranges: fixedpoint.Ranges | None = None) -> float:
        """Per-coordinate bound on |aggregate - mean of clipped updates| for this many survivors' round."""
        return self.config.quantization_error_bound(num_clients, ranges)

    # --- encoding ranges ------------------------------------------------------------------------

    def bind_plugins(self, plugins: Sequence[Any]) -> None:
        """The engine's round plugins: those with ``message_ranges(dim)`` (DP) declare what the
        messages hold, from which ``clip = "auto"`` derives the ranges each round."""
        self._declares = [p for p in plugins if callable(getattr(p, "message_ranges", None))]

    def declared_runs(self, dim: int) -> tuple[NoisyRun, ...] | None:
        """What the bound plugins declare of ``dim``-coordinate messages now (None: nothing)."""
        if not self._declares:
            return None
        runs = as_runs(self._declares[0].message_ranges(dim))
        if sum(r.length for r in runs) != dim:
            raise SecAggError(f"plugin {self._declares[0].name!r} declares ranges for "
                              f"{sum(r.length for r in runs)} coordinates, the messages have {dim}")
        return runs

    def ranges(self, dim: int, clients: int) -> tuple[fixedpoint.Ranges, float | None]:
        """This round's encoding of ``dim``-coordinate messages from ``clients`` clients, and the
        bound on the probability that it clips some honest client's noise (None when no plugin
        declares noise: without DP only the user's range exists)."""
        cfg = self.config
        runs = self.declared_runs(dim)
        if runs is None:
            return fixedpoint.Ranges.uniform(dim, cfg.fixed_range), None
        if cfg.range == "auto":
            ranges, _ = derive(runs, clients, cfg.range_probability)
        else:
            ranges = fixedpoint.Ranges.uniform(dim, float(cfg.range))
        return ranges, clip_probability(ranges, runs, clients)

    def meets_bound(self, p: float) -> bool:
        """Whether ranges whose clip probability is ``p`` meet ``secagg.range_probability`` ("auto"
        ranges do by construction; the slack absorbs the rounding of Φ and its inverse)."""
        return self.config.range == "auto" or p <= self.config.range_probability * (1 + 1e-6)

    def _warn_explicit(self, ranges: fixedpoint.Ranges, p: float, clients: int, dim: int) -> None:
        if self._warned or self.meets_bound(p):
            return
        self._warned = True
        runs = self.declared_runs(dim)
        cfg = self.config
        auto, _ = derive(runs, clients, cfg.range_probability)
        need = ", ".join(f"[{lo:.4g}, {hi:.4g}] x {n}" for n, lo, hi in auto.runs)
        rng, prob = cfg.key_name("range"), cfg.key_name("range_probability")
        warnings.warn(
            f"{rng} = {cfg.range} clips the clients' DP noise with probability up to {p:.3g} per round "
            f"(above {prob} = {cfg.range_probability:g}; with {clients} clients the auto "
            f"ranges would be {need}): the aggregate is biased, and under distributed DP the noise shares of "
            f"clients that clip are not credited by the accountant; use {rng} = 'auto'",
            UserWarning, stacklevel=3,
        )

    def preflight(self, n: int, pipeline: RobustPipeline, *, dim: int) -> None:
        """Config-time: warn when an explicit ``secagg.range`` would clip the declared noise."""
        if self.config.range == "auto" or not self._declares or n < 1:
            return
        ranges, p = self.ranges(dim, n)
        if p is not None:
            self._warn_explicit(ranges, p, n, dim)

    def run_parties(
        self, inputs: dict[int, np.ndarray], ctx: RoundContext, drop_at: dict[int, str],
        ranges: fixedpoint.Ranges | None = None,
    ) -> RoundOutcome:
        """Run the round's parties on ``inputs`` (client id -> float vector), encoded in
        ``ranges``: here, in this process (or on Ray actors), over the in-memory transport;
        ``fedsafe.flower`` runs them on the SuperNodes instead."""
        randomness = seeded_randomness(self.key_seed, ctx.round) if self.key_seed is not None else None
        factory = None
        if self.config.execution == "ray":
            from fedsafe.protocols.secagg.ray_parties import ray_client_factory

            factory = ray_client_factory()
        return run_round(
            inputs, self.config, round_=ctx.round, drop_at=drop_at, randomness=randomness,
            graph_rng=numpy_stream(ctx.seed, "secagg.graph", ctx.round), client_factory=factory,
            enrolment=self.enrolment, ranges=ranges,
        )

    def aggregate(self, messages: list[Message], pipeline: RobustPipeline, ctx: RoundContext) -> Aggregate:
        t_start = time.perf_counter()
        cfg = self.config
        if not messages:
            raise SecAggError(f"round {ctx.round}: no messages to aggregate")
        ids = [int(m.client_id) for m in messages]
        if len(set(ids)) != len(ids):
            raise SecAggError(f"round {ctx.round}: client ids repeat among the messages")
        shape = messages[0].vector.shape
        if any(m.vector.shape != shape for m in messages):
            raise SecAggError(f"round {ctx.round}: messages have different shapes")
        dtype = messages[0].vector.dtype

        inputs: dict[int, np.ndarray] = {}
        drop_at: dict[int, str] = {}
        stages = cfg.stages
        draws = numpy_stream(ctx.seed, "secagg.dropout", ctx.round).random((len(messages), len(stages)))
        nonfinite = 0
        for i, m in enumerate(messages):
            v = self.client_transform(m, ctx) if self.client_transform is not None else m.vector
            x = v.detach().to("cpu", torch.float64).reshape(-1).numpy()
            cid = ids[i]
            inputs[cid] = x
            for j, stage in enumerate(stages):
                if stage in cfg.drop_stages and draws[i, j] < cfg.dropout:
                    drop_at[cid] = stage
                    break
            if not np.isfinite(x).all():
                # the client withholds a non-finite update: to the protocol it is a dropout
                nonfinite += 1
                drop_at[cid] = "advertise"

        dim = int(np.prod(shape)) if len(shape) else 1
        ranges, p_clip = self.ranges(dim, len(messages))
        if p_clip is not None:
            self._warn_explicit(ranges, p_clip, len(messages), dim)
        out = self.run_parties(inputs, ctx, drop_at, ranges)
        self.last_outcome = out
        vector = torch.from_numpy(out.mean()).to(dtype).reshape(shape)
        record_aggregate(pipeline, vector)  # what pipeline(...) would have remembered

        n = len(ids)
        up = np.array([out.bytes_up[c] for c in ids], dtype=np.float64)
        down = np.array([out.bytes_down[c] for c in ids], dtype=np.float64)
        cost: dict[str, float] = {"aggregate_seconds": time.perf_counter() - t_start}
        for s in stages:
            cost[f"secagg_{s}_seconds"] = out.stage_seconds[s]
            cost[f"secagg_server_{s}_seconds"] = out.server_seconds[s]
            cs = out.client_seconds[s]
            cost[f"secagg_client_{s}_seconds"] = float(np.mean(cs)) if cs else 0.0
        cost["secagg_client_mask_seconds_max"] = max(out.client_seconds["mask"], default=0.0)
        cost.update(
            bytes_up=float(up.sum()), bytes_down=float(down.sum()),
            secagg_bytes_up=float(up.sum()), secagg_bytes_down=float(down.sum()),
            bytes_up_per_client_mean=float(up.mean()), bytes_up_per_client_max=float(up.max()),
            bytes_down_per_client_mean=float(down.mean()), bytes_down_per_client_max=float(down.max()),
        )
        metrics: dict[str, float] = {
            # prefixed: the engine's own "dropouts" counts clients lost before the protocol
            "secagg_survivors": float(len(out.survivors)),
            "secagg_dropouts": float(n - len(out.survivors)),
            "excluded_nonfinite": float(nonfinite),
            "secagg_threshold": float(out.threshold),
            "secagg_neighbors": float(out.neighbors),
            "secagg_quant_bits": float(out.quant_bits),
            "secagg_quant_error_bound": max(out.ranges.steps(out.quant_bits)) / 2 + 4.0 * 2.0**-52 * out.ranges.max_abs(),
            "secagg_rejected": float(len(out.rejected)),
            "secagg_client_aborts": float(len(out.aborted_clients)),
        }
        for s in stages:
            metrics[f"secagg_dropped_{s}"] = float(len(out.dropped[s]))
        metrics.update(self._clip_metrics(out, dim, p_clip))
        metrics["secagg_range"] = float(out.ranges.max_abs())  # what "auto" resolved to (the widest range)
        self._warn_destroyed(metrics, vector, out, ctx)
        seen = {
            "server": out.server_log,  # type, sender and size of every message; no vector
            "transport": {"bytes_up": dict(out.bytes_up), "bytes_down": dict(out.bytes_down)},
        }
        return Aggregate(vector=vector, count=len(out.survivors), cost=cost, seen=seen, metrics=metrics, included=tuple(out.survivors))


    def _warn_destroyed(self, metrics: dict[str, float], vector: Tensor, out: RoundOutcome, ctx: RoundContext) -> None:
        """Warn once per run when the encoding destroys the messages, naming ``secagg.range``:
        it clips more than :data:`CLIPPED_WARN_FRACTION` of the coordinates, or its quantization
        step exceeds the released mean's root-mean-square coordinate (what the server sees
        anyway), so the mean is mostly rounding."""
        rng = self.config.key_name("range")
        frac = metrics["secagg_clipped_fraction"]
        if frac > CLIPPED_WARN_FRACTION and "clipped" not in self._warned_destroyed:
            self._warned_destroyed.add("clipped")
            warnings.warn(
                f"secagg: {rng} = {self.config.range} ([-{metrics['secagg_range']:.3g}, {metrics['secagg_range']:.3g}]) clips "
                f"{frac:.1%} of the coordinates in round {ctx.round}: the mean loses their magnitudes; raise {rng} "
                "(a number c means [-c, c]) above the messages' largest coordinates (metric secagg_clipped_fraction)",
                UserWarning, stacklevel=3,
            )
        step = max(out.ranges.steps(out.quant_bits))
        rms = float(torch.sqrt(torch.mean(vector.double() ** 2))) if vector.numel() else 0.0
        if 0.0 < rms < step and "step" not in self._warned_destroyed:
            self._warned_destroyed.add("step")
            warnings.warn(
                f"secagg: the quantization step {step:.3g} of {rng} = {self.config.range} at "
                f"{out.quant_bits} bits exceeds the released mean's RMS coordinate {rms:.3g} in round {ctx.round}: "
                f"the mean is mostly rounding; lower {rng} towards the messages' scale, or raise secagg.bits",
                UserWarning, stacklevel=3,
            )

    def _clip_metrics(self, out: RoundOutcome, dim: int, p_clip: float | None) -> dict[str, float]:
        clients, coords = out.clipped()
        m = {
            "secagg_clipped_clients": float(clients),
            "secagg_clipped_coordinates": float(coords),
            "secagg_clipped_fraction": coords / (len(out.survivors) * dim),
        }
        if p_clip is not None:
            runs = self.declared_runs(dim)
            steps = out.ranges.steps(out.quant_bits)
            # the worst ratio of a quantization step to the noise std it rounds, over the runs
            ratios = [_step_on(out.ranges, steps, r, start) for r, start in _starts(runs) if r.noise_std > 0]
            m["secagg_clip_probability"] = p_clip
            m["secagg_uncredited_shares"] = 0.0 if self.meets_bound(p_clip) else float(clients)
            if ratios:
                m["secagg_quant_step_to_noise"] = max(ratios)
        return m


def _starts(runs: Sequence[NoisyRun]):
    start = 0
    for r in runs:
        yield r, start
        start += r.length


def _step_on(ranges: fixedpoint.Ranges, steps: tuple[float, ...], run: NoisyRun, start: int) -> float:
    """The largest quantization step over ``run``'s coordinates, divided by its noise std."""
    worst, pos = 0.0, 0
    for (n, _, _), step in zip(ranges.runs, steps):
        if pos < start + run.length and start < pos + n:
            worst = max(worst, step)
        pos += n
    return worst / run.noise_std


def from_config(cfg: Any) -> SecAggProtocol:
    """``protocol = "secagg"``: the protocol built from the experiment's ``[secagg]`` section."""
    return SecAggProtocol(cfg.secagg)
