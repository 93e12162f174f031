"""The robust rules the TEE offload runs, and why the others cannot.

Each rule has two phases: a *selection* from the decoded distance matrix ``D`` or Gram matrix
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

import torch
from torch import Tensor

from fedsafe.robust.filters import cosine_filter_select, norm_filter_select
from fedsafe.robust.aggregators import mean_around_median
from fedsafe.robust.rows import average_rows
from fedsafe.robust.krum import bulyan_select, krum_select, multi_krum_select

# rule -> the parameters it accepts
TEE_RULES: dict[str, tuple[str, ...]] = {
    "krum": (),
    "multi_krum": ("m",),
    "bulyan": (),
    "norm_filter": ("factor",),
    "cosine_filter": (),
}

_COORDINATE_WISE = {"median", "trimmed_mean", "meamed", "signguard", "dnc", "centered_clipping", "mean"}


def refusal(rule: str) -> str | None:
    """Why ``rule`` cannot run on the TEE offload, or None if it can."""
    if rule in TEE_RULES:
        return None
    valid = ", ".join(TEE_RULES)
    if rule in _COORDINATE_WISE:
        why = (
            "it works on individual coordinates (or whole vectors, not their distances); the "
            "accelerators hold only encoded vectors Y = g ± R, from which nothing but distances "
            "and inner products decode, so the rule would run entirely inside the enclave — the "
            "single-threaded cost the offload exists to avoid"
        )
    else:
        why = "the offload decodes only pairwise distances and inner products, and this rule is not implemented on them"
    return f"rule {rule!r} cannot run with protocol 'tee': {why}. Valid rules: {valid}"


def check_params(rule: str, params: dict[str, Any]) -> None:
    unknown = sorted(set(params) - set(TEE_RULES[rule]))
    if unknown:
        allowed = ", ".join(TEE_RULES[rule]) or "none"
        raise ValueError(f"rule {rule!r} with protocol 'tee': unknown parameter(s) {', '.join(unknown)}; valid: {allowed}")


def select(rule: str, gram: Tensor, dist: Tensor, f: int, params: dict[str, Any]) -> Tensor:
    """Indices of the selected updates (the order the rule defines)."""
    check_params(rule, params)
    if rule == "krum":
        return torch.tensor([krum_select(dist, f)])
    if rule == "multi_krum":
        return multi_krum_select(dist, f, params.get("m"))
    if rule == "bulyan":
        return bulyan_select(dist, f)
    if rule == "norm_filter":
        return norm_filter_select(gram, f, **params)
    if rule == "cosine_filter":
        return cosine_filter_select(gram, f)
    raise ValueError(refusal(rule))


def combine(rule: str, updates: Tensor, idx: Tensor, f: int) -> Tensor:
    """The aggregate of the selected ``updates[idx]``, as the plaintext rule computes it."""
    if rule == "krum":
        return updates[int(idx[0])].clone()
    if rule == "bulyan":
        theta = idx.numel()
        return mean_around_median(torch.sort(updates.index_select(0, idx), dim=0).values, theta - 2 * f)
    return average_rows(updates, idx)
