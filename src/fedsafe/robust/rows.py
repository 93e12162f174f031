"""What every robust rule and pre-aggregator does to the rows of an ``(n, d)`` update matrix
before and after its own logic: check the input, check its requirement on (n, f), average the
rows it selected.

A requirement that fails raises :class:`fedsafe.core.errors.RequirementError`, so the engine can
tell "this round's sample is too small for the rule" (skipped and recorded under Poisson
sampling) from a programming error (which propagates).
"""

from __future__ import annotations

from torch import Tensor

from fedsafe.core.errors import RequirementError


def check_matrix(updates: Tensor, name: str, *, floating: bool = True) -> int:
    """n, after checking that ``updates`` is a non-empty 2-D tensor (of floating point unless
    ``floating`` is false); ValueError naming ``name`` otherwise."""
    if updates.ndim != 2:
        raise ValueError(f"{name}: updates must be a 2-D (n, d) tensor, got shape {tuple(updates.shape)}")
    n = updates.shape[0]
    if n == 0:
        raise ValueError(f"{name}: no updates to aggregate")
    if floating and not updates.is_floating_point():
        raise ValueError(f"{name}: updates must be floating point, got {updates.dtype}")
    return n


def require(rule: str, n: int, f: int, ok: bool, requirement: str) -> None:
    """Raise ValueError for an invalid ``f`` and RequirementError when ``ok`` is false, naming
    ``rule``, the ``requirement`` it states (e.g. ``"n >= 2f + 3"``) and the n, f given."""
    if not isinstance(f, int) or isinstance(f, bool) or f < 0:
        raise ValueError(f"{rule}: f must be an integer >= 0, got f={f!r}")
    if not ok:
        raise RequirementError(f"{rule} requires {requirement}, got n={n}, f={f}")


def average_rows(updates: Tensor, rows: Tensor) -> Tensor:
    """Mean of the selected rows (index or boolean tensor) as one matrix-vector product with
    weights 1/|rows| on them and 0 elsewhere: no copy of the selected (m, d) block."""
    w = updates.new_zeros(updates.shape[0])
    w[rows.to(updates.device)] = 1.0
    return (w / w.sum()) @ updates


def median_value(values: Tensor) -> Tensor:
    """The median of a 1-D tensor, as a 0-d tensor (even count: the mean of the two middle
    values, fedsafe's median convention)."""
    s = values.sort().values
    h = s.numel() // 2
    return s[h] if s.numel() % 2 else (s[h - 1] + s[h]) / 2
