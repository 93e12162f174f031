"""Cross-device scale (issue #29 item 3): the engine's memory grows with the clients that take
part, not with the population ``clients.num_clients``.

Measured structurally (sizes of the state, never wall time): client momentum is kept for the
clients seen only (``ClientRows``), with β = 0 not at all; the Byzantine ids are looked up, not
masked over the population; per-client state whose bound over a run exceeds the limit is
refused at set-up naming the settings; partitions and the dataset check stay vectorised at
10^4-10^5 clients. Each check compares with an independent reference (a dense matrix, the
sequential loops the vectorised code replaced).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsafe.config import apply_overrides, validate
from fedsafe.core.errors import ConfigError
from fedsafe.data import FederatedDataset
from fedsafe.data.partition import dirichlet, iid, shards
from fedsafe.engine import federation as federation_module
from fedsafe.engine.federation import Federation, clients_seen_bound
from fedsafe.engine.sampling import sample_clients
from fedsafe.engine.state import ClientRows, FederationState, load_checkpoint, run_identity, save_checkpoint, state_nbytes

FEATURES, CLASSES = 6, 3

# runs of a few rounds on random features: they measure state, not learning
pytestmark = pytest.mark.filterwarnings("ignore:the run ended at chance level")


def population(num_clients: int, per_client: int = 2, seed: int = 0) -> FederatedDataset:
    """A cheap dataset of ``num_clients`` clients holding ``per_client`` samples each."""
    g = torch.Generator().manual_seed(seed)
    n = num_clients * per_client
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = torch.randn(n, FEATURES, generator=g) + 2.0 * torch.nn.functional.one_hot(y, FEATURES).float()
    idx = np.arange(n, dtype=np.int64).reshape(num_clients, per_client)
    return FederatedDataset(
        name="population", x_train=x, y_train=y, x_test=x[:50], y_test=y[:50],
        client_indices=list(idx), num_classes=CLASSES, input_shape=(FEATURES,),
    )


def config(num_clients: int, **over):
    raw = {
        "seed": 1, "rounds": 3, "eval_every": 3, "secure_randomness": False,
        "model": {"name": "logreg"},
        "clients": {"num_clients": num_clients, "sampling": "fixed", "sample_size": 10, "batch_size": 2,
                    "momentum": 0.9},
        "server": {"lr": 0.1},
    }
    if over.get("clients.sampling", "fixed") != "fixed":
        del raw["clients"]["sample_size"]
    return validate(apply_overrides(raw, over))


def engine_state_bytes(fed: Federation) -> int:
    """Bytes of the state the engine keeps across rounds, besides the dataset: the federation
    state (model, server buffer, client momentum, plugin and attack state), the rule's client
    histories, and every array attribute of the federation itself."""
    st = fed.state
    roots = (st.params, st.server_buf, st.momentum, st.previous, st.attack_state, st.extra, fed.pipeline.history)
    arrays = [v for v in vars(fed).values() if isinstance(v, (np.ndarray, torch.Tensor))]
    return state_nbytes(roots) + state_nbytes(arrays)


def test_client_rows_match_a_dense_matrix():
    # random gathers and scatters against a dense (N, d) matrix of zeros
    rng = np.random.default_rng(0)
    n_clients, d = 40, 5
    dense = torch.zeros(n_clients, d)
    rows = ClientRows(d)
    for _ in range(30):
        ids = np.sort(rng.choice(n_clients, size=int(rng.integers(1, 12)), replace=False))
        torch.testing.assert_close(rows.gather(ids), dense[torch.from_numpy(ids)], rtol=0, atol=0)
        new = torch.randn(len(ids), d)
        rows.scatter(ids, new)
        dense[torch.from_numpy(ids)] = new
    torch.testing.assert_close(rows.to_dense(n_clients), dense, rtol=0, atol=0)
    seen = int((dense != 0).any(dim=1).sum())
    assert len(rows) == seen and rows.nbytes <= 2 * seen * d * 4
    back = ClientRows.from_state(rows.state_dict(), dim=d, num_clients=n_clients)
    torch.testing.assert_close(back.to_dense(n_clients), dense, rtol=0, atol=0)
    with pytest.raises(ValueError, match="outside this run's 0..9"):
        ClientRows.from_state(rows.state_dict(), dim=d, num_clients=10)
    with pytest.raises(ValueError, match="columns"):
        ClientRows.from_state(rows.state_dict(), dim=d + 1)


def test_engine_momentum_follows_a_dense_replay():
    # every round's momentum rows handed to the clients, and stored back, equal a dense
    # (N, d) replay of the same calls; clients sampled twice carry their momentum
    fed = Federation(config(60, rounds=8), data=population(60))
    d = fed.state.params.numel()
    dense = torch.zeros(60, d)
    calls = []
    run = fed.work.run

    def spy(round_, params, ids, momentum=None, poison=None):
        res = run(round_, params, ids, momentum, poison)
        calls.append((np.array(ids), momentum.clone(), res.momentum.clone()))
        return res

    fed.work.run = spy
    fed.run()
    for ids, given, stored in calls:
        torch.testing.assert_close(given, dense[torch.from_numpy(ids)], rtol=0, atol=0)
        dense[torch.from_numpy(ids)] = stored
    assert sum(len(set(ids) & set(c[0])) for i, (ids, _, _) in enumerate(calls) for c in calls[:i]) > 0
    torch.testing.assert_close(fed.state.momentum.to_dense(60), dense, rtol=0, atol=0)


def test_engine_state_does_not_grow_with_the_population():
    # the same 10 clients a round, at populations 100 and 20,000: the state is the same size
    # (a dense momentum matrix would be 200x larger), and the rows kept are those of the
    # clients seen
    small = Federation(config(100), data=population(100))
    large = Federation(config(20_000), data=population(20_000))
    for fed in (small, large):
        fed.run()
    d = large.state.params.numel()
    seen = len({int(c) for t in range(1, 4) for c in sample_clients(1, t, 20_000, "fixed", sample_size=10)})
    assert len(large.state.momentum) == seen <= 30
    assert large.state.momentum.nbytes <= 2 * 30 * d * 4 < 20_000 * d * 4
    assert engine_state_bytes(large) == engine_state_bytes(small)


def test_zero_momentum_keeps_no_client_state(tmp_path):
    fed = Federation(config(500, **{"clients.momentum": 0.0}), data=population(500))
    assert fed.state.momentum is None
    fed.run()
    # the same run with β = 0.9 keeps rows; its first round (no history yet) is the same step
    ref = Federation(config(500, rounds=1, **{"clients.momentum": 0.9}), data=population(500))
    zero = Federation(config(500, rounds=1, **{"clients.momentum": 0.0}), data=population(500))
    ref.run_round()
    zero.run_round()
    # m = (1 − β) g: the first β = 0.9 step is a tenth of the β = 0 one
    delta_ref = ref.state.params - flat_initial(ref)
    delta_zero = zero.state.params - flat_initial(zero)
    torch.testing.assert_close(delta_ref, 0.1 * delta_zero, rtol=1e-4, atol=1e-7)


def flat_initial(fed: Federation) -> torch.Tensor:
    from fedsafe.models import flatten_params

    return flatten_params(fed.model)


def test_momentum_checkpoint_round_trips_sparse_and_dense(tmp_path):
    rows = ClientRows(4)
    rows.scatter(np.array([7, 2]), torch.arange(8.0).reshape(2, 4) + 1)
    cfg = config(10)
    save_checkpoint(FederationState(round=0, params=torch.zeros(4), momentum=rows), tmp_path, run_identity(cfg))
    back = load_checkpoint(tmp_path, run_identity(cfg)).momentum
    torch.testing.assert_close(back.to_dense(10), rows.to_dense(10), rtol=0, atol=0)
    # a checkpoint written with the old dense (num_clients, d) matrix still loads
    dense = torch.randn(10, 4)
    save_checkpoint(FederationState(round=0, params=torch.zeros(4), momentum=dense), tmp_path, run_identity(cfg))
    torch.testing.assert_close(load_checkpoint(tmp_path, run_identity(cfg)).momentum.to_dense(10), dense, rtol=0, atol=0)


def test_resume_with_sparse_momentum_matches_an_uninterrupted_run(tmp_path):
    cfg = config(300, rounds=6, checkpoint_every=3)
    (tmp_path / "full").mkdir()
    (tmp_path / "part").mkdir()
    full = Federation(cfg, data=population(300), out_dir=tmp_path / "full")
    full.run()
    first = Federation(cfg.model_copy(update={"rounds": 3}), data=population(300), out_dir=tmp_path / "part")
    first.run()
    resumed = Federation(cfg, data=population(300), out_dir=tmp_path / "part")
    resumed.restore()
    resumed.run()
    torch.testing.assert_close(resumed.state.params, full.state.params, rtol=0, atol=0)
    torch.testing.assert_close(resumed.state.momentum.to_dense(300), full.state.momentum.to_dense(300), rtol=0, atol=0)


def test_client_state_bound_and_refusal(monkeypatch):
    # the bound on clients seen: min(N, rounds x the largest likely sample)
    cfg = config(100_000, rounds=50, **{"clients.sampling": "poisson", "clients.sample_rate": 0.01})
    m = 100_000 * 0.01
    assert clients_seen_bound(cfg) == min(100_000, 50 * math.ceil(m + 6 * math.sqrt(m * 0.99) + 1)) == 59_500
    assert clients_seen_bound(config(100_000, rounds=50)) == 500  # fixed, 10 a round
    assert clients_seen_bound(config(100, rounds=50, **{"clients.sampling": "all"})) == 100
    # over the limit: refused at set-up, naming the settings; under it, accepted
    data = population(2_000)
    d = FEATURES * CLASSES + CLASSES
    monkeypatch.setattr(federation_module, "MAX_CLIENT_STATE_BYTES", 100 * d * 8)
    with pytest.raises(ConfigError, match=r"foolsgold keeps a history of 21 float64 for every client it has seen, "
                                          r"up to 2,000 clients \(clients.num_clients = 2,000, rounds = 3"):
        Federation(config(2_000, **{"robust.rule": "foolsgold", "clients.sampling": "all", "clients.momentum": 0.0}), data=data)
    with pytest.raises(ConfigError, match=r"dsgd keeps a momentum row of 21 float32 .* set clients.momentum = 0"):
        Federation(config(2_000, **{"clients.sampling": "all"}), data=data)
    fed = Federation(config(2_000, **{"robust.rule": "foolsgold", "clients.momentum": 0.0}), data=data)  # 3 x 10 clients
    fed.run()
    seen = {int(c) for t in range(1, 4) for c in sample_clients(1, t, 2_000, "fixed", sample_size=10)}
    assert set(fed.pipeline.history) == seen  # FoolsGold's histories: the clients seen only


def test_byzantine_lookup_matches_a_mask():
    fed = Federation(config(5_000, **{"attack.name": "alie", "attack.f": 250, "clients.sample_size": 200}),
                     data=population(5_000))
    mask = np.zeros(5_000, dtype=bool)
    mask[list(fed.byzantine)] = True
    for t in range(1, 4):
        ids = sample_clients(1, t, 5_000, "fixed", sample_size=200)
        row = fed.run_round()
        assert row["byzantine"] == int(mask[ids].sum())


# --- data at thousands of clients -----------------------------------------------------------


def dirichlet_reference(labels, num_clients, rng, alpha):
    """The sequential Dirichlet split the vectorised one replaced (per-client lists, the
    O(E·K) fill of empty clients): the same draws, so the same partition."""
    parts = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        p = rng.dirichlet(np.full(num_clients, float(alpha)))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:
            p = np.full(num_clients, 1.0 / num_clients)
        cuts = np.rint(np.cumsum(p)[:-1] / p.sum() * idx.size).astype(np.int64)
        for k, piece in enumerate(np.split(idx, np.clip(cuts, 0, idx.size))):
            parts[k].append(piece)
    merged = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
    for k in range(num_clients):
        if merged[k].size:
            continue
        donor = int(np.argmax([p.size for p in merged]))
        j = int(rng.integers(merged[donor].size))
        merged[k] = merged[donor][j : j + 1].copy()
        merged[donor] = np.delete(merged[donor], j)
    return [np.sort(p.astype(np.int64)) for p in merged]


@pytest.mark.parametrize("seed", range(6))
def test_dirichlet_equals_the_sequential_reference(seed):
    r = np.random.default_rng(seed)
    n = int(r.integers(50, 600))
    k = int(r.integers(1, n + 1))
    alpha = float(r.choice([0.05, 0.5, 5.0]))
    labels = r.integers(0, int(r.integers(2, 11)), size=n)
    got = dirichlet(labels, k, np.random.default_rng(seed + 1), alpha=alpha)
    want = dirichlet_reference(labels, k, np.random.default_rng(seed + 1), alpha)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def check_partition(parts, n, k):
    assert len(parts) == k and all(p.size for p in parts)
    flat = np.concatenate(parts)
    assert flat.size == n and np.array_equal(np.sort(flat), np.arange(n))


def test_mnist_sized_splits_over_thousands_of_clients():
    labels = np.random.default_rng(0).integers(0, 10, size=60_000)  # MNIST's training labels' shape
    parts = iid(labels, 6_000, np.random.default_rng(1))
    check_partition(parts, 60_000, 6_000)
    assert {p.size for p in parts} == {10}
    parts = shards(labels, 6_000, np.random.default_rng(1), shards_per_client=2)
    check_partition(parts, 60_000, 6_000)
    assert max(np.unique(labels[p]).size for p in parts) <= 2 + 2  # a shard may straddle two classes
    # a Dirichlet over 20,000 clients leaves thousands empty before the fill (the sequential fill
    # was O(E·K)); every client ends with data
    parts = dirichlet(labels, 20_000, np.random.default_rng(1), alpha=0.1)
    check_partition(parts, 60_000, 20_000)


def reference_first_bad_client(indices, n):
    seen = np.zeros(n, dtype=bool)
    for k, idx in enumerate(indices):
        if idx.size == 0 or idx.min() < 0 or idx.max() >= n or seen[idx].any() or np.unique(idx).size != idx.size:
            return k
        seen[idx] = True
    return None


@pytest.mark.parametrize("seed", range(8))
def test_dataset_check_names_the_first_bad_client(seed):
    r = np.random.default_rng(seed)
    n = 200
    parts = [np.sort(p).astype(np.int64) for p in np.array_split(r.permutation(n), 40)]
    k = int(r.integers(40))
    kind = seed % 4
    if kind == 0:
        parts[k] = np.empty(0, np.int64)
    elif kind == 1:
        parts[k] = np.append(parts[k], n + 3)
    elif kind == 2:
        parts[k] = np.append(parts[k], parts[int(r.integers(40))][0])
    else:
        parts[k] = np.append(parts[k], parts[k][0])
    want = reference_first_bad_client(parts, n)
    x = torch.zeros(n, 2)
    y = torch.zeros(n, dtype=torch.int64)
    with pytest.raises(ValueError, match=rf"client_indices\[{want}\]"):
        FederatedDataset("t", x, y, x, y, parts, 2, (2,))
