"""Drive one round among in-process parties: the server and one :class:`ClientParty` per input.

The driver plays the network and the clock only: it lets each online party process its mailbox
in turn, and closes a stage when every online client has had its turn (the stage deadline).
Parties exchange nothing but bytes through the transport. A client dropping "at" a stage is
offline from that stage on: it never sends that stage's message (nor any later one), and what
was sent to it is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedsafe.protocols.secagg import crypto, fixedpoint
from fedsafe.protocols.secagg.client import ClientParty
from fedsafe.protocols.secagg.config import SecAggConfig
from fedsafe.protocols.secagg.errors import SecAggError
from fedsafe.protocols.secagg.pki import Enrolment
from fedsafe.protocols.secagg.server import ServerParty
from fedsafe.protocols.secagg.transport import InMemoryTransport

Randomness = crypto.OsRandomness | crypto.SeededRandomness


@dataclass
class RoundOutcome:
    """What a completed round produced and cost."""

    total: np.ndarray  # exact sum mod 2^bits of the survivors' quantized inputs
    survivors: tuple[int, ...]
    participants: tuple[int, ...]
    bits: int
    quant_bits: int
    ranges: fixedpoint.Ranges  # the encoding the server announced
    threshold: int
    neighbors: int
    dropped: dict[str, tuple[int, ...]]  # offline from this stage on (simulated)
    aborted_clients: tuple[int, ...]  # clients that stopped by their own checks
    stage_seconds: dict[str, float]  # wall time of each stage, all parties
    client_seconds: dict[str, list[float]]  # per online client, per stage
    server_seconds: dict[str, float]
    bytes_up: dict[int, int]  # per client, sent to the server
    bytes_down: dict[int, int]  # per client, sent by the server
    server_log: list[dict[str, object]]
    rejected: list[str] = field(default_factory=list)
    clip_stats: np.ndarray | None = None  # exact sum of the survivors' clipping-statistics words

    def mean(self) -> np.ndarray:
        """The float64 mean of the survivors' clipped updates (up to quantization)."""
        return fixedpoint.decode_mean(self.total, len(self.survivors), self.ranges, self.quant_bits)

    def clipped(self) -> tuple[int, int]:
        """``(survivors that clipped a coordinate, clipped coordinates)``: all the server learns
        of the clipping, from the securely summed statistics words."""
        if self.clip_stats is None:
            raise ValueError("this outcome carries no clipping statistics")
        return fixedpoint.decode_stats(self.clip_stats, len(self.survivors), self.ranges.dim, self.quant_bits)


