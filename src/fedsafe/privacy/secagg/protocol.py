"""``protocol = "secagg"``: the engine-facing secure aggregation protocol.

Each round runs the full multi-party protocol (:func:`session.run_round`) among one client party
per message and a server party, over an in-memory transport that counts bytes. The server ends
with the exact integer sum of the survivors' quantized updates and nothing else; the aggregate
is that sum decoded and divided by the number of survivors (the ``mean`` rule over survivors).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.errors import ProtocolError
from fedsafe.core.streams import numpy_stream
from fedsafe.core.types import Aggregate, Message, RoundContext
from fedsafe.privacy.secagg import crypto
from fedsafe.privacy.secagg.config import SecAggConfig
from fedsafe.privacy.secagg.errors import SecAggError
from fedsafe.privacy.secagg.pki import Enrolment
from fedsafe.privacy.secagg.session import RoundOutcome, run_round, seeded_randomness
from fedsafe.robust.pipeline import RobustPipeline


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
        if self.config.adversary == "active":
            seeded = key_seed is not None
            self.enrolment = Enrolment(
                (lambda cid: crypto.SeededRandomness(key_seed, f"enrol/{cid}")) if seeded else None
            )

    def check(self, pipeline: RobustPipeline) -> None:
        """Secure aggregation reveals only the sum, so only the plain mean can run on it."""
        problems = []
        if pipeline.rule_name != "mean":
            problems.append(f"rule {pipeline.rule_name!r}")
        if pipeline.pre:
            problems.append("pre-aggregators " + ", ".join(repr(p[0]) for p in pipeline.pre))
        if problems:
            raise ProtocolError(
                f"secure aggregation reveals only the sum of the updates, never an individual one, so "
                f"{' and '.join(problems)} (which need individual updates) cannot run on it; use "
                f"robust.rule = 'mean' with no pre-aggregators, or protocol = 'plain'"
            )

    def quantization_error_bound(self, num_clients: int) -> float:
        """Per-coordinate bound on |aggregate - mean of clipped updates| for this many survivors' round."""
        return self.config.quantization_error_bound(num_clients)

    def run_parties(self, inputs: dict[int, np.ndarray], ctx: RoundContext, drop_at: dict[int, str]) -> RoundOutcome:
        """Run the round's parties on ``inputs`` (client id -> float vector): here, in this process
        (or on Ray actors), over the in-memory transport; ``fedsafe.flower`` runs them on the
        SuperNodes instead."""
        randomness = seeded_randomness(self.key_seed, ctx.round) if self.key_seed is not None else None
        factory = None
        if self.config.placement == "ray":
            from fedsafe.privacy.secagg.ray_parties import ray_client_factory

            factory = ray_client_factory()
        return run_round(
            inputs, self.config, round_=ctx.round, drop_at=drop_at, randomness=randomness,
            graph_rng=numpy_stream(ctx.seed, "secagg.graph", ctx.round), client_factory=factory,
            enrolment=self.enrolment,
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

        out = self.run_parties(inputs, ctx, drop_at)
        self.last_outcome = out
        vector = torch.from_numpy(out.mean()).to(dtype).reshape(shape)
        pipeline.previous = vector  # what pipeline(...) would have remembered

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
            "secagg_neighbours": float(out.neighbours),
            "secagg_quant_bits": float(out.quant_bits),
            "secagg_quant_error_bound": cfg.clip / ((1 << out.quant_bits) - 1) + 4.0 * 2.0**-52 * cfg.clip,
            "secagg_rejected": float(len(out.rejected)),
            "secagg_client_aborts": float(len(out.aborted_clients)),
        }
        for s in stages:
            metrics[f"secagg_dropped_{s}"] = float(len(out.dropped[s]))
        seen = {
            "server": out.server_log,  # type, sender and size of every message; no vector
            "transport": {"bytes_up": dict(out.bytes_up), "bytes_down": dict(out.bytes_down)},
        }
        return Aggregate(vector=vector, count=len(out.survivors), cost=cost, seen=seen, metrics=metrics, included=tuple(out.survivors))


def from_config(cfg: Any) -> SecAggProtocol:
    """``protocol = "secagg"``: the protocol built from the experiment's ``[secagg]`` section."""
    return SecAggProtocol(cfg.secagg)
