"""Fixtures for the Flower tests: skipped when Flower (fedsafe[flower]) is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="fedsafe[flower] is not installed")


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages built outside a Flower runtime need a task identity (FakeGrid sets one)."""
    from flwr.supercore.task_identity import TaskIdentity

    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None
