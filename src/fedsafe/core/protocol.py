"""Aggregation protocols decide who sees what: the interface, the registry, and ``plain``.

A protocol receives the round's client messages and the server's robust pipeline and returns
an :class:`Aggregate`: the aggregate in the message space, its cost per phase, and what each
non-client party saw. Combinations a protocol cannot run are refused by ``check`` at config
time, with the reason; ``preflight`` (optional) checks a round of the configured size and
message dimension before the run starts.

:data:`PROTOCOLS` maps the config's ``protocol`` name to a factory ``(ExperimentConfig) ->
SecureProtocol``. The built-in ones are registered lazily here (``secagg``, ``he``, ``tee``
load only when chosen); a new protocol registers its factory with
``PROTOCOLS.register("name")`` (or ``register_lazy``) and the engine needs no change.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol

from fedsafe.core.errors import ProtocolError
from fedsafe.core.registry import Registry
from fedsafe.core.types import Aggregate, Message, RoundContext, client_ids, stack_messages

if TYPE_CHECKING:
    import torch


class SecureProtocol(TypingProtocol):
    """What the engine asks of a protocol. ``pipeline`` is the server's robust pipeline
    (:class:`fedsafe.robust.pipeline.RobustPipeline`): calling it aggregates an (n, d) tensor
    (and remembers the result). A protocol that performs the aggregation itself instead reads
    ``pipeline.spec`` (a read-only ``PipelineSpec``: the rule, its params, ``f``, the
    pre-aggregators), hands its aggregate to ``pipeline.record(vector)``, and names the rules
    it performs in ``performs()``, which its ``check`` refuses every other rule by (None: it
    runs the pipeline, so every rule). A protocol may also define
    ``preflight(n, pipeline, *, dim)`` (config-time check of a round's size), ``close()`` and
    ``state_dict`` / ``load_state_dict``."""

    name: str
    reveals_messages: bool  # whether the server sees individual messages (server-side transforms)

    def performs(self) -> tuple[str, ...] | None: ...

    def check(self, pipeline: Any) -> None: ...

    def aggregate(self, messages: list[Message], pipeline: Any, ctx: RoundContext) -> Aggregate: ...


def finite_rows(updates: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the rows whose every entry is finite.

    One pass: a row's sum is finite when every entry is (NaN and ±Inf propagate), so only the
    rows whose sum is not finite — a non-finite entry, or finite entries whose sum overflows —
    are looked at again, with max and min (NaN propagates through both, ±Inf is one of them).
    """
    import torch

    ok = torch.isfinite(updates.sum(dim=1))
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten()
        rows = updates.index_select(0, bad)
        ok[bad] = torch.isfinite(rows.amax(dim=1)) & torch.isfinite(rows.amin(dim=1))
    return ok


class PlainProtocol:
    """The server receives every message in the clear and runs the robust pipeline.

    Non-finite updates (NaN/Inf, from a faulty or malicious client) never reach the rule: they
    are excluded first and counted in ``metrics["excluded_nonfinite"]``.
    """

    name = "plain"
    reveals_messages = True

    def performs(self) -> None:
        """None: the server runs the pipeline itself, so every rule."""
        return None

    def check(self, pipeline: Any) -> None:
        return None  # the server holds individual updates, so every rule can run

    def aggregate(self, messages: list[Message], pipeline: Any, ctx: RoundContext) -> Aggregate:
        t0 = time.perf_counter()
        updates = stack_messages(messages)
        ok = finite_rows(updates)
        excluded = int((~ok).sum())
        kept = updates[ok] if excluded else updates
        if kept.shape[0] == 0:
            raise ProtocolError(f"round {ctx.round}: every update was non-finite")
        ids = [c for c, keep in zip(client_ids(messages), ok.tolist()) if keep]
        vector = pipeline(kept, ctx.round, ids)
        return Aggregate(
            vector=vector,
            count=int(kept.shape[0]),
            cost={
                "aggregate_seconds": time.perf_counter() - t0,
                "bytes_up": float(updates.numel() * updates.element_size()),
            },
            seen={"server": "individual updates"},
            metrics={"excluded_nonfinite": float(excluded)},
            included=tuple(ids),
        )


def plain(cfg: Any) -> PlainProtocol:
    """the server receives every message in the clear and runs the robust pipeline"""
    return PlainProtocol()


PROTOCOLS: Registry = Registry("protocol")
PROTOCOLS.register("plain")(plain)
PROTOCOLS.register_lazy(
    "secagg", "fedsafe.protocols.secagg.protocol:from_config",
    "only the sum: Bonawitz et al. secure aggregation, SecAgg+ graphs, semi-honest or active server",
)
PROTOCOLS.register_lazy(
    "he", "fedsafe.protocols.he.protocol:from_config",
    "trimmed mean / median over BFV ciphertexts (SABLE)",
)
PROTOCOLS.register_lazy(
    "tee", "fedsafe.protocols.tee.protocol:from_config",
    "an enclave offloads encoded distance computations to untrusted accelerators (Hashemi et al.)",
)


def make_protocol(cfg: Any) -> SecureProtocol:
    """The protocol named by ``cfg.protocol``, built by its registered factory."""
    return PROTOCOLS.entry(cfg.protocol).impl(cfg)
