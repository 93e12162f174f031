"""Round plugins: the small interfaces through which subsystems join the round, and their registry.

A subsystem implements only the parts it needs (``fedsafe.engine.round`` runs each stage over
the plugins that implement its hook, in the order they were made)::

    honest local work ─► ClientTransform.transform_honest   (clipping, local noise; run by the
                         clients themselves where they are remote: the server's instance then
                         gets ClientTransform.observe_honest with what each client reported)
    + Byzantine messages + ServerTransform.extra_messages    (extra participants: canaries)
    ─► ServerTransform.transform_messages                     (only if the protocol reveals messages)
    ─► protocol.aggregate ─► ServerTransform.transform_aggregate (central noise, rescaling)
    ─► decode ─► server step ─► transform_model                (the new global model: CRFL)
    ─► Observer.on_round_end                                   (accountants, trackers)

- :class:`ClientTransform`: what runs on (or for) each client's row, and what crosses the
  network with remote clients (``client_state``, ``client_reports``);
- :class:`ServerTransform`: what the server does to the messages and the released aggregate;
- :class:`Observer`: figures for the metrics row and the summary.

Each part derives from :class:`RoundPlugin` (its ``name``, and its checkpointed state through
``state_dict``/``load_state_dict``, saved under the ``name``). :class:`Plugin` is all three
at once, the interface before the split, kept so existing plugins run unchanged.

:data:`ROUND_PLUGINS` maps a name to a factory ``(PluginSetup) -> RoundPlugin | None`` (None:
not enabled by this config). The engine calls every factory, in registration order, and runs the
plugins it gets in that order; a factory sees the plugins made before it
(``PluginSetup.plugins``: the audit plugin reads the DP plugin's clip norm). The built-in
factories live in their subsystems' light config modules and are registered lazily here; a new
subsystem registers its own (``ROUND_PLUGINS.register("name")``) and the engine needs no change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


@dataclass
class ModelState:
    """The part of a run's state a plugin reads: the round just finished and the flat model."""

    round: int
    params: Tensor


@dataclass
class HostView:
    """A :class:`RoundHost` for a server that is not a ``Federation`` (the Flower strategy)."""

    cfg: Any
    state: ModelState
    out_dir: Path | None
    rows: list[dict[str, Any]]


def implementing(plugins: Sequence[Any], hook: str) -> tuple[Any, ...]:
    """The plugins, in order, that take part in the stage of ``hook`` (they define it)."""
    return tuple(p for p in plugins if callable(getattr(p, hook, None)))


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
    plugins: Mapping[str, RoundPlugin]
    source: RandomSource


class RoundPlugin:
    """What every round plugin has: a ``name`` and the state a restart needs."""

    name = "plugin"

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a restart, saved in the checkpoint under :attr:`name`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class ClientTransform(RoundPlugin):
    """The client side of a subsystem: each honest client's row, before anyone else sees it.

    Where it runs is the round plan's choice (``fedsafe.engine.round.RoundPlan.clients_remote``),
    not the plugin's: in process the server's instance runs :meth:`transform_honest` on every
    row; with remote clients (``fedsafe.flower``) each client runs it on its own row in its own
    instance, with the state the server sent (:meth:`client_state` → :meth:`load_client_state`),
    and returns :meth:`client_reports`, which the server's instance gets in
    :meth:`observe_honest`."""

    def message_dim(self, dim: int) -> int:
        """The message dimension after this plugin's client-side transform."""
        return dim

    def configure_clients(self, work: Any) -> None:
        """Called once, before the first round, with the engine's client work
        (``fedsafe.engine.clients.ClientWork``): a plugin that parameterises the clients'
        local computation (the inherent-noise plugin's σ², example-level DP's private
        gradients) sets it here. On a Flower node, fedsafe's ClientApp calls a client's own
        instance with the node's client work before each local training."""
        return None

    def transform_honest(self, updates: Tensor, ctx: RoundContext, ids: np.ndarray) -> Tensor:
        """Row i is client ``ids[i]``'s update. Row i's result must depend on that row, the
        client id and the round only (and on the state the server sends each round, such as DP's
        clip norm), since a remote client computes its row alone."""
        return updates

    def observe_honest(self, ctx: RoundContext, ids: np.ndarray, reports: list[dict[str, float]]) -> None:
        """Remote clients: the server's instance learns which honest clients ran
        :meth:`transform_honest` on their side this round, and what each reported."""
        return None

    def client_state(self) -> dict[str, float]:
        """Remote clients: what the server sends each client's instance before a round (DP:
        the current clip norm), loaded there by :meth:`load_client_state`."""
        return {}

    def load_client_state(self, state: dict[str, float]) -> None:
        return None

    def client_reports(self) -> dict[str, float]:
        """Remote clients: what a client's instance reports to the server after its
        :meth:`transform_honest` (a figure the server may see, e.g. whether it clipped)."""
        return {}


