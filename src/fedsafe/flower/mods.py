"""``dp_mod``: the client side of :class:`~fedsafe.flower.strategy.FedsafeStrategy`'s local and
distributed DP, as a Flower mod for your own ClientApp::

    from fedsafe.flower import dp_mod
    app = ClientApp(mods=[dp_mod])

After your train function returns, the mod turns the model you trained into the global model
plus your update clipped to the server's clip norm C and noised on this node, exactly as
fedsafe's own clients do (``DPPlugin.transform_honest``: ``local`` adds N(0, (zC)²) per
coordinate, ``distributed`` a share N(0, (zC)²/n_s); with adaptive clipping the clipping bit
goes back in the metrics, under distributed placement with its own noise share). The noise
secret is fresh from the OS on every message and never leaves the node. The mod marks its reply
(``fedsafe.dp = 1`` and the clip norm used, in the reply's ``"metrics"`` record); the strategy
refuses replies without the mark, so an update without noise never reaches the aggregate.
Messages other than ``train``, and train messages that ask for no client-side noise (no DP,
or central DP), pass through untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedsafe.flower.records import FlowerError, check_like, flatten_arrays, unflatten_arrays


def dp_mod(msg: Any, context: Any, call_next: Any) -> Any:
    """A Flower mod: run the ClientApp's train function, then clip and noise its update on this
    node as FedsafeStrategy's ``local``/``distributed`` DP asks (see the module docstring)."""
    from flwr.app import MessageType, MetricRecord

    from fedsafe.config import parse_toml, validate
    from fedsafe.core.randomness import RandomSource
    from fedsafe.core.types import RoundContext
    from fedsafe.flower.client import client_plugins

    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    confs = [rec for rec in msg.content.config_records.values() if "fedsafe.config" in rec]
    if not confs:  # the server asks for no client-side noise (no DP, or central DP)
        return call_next(msg, context)
    arrays = list(msg.content.array_records.items())
    if len(arrays) != 1:
        raise FlowerError(f"dp_mod: the train message carries {len(arrays)} ArrayRecords; expected one, the global model")
    conf, (key, global_arrays) = confs[0], arrays[0]
    cfg = validate(parse_toml(str(conf["fedsafe.config"]), "fedsafe.config"))
    cid, round_ = int(conf["fedsafe.client"]), int(conf["fedsafe.round"])
    flat, layout = flatten_arrays(global_arrays)
    flat = flat.clone()  # before your train function can touch the message
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    if key not in reply.content.array_records:
        raise FlowerError(f"dp_mod: the ClientApp's reply has no ArrayRecord {key!r} (the trained model)")
    local = reply.content[key]
    check_like(local, layout, what="dp_mod: the trained model")
    delta = (flatten_arrays(local)[0].to(flat.dtype) - flat).unsqueeze(0)
    out, ctx = delta, RoundContext(round_, cfg.seed, (cid,), 0)
    reports: dict[str, float] = {}
    for plugin in client_plugins(cfg, RandomSource.secure(cfg.seed), flat):
        plugin.load_client_state({k.split(".", 2)[2]: float(conf[k]) for k in conf if k.startswith(f"fedsafe.{plugin.name}.")})
        out = plugin.transform_honest(out, ctx, np.array([cid]))
        reports.update(plugin.client_reports())
    out = out[0]
    metrics = reply.content.metric_records.get("metrics")
    if metrics is None:
        metrics = reply.content["metrics"] = MetricRecord()
    if cfg.dp.adaptive:
        metrics["fedsafe.dp_bit"] = float(out[-1])
        out = out[:-1]
    reply.content[key] = unflatten_arrays(flat + out, global_arrays)
    for k, v in reports.items():  # what the plugins report to the server (Plugin.client_reports)
        metrics[f"fedsafe.{k}"] = float(v)
    metrics["fedsafe.dp"] = 1.0
    metrics["fedsafe.clip"] = float(conf["fedsafe.dp.clip"])
    return reply
