"""clients.gradient = "zeroth_order" inside the engine (BAFFLE)."""

import numpy as np
import torch

from fedsafe.config import apply_overrides, validate
from fedsafe.engine.federation import Federation


def cfg(**over):
    raw = {
        "seed": 0, "rounds": 30, "eval_every": 30,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": 10, "batch_size": 32, "gradient": "zeroth_order"},
        "server": {"lr": 0.5},
        "zo": {"k": 200, "sigma": 1e-3, "clip_inf": None},
    }
    return validate(apply_overrides(raw, over))


def test_fedsgd_uploads_k_scalars_and_learns():
    fed = Federation(cfg())
    fed.run()
    assert fed.rows[0]["bytes_up"] == 10 * 4 * 200  # 4K bytes per client
    assert fed.rows[-1]["test_accuracy"] > 0.5  # chance is 0.1
    assert fed.state.momentum is None


def test_decoded_direction_matches_backprop_direction():
    zo = Federation(cfg(rounds=1, **{"zo.k": 2000}))
    bp = Federation(cfg(rounds=1, **{"clients.gradient": "backprop", "clients.momentum": 0.0}))
    ids = torch.arange(10).numpy()
    g_bp = bp.work.run(1, bp.state.params, ids, torch.zeros(10, bp.state.params.numel())).updates.mean(0)
    msgs = zo.work.run(1, zo.state.params, ids).updates
    g_zo = zo.work.decode(msgs.mean(0), 1)
    cos = torch.nn.functional.cosine_similarity(g_zo, g_bp, dim=0)
    # √(K/(d+K)) = √(2000/2650) ≈ 0.87 for an unbiased estimator; allow statistical slack.
    assert cos > 0.75


def test_robust_rules_run_on_the_scalars_under_attack():
    fed = Federation(cfg(rounds=3, **{"robust.rule": "trimmed_mean", "attack.name": "sign_flip", "attack.f": 2}))
    fed.run()
    assert all("skipped" not in r for r in fed.rows)


def test_fedavg_zeroth_order_sends_model_delta():
    fed = Federation(cfg(rounds=2, **{"clients.algorithm": "fedavg", "clients.local_steps": 2, "clients.lr": 0.1,
                                      "zo.k": 20}))
    fed.run()
    d = fed.state.params.numel()
    assert fed.rows[0]["bytes_up"] == 10 * 4 * d


# --- every clients.* / zo.* knob acts in both modes (checked against loops written out) ------

def _naive_loss(fed):
    from torch.func import functional_call

    def loss(flat, x, y):
        return torch.nn.functional.cross_entropy(functional_call(fed.model, fed.layout.unflatten(flat), (x,)), y)

    return loss


def _batch(fed, t, s, c):
    from fedsafe.engine.clients import draw_batches

    idx = torch.from_numpy(draw_batches(fed.cfg.seed, t, s, np.array([c]), fed.data.client_indices,
                                        fed.cfg.clients.batch_size))[0]
    return fed.data.x_train[idx], fed.data.y_train[idx]


def _close(got, want):
    # float32 loss differences at σ = 1e-3 carry ~1e-4 relative rounding; a missing clip, decay or
    # momentum moves the result by O(1)
    assert float((got - want).norm()) <= 1e-3 * float(want.norm())


def _clip(g, c):  # torch.nn.utils.clip_grad_norm_(norm_type=inf) written out
    return g if c is None else g * min(1.0, c / (float(g.abs().max()) + 1e-6))


def test_fedavg_clips_every_local_step_like_the_loop_written_out():
    from fedsafe.zo import PerturbationSource

    over = {"clients.algorithm": "fedavg", "clients.local_steps": 3, "clients.lr": 0.5,
            "clients.weight_decay": 0.01, "zo.k": 8, "zo.clip_inf": 0.02, "zo.chunk": 3}
    fed = Federation(cfg(rounds=1, **over))
    loss, d = _naive_loss(fed), fed.state.params.numel()
    src = PerturbationSource(0, d, 1e-3, "zo.local")
    w0 = fed.state.params
    ids = np.array([0, 3, 7])
    got = fed.work.run(1, w0, ids).updates
    for row, c in enumerate(ids):
        w = w0.clone()
        for s in range(3):
            x, y = _batch(fed, 1, s, c)
            base = loss(w, x, y)
            g = sum(src.unit((1, int(c), s), k) * (loss(w + 1e-3 * src.unit((1, int(c), s), k), x, y) - base)
                    for k in range(8)) / (8 * 1e-3)
            w = w - 0.5 * (_clip(g, 0.02) + 0.01 * w)
        _close(got[row], w - w0)


def test_fedsgd_applies_clip_weight_decay_and_momentum_like_the_loop_written_out():
    from fedsafe.zo import PerturbationSource

    beta, lam, clip, lr, k, sigma = 0.6, 0.05, 0.05, 0.5, 12, 1e-3
    over = {"clients.momentum": beta, "clients.weight_decay": lam, "zo.clip_inf": clip, "zo.k": k,
            "zo.chunk": 5, "server.lr": lr, "clients.num_clients": 4}
    fed = Federation(cfg(rounds=3, **over))
    fed.run()
    loss = _naive_loss(fed)
    w0 = Federation(cfg(rounds=3, **over)).state.params
    w = w0.clone()
    src = PerturbationSource(0, w.numel(), sigma, "zo.delta")
    m = torch.zeros_like(w)
    for t in range(1, 4):
        batches = [_batch(fed, t, 0, c) for c in range(4)]
        # mean over clients of s_k = L(W + σ z_k) − L(W), then ĝ = (1/(Kσ)) Σ z_k s̄_k
        s = [sum(loss(w + sigma * src.unit(t, j), x, y) - loss(w, x, y) for x, y in batches) / 4 for j in range(k)]
        g = sum(src.unit(t, j) * s[j] for j in range(k)) / (k * sigma)
        m = beta * m + (1 - beta) * (_clip(g, clip) + lam * w)
        w = w - lr * m
    _close(fed.state.params - w0, w - w0)


def test_fedsgd_momentum_resumes_exactly(tmp_path):
    from fedsafe.engine.metrics import read_metrics

    c = cfg(rounds=4, checkpoint_every=2, **{"clients.momentum": 0.8, "clients.weight_decay": 1e-3, "zo.k": 10,
                                             "clients.num_clients": 3, "eval_every": 1})
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    full = Federation(c, out_dir=tmp_path / "a")
    full.run()
    killed = Federation(c, out_dir=tmp_path / "b")
    for _ in range(3):  # checkpoint after round 2; round 3 is redone on resume
        killed.run_round()
    resumed = Federation(c, out_dir=tmp_path / "b")
    resumed.restore()
    resumed.run()
    assert torch.equal(full.state.params, resumed.state.params)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in rows]  # noqa: E731
    assert strip(read_metrics(tmp_path / "a")) == strip(read_metrics(tmp_path / "b"))
