"""FLDetector (Zhang et al., KDD 2022): the L-BFGS Hessian-vector product against the BFGS
recursion and the reference code's compact form, exact 1-D k-means against brute force, the gap
statistic's choices, the checkpointable state, and detection of sign-flipping and scaling
attackers on a toy quadratic federation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.robust.fldetector import FLDetector, gap_statistic_k, kmeans_1d, lbfgs_hvp

try:
    from . import naive
except ImportError:  # tests/robust is not a package: pytest puts this folder on sys.path
    import naive


def _pairs(seed: int, n_pairs: int = 4, d: int = 9):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    h = a @ a.T + d * torch.eye(d, dtype=torch.float64)  # positive definite: yᵀs > 0
    s = torch.randn(n_pairs, d, generator=g, dtype=torch.float64)
    y = s @ h
    v = torch.randn(d, generator=g, dtype=torch.float64)
    return s, y, v


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_pairs", [1, 3, 6])
def test_hvp_against_the_bfgs_recursion(seed, n_pairs):
    s, y, v = _pairs(seed, n_pairs)
    want = naive.bfgs_matrix(s, y) @ v.numpy()
    np.testing.assert_allclose(lbfgs_hvp(s, y, v).numpy(), want, rtol=1e-9, atol=1e-10)


def test_hvp_as_the_reference_codes_compact_form():
    # the reference's lbfgs(): S, Y as d × N column matrices, R = triu(SᵀY), L = SᵀY − R
    s, y, v = _pairs(3, 5)
    S, Y, vv = s.numpy().T, y.numpy().T, v.numpy()[:, None]
    sty = S.T @ Y
    L = sty - np.triu(sty)
    sigma = float(Y[:, -1] @ S[:, -1]) / float(S[:, -1] @ S[:, -1])
    mat = np.block([[sigma * S.T @ S, L], [L.T, -np.diag(np.diag(sty))]])
    p = np.concatenate([S.T @ (sigma * vv), Y.T @ vv])
    ref = sigma * vv - np.concatenate([sigma * S, Y], axis=1) @ np.linalg.inv(mat) @ p
    np.testing.assert_allclose(lbfgs_hvp(s, y, v).numpy(), ref[:, 0], rtol=1e-9, atol=1e-10)


def test_hvp_is_invariant_to_a_common_scale_of_the_model_differences():
    # why a fixed multiple of w_t − w_{t−1} (e.g. −server.lr × the previous aggregate) serves
    s, y, v = _pairs(4, 4)
    base = lbfgs_hvp(s, y, v)
    for c in (1e-3, -0.5, 7.0):
        torch.testing.assert_close(lbfgs_hvp(c * s, y, c * v), base, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_exact_1d_kmeans_where_the_reference_runs_sklearns_heuristic(seed):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(0, 1, 5), rng.normal(6, 0.5, 4), [6.0, 6.0]])
    for k in range(1, 6):
        sse, labels = kmeans_1d(x, k)
        assert sse == pytest.approx(naive.kmeans_1d_sse(x, k), rel=1e-9, abs=1e-12)
        recomputed = sum(float(((x[labels == c] - x[labels == c].mean()) ** 2).sum()) for c in range(k))
        assert recomputed == pytest.approx(sse, rel=1e-9, abs=1e-12)
        order = np.argsort(x, kind="stable")
        assert (np.diff(labels[order]) >= 0).all()  # labels increase with the values


def test_gap_statistic_finds_two_groups_and_not_one():
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    two = np.concatenate([rng.normal(0.01, 0.001, 16), rng.normal(0.2, 0.005, 4)])
    one = rng.normal(0.05, 0.01, 20)
    assert gap_statistic_k(two, g) > 1  # an attack: FLDetector then splits by 2-means
    assert gap_statistic_k(one, g) == 1
    assert gap_statistic_k(np.full(5, 0.3), g) == 1  # all equal: nothing to split


def test_gap_statistic_against_a_naive_twin():
    # the same draws, the brute-force SSE and the formula's loops
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 1, 6), rng.normal(4, 1, 4)])
    got = gap_statistic_k(x, torch.Generator().manual_seed(5), refs=4, max_k=4)
    g = torch.Generator().manual_seed(5)
    z = (x - x.min()) / (x.max() - x.min())
    gaps, sds = [], []
    for k in range(1, 5):
        w = naive.kmeans_1d_sse(z, k)
        ref = [naive.kmeans_1d_sse(torch.rand(10, generator=g, dtype=torch.float64).numpy(), k) for _ in range(4)]
        logs = [math.log(r) for r in ref]
        mean_log = sum(logs) / 4
        gaps.append(math.log(sum(ref) / 4) - math.log(w))
        sds.append(math.sqrt(1 + 1 / 4) * math.sqrt(sum((t - mean_log) ** 2 for t in logs) / 4))
    want = next((k + 1 for k in range(3) if gaps[k] - gaps[k + 1] + sds[k + 1] >= 0), 4)
    assert got == want


def _federation(attack: str, rounds: int = 30, n: int = 20, bad: int = 4, d: int = 12, seed: int = 0, window: int = 5):
    """Gradient descent on Σ_i ½ (w − c_i)ᵀ A (w − c_i); clients 0..bad−1 attack; the
    detector gets the model's change each round. Returns the detector and its outputs."""
    g = torch.Generator().manual_seed(seed)
    a = torch.diag(torch.linspace(0.5, 2.0, d, dtype=torch.float64))
    centers = 1.0 + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64)
    prev_w = None
    det = FLDetector(window=window, rule="mean")
    outs = []
    for t in range(rounds):
        grads = (w - centers) @ a  # honest gradients (A symmetric)
        honest_mean = grads[bad:].mean(0)
        if attack == "sign_flip":
            grads[:bad] = -honest_mean
        elif attack == "scaling":
            grads[:bad] = 5.0 * grads[:bad] + 0.5 * torch.randn(bad, d, generator=g, dtype=torch.float64)
        delta = None if prev_w is None else w - prev_w
        out = det.aggregate(grads, list(range(n)), delta, torch.Generator().manual_seed(100 + t))
        outs.append(out)
        prev_w, w = w, w - 0.3 * out
    return det, outs


