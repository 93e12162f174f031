"""Issue #25.1: DP noise and the DP client sample must not be regenerable from the public seed.

The finding: central, local and distributed noise, and the Poisson sample, came from streams of
``config.seed`` (saved beside the model), so the noise in a released model could be regenerated
and subtracted (it matched to 1.2e-8). By default every privacy-relevant draw now comes from a
secret drawn from the OS (``fedsafe.core.randomness``); ``secure_randomness = false`` keeps the
old, reproducible draws and stamps the run "not private".
"""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

from fedsafe.config import apply_overrides, validate
from fedsafe.core.randomness import SEEDED_WARNING, RandomSource, sample_subset
from fedsafe.core.streams import numpy_stream, torch_stream
from fedsafe.engine.federation import Federation
from fedsafe.engine.run import run_experiment
from fedsafe.engine.sampling import sample_clients

Z, CLIP, M, SERVER_LR = 1.0, 0.5, 10, 1.0


def cfg(**over):
    raw = {
        "seed": 0, "rounds": 1, "eval_every": 1,
        "data": {"name": "digits"}, "model": {"name": "mlp", "hidden": 32},
        "clients": {"num_clients": M, "sampling": "all", "algorithm": "fedavg", "local_steps": 1, "lr": 0.1},
        "server": {"lr": SERVER_LR},
        "dp": {"enabled": True, "clip": CLIP, "noise_multiplier": Z, "placement": "central", "delta": 1e-5},
    }
    return validate(apply_overrides(raw, over))


def released_noise(**over) -> torch.Tensor:
    """The noise in a released one-round model: the model minus the same round run with z = 0
    (same data, clipping and step), times m/lr (FedAvg steps along the mean delta), i.e. the
    noise added to the sum."""
    noisy = Federation(cfg(**over))
    noisy.run()
    clean = Federation(cfg(**over, **{"dp.noise_multiplier": 0.0}))
    clean.run()
    return (noisy.state.params - clean.state.params).double() * M / SERVER_LR


def regenerated_central_noise(d: int, seed: int = 0) -> torch.Tensor:
    """What an attacker regenerates from the public seed: the server-noise stream of round 1."""
    return torch.randn(d, generator=torch_stream(seed, "dp.server_noise", 1), dtype=torch.float32).double() * Z * CLIP


def test_seeded_noise_is_regenerable_from_the_seed_which_is_why_it_is_opt_in():
    noise = released_noise(secure_randomness=False)
    guess = regenerated_central_noise(noise.numel())
    assert float((noise - guess).abs().max()) < 1e-5 * float(guess.abs().max())


def test_default_noise_cannot_be_regenerated_from_the_seed():
    noise = released_noise()
    d = noise.numel()
    guess = regenerated_central_noise(d)
    cos = float(noise @ guess / (noise.norm() * guess.norm()))
    assert abs(cos) < 5 / math.sqrt(d)  # uncorrelated: |cos| ~ 1/sqrt(d) = 0.007
    # ...and it is still N(0, (zC)^2) per coordinate
    assert float(noise.std()) == pytest.approx(Z * CLIP, rel=0.05)
    assert stats.kstest(noise.numpy() / (Z * CLIP), "norm").pvalue > 1e-4


@pytest.mark.parametrize("placement", ["local", "distributed"])
def test_client_noise_is_secret_too(placement):
    over = {"dp.placement": placement}
    noise = released_noise(**over)  # the sum of the clients' noise (clipping is the same in both runs)
    d = noise.numel()
    guess = torch.zeros(d, dtype=torch.float64)
    share = Z * CLIP / (math.sqrt(M) if placement == "distributed" else 1.0)
    for cid in range(M):
        g = torch_stream(0, "dp.client_noise", 1, cid)
        guess += torch.randn(1, d, generator=g).double()[0] * share
    cos = float(noise @ guess / (noise.norm() * guess.norm()))
    assert abs(cos) < 5 / math.sqrt(d)
    seeded = released_noise(secure_randomness=False, **over)
    assert float((seeded - guess).abs().max()) < 1e-4 * float(guess.abs().max())


def test_two_default_runs_draw_different_noise_two_seeded_runs_the_same():
    a, b = Federation(cfg()), Federation(cfg())
    a.run(), b.run()
    assert not torch.equal(a.state.params, b.state.params)
    c, d = Federation(cfg(secure_randomness=False)), Federation(cfg(secure_randomness=False))
    c.run(), d.run()
    assert torch.equal(c.state.params, d.state.params)


def test_poisson_sample_under_dp_is_secret():
    over = {"clients.num_clients": 200, "clients.sampling": "poisson", "clients.sample_rate": 0.3, "rounds": 3}
    fed = Federation(cfg(**over))
    fed.run()
    seeded = [len(sample_clients(0, t, 200, "poisson", sample_rate=0.3)) for t in (1, 2, 3)]
    got = [r["participants"] for r in fed.rows]
    assert got != seeded  # P(all three equal by chance) < 0.1^3
    fed2 = Federation(cfg(secure_randomness=False, **over))
    fed2.run()
    assert [r["participants"] for r in fed2.rows] == seeded


