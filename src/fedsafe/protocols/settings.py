"""Validation shared by the protocols' config sections (a light module: the config imports it)."""

from __future__ import annotations

import math


def number_or_auto(key: str, value: object, *, upper: float = math.inf) -> object:
    """An encoding range or bound: ``"auto"`` (resolved by the protocol at run time) or a finite
    number in (0, ``upper``], as a float; a ``ValueError`` naming ``key`` and the valid values
    otherwise (booleans and other strings included)."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"{key} must be a number > 0 or 'auto', got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number > 0 or 'auto', got {value!r}")
    if not math.isfinite(value) or not 0 < value <= upper:
        limit = "greater than 0" if upper == math.inf else f"in (0, {upper:g}]"
        raise ValueError(f"{key} must be a finite number {limit} (or 'auto'), got {value}")
    return float(value)
