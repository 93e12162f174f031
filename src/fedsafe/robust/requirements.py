"""The check every robust rule and pre-aggregator makes on (n, f) before it runs.

A requirement that fails raises :class:`fedsafe.core.errors.RequirementError`, so the engine can
tell "this round's sample is too small for the rule" (skipped and recorded under Poisson
sampling) from a programming error (which propagates).
"""

from __future__ import annotations

from fedsafe.core.errors import RequirementError


def require(rule: str, n: int, f: int, ok: bool, requirement: str) -> None:
    """Raise ValueError for an invalid ``f`` and RequirementError when ``ok`` is false, naming
    ``rule``, the ``requirement`` it states (e.g. ``"n >= 2f + 3"``) and the n, f given."""
    if not isinstance(f, int) or isinstance(f, bool) or f < 0:
        raise ValueError(f"{rule}: f must be an integer >= 0, got f={f!r}")
    if not ok:
        raise RequirementError(f"{rule} requires {requirement}, got n={n}, f={f}")