def run_round(
    inputs: Mapping[int, np.ndarray],
    config: SecAggConfig,
    *,
    round_: int = 1,
    drop_at: Mapping[int, str] | None = None,
    transport: InMemoryTransport | None = None,
    randomness: Callable[[str], Randomness] | None = None,
    graph_rng: np.random.Generator | None = None,
    keep: dict | None = None,
    client_factory: Callable[..., object] | None = None,
    server_factory: Callable[..., ServerParty] | None = None,
    enrolment: Enrolment | None = None,
    ranges: fixedpoint.Ranges | None = None,
) -> RoundOutcome:
    """Run the full protocol for ``inputs`` (client id -> float update vector).

    ``drop_at`` maps a client to the stage (one of ``config.stages``) from which it is offline.
    ``randomness(label)`` supplies each party's random bytes (default: the OS); pass seeded
    sources for reproducible keys in tests only. ``keep``, when given, receives the party
    objects (``"server"``, ``"clients"``, ``"transport"``) so tests can inspect them.
    ``client_factory(id, vector, transport, round_=, rand=)`` builds the client parties
    (default :class:`ClientParty` in this process; :func:`.ray_parties.ray_client_factory`
    places each on a Ray actor). ``server_factory`` builds the server party, with
    :class:`ServerParty`'s arguments (default :class:`ServerParty`; tests pass malicious ones).
    With ``config.adversary = "active"``, ``enrolment`` is the PKI (clients not yet enrolled are
    enrolled; default: a fresh one with OS keys): each client party gets its own identity
    (``identity=`` of the factory), the server only the directory.
    ``ranges`` is the encoding (default ``[-c, c]`` everywhere, ``c = config.fixed_range``).
    Raises :class:`SecAggError` when the round aborts.
    """
    stages = config.stages
    drop_at = dict(drop_at or {})
    for c, s in drop_at.items():
        if s not in stages:
            raise ValueError(f"client {c}: unknown stage {s!r}; valid: {', '.join(stages)}")
        if c not in inputs:
            raise ValueError(f"drop_at names client {c}, which has no input")
    ids = sorted(int(c) for c in inputs)
    if not ids:
        raise SecAggError("no participants")
    dims = {np.asarray(v).size for v in inputs.values()}
    if len(dims) != 1:
        raise SecAggError(f"inputs have different sizes: {sorted(dims)}")
    dim = dims.pop()
    rand = randomness or (lambda label: crypto.OsRandomness())
    net = transport if transport is not None else InMemoryTransport()
    make_server = server_factory or ServerParty
    make_client = client_factory or ClientParty
    if config.adversary == "active":
        enrolment = enrolment if enrolment is not None else Enrolment()
        enrolment.enrol(ids)
        server = make_server(ids, config, dim, net, round_=round_, rand=rand("server"), graph_rng=graph_rng,
                             directory=enrolment.directory, ranges=ranges)
        clients = {
            c: make_client(c, inputs[c], net, round_=round_, rand=rand(f"client/{c}"),
                           identity=enrolment.identity(c))
            for c in ids
        }
    else:
        server = make_server(ids, config, dim, net, round_=round_, rand=rand("server"), graph_rng=graph_rng,
                             ranges=ranges)
        clients = {c: make_client(c, inputs[c], net, round_=round_, rand=rand(f"client/{c}")) for c in ids}
    if keep is not None:
        keep.update(server=server, clients=clients, transport=net)

    stage_index = {s: i for i, s in enumerate(stages)}
    offline_from = {c: stage_index[s] for c, s in drop_at.items()}
    stage_seconds: dict[str, float] = {}
    client_seconds: dict[str, list[float]] = {s: [] for s in stages}
    server_seconds: dict[str, float] = {s: 0.0 for s in stages}

    t_stage = time.perf_counter()
    t0 = time.perf_counter()
    server.start()
    server_seconds["advertise"] += time.perf_counter() - t0
    for i, stage in enumerate(stages):
        for c in ids:
            if offline_from.get(c, len(stages)) <= i:
                net.discard(c)
                continue
            t0 = time.perf_counter()
            clients[c].step()
            client_seconds[stage].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            server.step()  # streaming: masked inputs are summed as they arrive
            server_seconds[stage] += time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            server.close_stage()
        except SecAggError as e:
            raise _with_client_aborts(e, clients) from None
        now = time.perf_counter()
        server_seconds[stage] += now - t0
        stage_seconds[stage] = now - t_stage
        t_stage = now

    _close(clients)
    dropped = {s: tuple(sorted(c for c, j in offline_from.items() if j == stage_index[s])) for s in stages}
    rejected = [str(e) for e in server.rejected] + [str(e) for c in clients.values() for e in c.rejected]
    return RoundOutcome(
        total=server.total,
        survivors=server.survivors,
        participants=tuple(ids),
        bits=config.bits,
        quant_bits=server.quant_bits,
        ranges=server.ranges,
        threshold=server.threshold,
        neighbors=server.k,
        dropped=dropped,
        aborted_clients=tuple(c for c in ids if clients[c].abort_reason is not None),
        stage_seconds=stage_seconds,
        client_seconds=client_seconds,
        server_seconds=server_seconds,
        bytes_up={c: net.bytes_sent[c] for c in ids},
        bytes_down={c: net.bytes_received[c] for c in ids},
        server_log=list(server.log),
        rejected=rejected,
        clip_stats=server.clip_stats,
    )


def _close(clients: Mapping[int, object]) -> None:
    for party in clients.values():
        close = getattr(party, "close", None)
        if close is not None:
            close()


def _with_client_aborts(e: SecAggError, clients: Mapping[int, object]) -> SecAggError:
    """The round-level error, naming the clients that stopped by their own checks (their abort
    is usually why too few clients answered: a misbehaving server)."""
    _close(clients)
    aborted = {c: p.abort_reason for c, p in clients.items() if p.abort_reason is not None}
    if not aborted:
        return e
    first = next(iter(aborted.values()))
    out = SecAggError(f"{str(e).removeprefix('secagg: ')}; {len(aborted)} clients aborted, e.g. {first}")
    out.sender, out.field = e.sender, e.field
    return out


def seeded_randomness(seed: int, round_: int) -> Callable[[str], crypto.SeededRandomness]:
    """Per-party deterministic randomness for ``run_round`` — tests and benchmarks only."""
    return lambda label: crypto.SeededRandomness(seed, f"round/{round_}/{label}")

