"""The ServerApp's side of fedsafe's clients on Flower: finding which SuperNode holds which
client (:class:`Nodes`) and running a round's local work there (:class:`FlowerClientWork`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.clients import LocalResult
from fedsafe.core.plugins import implementing
from fedsafe.engine.clients import ClientWork
from fedsafe.flower.records import (
    CONF,
    HELLO,
    METRICS,
    PARAMS,
    TRAIN,
    UPDATE,
    FlowerError,
    array_record,
    config_value,
    read_tensor,
)

log = logging.getLogger("fedsafe.flower")


class Nodes:
    """Which Flower node holds which fedsafe client, and one request/reply exchange with them.

    At start-up every connected node is asked which client it holds (its ``partition-id``);
    the run starts once each of the ``num_clients`` clients is held by exactly one node, and
    fails after ``wait`` seconds naming the missing ones (and two nodes holding one client fail
    it). A node that replies with an error or not within ``timeout`` seconds has dropped out of
    that exchange; nodes that connect later are asked before each round, and one holding a
    client already known (a restarted SuperNode gets a new node id) takes over that client.
    """

    def __init__(self, grid: Any, num_clients: int, *, timeout: float, wait: float) -> None:
        self.grid = grid
        self.num_clients = num_clients
        self.timeout = timeout
        self.node_of: dict[int, int] = {}
        self._asked: set[int] = set()
        self.errors: list[tuple[int, str]] = []  # (client, reason) of replies that were errors
        self._started = False
        deadline = time.monotonic() + wait
        while True:
            self.refresh()
            missing = [c for c in range(num_clients) if c not in self.node_of]
            if not missing:
                self._started = True
                return
            if time.monotonic() >= deadline:
                raise FlowerError(
                    f"after {wait:g} s, no SuperNode holds fedsafe clients {missing[:10]}"
                    f"{' …' if len(missing) > 10 else ''} ({len(self.node_of)} of {num_clients} found); start one "
                    f"SuperNode per client with --node-config \"partition-id=<id> num-partitions={num_clients}\""
                )
            time.sleep(0.5)

    def refresh(self) -> None:
        """Ask the nodes not asked yet which client they hold."""
        from flwr.app import Message, RecordDict

        new = [n for n in self.grid.get_node_ids() if n not in self._asked]
        if not new:
            return
        msgs = {n: Message(RecordDict(), dst_node_id=n, message_type=HELLO) for n in new}
        replies = _replies(self.grid, msgs, self.timeout)
        for node, reply in replies.items():
            if reply.has_error():
                continue  # asked again next time
            self._asked.add(node)
            conf = reply.content[CONF]
            cid = config_value(conf, "client", int, what=f"node {node}'s hello")
            total = config_value(conf, "clients", int, what=f"node {node}'s hello")
            if not 0 <= cid < self.num_clients:
                raise FlowerError(
                    f"node {node} holds partition-id {cid}, outside this experiment's clients 0..{self.num_clients - 1}"
                )
            if total not in (-1, self.num_clients):
                raise FlowerError(f"node {node} has num-partitions {total}, but clients.num_clients = {self.num_clients}")
            old = self.node_of.get(cid)
            if old is not None and old != node:
                if not self._started and old in set(self.grid.get_node_ids()):
                    raise FlowerError(f"nodes {old} and {node} both hold fedsafe client {cid} (partition-id)")
                # during the run: a restarted SuperNode (a new node id); the old one is gone or going
                log.warning("fedsafe client %d moves from node %d to node %d", cid, old, node)
            self.node_of[cid] = node

    def send(self, message_type: str, contents: dict[int, Any], *, group: str = "") -> dict[int, Any]:
        """Send ``contents[client]`` (a RecordDict) to each client's node; the replies' contents
        by client, without those that failed or did not come in ``timeout`` seconds."""
        from flwr.app import Message

        msgs = {
            cid: Message(content, dst_node_id=self.node_of[cid], message_type=message_type, group_id=group)
            for cid, content in contents.items()
        }
        out: dict[int, Any] = {}
        for cid, reply in _replies(self.grid, msgs, self.timeout).items():
            if reply.has_error():  # the ClientApp raised, or the SuperLink found the node offline
                self.errors.append((cid, reply.error.reason))
                log.warning("fedsafe client %d (node %d) failed: %s", cid, self.node_of[cid], reply.error.reason)
                continue
            out[cid] = reply.content
        return out

    def ask(self, message_type: str, confs: dict[int, dict[str, Any]]) -> dict[int, Any]:
        """:meth:`send` with one ConfigRecord (``"fedsafe"``) each way."""
        from flwr.app import ConfigRecord, RecordDict

        sent = {c: RecordDict({CONF: ConfigRecord(v)}) for c, v in confs.items()}
        group = str(next(iter(confs.values())).get("round", "")) if confs else ""
        return {c: content[CONF] for c, content in self.send(message_type, sent, group=group).items()}


# How often the ServerApp asks the SuperLink for replies (Flower's own Grid: every 3 s): every
# POLL_SECONDS after a reply came in, backing off to POLL_MAX_SECONDS while none does (each pull
# is a request the SuperLink answers: a tight loop would cost CPU while the nodes compute).
POLL_SECONDS = 0.05
POLL_MAX_SECONDS = 0.5


def _replies(grid: Any, msgs: dict[int, Any], timeout: float, poll: float = POLL_SECONDS) -> dict[int, Any]:
    """Send ``msgs`` (by key) and wait; the replies by the key of the message each answers.
    Replies are matched on ``reply_to_message_id`` (the grid sets each message's id as it
    pushes it): an error reply for an offline node comes from the SuperLink, not the node.

    A Flower ``Grid`` is driven through its ``push_messages`` and ``pull_messages``, pulling
    ``poll`` seconds after the last reply came in, and then at intervals doubling up to
    :data:`POLL_MAX_SECONDS`, until every reply is in or ``timeout`` has passed: Flower's own
    ``send_and_receive`` sleeps 3 s between pulls, which a deployed round (one exchange for
    plain aggregation, five under secure aggregation) would pay at every exchange. Any other
    object with ``send_and_receive`` (the tests' in-process grids) is called as it is."""
    if not msgs:
        return {}
    if _pushes(grid):
        replies = _push_and_pull(grid, list(msgs.values()), timeout, poll)
    else:
        replies = list(grid.send_and_receive(list(msgs.values()), timeout=timeout))
    key_of = {m.metadata.message_id: k for k, m in msgs.items()}
    out = {}
    for reply in replies:
        k = key_of.get(reply.metadata.reply_to_message_id)
        if k is not None:
            out[k] = reply
    return out


def _pushes(grid: Any) -> bool:
    """Whether ``grid`` is a Flower ``Grid`` (which has ``push_messages``/``pull_messages``)."""
    try:
        from flwr.serverapp import Grid
    except ImportError:  # pragma: no cover - fedsafe.flower needs Flower
        return False
    return isinstance(grid, Grid)


def _push_and_pull(grid: Any, messages: list[Any], timeout: float, poll: float) -> list[Any]:
    """``grid.send_and_receive(messages, timeout=timeout)``, pulling ``poll`` seconds after a
    reply and backing off (doubling, up to :data:`POLL_MAX_SECONDS`) while none comes."""
    waiting = {i for i in grid.push_messages(messages) if i}  # a message that could not be pushed: no id
    deadline = time.monotonic() + timeout
    out: list[Any] = []
    wait = poll
    while waiting:
        got = list(grid.pull_messages(list(waiting)))
        out.extend(got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        wait = poll if got else min(2 * wait, max(poll, POLL_MAX_SECONDS))
        left = deadline - time.monotonic()
        if not waiting or left <= 0:
            break
        time.sleep(min(wait, left))
    return out


class FlowerClientWork(ClientWork):
    """Client work whose clients are Flower SuperNodes running :func:`fedsafe.flower.client_app`.

    The server keeps the same :class:`ClientWork` it would run in process (for ``decode``, the
    message size and the server optimizer), but ``run`` sends each client a ``train.fedsafe``
    message with the global model (and, for dsgd, the client's momentum row, which comes back
    like with Ray, so the server stays the one owner of run state and a run resumes exactly).
    The nodes run the plugins' client-side transforms themselves (``remote_clients``): the engine
    then gets each plugin's ``client_reports`` through ``observe_honest``. Under secure
    aggregation (``secure``) the updates stay on the nodes: the rows returned are zeros (NaN for
    a client that withheld a non-finite update), and :class:`fedsafe.flower.secagg.FlowerSecAgg`
    aggregates them with the nodes; so does a dsgd client's momentum (which is its message), in
    the node's ``Context.state``: the server's checkpoint then does not hold it, and a run resumed
    in a new Flower run restarts the nodes' momentum from zero.
    """

    execution = "flower"
    remote_clients = True

    def __init__(self, experiment: Any, backend: Any, data: Any, nodes: Nodes, *, secure: bool) -> None:
        super().__init__(experiment.clients, backend, data, experiment.seed, zo=experiment.zo)
        self.nodes = nodes
        self.secure = secure
        self._cfg_toml = experiment.to_toml()
        self.plugins: list[Any] = []  # the server's round plugins, whose client state goes out each round

    def run(self, round_: int, params: Tensor, ids: np.ndarray, momentum: Tensor | None = None, poison: Any = None) -> LocalResult:
        from flwr.app import ConfigRecord, RecordDict

        self.nodes.refresh()
        state: dict[str, Any] = {}
        for p in implementing(self.plugins, "client_state"):
            state.update({f"{p.name}.{k}": float(v) for k, v in p.client_state().items()})
        state.update(self.algorithm.remote_settings())  # the algorithm's own (inherent: σ²)
        contents = {}
        for row, cid in enumerate(map(int, ids)):
            if cid not in self.nodes.node_of:
                continue
            conf = ConfigRecord({
                "config": self._cfg_toml, "round": int(round_), "client": cid, "poison": poison is not None,
                "secagg": self.secure and poison is None, **state,
            })
            # under secure aggregation a client's momentum (dsgd's message itself) stays on its node
            mom = None if momentum is None or conf["secagg"] else momentum[row : row + 1]
            contents[cid] = RecordDict({PARAMS: array_record(params=params, momentum=mom), CONF: conf})
        replies = self.nodes.send(TRAIN, contents, group=str(round_))
        d, width = params.numel(), self.message_dim(params.numel())
        for p in implementing(self.plugins, "message_dim"):  # after the client-side transforms (DP's adaptive bit)
            width = p.message_dim(width)
        updates = params.new_zeros((len(ids), width))
        losses = params.new_full((len(ids),), float("nan"))
        new_mom = None if momentum is None else momentum.clone()
        ok = np.zeros(len(ids), dtype=bool)
        reports: list[dict[str, float]] = [{} for _ in ids]
        for row, cid in enumerate(map(int, ids)):
            content = replies.get(cid)
            if content is None:
                continue
            what = f"client {cid}'s train reply"
            metrics = content[METRICS]
            losses[row] = float(config_value(metrics, "loss", float, what=what))
            arrays = content[UPDATE]
            if self.secure and poison is None:
                if not int(metrics.get("finite", 1)):
                    updates[row] = float("nan")  # withheld: the protocol counts it as non-finite
            else:
                updates[row] = read_tensor(arrays, "update", what=what, shape=(1, width))[0].to(params.dtype)
            if new_mom is not None and not (self.secure and poison is None):
                new_mom[row] = read_tensor(arrays, "momentum", what=what, shape=(1, d))[0].to(params.dtype)
            reports[row] = {k: float(metrics[k]) for k in metrics if k not in ("loss", "seconds", "finite")}
            ok[row] = True
        return LocalResult(updates, losses, new_mom, survivors=ok, reports=reports)


