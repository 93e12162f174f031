"""fedsafe's ClientApp: each SuperNode is one fedsafe client.

A node holds the client whose id is its ``partition-id`` (Flower's simulation sets it; a
deployed SuperNode gets it with ``--node-config "partition-id=3 num-partitions=10"``). It answers
three messages from fedsafe's ServerApp (:mod:`fedsafe.flower.server`):

- ``query.fedsafe_hello``: which client it holds;
- ``train.fedsafe``: the round's local work at the global model, exactly the engine's client
  code (``ClientWork``, the configured algorithm, zeroth order included; with ``dp.unit =
  "example`` every local step a DP-SGD step: per-example clipping and the client's own noise),
  then the client-side transforms of the round plugins *on the node*: DP clipping and, for
  ``local`` and ``distributed`` placement, the client's own Gaussian noise. Its noise comes from a secret the
  node draws from the OS for every message (:class:`fedsafe.core.randomness.RandomSource`)
  unless the run asks for ``noise_seed = "experiment"`` or its config sets
  ``secure_randomness = false`` (the experiment's seed: reproducible, and the server could
  remove the noise — for tests only). Under secure aggregation the update stays on the node
  (``Context.state``) and only the loss goes back;
- ``query.fedsafe_secagg``: one stage of secure aggregation. The node runs fedsafe's own
  client party (:class:`fedsafe.protocols.secagg.client.ClientParty`) on the bytes the server
  relays. Flower starts a fresh ClientApp process for every message, so the party is rebuilt
  each stage: its randomness is a 256-bit secret drawn from the OS at the first stage and kept
  in ``Context.state``, which never leaves the SuperNode, and the messages of the earlier
  stages are replayed into it (their outputs were already sent and are discarded). Replaying
  is deterministic, so the party is the same party at every stage; the price is that the
  earlier stages' client-side work is redone (at most one masking per round). Where one
  process handles a node's successive messages (Flower's simulation), it keeps the party
  instead.

The experiment arrives as TOML text and is validated on the node; the node loads its own
partition of the configured dataset.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsafe.flower.records import (
    CONF,
    METRICS,
    NUM_PARTITIONS,
    PARAMS,
    PARTITION_ID,
    UPDATE,
    FlowerError,
    array_record,
    config_value,
    read_tensor,
)

if TYPE_CHECKING:  # torch is imported where it is used: a secure-aggregation stage needs none
    import torch

NOISE_SEEDS = ("secret", "experiment")
_STATE = "fedsafe.secagg"  # Context.state: the secure-aggregation party of this round
_VECTOR = "fedsafe.update"  # Context.state: the update kept on the node under secure aggregation
_MOMENTUM = "fedsafe.momentum"  # Context.state: a dsgd client's momentum under secure aggregation


class _Node:
    """What a node builds once per experiment (and per process): its client work and plugins."""

    def __init__(self, cfg_toml: str, model: torch.nn.Module | None, loss: Any) -> None:
        from fedsafe.config import parse_toml, validate
        from fedsafe.core.streams import torch_stream
        from fedsafe.data import load_federated
        from fedsafe.engine.backends import make_backend
        from fedsafe.engine.clients import ClientWork
        from fedsafe.models import ParamLayout, build_model, check_model
        from fedsafe.robust.backdoor import make_poison

        cfg = validate(parse_toml(cfg_toml))
        self.cfg = cfg
        data = load_federated(cfg.data, cfg.clients.num_clients, cfg.seed)
        if model is not None:
            model = check_model(model, data.input_shape, data.num_classes)
        else:
            model = build_model(cfg.model, data.input_shape, data.num_classes, generator=torch_stream(cfg.seed, "model.init"))
        inner = cfg.execution if cfg.execution in ("serial", "vectorized") else cfg.ray.inner
        backend = make_backend(inner, model, ParamLayout.from_model(model), loss)
        self.data = data
        self.work = ClientWork(cfg.clients, backend, data, cfg.seed, zo=cfg.zo)
        self.poison = make_poison(cfg.attack.name, cfg.attack.params, data.x_train, data.num_classes, y_train=data.y_train)
        self.dim = sum(p.numel() for p in model.parameters())

    def client_plugins(self, source: Any) -> list[Any]:
        """Fresh instances of the round plugins with a client side, drawing from the node's
        noise source."""
        import torch

        sizes = tuple(len(ix) for ix in self.data.client_indices)  # example-level DP samples each client's records
        return client_plugins(self.cfg, source, torch.zeros(self.dim), sizes)


CLIENT_SIDE_PLUGINS = ("dp",)  # the round plugins whose transform_honest runs on the clients


def client_plugins(cfg: Any, source: Any, initial: torch.Tensor, client_sizes: tuple[int, ...] | None = None) -> list[Any]:
    """The client-side round plugins ``cfg`` enables (:data:`CLIENT_SIDE_PLUGINS`), as one
    client's own instances: ``source`` (a :class:`~fedsafe.core.randomness.RandomSource`) is
    where that client's noise comes from; ``client_sizes`` the clients' record counts (example-
    level DP samples from them; 1 each when not given: client-level DP does not read them)."""
    from fedsafe.core.plugins import make_plugins

    sizes = client_sizes if client_sizes is not None else (1,) * cfg.clients.num_clients
    return make_plugins(cfg, source, initial, sizes, CLIENT_SIDE_PLUGINS)


_NODES: dict[tuple[str, int, int], _Node] = {}


def _node(cfg_toml: str, model: torch.nn.Module | None, loss: Any) -> _Node:
    key = (cfg_toml, id(model), id(loss))
    node = _NODES.get(key)
    if node is None:
        _NODES.clear()  # one experiment per process at a time
        node = _NODES[key] = _Node(cfg_toml, model, loss)
    return node


def partition(context: Any) -> tuple[int, int | None]:
    """This node's fedsafe client id (``partition-id``) and ``num-partitions`` (None if unset)."""
    nc = context.node_config
    if PARTITION_ID not in nc:
        raise FlowerError(
            f"this SuperNode has no {PARTITION_ID!r} in its node config: start it with "
            f"--node-config \"{PARTITION_ID}=<fedsafe client id> {NUM_PARTITIONS}=<clients.num_clients>\""
        )
    pid = nc[PARTITION_ID]
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        raise FlowerError(f"node config {PARTITION_ID} = {pid!r}: must be an integer >= 0")
    total = nc.get(NUM_PARTITIONS)
    return pid, (int(total) if isinstance(total, int) and not isinstance(total, bool) else None)


