"""Shared test helpers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


class _Stop(Exception):
    """Raised by a callback to stop a run mid-way, as a crash or Ctrl-C would."""


@pytest.fixture
def interrupted_then_resumed() -> Callable:
    """``resume(make, out_dir, after=2)``: run ``make()`` (a fresh ``fedsafe.Experiment``) into
    ``out_dir``, stop it after round ``after`` (its checkpoint there), then resume it with
    another ``make()``; returns the resumed run's ``Result``."""

    def resume(make: Callable, out_dir: Path, after: int = 2):
        def stop(row):
            if row["round"] == after:
                raise _Stop

        with pytest.raises(_Stop):
            make().run(out_dir, callbacks=[stop])
        return make().run(out_dir, resume=True)

    return resume
