"""A Flower ``Grid`` in this process, for fast tests of fedsafe's ServerApp logic: each node is a
``Context`` (its node config and its persistent ``state``) and the ClientApp is called directly,
as a SuperNode would call it. A node can be killed from a given message on: it then never
replies again, as a SuperNode whose process died."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity


class FakeGrid:
    def __init__(self, client_app: Any, num_nodes: int, *, partitions: list[int] | None = None,
                 num_partitions: int | None = None, run_config: dict | None = None) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # the ServerApp (conftest resets it)
        self.app = client_app
        ids = partitions if partitions is not None else list(range(num_nodes))
        total = num_partitions if num_partitions is not None else num_nodes
        self.nodes = {
            1000 + i: Context(run_id=1, node_id=1000 + i, node_config={"partition-id": pid, "num-partitions": total},
                              state=RecordDict(), run_config=dict(run_config or {}))
            for i, pid in enumerate(ids)
        }
        self.dead: set[int] = set()
        self.kill_when: list[tuple[int, Any]] = []  # (node, predicate(message)) -> dies on a match
        self.sent: list[Message] = []
        self.replies: list[Message] = []

    def add_node(self, partition: int, num_partitions: int) -> int:
        """A new SuperNode (a restarted one gets a new node id) holding ``partition``."""
        node = max(self.nodes) + 1
        self.nodes[node] = Context(run_id=1, node_id=node, node_config={"partition-id": partition,
                                   "num-partitions": num_partitions}, state=RecordDict(), run_config={})
        return node

    def node_of(self, client: int) -> int:
        return next(n for n, c in self.nodes.items() if c.node_config["partition-id"] == client and n not in self.dead)

    def kill(self, client: int, when: Any = None) -> None:
        """Kill ``client``'s node now, or when ``when(message)`` first holds for a message to it."""
        node = self.node_of(client)
        if when is None:
            self.dead.add(node)
        else:
            self.kill_when.append((node, when))

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.nodes if n not in self.dead]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        out = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())  # as a grid does on push
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            for k, (n, when) in enumerate(list(self.kill_when)):
                if n == node and when(msg):
                    self.dead.add(n)
                    self.kill_when.remove((n, when))
            if node in self.dead or node not in self.nodes:
                continue  # no reply: the timeout passes
            try:
                reply = self.app(msg, self.nodes[node])
            except Exception as e:  # what a SuperNode sends back for a ClientApp that raised
                reply = Message(Error(code=1, reason=f"{type(e).__name__}: {e}"), reply_to=msg)
            self.replies.append(reply)
            out.append(reply)
        return out
