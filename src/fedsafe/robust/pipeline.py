"""The server's robust aggregation pipeline: pre-aggregators in order, then the rule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedsafe.core.streams import torch_stream
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.preaggregators import PREAGGREGATORS


class RobustPipeline:
    """``rule(pre_k(...pre_1(updates)))`` with the configured parameters.

    The only state is the previous round's aggregate, handed explicitly to rules that take it
    (centered clipping) and saved in checkpoints. Rules that take ``server_update`` (FLTrust)
    get :attr:`server_update`, which the engine sets every round before anything aggregates;
    randomised rules (FLAME) draw from the stream ``("robust.rule", round)``. Randomised pre-aggregators (bucketing) draw
    from the stream ``("robust.pre", round, position)``.
    """

    def __init__(
        self,
        rule: str,
        rule_params: dict[str, Any],
        pre: Sequence[tuple[str, dict[str, Any]]],
        f: int,
        seed: int,
    ) -> None:
        self.rule_name = rule
        self.rule_params = dict(rule_params)  # as configured: protocols that run the rule themselves read them
        self.rule = AGGREGATORS.get(rule, rule_params)
        reserved = _reserved_params(AGGREGATORS, rule)
        self.uses_previous = "previous" in reserved
        self.uses_server_update = "server_update" in reserved
        self.rule_randomised = "generator" in reserved
        # rules that follow clients across rounds (FoolsGold): the rows' client ids, and each
        # client's sum of its past updates, kept here and checkpointed
        self.uses_history = "history" in reserved
        self.history: dict[int, Tensor] = {}
        self.server_update: Tensor | None = None
        self.pre = [
            (name, PREAGGREGATORS.get(name, params), "generator" in _reserved_params(PREAGGREGATORS, name))
            for name, params in pre
        ]
        self.f = f
        self.seed = seed
        self.previous: Tensor | None = None
        if self.uses_history and self.pre:
            raise ValueError(
                f"rule {rule!r} follows each client's updates across rounds, so it cannot run after "
                f"pre-aggregators ({', '.join(n for n, _, _ in self.pre)}), whose rows are no client's"
            )

    def apply(self, updates: Tensor, round_: int, ids: Sequence[int] | None = None) -> Tensor:
        """The aggregate of ``updates`` (n, d), whose rows come from the clients ``ids`` (rules
        that follow clients need them); does not change the pipeline's state."""
        x = updates
        for pos, (_, fn, randomised) in enumerate(self.pre):
            kw = {"generator": torch_stream(self.seed, "robust.pre", round_, pos)} if randomised else {}
            x = fn(x, f=self.f, **kw)
        kw = {"previous": self.previous} if self.uses_previous else {}
        if self.uses_server_update:
            kw["server_update"] = self.server_update
        if self.rule_randomised:  # randomised rules (FLAME's noise) draw from the round's stream
            kw["generator"] = torch_stream(self.seed, "robust.rule", round_)
        if self.uses_history:
            kw["client_ids"] = None if ids is None else tuple(int(i) for i in ids)
            kw["history"] = self.history
        return self.rule(x, f=self.f, **kw)

    def __call__(self, updates: Tensor, round_: int, ids: Sequence[int] | None = None) -> Tensor:
        """Aggregate, remember the result as the previous aggregate and, for rules that follow
        clients, add each row to its client's history."""
        out = self.apply(updates, round_, ids)
        self.previous = out
        if self.uses_history:
            for row, cid in zip(updates, ids):
                cid = int(cid)
                past = self.history.get(cid)
                self.history[cid] = row.detach().to(torch.float64).clone() if past is None else past + row.to(torch.float64)
        return out

    def describe(self) -> str:
        names = [n for n, _, _ in self.pre] + [self.rule_name]
        return " → ".join(names)


def _reserved_params(registry, name: str) -> set[str]:
    import inspect

    sig = inspect.signature(registry.entry(name).impl)
    return {p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