@pytest.mark.parametrize("attack", ["sign_flip", "scaling"])
def test_detects_sign_flipping_and_scaling_attackers(attack):
    det, _ = _federation(attack)
    assert det.flagged == {0, 1, 2, 3}


def test_no_attack_flags_nobody():
    det, outs = _federation("none")
    assert det.flagged == set()
    assert len(det.scores) == 20


def test_flagged_clients_leave_the_mean_for_the_rest_of_the_run():
    det, outs = _federation("sign_flip", rounds=30)
    # after detection, the aggregate is the honest clients' mean (the toy's honest gradients)
    g = torch.Generator().manual_seed(0)
    assert det.flagged == {0, 1, 2, 3}
    x = torch.randn(20, 12, generator=g, dtype=torch.float64)
    out = det.aggregate(x, list(range(20)), x[0] * 0 + 1e-3, torch.Generator().manual_seed(1))
    torch.testing.assert_close(out, x[4:].mean(0))


def test_state_dict_resumes_exactly():
    full_det, full = _federation("sign_flip", rounds=20)
    # replay: stop after 12 rounds, save, load into a fresh detector, finish
    g = torch.Generator().manual_seed(0)
    d, n, bad = 12, 20, 4
    a = torch.diag(torch.linspace(0.5, 2.0, d, dtype=torch.float64))
    centers = 1.0 + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    w, prev_w = torch.zeros(d, dtype=torch.float64), None
    det = FLDetector(window=5, rule="mean")
    outs = []
    for t in range(20):
        if t == 12:
            fresh = FLDetector(window=5, rule="mean")
            fresh.load_state_dict(det.state_dict())
            det = fresh
        grads = (w - centers) @ a
        grads[:bad] = -grads[bad:].mean(0)
        out = det.aggregate(grads, list(range(n)), None if prev_w is None else w - prev_w, torch.Generator().manual_seed(100 + t))
        outs.append(out)
        prev_w, w = w, w - 0.3 * out
    for a_, b_ in zip(outs, full):
        assert torch.equal(a_, b_)
    assert det.flagged == full_det.flagged


def test_errors():
    with pytest.raises(ValueError, match=r"fldetector: window must be an integer >= 1, got 0"):
        FLDetector(window=0)
    with pytest.raises(ValueError, match=r"fldetector: refs must be an integer >= 2"):
        FLDetector(refs=1)
    with pytest.raises(ValueError, match="one distinct client id per row"):
        FLDetector().aggregate(torch.ones(2, 3), [1, 1], None, torch.Generator())
    with pytest.raises(ValueError, match=r"kmeans_1d: k must be in \[1, 3\]"):
        kmeans_1d(np.ones(3), 4)


# --- the registered rule, run by the robust pipeline and the engine ------------------------------