def test_without_dp_the_sample_stays_seeded():
    # nothing rests on its secrecy: a run without a privacy mechanism stays reproducible
    over = {"dp.enabled": False, "clients.num_clients": 50, "clients.sampling": "poisson",
            "clients.sample_rate": 0.3, "rounds": 2}
    a, b = Federation(cfg(**over)), Federation(cfg(**over))
    a.run(), b.run()
    assert torch.equal(a.state.params, b.state.params)
    assert "privacy_warning" not in a.summary() and "randomness" not in a.summary()


def test_summary_and_saved_model_are_stamped(tmp_path):
    run_experiment(cfg(secure_randomness=False), tmp_path / "seeded", quiet=True)
    summary = json.loads((tmp_path / "seeded" / "summary.json").read_text())
    meta = json.loads((tmp_path / "seeded" / "model.json").read_text())
    for doc in (summary, meta):
        assert doc["randomness"] == "seeded" and doc["privacy_warning"] == SEEDED_WARNING
    run_experiment(cfg(), tmp_path / "secure", quiet=True)
    summary = json.loads((tmp_path / "secure" / "summary.json").read_text())
    meta = json.loads((tmp_path / "secure" / "model.json").read_text())
    for doc in (summary, meta):
        assert doc["randomness"] == "secure" and "privacy_warning" not in doc


def test_secret_is_never_written_and_resume_continues_exactly(tmp_path, interrupted_then_resumed):
    import fedsafe

    secrets_seen: list[bytes] = []
    real = RandomSource.secure

    def spy(seed=0):
        src = real(seed)
        secrets_seen.append(src.secret)
        return src

    over = {"rounds": 4, "checkpoint_every": 1, "clients.sampling": "fixed", "clients.sample_size": 5,
            "dp.accountant": "rdp"}
    raw = cfg(**over).model_dump(mode="json")
    RandomSource.secure = staticmethod(spy)
    try:
        res = interrupted_then_resumed(lambda: fedsafe.Experiment(raw), tmp_path / "run", after=2)
    finally:
        RandomSource.secure = staticmethod(real)
    assert len(secrets_seen) == 2 and secrets_seen[0] != secrets_seen[1]  # a fresh secret on resume
    blobs = b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file())
    for s in secrets_seen:
        assert s not in blobs
    assert [r["round"] for r in res.rows] == [1, 2, 3, 4]
    # ε is a function of the rounds composed: the resumed accountant continued from round 2
    uninterrupted = Federation(cfg(**over))
    uninterrupted.run()
    assert res.summary["epsilon"] == pytest.approx(uninterrupted.summary()["epsilon"], rel=1e-9)


# --- the source itself -----------------------------------------------------------------------------


def test_secret_stream_normals_are_standard_normal():
    z = RandomSource.secure().stream("test", 1).normal(200_000, torch.float64).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert z.var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / z.size))
    assert stats.kurtosis(z) == pytest.approx(0.0, abs=0.05)


def test_secret_streams_are_pure_functions_of_secret_name_and_keys():
    src = RandomSource.secure()
    a = src.stream("dp.client_noise", 3, 7).normal(1000)
    assert torch.equal(a, src.stream("dp.client_noise", 3, 7).normal(1000))
    others = [src.stream("dp.client_noise", 3, 8), src.stream("dp.client_noise", 4, 7),
              src.stream("dp.server_noise", 3, 7), RandomSource.secure().stream("dp.client_noise", 3, 7)]
    for s in others:
        b = s.normal(1000)
        assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.15
    # successive calls continue one stream: two halves are the whole
    s = src.stream("x", 0)
    u = np.concatenate([s.uniform(100), s.uniform(100)])
    assert np.array_equal(u, src.stream("x", 0).uniform(200))


def test_seeded_source_reproduces_the_named_streams():
    src = RandomSource.seeded(5)
    g = torch_stream(5, "dp.client_noise", 2, 3)
    assert torch.equal(src.stream("dp.client_noise", 2, 3).normal((2, 50)), torch.randn(2, 50, generator=g))
    assert np.array_equal(src.stream("sampling", 4).uniform(30), numpy_stream(5, "sampling", 4).random(30))


def test_secret_subset_is_uniform():
    # every element equally likely to be in a subset of size 3 of 10 (chi-square over 6,000 draws)
    src = RandomSource.secure()
    counts = np.zeros(10)
    for t in range(6000):
        pick = sample_subset(src.stream("sampling", t), 10, 3)
        assert len(set(pick.tolist())) == 3 and np.all(np.diff(pick) > 0)
        counts[pick] += 1
    assert stats.chisquare(counts).pvalue > 1e-4


def test_secret_poisson_sample_has_rate_q():
    src = RandomSource.secure()
    sizes = [len(sample_clients(0, t, 1000, "poisson", sample_rate=0.1, source=src)) for t in range(1, 201)]
    assert np.mean(sizes) == pytest.approx(100, abs=5 * math.sqrt(1000 * 0.1 * 0.9 / 200))


def test_secret_never_shows_in_repr_and_validates_its_length():
    src = RandomSource.secure()
    assert src.secret.hex() not in repr(src) and "secret" not in repr(src)
    with pytest.raises(ValueError, match="32 bytes"):
        RandomSource(0, b"short")
    assert pickle.loads(pickle.dumps(RandomSource.seeded(3))) == RandomSource.seeded(3)
