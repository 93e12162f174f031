"""Fixtures for the Flower tests: skipped when Flower (fedsafe[flower]) is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="fedsafe[flower] is not installed")


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages built outside a Flower runtime need a task identity (FakeGrid sets one)."""
    from flwr.supercore.task_identity import TaskIdentity

    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


#: The Flower project whose own ClientApps FedsafeStrategy is tested with.
STRATEGY_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower_strategy"


@pytest.fixture(scope="module")
def digits():
    """examples/flower_strategy's modules: (client_app, task, server_app)."""
    sys.path.insert(0, str(STRATEGY_EXAMPLE))
    try:
        import digits_app.client_app as client
        import digits_app.server_app as server
        import digits_app.task as task

        yield client, task, server
    finally:
        sys.path.remove(str(STRATEGY_EXAMPLE))
