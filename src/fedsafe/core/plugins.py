"""Round plugins: the named placements where subsystems join the round, and their registry.

A plugin overrides the hooks it needs; each has a no-op default::

    honest local work ─► transform_honest        (client side: clipping, local noise)
    + Byzantine messages + extra_messages        (extra participants: canaries)
    ─► transform_messages                         (server side, only if it sees messages)
    ─► protocol.aggregate ─► transform_aggregate (server side: central noise, rescaling)
    ─► decode ─► server step ─► on_round_end     (observers: accountants, trackers)

Plugin state that must survive a restart goes through ``state_dict``/``load_state_dict`` and is
saved in the checkpoint under the plugin's ``name``.

:data:`ROUND_PLUGINS` maps a name to a factory ``(PluginSetup) -> Plugin | None`` (None: not
enabled by this config). The engine calls every factory, in registration order, and runs the
plugins it gets in that order; a factory sees the plugins made before it
(``PluginSetup.plugins``: the audit plugin reads the DP plugin's clip norm). The built-in
factories live in their subsystems' light config modules and are registered lazily here; a new
subsystem registers its own (``ROUND_PLUGINS.register("name")``) and the engine needs no change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from fedsafe.core.errors import ConfigError
from fedsafe.core.randomness import RandomSource
from fedsafe.core.registry import Registry
from fedsafe.core.types import Aggregate, Message, RoundContext


class RoundHost(Protocol):
    """What a plugin may read of the federation running it (``fedsafe.engine.federation.Federation``)."""

    cfg: Any  # the ExperimentConfig
    state: Any  # FederationState: ``round``, ``params`` (the global model, flat)
    out_dir: Path | None
    rows: list[dict[str, Any]]  # the metrics rows so far


@dataclass(frozen=True)
class PluginSetup:
    """What a plugin factory is given: the experiment, the initial flat parameters, the
    clients' dataset sizes, the plugins made before it, by name, and ``source``, where noise
    that protects privacy comes from (:class:`~fedsafe.core.randomness.RandomSource`: secret
    unless the run opts into seeded randomness)."""

    cfg: Any  # the ExperimentConfig
    seed: int
    initial: Tensor
    client_sizes: tuple[int, ...]
    plugins: Mapping[str, Plugin]
    source: RandomSource


class Plugin:
    name = "plugin"

    def message_dim(self, dim: int) -> int:
        """The message dimension after this plugin's client-side transform."""
        return dim

    def transform_honest(self, updates: Tensor, ctx: RoundContext, ids: np.ndarray) -> Tensor:
        """Client side: row i is client ``ids[i]``'s update. Where the clients are remote processes
        (``fedsafe.flower``), each client runs this on its own row, in its own instance of the
        plugin, and the server's instance gets :meth:`observe_honest` instead: so row i's result
        must depend on that row, the client id and the round only (and on the plugin's state the
        server sends each round, such as DP's clip norm)."""
        return updates

    def client_reports(self) -> dict[str, float]:
        """Remote clients: what a client's instance reports to the server after its
        :meth:`transform_honest` (a figure the server may see, e.g. whether it clipped)."""
        return {}

    def client_state(self) -> dict[str, float]:
        """Remote clients: what the server sends each client's instance before a round (DP:
        the current clip norm), loaded there by :meth:`load_client_state`."""
        return {}

    def load_client_state(self, state: dict[str, float]) -> None:
        return None

    def observe_honest(self, ctx: RoundContext, ids: np.ndarray, reports: list[dict[str, float]]) -> None:
        """Remote clients: the server's instance learns which honest clients ran
        :meth:`transform_honest` on their side this round, and what each reported."""
        return None

    def extra_messages(self, ctx: RoundContext, dim: int) -> list[Message]:
        return []

    def transform_messages(self, messages: list[Message], ctx: RoundContext) -> list[Message]:
        """Server side, before aggregation; called only when the protocol reveals messages."""
        return messages

    def transform_aggregate(self, vector: Tensor, ctx: RoundContext, agg: Aggregate | None) -> Tensor:
        return vector

    def configure_clients(self, work: Any) -> None:
        """Called once, before the first round, with the engine's client work
        (``fedsafe.engine.clients.ClientWork``): a plugin that parameterises the clients'
        local computation (the inherent-noise plugin's σ²) sets it here."""
        return None

    def empty_aggregate(self, ctx: RoundContext, dim: int) -> Tensor | None:
        """What the server releases when nobody was sampled (None: skip the round)."""
        return None

    def on_round_end(self, fed: RoundHost, row: dict[str, Any]) -> dict[str, Any]:
        return {}

    def summary(self, fed: RoundHost) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


ROUND_PLUGINS: Registry = Registry("round plugin")
# Order matters: DP clips and noises before anything else sees an update; the audit's canaries
# are scaled to the DP plugin's clip norm, so it comes after DP.
ROUND_PLUGINS.register_lazy("dp", "fedsafe.privacy.dp.config:make_plugin", "client-level DP-FedAvg ([dp])")
ROUND_PLUGINS.register_lazy(
    "inherent", "fedsafe.privacy.inherent.config:make_plugin", "ε of Zhang et al.'s Table 1 rows ([inherent])"
)
ROUND_PLUGINS.register_lazy("audit", "fedsafe.audit.config:make_plugin", "canary clients, one-shot ε estimate ([audit])")


def make_plugins(
    cfg: Any, source: RandomSource, initial: Tensor, client_sizes: tuple[int, ...], names: tuple[str, ...] | None = None
) -> list[Plugin]:
    """The round plugins ``cfg`` enables: every factory of :data:`ROUND_PLUGINS` (or only those
    in ``names``), in registration order, each seeing the ones made before it; their noise
    comes from ``source``. A factory's ``ValueError`` becomes a ``ConfigError`` naming the
    plugin."""
    made: dict[str, Plugin] = {}
    setup = PluginSetup(
        cfg=cfg, seed=cfg.seed, initial=initial, client_sizes=client_sizes, plugins=made, source=source
    )
    for name in ROUND_PLUGINS.ordered():
        if names is not None and name not in names:
            continue
        try:
            plugin = ROUND_PLUGINS.entry(name).impl(setup)
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError([f"{name}: {e}"]) from None
        if plugin is not None:
            made[name] = plugin
    return list(made.values())
