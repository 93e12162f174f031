"""One round's stages, written once: the engine (:class:`~fedsafe.engine.federation.Federation`)
and the Flower strategy (:class:`~fedsafe.flower.strategy.FedsafeStrategy`) both run them.

Each caller resolves a :class:`RoundPlan` once, when it is set up: the protocol, the robust
pipeline, the round plugins sorted by the stages they take part in, where the client-side
transform runs, how the released aggregate becomes a descent direction, and which errors of
the protocol skip a round. A round then runs, in this order (docs/architecture.md, §2)::

    honest updates (the caller's client work)
    ─► rule inputs            pipeline.begin_round: what the rule computes on the server's own
                              data before it sees any message (FLTrust's root update)
    ─► client transform       here: ClientTransform.transform_honest on the rows;
                              remote (the clients ran it): ClientTransform.observe_honest(reports)
    ─► messages               the honest rows + the Byzantine messages (the engine's attack)
                              + ServerTransform.extra_messages (audit canaries)
    ─► transform_messages     ServerTransform, only if the protocol reveals messages
    ─► protocol.aggregate     an Aggregate; its cost and metrics go into the row
    ─► transform_aggregate    ServerTransform (central DP noise, canary cosines)
    ─► decode ─► finite? ─► server step
    ─► transform_model        on the new global model, inside the caller's step
                              (finish_step; CRFL: clip to ρ_t, add N(0, σ² I))
    ... the caller evaluates ...
    ─► on_round_end           Observer: keys merged into the row (the accountant's ε)

:func:`aggregate_and_step` runs the stages up to the server step; :func:`finish_step` the
model stage, which each caller's step calls on the parameters its optimizer returned (the
round module does not hold the model; ``release_empty``'s step passes through it too);
:func:`end_round` the observers; :func:`release_empty` what the server releases when nobody was sampled;
:func:`plugin_summary` the observers' summary keys. A stage runs over the plugins that implement
its hook (:func:`fedsafe.core.plugins.implementing`), in the order the plugins were made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.plugins import RoundHost, implementing
from fedsafe.core.protocol import ProtocolError
from fedsafe.core.types import Messages, RoundContext

Decode = Callable[[Tensor, int], Tensor]
Step = Callable[[Tensor], None]


@dataclass(frozen=True)
class RoundPlan:
    """What a round runs, resolved once from the config and the set-up (:func:`resolve_plan`).

    ``clients_remote``: the clients ran the client-side transforms themselves (Flower nodes;
    DP noise added by ``dp_mod``), so the server's plugins only observe what they report;
    ``reveals_messages``: the protocol shows the server each message (server-side transforms of
    single messages run); ``record_cost``: the protocol's cost figures go into the row;
    ``skip_on``: the errors of ``protocol.aggregate`` that skip the round (their message is the
    row's ``skipped``) instead of propagating.
    """

    protocol: Any
    pipeline: Any
    plugins: tuple[Any, ...]
    decode: Decode
    clients_remote: bool = False
    reveals_messages: bool = True
    record_cost: bool = True
    skip_on: tuple[type[BaseException], ...] = (ProtocolError,)
    # the plugins of each stage, in the order they were made
    transform_honest: tuple[Any, ...] = field(default=(), repr=False)
    observe_honest: tuple[Any, ...] = field(default=(), repr=False)
    extra_messages: tuple[Any, ...] = field(default=(), repr=False)
    transform_messages: tuple[Any, ...] = field(default=(), repr=False)
    transform_aggregate: tuple[Any, ...] = field(default=(), repr=False)
    empty_aggregate: tuple[Any, ...] = field(default=(), repr=False)
    transform_model: tuple[Any, ...] = field(default=(), repr=False)
    on_round_end: tuple[Any, ...] = field(default=(), repr=False)
    summary: tuple[Any, ...] = field(default=(), repr=False)

    def with_protocol(self, protocol: Any) -> RoundPlan:
        """The same plan with another protocol (a caller that swaps its protocol after set-up)."""
        return replace(self, protocol=protocol, reveals_messages=bool(protocol.reveals_messages))

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this plan runs, in order (the ones without plugins left out)."""
        out = ["rule inputs" if getattr(self.pipeline, "uses_server_update", False) else None,
               "observe_honest" if self.clients_remote and self.observe_honest else None,
               "transform_honest" if not self.clients_remote and self.transform_honest else None,
               "extra_messages" if self.extra_messages else None,
               "transform_messages" if self.reveals_messages and self.transform_messages else None,
               "aggregate",
               "transform_aggregate" if self.transform_aggregate else None,
               "decode", "step",
               "transform_model" if self.transform_model else None,
               "on_round_end" if self.on_round_end else None]
        return tuple(s for s in out if s is not None)


def resolve_plan(
    protocol: Any,
    pipeline: Any,
    plugins: Sequence[Any],
    decode: Decode,
    *,
    clients_remote: bool = False,
    record_cost: bool = True,
    skip_on: tuple[type[BaseException], ...] = (ProtocolError,),
) -> RoundPlan:
    """The :class:`RoundPlan` of a set-up: each stage's plugins are those that implement its hook."""
    plugins = tuple(plugins)
    hooks = ("transform_honest", "observe_honest", "extra_messages", "transform_messages", "transform_aggregate",
             "empty_aggregate", "transform_model", "on_round_end", "summary")
    return RoundPlan(
        protocol=protocol, pipeline=pipeline, plugins=plugins, decode=decode, clients_remote=clients_remote,
        reveals_messages=bool(protocol.reveals_messages), record_cost=record_cost, skip_on=skip_on,
        **{h: implementing(plugins, h) for h in hooks},
    )


def aggregate_and_step(
    plan: RoundPlan,
    ctx: RoundContext,
    honest: np.ndarray,
    updates: Tensor,
    row: dict[str, Any],
    step: Step,
    *,
    params: Tensor | None = None,
    reports: Sequence[dict[str, float]] | None = None,
    byzantine: Callable[[Tensor], Messages | None] | None = None,
) -> str | None:
    """The round's stages from the honest updates (row i: client ``honest[i]``) to the server
    step (``step(direction)``). Returns why the round was skipped (None: it stepped).

    ``params``: the round's global model, for a rule that computes its own inputs on the server
    (``pipeline.begin_round``); ``reports``: with remote clients, each honest client's plugin
    reports, in row order; ``byzantine(honest rows after the client transform)``: the
    Byzantine clients' messages, if any."""
    t = ctx.round
    begin = getattr(plan.pipeline, "begin_round", None)
    if begin is not None and params is not None:  # before any aggregation, the attackers' included
        begin(t, params)
    if plan.clients_remote:  # the clients transformed their own rows
        reps = list(reports) if reports is not None else [{} for _ in honest]
        for p in plan.observe_honest:
            p.observe_honest(ctx, honest, reps)
    else:
        for p in plan.transform_honest:
            updates = p.transform_honest(updates, ctx, honest)
    messages = Messages(honest, updates)  # no copy: the rows of the client work's output
    if byzantine is not None:
        byz = byzantine(updates)
        if byz is not None:
            messages = messages + byz
    for p in plan.extra_messages:
        messages = messages + p.extra_messages(ctx, updates.shape[1])
    if plan.reveals_messages:
        for p in plan.transform_messages:
            messages = p.transform_messages(messages, ctx)
    try:
        agg = plan.protocol.aggregate(messages, plan.pipeline, ctx)
    except plan.skip_on as e:
        return str(e)
    if plan.record_cost:
        row.update(agg.cost)
    row.update(agg.metrics)
    vector = agg.vector
    for p in plan.transform_aggregate:
        vector = p.transform_aggregate(vector, ctx, agg)
    direction = plan.decode(vector, t)
    if not bool(torch.isfinite(direction).all()):
        return "non-finite aggregate"
    step(direction)
    return None


def release_empty(plan: RoundPlan, ctx: RoundContext, dim: int, step: Step) -> bool:
    """Nobody was sampled: every plugin's ``empty_aggregate`` runs, and the server steps on
    the first one released (DP: noise, so emptiness reveals nothing). Returns whether anything
    was released."""
    released = [v for p in plan.empty_aggregate if (v := p.empty_aggregate(ctx, dim)) is not None]
    if not released:
        return False
    step(plan.decode(released[0], ctx.round))
    return True


def finish_step(plan: RoundPlan, params: Tensor, t: int) -> Tensor:
    """The model stage, after round ``t``'s server step: each plugin's
    ``transform_model(params, t)`` on the new global model, in order (CRFL clips it to ρ_t and
    adds N(0, σ_train² I)). Each caller's step calls it on the parameters its optimizer returned,
    before it stores them (and before the engine's moving average sees them)."""
    for p in plan.transform_model:
        params = p.transform_model(params, t)
    return params


def end_round(plan: RoundPlan, host: RoundHost, row: dict[str, Any]) -> None:
    """The observers, after the step (and the caller's evaluation): their keys join ``row``."""
    for p in plan.on_round_end:
        row.update(p.on_round_end(host, row))


def plugin_summary(plan: RoundPlan, host: RoundHost) -> dict[str, Any]:
    """The observers' keys for ``summary.json``."""
    out: dict[str, Any] = {}
    for p in plan.summary:
        out.update(p.summary(host))
    return out