def noise_source(choice: str | None, cfg: Any) -> Any:
    """The node's noise source: ``"experiment"`` the seeded source of the experiment's seed,
    ``"secret"`` a fresh secret from the OS; None follows the config's ``secure_randomness``."""
    from fedsafe.core.randomness import RandomSource

    if choice is None:
        choice = "secret" if cfg.secure_randomness else "experiment"
    return RandomSource.for_run(cfg.seed, choice == "secret")


def client_app(
    *, noise_seed: str | None = None, model: torch.nn.Module | None = None, loss: Any = None
) -> Any:
    """fedsafe's Flower ``ClientApp``.

    ``noise_seed``: ``"secret"`` (the node's clients draw DP noise from a secret only the node
    knows) or ``"experiment"`` (the experiment's seed, so a run is reproducible and equal to
    fedsafe's own engine; the server can then remove the noise: for tests only). When None,
    the run config's ``fedsafe-noise-seed`` decides, and without it (or if empty) the experiment's
    ``secure_randomness`` (true, the default: ``"secret"``). ``model``/``loss``: your own
    ``nn.Module`` and loss, the same ones you give :func:`fedsafe.flower.server_app`.
    """
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    if noise_seed is not None and noise_seed not in NOISE_SEEDS:
        raise ValueError(f"noise_seed must be one of {NOISE_SEEDS}, got {noise_seed!r}")
    app = ClientApp()

    @app.query("fedsafe_hello")
    def hello(msg: Message, context: Any) -> Message:
        pid, total = partition(context)
        conf = ConfigRecord({"client": pid, "clients": -1 if total is None else total})
        return Message(RecordDict({CONF: conf}), reply_to=msg)

    @app.train("fedsafe")
    def train(msg: Message, context: Any) -> Message:
        import torch

        t0 = time.perf_counter()
        conf = msg.content[CONF]
        what = "train message"
        cfg_toml = config_value(conf, "config", str, what=what)
        t = config_value(conf, "round", int, what=what)
        cid = config_value(conf, "client", int, what=what)
        pid, _ = partition(context)
        if cid != pid:
            raise FlowerError(f"{what}: addressed to client {cid}, but this node holds client {pid}")
        node = _node(cfg_toml, model, loss)
        arrays = msg.content[PARAMS]
        params = read_tensor(arrays, "params", what=what, shape=(node.dim,))
        secure = bool(config_value(conf, "secagg", bool, what=what))
        momentum = None
        if "momentum" in arrays:
            momentum = read_tensor(arrays, "momentum", what=what, shape=(1, node.dim))
        elif secure and node.work.keeps_momentum:  # kept here, never sent (see FlowerClientWork)
            kept = context.state.get(_MOMENTUM)
            momentum = torch.zeros(1, node.dim) if kept is None else read_tensor(kept, "momentum", what="node state", shape=(1, node.dim))
        poisoned = bool(config_value(conf, "poison", bool, what=what))
        if poisoned and node.poison is None:
            raise FlowerError(f"{what}: asks for poisoned training, but attack {node.cfg.attack.name!r} poisons no data")
        choice = noise_seed or context.run_config.get("fedsafe-noise-seed") or None  # "": the experiment's choice
        if choice is not None and choice not in NOISE_SEEDS:
            raise FlowerError(f"run config fedsafe-noise-seed = {choice!r}: valid: {', '.join(NOISE_SEEDS)}")
        source = noise_source(choice, node.cfg)
        node.work.algorithm.load_remote_settings(conf, experiment=node.cfg, source=source)
        ids = np.array([cid])
        plugins = [] if poisoned else node.client_plugins(source)  # a Byzantine client skips them
        for p in plugins:  # example-level DP: this client's steps are DP-SGD steps, with its noise
            p.configure_clients(node.work)
        res = node.work.run(t, params, ids, momentum, node.poison if poisoned else None)
        update = res.updates
        reports: dict[str, float] = {}
        if plugins:  # an honest client's client-side transforms
            from fedsafe.core.types import RoundContext

            ctx = RoundContext(t, node.cfg.seed, (cid,), 0)
            for p in plugins:
                p.load_client_state({k.split(".", 1)[1]: conf[k] for k in conf if k.startswith(f"{p.name}.")})
                update = p.transform_honest(update, ctx, ids)
                reports.update(p.client_reports())
        metrics = MetricRecord({"loss": float(res.losses[0]), "seconds": time.perf_counter() - t0, **reports})
        content = RecordDict({METRICS: metrics})
        finite = bool(torch.isfinite(update).all())
        metrics["finite"] = int(finite)
        if secure:  # the update stays here, for the secure-aggregation stages that follow
            for key in (_STATE, _VECTOR):
                context.state.pop(key, None)
            if finite:
                context.state[_VECTOR] = array_record(update=update[0])
                context.state[_STATE] = ConfigRecord({"round": t, "stages": 0})
            if res.momentum is not None:
                context.state[_MOMENTUM] = array_record(momentum=res.momentum)
            content[UPDATE] = array_record()
        else:
            content[UPDATE] = array_record(update=update, momentum=res.momentum)
        return Message(content, reply_to=msg)

    @app.query("fedsafe_secagg")
    def secagg(msg: Message, context: Any) -> Message:
        from fedsafe.flower.party import client_stage  # no torch, no server protocol: a process per stage

        pid, _ = partition(context)
        conf = client_stage(msg.content[CONF], context.state, pid, _STATE, _VECTOR)
        return Message(RecordDict({CONF: conf}), reply_to=msg)

    return app
