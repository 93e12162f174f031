"""Aggregation protocols decide who sees what (DESIGN.md: plain | secagg | he | tee).

A protocol receives the round's client messages and the server's robust pipeline and returns
an :class:`Aggregate`: the aggregate in the message space, its cost per phase, and what each
non-client party saw. Combinations a protocol cannot run are refused by ``check`` at config
time, with the reason.
"""

from __future__ import annotations

import time
from typing import Protocol as TypingProtocol

import torch

from fedsafe.core.types import Aggregate, Message, RoundContext, stack_messages
from fedsafe.robust.pipeline import RobustPipeline


class ProtocolError(ValueError):
    """An impossible protocol / rule combination, or a round the protocol cannot complete."""


class SecureProtocol(TypingProtocol):
    name: str
    reveals_messages: bool  # whether the server sees individual messages (server-side transforms)

    def check(self, pipeline: RobustPipeline) -> None: ...

    def aggregate(self, messages: list[Message], pipeline: RobustPipeline, ctx: RoundContext) -> Aggregate: ...


def finite_rows(updates: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the rows whose every entry is finite.

    NaN propagates through max/min and ±Inf is the max or min of its row, so two row
    reductions decide it without materialising an (n, d) boolean matrix (~10x faster).
    """
    return torch.isfinite(updates.amax(dim=1)) & torch.isfinite(updates.amin(dim=1))


class PlainProtocol:
    """The server receives every message in the clear and runs the robust pipeline.

    Non-finite updates (NaN/Inf, from a faulty or malicious client) never reach the rule: they
    are excluded first and counted in ``metrics["excluded_nonfinite"]``.
    """

    name = "plain"
    reveals_messages = True

    def check(self, pipeline: RobustPipeline) -> None:
        return None  # the server holds individual updates, so every rule can run

    def aggregate(self, messages: list[Message], pipeline: RobustPipeline, ctx: RoundContext) -> Aggregate:
        t0 = time.perf_counter()
        updates = stack_messages(messages)
        ok = finite_rows(updates)
        excluded = int((~ok).sum())
        kept = updates[ok] if excluded else updates
        if kept.shape[0] == 0:
            raise ProtocolError(f"round {ctx.round}: every update was non-finite")
        vector = pipeline(kept, ctx.round)
        return Aggregate(
            vector=vector,
            count=int(kept.shape[0]),
            cost={
                "aggregate_seconds": time.perf_counter() - t0,
                "bytes_up": float(sum(m.vector.numel() * m.vector.element_size() for m in messages)),
            },
            seen={"server": "individual updates"},
            metrics={"excluded_nonfinite": float(excluded)},
            included=tuple(int(m.client_id) for m, keep in zip(messages, ok.tolist()) if keep),
        )


def make_protocol(cfg) -> SecureProtocol:
    """The protocol named by ``cfg.protocol``, built from its config section."""
    if cfg.protocol == "plain":
        return PlainProtocol()
    if cfg.protocol == "secagg":
        from fedsafe.privacy.secagg import SecAggProtocol

        return SecAggProtocol(cfg.secagg)
    if cfg.protocol == "he":
        from fedsafe.privacy.he import HEProtocol

        return HEProtocol(cfg.he)
    if cfg.protocol == "tee":
        from fedsafe.privacy.tee import TEEProtocol

        return TEEProtocol(cfg.tee)
    raise ProtocolError(f"unknown protocol {cfg.protocol!r}; valid: plain, secagg, he, tee")