class ServerTransform(RoundPlugin):
    """The server side of a subsystem: extra participants, the received messages (where the
    protocol reveals them) and the released aggregate."""

    def extra_messages(self, ctx: RoundContext, dim: int) -> list[Message]:
        """Messages of extra participants (the audit's canaries), after the Byzantine ones."""
        return []

    def transform_messages(self, messages: list[Message], ctx: RoundContext) -> list[Message]:
        """Before aggregation; called only when the protocol reveals messages."""
        return messages

    def transform_aggregate(self, vector: Tensor, ctx: RoundContext, agg: Aggregate | None) -> Tensor:
        """The released aggregate (``agg``: what the protocol returned; None for an empty round)."""
        return vector

    def empty_aggregate(self, ctx: RoundContext, dim: int) -> Tensor | None:
        """What the server releases when nobody was sampled (None: skip the round)."""
        return None


class Observer(RoundPlugin):
    """Figures about the run: keys for each metrics row and for ``summary.json``."""

    def on_round_end(self, fed: RoundHost, row: dict[str, Any]) -> dict[str, Any]:
        """After the step and the evaluation: keys merged into the round's row."""
        return {}

    def summary(self, fed: RoundHost) -> dict[str, Any]:
        return {}


class Plugin(ClientTransform, ServerTransform, Observer):
    """All three parts at once: the round plugin interface before it was split, kept so that a
    plugin written against it runs unchanged (it takes part in every stage, as before)."""


ROUND_PLUGINS: Registry = Registry("round plugin")
# Order matters: DP clips and noises before anything else sees an update; the audit's canaries
# are scaled to the DP plugin's clip norm, so it comes after DP.
ROUND_PLUGINS.register_lazy("dp", "fedsafe.privacy.dp.config:make_plugin", "client-level DP-FedAvg ([dp])")
ROUND_PLUGINS.register_lazy(
    "inherent", "fedsafe.privacy.inherent.config:make_plugin", "ε of Zhang et al.'s Table 1 rows ([inherent])"
)
ROUND_PLUGINS.register_lazy("audit", "fedsafe.audit.config:make_plugin", "canary clients, one-shot ε estimate ([audit])")
ROUND_PLUGINS.register_lazy(
    "crfl", "fedsafe.robust.crfl_config:make_plugin", "CRFL: clip and perturb the global model, certify it ([crfl])"
)


def section_enabled(cfg: Any, name: str) -> bool | None:
    """The switch of the subsystem ``name`` (docs/architecture.md, *Switching a subsystem on*):
    the ``enabled`` of its config section ``cfg.<name>`` (an absent optional section is off);
    None where the config has no section of that name (a plugin of your own decides itself)."""
    fields = getattr(type(cfg), "model_fields", None)
    if not (name in fields if fields is not None else hasattr(cfg, name)):
        return None
    section = getattr(cfg, name, None)
    return section is not None and bool(getattr(section, "enabled", True))


def make_plugins(
    cfg: Any, source: RandomSource, initial: Tensor, client_sizes: tuple[int, ...], names: tuple[str, ...] | None = None
) -> list[RoundPlugin]:
    """The round plugins ``cfg`` enables: every factory of :data:`ROUND_PLUGINS` (or only those
    in ``names``), in registration order, each seeing the ones made before it; their noise
    comes from ``source``. A plugin named after a config section runs only when that section
    is enabled (:func:`section_enabled`); its factory may still return None. A factory's ``ValueError`` becomes a ``ConfigError`` naming the
    plugin."""
    made: dict[str, RoundPlugin] = {}
    setup = PluginSetup(
        cfg=cfg, seed=cfg.seed, initial=initial, client_sizes=client_sizes, plugins=made, source=source
    )
    for name in ROUND_PLUGINS.ordered():
        if names is not None and name not in names:
            continue
        if section_enabled(cfg, name) is False:  # the one switch: the section's `enabled`
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
