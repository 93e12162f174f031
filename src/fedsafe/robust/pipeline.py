"""The server's robust aggregation pipeline: pre-aggregators in order, then the rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from fedsafe.core.streams import torch_stream
from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.preaggregators import PREAGGREGATORS


@dataclass(frozen=True)
class PipelineSpec:
    """What a robust pipeline aggregates, read-only (:attr:`RobustPipeline.spec`): what a
    protocol that performs the aggregation itself, in the pipeline's place, reads instead of
    the pipeline's attributes."""

    rule: str  # the rule's registered name (robust.rule)
    params: Mapping[str, Any]  # its parameters as configured (robust.params), a read-only view
    f: int  # the number of Byzantine updates the rule must tolerate
    pre: tuple[str, ...]  # the pre-aggregators' names, in the order they run (robust.pre)


class RobustPipeline:
    """``rule(pre_k(...pre_1(updates)))`` with the configured parameters.

    The state across rounds is the previous round's aggregate, handed explicitly to rules that
    take it (centered clipping), and what a rule that follows clients keeps (below), all saved in
    checkpoints. A protocol that performs the rule itself
    (secagg, he, tee) reads :attr:`spec` and hands its aggregate to :meth:`record`. Rules that take ``server_update`` (FLTrust)
    get :attr:`server_update`, which :meth:`begin_round` computes every round, before anything
    aggregates, from the server's own data (:meth:`attach_server_data`: a root dataset);
    randomised rules (FLAME) draw from the stream ``("robust.rule", round)``. Randomised pre-aggregators (bucketing) draw
    from the stream ``("robust.pre", round, position)``.

    Rules that follow clients across rounds get the rows' ``client_ids`` and either ``history``
    (FoolsGold: each client's sum of past updates, which the pipeline adds to) or ``state`` (a
    rule registered with ``state=<class>``, FLDetector: one object per run made from the rule's
    parameters, which records a round only when the rule is called with ``commit=True``, i.e.
    when the pipeline itself aggregates, never when an attacker simulates the rule through
    :meth:`apply`). Rules that take ``model_delta`` get the model's change since the previous
    round, ``w_t − w_{t−1}``, which :meth:`begin_round` computes.
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
        self.rule_params = dict(rule_params)  # as configured (protocols read them through spec)
        self.rule = AGGREGATORS.get(rule, rule_params)
        reserved = _reserved_params(AGGREGATORS, rule)
        self.uses_previous = "previous" in reserved
        self.uses_server_update = "server_update" in reserved
        self.rule_randomised = "generator" in reserved
        # rules that follow clients across rounds (FoolsGold): the rows' client ids, and each
        # client's sum of its past updates, kept here and checkpointed
        self.uses_history = "history" in reserved
        self.history: dict[int, Tensor] = {}
        # rules registered with a state class (FLDetector): one object for the run, made from the
        # rule's parameters (defaults filled in), recording rounds only on commit
        entry = AGGREGATORS.entry(rule)
        self.uses_state = "state" in reserved
        self.rule_state: Any = None
        if self.uses_state:
            settings = {name: self.rule_params.get(name, p.default) for name, p in entry.params.items()}
            self.rule_state = entry.meta["state"](**settings)
        self.uses_model_delta = "model_delta" in reserved
        self.model_delta: Tensor | None = None
        self._last_params: Tensor | None = None
        self.server_update: Tensor | None = None
        self.root: Any = None  # the server's root-dataset update (fedsafe.robust.root), for server_update
        self.pre = [
            (name, PREAGGREGATORS.get(name, params), "generator" in _reserved_params(PREAGGREGATORS, name))
            for name, params in pre
        ]
        self.f = f
        self.seed = seed
        self.previous: Tensor | None = None
        if self.follows_clients and self.pre:
            raise ValueError(
                f"rule {rule!r} follows each client's updates across rounds, so it cannot run after "
                f"pre-aggregators ({', '.join(n for n, _, _ in self.pre)}), whose rows are no client's"
            )

    @property
    def follows_clients(self) -> bool:
        """Whether the rule follows clients across rounds (client histories or a state object):
        it needs every row with its client, so no protocol can perform it in the pipeline's place."""
        return self.uses_history or self.uses_state

    def apply(self, updates: Tensor, round_: int, ids: Sequence[int] | None = None) -> Tensor:
        """The aggregate of ``updates`` (n, d), whose rows come from the clients ``ids`` (rules
        that follow clients need them); does not change the pipeline's state."""
        return self._aggregate(updates, round_, ids, commit=False)

    def _aggregate(self, updates: Tensor, round_: int, ids: Sequence[int] | None, *, commit: bool) -> Tensor:
        x = updates
        for pos, (_, fn, randomised) in enumerate(self.pre):
            kw = {"generator": torch_stream(self.seed, "robust.pre", round_, pos)} if randomised else {}
            x = fn(x, f=self.f, **kw)
        kw = {"previous": self.previous} if self.uses_previous else {}
        if self.uses_server_update:
            kw["server_update"] = self.server_update
        if self.rule_randomised:  # randomised rules (FLAME's noise) draw from the round's stream
            kw["generator"] = torch_stream(self.seed, "robust.rule", round_)
        if self.follows_clients:
            kw["client_ids"] = None if ids is None else tuple(int(i) for i in ids)
        if self.uses_history:
            kw["history"] = self.history
        if self.uses_state:
            kw["state"], kw["commit"] = self.rule_state, commit
        if self.uses_model_delta:
            kw["model_delta"] = self.model_delta
        return self.rule(x, f=self.f, **kw)

    def __call__(self, updates: Tensor, round_: int, ids: Sequence[int] | None = None) -> Tensor:
        """Aggregate, remember the result as the previous aggregate and, for rules that follow
        clients, add each row to its client's history."""
        out = self._aggregate(updates, round_, ids, commit=True)
        self.previous = out
        if self.uses_history:
            for row, cid in zip(updates, ids):
                cid = int(cid)
                past = self.history.get(cid)
                self.history[cid] = row.detach().to(torch.float64).clone() if past is None else past + row.to(torch.float64)
        return out

    # --- what the rule computes on the server, and its state across rounds ------------------

    def attach_server_data(self, data: Any, seed: int, make_work: Any) -> None:
        """For a rule that takes ``server_update`` (FLTrust): draw its root dataset from ``data``
        (``robust.params.root_size`` samples, the rule's own default otherwise) and the client
        work that computes the server's update on it (``make_work(root dataset, batch seed)``).
        A no-op for other rules. Raises ``ValueError`` for a root size the data cannot give."""
        if not self.uses_server_update:
            return
        from fedsafe.robust.root import RootUpdate

        default = AGGREGATORS.entry(self.rule_name).params["root_size"].default
        self.root = RootUpdate(data, seed, self.rule_params.get("root_size", default), make_work)

    def check_size(self, n: int) -> None:
        """Run on a dummy round of ``n`` rows (with a dummy server update, for a rule that takes
        one): ``ValueError`` (a ``RequirementError``) where the rule's (n, f) requirement fails."""
        self.server_update = torch.zeros(2) if self.uses_server_update else None
        try:
            self.apply(torch.zeros(n, 2), 0, list(range(n)))
        finally:
            self.server_update = None  # each round sets its own

    def begin_round(self, round_: int, params: Tensor) -> None:
        """Before anything aggregates this round (the attackers' aggregates included): the
        server's own inputs to the rule at the round's model ``params`` (FLTrust's root update;
        the model's change since the previous round for a rule that takes ``model_delta``)."""
        if self.root is not None:
            self.server_update = self.root.update(round_, params)
        if self.uses_model_delta:
            flat = params.detach().reshape(-1)
            self.model_delta = None if self._last_params is None else flat - self._last_params
            self._last_params = flat.clone()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the previous aggregate: the root update's momentum
        (``_root``), the clients' histories (``_history``), the rule's state object
        (``_rule_state``) and the model the next round's change is taken from
        (``_last_params``), for the rules that have them."""
        out: dict[str, Any] = {}
        if self.root is not None:
            out["_root"] = self.root.state_dict()
        if self.uses_history:
            out["_history"] = {str(k): v for k, v in self.history.items()}
        if self.uses_state:
            out["_rule_state"] = self.rule_state.state_dict()
        if self.uses_model_delta and self._last_params is not None:
            out["_last_params"] = self._last_params
        return out

    def load_state_dict(self, state: dict[str, Any], *, dim: int, params: int, num_clients: int) -> None:
        """Restore :meth:`state_dict` for messages of ``dim`` coordinates, a model of ``params``
        parameters and ``num_clients`` clients; ``ValueError`` where it does not fit."""
        if self.uses_history:
            history = {int(k): v for k, v in state.get("_history", {}).items()}
            bad = [k for k, v in history.items() if not 0 <= k < num_clients or tuple(v.shape) != (dim,)]
            if bad:
                raise ValueError(f"client histories of clients {bad[:4]} do not fit this run")
            self.history = history
        if self.uses_state and "_rule_state" in state:
            self.rule_state.load_state_dict(state["_rule_state"])
        if self.uses_model_delta:
            last = state.get("_last_params")
            if last is not None and tuple(last.shape) != (params,):
                raise ValueError(f"the model the next round's change is taken from has shape {tuple(last.shape)}, expected ({params},)")
            self._last_params = last
        if self.root is not None:
            momentum = state.get("_root", {}).get("momentum")
            if momentum is not None and tuple(momentum.shape) != (1, params):
                raise ValueError(f"the root dataset's momentum has shape {tuple(momentum.shape)}, expected (1, {params})")
            self.root.load_state_dict({"momentum": momentum})

    @property
    def spec(self) -> PipelineSpec:
        """What this pipeline aggregates: the rule, its parameters, f and the pre-aggregators."""
        return PipelineSpec(
            rule=self.rule_name, params=MappingProxyType(dict(self.rule_params)), f=int(self.f),
            pre=tuple(n for n, _, _ in self.pre),
        )

    def record(self, aggregate: Tensor) -> None:
        """Remember ``aggregate``, which a protocol computed in the pipeline's place, as calling
        the pipeline remembers its own: the previous aggregate, handed to rules that take it
        (centered clipping) and saved in checkpoints. A rule that follows clients (FoolsGold)
        also needs the rows, so no protocol can perform it in the pipeline's place."""
        if self.follows_clients:
            raise ValueError(f"rule {self.rule_name!r} follows each client's updates: only calling the pipeline records them")
        self.previous = aggregate

    def describe(self) -> str:
        names = [n for n, _, _ in self.pre] + [self.rule_name]
        return " → ".join(names)


def spec_of(pipeline: Any) -> PipelineSpec:
    """``pipeline.spec``; for a stand-in written before it (an object with ``rule_name``,
    ``rule_params``, ``pre`` and ``f``), the same description built from those."""
    spec = getattr(pipeline, "spec", None)
    if isinstance(spec, PipelineSpec):
        return spec
    pre = tuple(p if isinstance(p, str) else p[0] for p in getattr(pipeline, "pre", ()) or ())
    return PipelineSpec(
        rule=getattr(pipeline, "rule_name", None), params=MappingProxyType(dict(getattr(pipeline, "rule_params", {}) or {})),
        f=int(getattr(pipeline, "f", 0)), pre=pre,
    )


def record_aggregate(pipeline: Any, aggregate: Tensor) -> None:
    """``pipeline.record(aggregate)``; a stand-in written before it, with only a ``previous``
    attribute, gets ``previous = aggregate``."""
    record = getattr(pipeline, "record", None)
    if callable(record):
        record(aggregate)
    elif hasattr(pipeline, "previous"):
        pipeline.previous = aggregate


def _reserved_params(registry, name: str) -> set[str]:
    import inspect

    sig = inspect.signature(registry.entry(name).impl)
    return {p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