def test_the_rule_alone_sees_one_round_and_returns_the_mean():
    from fedsafe.robust.aggregators import AGGREGATORS

    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    rule = AGGREGATORS.get("fldetector")
    median = torch.from_numpy(np.median(x.numpy(), axis=0))
    torch.testing.assert_close(rule(x, f=1, client_ids=range(6)), median)  # the default base rule
    torch.testing.assert_close(AGGREGATORS.get("fldetector", {"rule": "mean"})(x, f=1, client_ids=range(6)), x.mean(0))
    with pytest.raises(ValueError, match="needs the client id of every row"):
        rule(x, f=1)
    with pytest.raises(ValueError, match="parameter space"):  # zeroth-order messages: not the model's size
        rule(x, f=1, client_ids=range(6), model_delta=torch.ones(9), state=FLDetector(window=1), commit=True)
    assert set(AGGREGATORS.entry("fldetector").params) == {"window", "min_scores", "refs", "max_k", "rule"}
    with pytest.raises(ValueError, match="needs client_ids, history"):
        FLDetector(rule="foolsgold")
    with pytest.raises(ValueError, match="must be a registered aggregation rule"):
        FLDetector(rule="nope")


def test_the_pipeline_runs_the_detector_from_the_models_changes():
    """The pipeline makes the detector from the rule's parameters, computes Δw = w_t − w_{t−1}
    from the models begin_round sees, and records a round only when it aggregates it: the same
    outputs and flags as the detector driven by hand (_federation), and an attacker's what-if
    aggregation (apply) changes nothing."""
    from fedsafe.robust.pipeline import RobustPipeline

    want_det, want = _federation("sign_flip", rounds=20)
    pipe = RobustPipeline("fldetector", {"window": 5, "rule": "mean"}, [], 4, seed=0)
    assert pipe.follows_clients and pipe.uses_model_delta
    g = torch.Generator().manual_seed(0)
    n, bad, d = 20, 4, 12
    a = torch.diag(torch.linspace(0.5, 2.0, d, dtype=torch.float64))
    centers = 1.0 + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64)
    got = []
    # the detector's gap statistic draws from the pipeline's stream ("robust.rule", t)
    for t in range(20):
        pipe.begin_round(t, w)
        grads = (w - centers) @ a
        grads[:bad] = -grads[bad:].mean(0)
        before = pipe.state_dict()
        pipe.apply(-grads, t, list(range(n)))
        after = pipe.state_dict()
        assert before["_rule_state"]["scores"] == after["_rule_state"]["scores"]
        assert before["_rule_state"]["flagged"] == after["_rule_state"]["flagged"]
        out = pipe(grads, t, list(range(n)))
        got.append(out)
        w = w - 0.3 * out
    assert pipe.rule_state.flagged == want_det.flagged == {0, 1, 2, 3}
    # the same aggregates until detection draws (its generator differs from _federation's)
    for x, y in zip(got[:6], want[:6]):
        torch.testing.assert_close(x, y)
    with pytest.raises(ValueError, match="cannot run after pre-aggregators"):
        RobustPipeline("fldetector", {}, [("nnm", {})], 1, 0)
    with pytest.raises(ValueError, match="only calling the pipeline records them"):
        pipe.record(got[-1])


# each client's full-batch gradient, as the reference code's clients send (FLDetector assumes
# an honest update is predictable from the last one: see the class docstring)
RAW_FLD = {"rounds": 16, "seed": 1, "eval_every": 4, "checkpoint_every": 2,
           "data": {"name": "digits"}, "model": {"name": "logreg"},
           "clients": {"num_clients": 10, "sampling": "all", "algorithm": "dsgd", "batch_size": 1000},
           "robust": {"rule": "fldetector", "params": {"window": 3}}, "attack": {"name": "sign_flip", "f": 2}}


def test_engine_flags_the_byzantine_clients_and_resumes_exactly(tmp_path, interrupted_then_resumed):
    from fedsafe import Experiment

    whole = Experiment(RAW_FLD).run(tmp_path / "whole")
    fed = whole.federation
    flagged = fed.pipeline.rule_state.flagged
    assert flagged == set(map(int, fed.byzantine))
    resumed = interrupted_then_resumed(lambda: Experiment(RAW_FLD), tmp_path / "cut", after=8)
    assert torch.equal(resumed.federation.state.params, fed.state.params)
    assert resumed.federation.pipeline.rule_state.flagged == flagged


def test_a_round_without_movement_is_not_scored():
    # the same updates every round: the aggregate differences are 0, the compact matrix singular
    det = FLDetector(window=2, rule="mean")
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for t in range(5):
        out = det.aggregate(x, range(5), torch.full((4,), 1e-3), torch.Generator().manual_seed(t))
        torch.testing.assert_close(out, x.mean(0))
    assert det.scores == {} and det.flagged == set()
    det.aggregate(x, range(5), torch.zeros(4), torch.Generator())  # a model that did not move either
