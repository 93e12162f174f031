"""DBA (Xie et al. ICLR 2020): the split trigger against the reference code's MNIST patterns and
a plain-loop twin, the per-attacker poisoned batches, and a toy run in which the global trigger
succeeds far more than any local part the attackers trained on."""

from __future__ import annotations

import math

import pytest
import torch

from fedsafe.robust.attacks import ATTACKS, AttackContext, needs_own_updates
from fedsafe.robust.backdoor import (
    DistributedPoison,
    Poison,
    attack_success_rate,
    dba_triggers,
    make_poison,
)

# AI-secure/DBA, utils/mnist_params.yaml ("gap 2 size 1*4 base (0, 0)"): [row, column] pixels
REFERENCE_MNIST_PATTERNS = [
    [[0, 0], [0, 1], [0, 2], [0, 3]],
    [[0, 6], [0, 7], [0, 8], [0, 9]],
    [[3, 0], [3, 1], [3, 2], [3, 3]],
    [[3, 6], [3, 7], [3, 8], [3, 9]],
]


def test_default_parts_are_the_reference_mnist_patterns():
    """Convention pinned: parts = 4, size = 4, gap = 2 reproduce the reference's
    ``k_poison_pattern`` pixel lists; the reference sets them to 1.0, the largest value of its
    unnormalised images, fedsafe to each channel's largest training value."""
    x = torch.rand(6, 1, 28, 28)
    glob, parts = dba_triggers(x, 4, 4, 2)
    assert len(parts) == 4
    for part, pixels in zip(parts, REFERENCE_MNIST_PATTERNS):
        want = torch.zeros(1, 28, 28, dtype=torch.bool)
        for r, c in pixels:
            want[0, r, c] = True
        assert torch.equal(part.mask, want)
        assert torch.equal(part.values[part.mask], x.max().expand(4))
    union = torch.zeros(1, 28, 28, dtype=torch.bool)
    for pixels in REFERENCE_MNIST_PATTERNS:
        for r, c in pixels:
            union[0, r, c] = True
    assert torch.equal(glob.mask, union)


