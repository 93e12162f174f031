"""How fedsafe's ServerApp waits for the nodes' replies: a Flower ``Grid`` is driven through
``push_messages``/``pull_messages``, pulling 0.05 s after a reply and at most 0.5 s apart, not
through ``send_and_receive`` (whose pulls are 3 s apart: up to 3 s lost at every exchange of a
deployed round)."""

from __future__ import annotations

import time
from typing import Any

from flwr.app import Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedsafe.flower.nodes import POLL_MAX_SECONDS, _replies


class DelayedGrid(Grid):
    """Replies to each message after ``delay[node]`` seconds (never for a node not in it)."""

    def __init__(self, delay: dict[int, float]) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # the ServerApp (conftest resets it)
        self.delay = delay
        self.ready: dict[str, tuple[float, Message]] = {}
        self.pulls = 0

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        for k, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{len(self.ready)}-{k}"
            node = msg.metadata.dst_node_id
            if node in self.delay:
                reply = Message(Error(code=0, reason=str(node)), reply_to=msg)
                self.ready[msg.metadata.message_id] = (time.monotonic() + self.delay[node], reply)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Any) -> list[Message]:
        self.pulls += 1
        now = time.monotonic()
        return [self.ready[i][1] for i in message_ids if i in self.ready and self.ready[i][0] <= now]

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        raise AssertionError("fedsafe must not wait through send_and_receive (a 3 s poll)")

    def get_node_ids(self) -> list[int]:
        return list(self.delay)

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover - unused
        raise NotImplementedError

    def set_run(self, run_id: int) -> None:  # pragma: no cover - unused
        pass

    @property
    def run(self) -> Any:  # pragma: no cover - unused
        return None


def _messages(nodes: list[int]) -> dict[int, Message]:  # after DelayedGrid(): a task identity is set
    return {n: Message(RecordDict(), dst_node_id=n, message_type="query.x") for n in nodes}


def test_replies_are_collected_as_they_come_not_3_s_later() -> None:
    grid = DelayedGrid({1: 0.0, 2: 0.3, 3: 2.0})
    t0 = time.monotonic()
    got = _replies(grid, _messages([1, 2, 3]), timeout=10)
    took = time.monotonic() - t0
    assert sorted(got) == [1, 2, 3] and all(got[n].error.reason == str(n) for n in got)
    assert 2.0 <= took < 2.0 + POLL_MAX_SECONDS + 0.2  # Flower's send_and_receive: 3 s
    # backing off while nothing comes: 2 s of waiting is not 40 pulls at 0.05 s
    assert 5 <= grid.pulls <= 12


def test_a_node_that_never_replies_costs_the_timeout_and_is_left_out() -> None:
    grid = DelayedGrid({1: 0.0, 2: 0.1})
    t0 = time.monotonic()
    got = _replies(grid, _messages([1, 2, 9]), timeout=0.8)  # node 9 is gone
    took = time.monotonic() - t0
    assert sorted(got) == [1, 2]
    assert 0.8 <= took < 0.8 + 0.2
