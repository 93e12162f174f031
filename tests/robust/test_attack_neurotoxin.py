"""Neurotoxin (Zhang et al. ICML 2022): the mask against a plain-loop twin and the reference
code's ``gradmask_ratio`` semantics, the masked update, the previous-aggregate variant's state,
and a toy run."""

from __future__ import annotations

import math

import pytest
import torch

from fedsafe.robust.attacks import ATTACKS, AttackContext, needs_own_updates, neurotoxin_mask


def _naive_mask(benign: list[float], ratio: float) -> list[bool]:
    d = len(benign)
    keep = int(math.floor(ratio * d))
    order = sorted(range(d), key=lambda i: (abs(benign[i]), i))  # ascending |g|, ties by index
    kept = set(order[:keep])
    return [i in kept for i in range(d)]


@pytest.mark.parametrize("ratio", [0.95, 0.5, 0.1, 1.0, 0.999])
def test_mask_against_a_plain_loop(ratio):
    g = torch.Generator().manual_seed(1)
    benign = torch.randn(203, generator=g, dtype=torch.float64)
    benign[10:20] = 0.5  # ties
    benign[30] = -benign[31]
    assert neurotoxin_mask(benign, ratio).tolist() == _naive_mask(benign.tolist(), ratio)


def test_ratio_is_the_fraction_retained():
    """Convention pinned: ``ratio`` is the reference's ``gradmask_ratio``
    (jhcknzzm/Federated-Learning-Backdoor, helper.grad_mask_cv: ``topk(-|grad|, int(len · ratio))``
    set to 1, i.e. the ratio of smallest-magnitude coordinates *kept*; 1.0 is its no-mask
    baseline); the paper's "top-k%" removed is 1 − ratio."""
    benign = torch.arange(1.0, 101.0)  # |g| increasing: the largest are the last ones
    mask = neurotoxin_mask(benign, 0.95)
    assert mask[:95].all() and not mask[95:].any()
    assert neurotoxin_mask(benign, 1.0).all()


def _ctx(own, f=2, n=7, state=None, aggregate=lambda u: u.mean(0)):
    return AttackContext(f=f, n=n, round=0, generator=torch.Generator(), aggregate=aggregate,
                         state={} if state is None else state, own_updates=own)


def test_update_touches_only_the_coordinates_honest_clients_update_least():
    assert needs_own_updates("neurotoxin")
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(5, 400, generator=g)
    own = torch.randn(2, 400, generator=g)
    out = ATTACKS.get("neurotoxin", {"ratio": 0.9, "boost": 2.0})(honest, ctx=_ctx(own))
    mean = honest.double().mean(0).tolist()
    keep = _naive_mask(mean, 0.9)
    for j in range(400):
        if keep[j]:
            assert torch.equal(out[:, j], own[:, j] * 2.0)
        else:
            assert (out[:, j] == 0).all()
    touched = out.abs().sum(0) > 0
    top = torch.topk(honest.double().mean(0).abs(), 40).indices  # the 10% honest clients update most
    assert not touched[top].any() and int(touched.sum()) == 360


def test_previous_aggregate_variant_keeps_the_servers_last_aggregate():
    """``benign = "previous_aggregate"`` (the paper's Algorithm 1): round 1 falls back to the honest
    mean; it stores ctx.aggregate(honest ∪ its messages) and masks round 2 with that."""
    g = torch.Generator().manual_seed(2)
    h1, h2 = torch.randn(4, 60, generator=g), torch.randn(4, 60, generator=g)
    own1, own2 = torch.randn(2, 60, generator=g), torch.randn(2, 60, generator=g)
    state: dict = {}
    atk = ATTACKS.get("neurotoxin", {"benign": "previous_aggregate", "ratio": 0.8})
    out1 = atk(h1, ctx=_ctx(own1, state=state))
    keep1 = torch.tensor(_naive_mask(h1.double().mean(0).tolist(), 0.8))
    assert torch.equal(out1, own1 * keep1)
    prev = torch.cat([h1, out1]).mean(0).double()
    torch.testing.assert_close(state["previous"], prev)
    out2 = atk(h2, ctx=_ctx(own2, state=state))
    keep2 = torch.tensor(_naive_mask(prev.tolist(), 0.8))
    assert torch.equal(out2, own2 * keep2)


def test_parameters_are_checked():
    own = torch.randn(2, 10)
    honest = torch.randn(3, 10)
    with pytest.raises(ValueError, match=r"'neurotoxin': ratio must be a number in \(0.0, 1.0\], got 0.0"):
        ATTACKS.get("neurotoxin", {"ratio": 0.0})(honest, ctx=_ctx(own))
    with pytest.raises(ValueError, match=r"benign 'x' unknown; valid: honest_mean, previous_aggregate"):
        ATTACKS.get("neurotoxin", {"benign": "x"})(honest, ctx=_ctx(own))
    with pytest.raises(ValueError, match="fraction must lie in"):
        ATTACKS.get("neurotoxin", {"fraction": 2.0})(honest, ctx=_ctx(own))


def test_toy_run_implants_the_backdoor():
    """Digits, 4 of 20 clients, 20 rounds: the masked backdoor still takes (ASR well above the
    clean model's, main accuracy kept) although it never touches the 5% of coordinates the honest
    clients move most."""
    from fedsafe import Experiment

    raw = {"rounds": 20, "seed": 0, "eval_every": 20, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20}}
    res = Experiment(raw, attack={"name": "neurotoxin", "f": 4}).run()
    assert res.summary["final_accuracy"] > 0.85
    assert res.summary["final_attack_success_rate"] > 0.6
