"""The robust rules the TEE offload runs, and why the others cannot.

The rules are those the robust registry tags ``"distance_split"`` (``fedsafe.robust.split``):
this module reads them, their parameters and their two phases from ``AGGREGATORS``, so a rule
added there with a split runs on the TEE with no change here. Each rule has two phases: a *selection* from the decoded distance matrix ``D`` or Gram matrix
``G`` (what the accelerators make possible), then an *aggregation* of the selected plaintext
updates inside the enclave, with the robust package's own code so that a TEE round and a
plaintext round with the same selection give bit-identical aggregates:

=============  =========================================  ===========================================
rule           selection (in the enclave, on decoded …)   aggregation (in the enclave)
=============  =========================================  ===========================================
krum           ``krum_select(D, f)``                      the selected update
multi_krum     ``multi_krum_select(D, f, m)``             mean of the ``m`` selected
bulyan         ``bulyan_select(D, f)`` (θ = n − 2f)       per coordinate, mean of the θ − 2f selected
                                                          values closest to their median
norm_filter    ``norm_filter_select(G, f, factor)``       mean of the kept
cosine_filter  ``cosine_filter_select(G, f)``             mean of the kept
=============  =========================================  ===========================================
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedsafe.robust.aggregators import AGGREGATORS
from fedsafe.robust.split import TAG, split_of

_COORDINATE_WISE = {"median", "trimmed_mean", "meamed", "signguard", "dnc", "centered_clipping", "mean"}


def tee_rules() -> dict[str, tuple[str, ...]]:
    """Rule -> the parameters it accepts, for every rule the offload runs."""
    return {name: tuple(AGGREGATORS.entry(name).params) for name in AGGREGATORS.tagged(TAG)}


def refusal(rule: str) -> str | None:
    """Why ``rule`` cannot run on the TEE offload, or None if it can."""
    valid = tee_rules()
    if rule in valid:
        return None
    if rule in _COORDINATE_WISE:
        why = (
            "it works on individual coordinates (or whole vectors, not their distances); the "
            "accelerators hold only encoded vectors Y = g ± R, from which nothing but distances "
            "and inner products decode, so the rule would run entirely inside the enclave — the "
            "single-threaded cost the offload exists to avoid"
        )
    else:
        why = "the offload decodes only pairwise distances and inner products, and this rule is not implemented on them"
    return f"rule {rule!r} cannot run with protocol 'tee': {why}. Valid rules: {', '.join(valid)}"


def check_params(rule: str, params: dict[str, Any]) -> None:
    allowed = tee_rules()[rule]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"rule {rule!r} with protocol 'tee': unknown parameter(s) {', '.join(unknown)}; "
            f"valid: {', '.join(allowed) or 'none'}"
        )


def select(rule: str, gram: Tensor, dist: Tensor, f: int, params: dict[str, Any]) -> Tensor:
    """Indices of the selected updates (the order the rule defines)."""
    split = split_of(AGGREGATORS, rule)
    if split is None:
        raise ValueError(refusal(rule))
    check_params(rule, params)
    return split.select(dist if split.matrix == "distances" else gram, f, **params)


def combine(rule: str, updates: Tensor, idx: Tensor, f: int) -> Tensor:
    """The aggregate of the selected ``updates[idx]``, as the plaintext rule computes it."""
    return split_of(AGGREGATORS, rule).combine(updates, idx, f)