def _naive_parts(x: torch.Tensor, parts: int, size: int, gap: int) -> list[set[tuple[int, int, int]]]:
    c = x.shape[1]
    out = []
    for k in range(parts):
        row = (k // 2) * (1 + gap)
        col = (k % 2) * (size + gap)
        out.append({(ch, row, col + j) for ch in range(c) for j in range(size)})
    return out


@pytest.mark.parametrize("parts, size, gap, shape", [(3, 3, 1, (4, 3, 8, 8)), (5, 2, 0, (3, 2, 7, 5)), (1, 4, 9, (2, 1, 4, 4))])
def test_parts_against_a_plain_loop(parts, size, gap, shape):
    x = torch.randn(shape)
    glob, local = dba_triggers(x, parts, size, gap)
    want = _naive_parts(x, parts, size, gap)
    for t, cells in zip(local, want):
        got = {tuple(int(i) for i in idx) for idx in torch.nonzero(t.mask)}
        assert got == cells
        for ch, r, col in cells:
            assert float(t.values[ch, r, col]) == float(x[:, ch].max())
    got = {tuple(int(i) for i in idx) for idx in torch.nonzero(glob.mask)}
    assert got == set().union(*want)
    stamped = glob.apply(x)
    assert torch.equal(stamped[:, ~glob.mask], x[:, ~glob.mask])


def test_each_attacker_stamps_its_own_part():
    """Convention pinned: the part of Byzantine client i is its rank among the sorted Byzantine
    ids mod parts (the reference's ``adversarial_index`` into ``adversary_list``); unbound, i mod
    parts."""
    x_train = torch.randn(50, 1, 8, 8)
    poison = make_poison("dba", {"size": 3, "gap": 1, "target": 5, "fraction": 0.25}, x_train, 10)
    assert isinstance(poison, DistributedPoison) and poison.per_client
    bound = poison.bind({14, 3, 9, 5, 20})
    assert bound.clients == (3, 5, 9, 14, 20)
    x = torch.randn(3, 8, 1, 8, 8)
    y = torch.randint(0, 10, (3, 8))
    ids = [20, 5, 14]  # ranks 4, 1, 3 -> parts 0, 1, 3
    px, py = bound(x, y, 10, ids)
    k = math.ceil(0.25 * 8)
    for row, part in zip(range(3), [0, 1, 3]):
        t = poison.parts[part]
        for s in range(8):
            if s < k:
                want = x[row, s].clone()
                want[t.mask] = t.values[t.mask]
                assert torch.equal(px[row, s], want)
                assert int(py[row, s]) == 5
            else:
                assert torch.equal(px[row, s], x[row, s]) and int(py[row, s]) == int(y[row, s])
    assert torch.equal(x, x.clone()) and not torch.equal(px, x)  # a copy, the input untouched
    unbound_x, _ = poison(x, y, 10, [6, 7, 8])  # 6 mod 4 = 2, 7 -> 3, 8 -> 0
    for row, part in zip(range(3), [2, 3, 0]):
        assert torch.equal(unbound_x[row, 0], poison.parts[part].apply(x[row, 0]))


def test_success_rate_uses_the_global_trigger():
    x_train = torch.randn(40, 1, 8, 8)
    poison = make_poison("dba", {"size": 3, "gap": 1, "target": 2}, x_train, 10)
    x_test = torch.randn(30, 1, 8, 8)
    y_test = torch.arange(30) % 10
    glob = poison.trigger
    # a "model" that answers 2 exactly when every global-trigger pixel is white
    def predict(x: torch.Tensor) -> torch.Tensor:
        full = (x[:, glob.mask] == glob.values[glob.mask]).all(1)
        logits = torch.zeros(x.shape[0], 10)
        logits[full, 2] = 1.0
        logits[~full, 0] = 1.0
        return logits

    assert attack_success_rate(predict, x_test, y_test, poison) == 1.0
    for part in poison.parts:  # one part alone never completes the global trigger
        assert attack_success_rate(predict, x_test, y_test, Poison(trigger=part, target=2)) == 0.0


def test_parameters_are_checked_naming_the_field():
    x = torch.randn(5, 1, 8, 8)
    with pytest.raises(ValueError, match=r"attack.params: 4 DBA parts of 1x4 bars with gap 2 need images of at least 4x10, got 8x8"):
        make_poison("dba", {}, x, 10)
    with pytest.raises(ValueError, match=r"attack.params.parts = 0 must be an integer >= 1"):
        make_poison("dba", {"parts": 0, "size": 3, "gap": 1}, x, 10)
    with pytest.raises(ValueError, match=r"attack.params.target = 10 must be a class in \[0, 10\)"):
        make_poison("dba", {"target": 10, "size": 3, "gap": 1}, x, 10)
    with pytest.raises(ValueError, match=r"attack.params.fraction = 0 must lie in \(0, 1\]"):
        make_poison("dba", {"fraction": 0, "size": 3, "gap": 1}, x, 10)
    with pytest.raises(ValueError, match=r"images \(n, C, H, W\)"):
        make_poison("dba", {}, torch.randn(5, 64), 10)


def test_attack_sends_the_scaled_own_updates():
    assert needs_own_updates("dba")
    own = torch.randn(3, 20)
    ctx = AttackContext(f=3, n=10, round=0, generator=torch.Generator(), aggregate=lambda u: u.mean(0), own_updates=own)
    honest = torch.randn(7, 20)
    assert torch.equal(ATTACKS.get("dba", {})(honest, ctx=ctx), own)
    assert torch.equal(ATTACKS.get("dba", {"scale": 100.0})(honest, ctx=ctx), own * 100.0)
    with pytest.raises(ValueError, match=r"'dba': scale must be a number in \(0.0, inf\)"):
        ATTACKS.get("dba", {"scale": 0.0})(honest, ctx=ctx)


def test_toy_run_global_trigger_beats_every_local_part():
    """Digits, 20 clients of which 4 attack, 20 rounds: the global trigger, which no attacker
    trained on, succeeds far more often than any attacker's own local part (DBA's claim); the
    clean model (f = 0) answers the target for the trigger almost never."""
    from torch.func import functional_call

    from fedsafe import Experiment

    raw = {"rounds": 20, "seed": 0, "eval_every": 20, "checkpoint_every": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 1.0},
           "model": {"name": "mlp", "hidden": 32}, "clients": {"num_clients": 20}}
    res = Experiment(raw, attack={"name": "dba", "f": 4, "params": {"size": 3, "gap": 1}}).run()
    fed = res.federation
    assert len(fed.poison.clients) == 4  # bound to the run's Byzantine ids
    w = fed.layout.unflatten(fed.state.params)
    predict = lambda x: functional_call(fed.model, w, (x,))  # noqa: E731
    glob = res.summary["final_attack_success_rate"]
    # the reported rate is the global trigger's, recounted here
    keep = fed.data.y_test != 2
    with torch.no_grad():
        recount = float((predict(fed.poison.trigger.apply(fed.data.x_test[keep])).argmax(1) == 2).float().mean())
    assert glob == pytest.approx(recount)
    local = [attack_success_rate(predict, fed.data.x_test, fed.data.y_test, Poison(trigger=p, target=2)) for p in fed.poison.parts]
    assert res.summary["final_accuracy"] > 0.85
    assert glob > 0.3 and glob > 2 * max(local), (glob, local)
    clean = Experiment(raw, rounds=10, attack={"name": "dba", "f": 0, "params": {"size": 3, "gap": 1}}).run()
    assert clean.summary["final_attack_success_rate"] < 0.1


def test_config_refuses_a_trigger_that_does_not_fit_naming_the_field():
    from fedsafe import Experiment
    from fedsafe.core.errors import ConfigError

    raw = {"rounds": 1, "seed": 0, "data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 8},
           "clients": {"num_clients": 6}}
    with pytest.raises(ConfigError, match=r"attack.params: 4 DBA parts of 1x4 bars with gap 2 need images of at least 4x10, got 8x8"):
        Experiment(raw, attack={"name": "dba", "f": 2}).run()
    with pytest.raises(ConfigError, match=r"attack.params.source and target must differ"):
        Experiment(raw, attack={"name": "edge_case_backdoor", "f": 2, "params": {"source": 1}}).run()
