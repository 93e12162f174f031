"""Secure aggregation over Flower: fedsafe's own Bonawitz/SecAgg+ parties, talking through Flower
messages instead of the in-process transport.

The server party (:class:`fedsafe.protocols.secagg.server.ServerParty`) runs in the ServerApp;
each client party (:class:`fedsafe.protocols.secagg.client.ClientParty`) runs on the SuperNode
that holds the client's update, which never leaves it unmasked. A stage is one Flower message
per online client, carrying the bytes the server party addressed to it; the reply carries the
bytes the client party sends back. A node that does not answer a stage within the timeout (its
process was killed, its network is gone) is offline from that stage on, exactly as a dropout
in the in-process protocol: the server recovers the survivors' sum from the other clients'
shares as long as the threshold holds, and otherwise the round is skipped.

The wire bytes are those of :mod:`fedsafe.protocols.secagg.wire` (decoded and checked by each
party; nothing is unpickled). Keys and masks come from the OS, on the node (see
:mod:`fedsafe.flower.client` for how a node keeps its party across Flower's per-message
processes; the node's side is :mod:`fedsafe.flower.party`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedsafe.core.streams import numpy_stream
from fedsafe.core.types import RoundContext
from fedsafe.flower.party import client_stage  # noqa: F401  (the node's side, re-exported; see fedsafe.flower.party)
from fedsafe.flower.records import CONF, SECAGG, FlowerError, config_value
from fedsafe.protocols.secagg import crypto
from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.protocol import SecAggProtocol
from fedsafe.protocols.secagg.server import ServerParty
from fedsafe.protocols.secagg.session import RoundOutcome
from fedsafe.protocols.secagg.transport import InMemoryTransport
from fedsafe.protocols.secagg.wire import SERVER


class FlowerSecAgg(SecAggProtocol):
    """``protocol = "secagg"`` with the client parties on Flower SuperNodes.

    ``nodes`` maps a fedsafe client id to its Flower node id and sends messages
    (:class:`fedsafe.flower.nodes.Nodes`). The semi-honest variant only: the active one needs a
    PKI that the nodes and the server both trust, which Flower does not provide (refused at
    set-up, :func:`check_config`). Emulated dropouts (``secagg.dropout``) still apply on top of
    the real ones: the server then does not contact the chosen clients from that stage on.
    """

    def __init__(self, config: Any, nodes: Any) -> None:
        super().__init__(config)
        self.nodes = nodes

    def run_parties(
        self, inputs: dict[int, np.ndarray], ctx: RoundContext, drop_at: dict[int, str], ranges: Any = None,
    ) -> RoundOutcome:
        cfg = self.config
        stages = cfg.stages
        ids = sorted(inputs)
        dim = next(iter(inputs.values())).size
        net = InMemoryTransport()
        server = ServerParty(
            ids, cfg, dim, net, round_=ctx.round, rand=crypto.OsRandomness(),
            graph_rng=numpy_stream(ctx.seed, "secagg.graph", ctx.round), ranges=ranges,  # announced in SETUP
        )
        index = {s: i for i, s in enumerate(stages)}
        offline_from = {c: index[s] for c, s in drop_at.items()}
        stage_seconds: dict[str, float] = {}
        client_seconds: dict[str, list[float]] = {s: [] for s in stages}
        server_seconds = {s: 0.0 for s in stages}
        rejected: list[str] = []
        aborted: list[int] = []
        t_stage = t0 = time.perf_counter()
        server.start()
        server_seconds[stages[0]] += time.perf_counter() - t0
        for i, stage in enumerate(stages):
            asked: dict[int, list[bytes]] = {}
            for c in ids:
                if offline_from.get(c, len(stages)) <= i:
                    net.discard(c)
                    continue
                asked[c] = [payload for _, payload in net.receive(c)]
            replies = self.nodes.ask(
                SECAGG, {c: {"round": ctx.round, "client": c, "stage": i, "payloads": p} for c, p in asked.items()},
            )
            for c in asked:
                conf = replies.get(c)
                if conf is None:  # no answer in time: offline from this stage on
                    offline_from[c] = i
                    continue
                what = f"secure-aggregation reply of client {c}"
                for payload in config_value(conf, "payloads", list, what=what):
                    if not isinstance(payload, bytes):
                        raise FlowerError(f"{what}: payloads must be bytes")
                    net.send(c, SERVER, payload)
                client_seconds[stage].append(float(config_value(conf, "seconds", float, what=what)))
                rejected.extend(str(r) for r in conf.get("rejected", []))
                if conf.get("abort", ""):
                    aborted.append(c)
            t0 = time.perf_counter()
            server.step()
            try:
                server.close_stage()
            except SecAggError as e:
                if aborted:
                    e = SecAggError(f"{str(e).removeprefix('secagg: ')}; clients {sorted(set(aborted))} aborted")
                raise e from None
            now = time.perf_counter()
            server_seconds[stage] += now - t0
            stage_seconds[stage] = now - t_stage
            t_stage = now
        dropped = {s: tuple(sorted(c for c, j in offline_from.items() if j == index[s])) for s in stages}
        return RoundOutcome(
            total=server.total, survivors=server.survivors, participants=tuple(ids), bits=cfg.bits,
            quant_bits=server.quant_bits, ranges=server.ranges, threshold=server.threshold, neighbors=server.k,
            dropped=dropped, aborted_clients=tuple(sorted(set(aborted))), stage_seconds=stage_seconds,
            client_seconds=client_seconds, server_seconds=server_seconds,
            bytes_up={c: net.bytes_sent[c] for c in ids}, bytes_down={c: net.bytes_received[c] for c in ids},
            server_log=list(server.log), rejected=[str(e) for e in server.rejected] + rejected,
            clip_stats=server.clip_stats,
        )


def check_config(cfg: Any) -> list[str]:
    """What of ``cfg`` secure aggregation over Flower cannot run (empty: all of it can)."""
    problems = []
    sa = cfg.secagg
    if sa.adversary == "active":
        problems.append(
            "secagg.adversary = 'active' needs a PKI that both the nodes and the server trust (Flower provides none); "
            "use adversary = 'semi_honest' over Flower"
        )
    if sa.execution != "serial":
        key = sa.key_name("execution")
        problems.append(f"{key}: over Flower the client parties run on the SuperNodes; leave secagg.execution = 'serial'")
    if cfg.attack.f > 0 and cfg.attack.name != "none":
        problems.append(
            f"attack {cfg.attack.name!r}: fedsafe emulates Byzantine clients at the server from the honest updates, "
            "which secure aggregation hides from it; use attack.f = 0 or attack.name = 'none' with secagg over Flower"
        )
    if cfg.audit.enabled:
        problems.append("audit: canary clients are not supported with secure aggregation over Flower")
    return problems
