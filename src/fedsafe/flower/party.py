"""The node's side of secure aggregation over Flower (:mod:`fedsafe.flower.secagg`): one stage of
fedsafe's own client party (:class:`fedsafe.protocols.secagg.client.ClientParty`) on the bytes the
server relayed, in a ClientApp.

Importing this module imports neither torch nor the server's protocol: a deployed SuperNode
starts a fresh ClientApp process for every message, and a stage needs only the party's
cryptography (numpy, ``cryptography``). A process that imports torch for nothing pays more than
a second of CPU per stage.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from fedsafe.flower.records import FlowerError, config_value
from fedsafe.protocols.secagg import crypto
from fedsafe.protocols.secagg.wire import SERVER

SECRET_BYTES = 32
# The live client parties of this process, by (client, round, secret): where one process handles
# a node's successive messages (Flower's simulation runtime), the next stage continues the party
# instead of replaying it. A deployed SuperNode starts a process per message: there it replays.
_PARTIES: dict[tuple[int, int, bytes], tuple[Any, Any, int]] = {}


def client_stage(conf: Any, state: Any, client_id: int, state_key: str, vector_key: str) -> Any:
    """One stage of the node's client party; returns the reply's ConfigRecord.

    ``state`` is the node's ``Context.state``: ``state_key`` holds the round, the stages done,
    the party's secret and the server's bytes of each earlier stage; ``vector_key`` the update
    the train message left there. The party is rebuilt from the secret and the earlier stages
    are replayed into it (their outputs discarded), then this stage's bytes are handled — unless
    this process still holds the party from the previous stage (:data:`_PARTIES`)."""
    from flwr.app import ConfigRecord

    from fedsafe.protocols.secagg.client import ClientParty
    from fedsafe.protocols.secagg.ray_parties import RelayTransport

    t0 = time.perf_counter()
    what = "secure-aggregation message"
    t = config_value(conf, "round", int, what=what)
    stage = config_value(conf, "stage", int, what=what)
    if config_value(conf, "client", int, what=what) != client_id:
        raise FlowerError(f"{what}: addressed to client {conf['client']}, but this node holds client {client_id}")
    payloads = config_value(conf, "payloads", list, what=what)
    if not all(isinstance(p, bytes) for p in payloads):
        raise FlowerError(f"{what}: payloads must be bytes")
    st = state.get(state_key)
    if st is None or vector_key not in state or st["round"] != t:
        raise FlowerError(f"{what}: this node holds no update for round {t} (did its training fail?)")
    if stage != st["stages"]:
        raise FlowerError(f"{what}: stage {stage} out of order, {st['stages']} stages done")
    if stage == 0:
        st["secret"] = os.urandom(SECRET_BYTES)
        for old in [k for k in _PARTIES if k[0] == client_id]:  # an earlier round that never finished
            del _PARTIES[old]
    key = (client_id, t, bytes(st["secret"]))
    live = _PARTIES.pop(key, None)
    if live is not None and live[2] == stage:  # this process ran the earlier stages: no replay
        party, net = live[0], live[1]
    else:
        vector = state[vector_key]["update"].numpy().astype(np.float64)
        net = RelayTransport()
        party = ClientParty(client_id, vector, net, round_=t, rand=crypto.SeededRandomness(st["secret"], f"client/{client_id}"))
        for k in range(stage):  # replay: the same secret gives the same keys, shares and masks
            net.inbox = [(SERVER, p) for p in st[f"inbox_{k}"]]
            party.step()
            net.outbox = []
    before = len(party.rejected)
    net.inbox = [(SERVER, p) for p in payloads]
    party.step()
    out = [payload for _, payload in net.outbox]
    st[f"inbox_{stage}"] = list(payloads)
    st["stages"] = stage + 1
    net.outbox = []
    if party.stage in ("done", "aborted"):  # the round is over for this client: forget it
        state.pop(state_key, None)
        state.pop(vector_key, None)
    else:
        _PARTIES[key] = (party, net, stage + 1)
    abort = "" if party.abort_reason is None else str(party.abort_reason)
    return ConfigRecord({
        "payloads": out, "seconds": time.perf_counter() - t0,
        "rejected": [str(e) for e in party.rejected[before:]], "abort": abort,
    })
