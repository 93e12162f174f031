"""Distributed DP against the two observers it faces (issue #25, item 4), checked against
references built here from the mechanism's densities and composed by dp-accounting.

With ``dp.placement = "distributed"`` each sampled client adds a noise share N(0, (zC)²/n_s) and
secure aggregation sums the messages. In high dimension the released sum's noise variance
reveals how many shares are in it, so an observer sees the count c of honest shares:

- the secure-aggregation server also sees who took part: no amplification by sampling. Each round
  a client's update is in is a Gaussian mechanism with the realised noise, multiplier
  z_t = z·√(n_t/n_s), on its update (zero-out: the server knows it took part); a client's rounds
  compose to one Gaussian with Σ z_t⁻²; ``epsilon_server`` is the largest over clients;
- an outsider who sees the released model only: amplification by Poisson sampling holds, but the
  count is revealed. The exact mechanism, given the count, is a mixture over the count of
  Poisson-subsampled Gaussians, and comparing D and D ∪ {target} at the same count swaps one other
  client's update u for the target's x: the worst case over the others (u = −x) moves the sum by
  2C. ``epsilon_released`` accounts that mixture.

The issue's "exact PLD gives 6.99" is this mixture with the others' updates at 0 (shift C); with
u = −x (a dataset DP must cover) the same run's exact figure is ≈ 22.65. The old figure, the
realised counts with amplification, is below both.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp
from scipy import optimize, stats
from scipy.special import log_ndtr, ndtr

from fedsafe.config import apply_overrides, validate
from fedsafe.engine.federation import Federation
from fedsafe.engine.run import run_experiment
from fedsafe.privacy.dp import accounting

# per round, the honest clients whose vectors the protocol put in the released sum
from test_dp_distributed import spy_members as spy_included  # noqa: E402  (this folder is on sys.path)

DELTA = 1e-5
NR = dpa.NeighboringRelation


def cfg(**over):
    # The issue's run: 40 clients, Poisson q = 0.25 (m = n_s = 10), z = 1.3, 30 rounds, distributed.
    raw = {
        "seed": 0, "secure_randomness": False, "rounds": 30, "eval_every": 30,
        "data": {"name": "digits"}, "model": {"name": "logreg"},
        "clients": {"num_clients": 40, "sampling": "poisson", "sample_rate": 0.25, "algorithm": "fedavg",
                    "local_steps": 1, "lr": 0.1},
        "server": {"lr": 1.0},
        "dp": {"enabled": True, "clip": 0.5, "noise_multiplier": 1.3, "placement": "distributed", "delta": DELTA},
    }
    return validate(apply_overrides(raw, over))


# --------------------------------------------------------------------------- references


class CountRevealed:
    """One round seen by an outsider who learns the number c of honest shares in the sum.

    Projected on the direction of the target's update x (‖x‖ = 1, in units of C; the orthogonal
    coordinates have the same law with and without the target), with every other honest client's
    update equal to u = (1 − shift)·x, so that replacing one of them by the target moves the sum
    by ``shift``: P(c, y) = Bin(N−1, q)(c) N(y; 0, σ_c²) without the target, and with it
    Q(c, y) = Bin(N, q)(c) [(1 − c/N) N(y; 0, σ_c²) + (c/N) N(y; shift, σ_c²)] (given c, the
    target is among the c sampled with probability c/N), σ_c = z·√(max(c, 1)/n_s).
    """

    def __init__(self, n: int, q: float, z: float, n_s: int, shift: float) -> None:
        self.n, self.q, self.z, self.n_s, self.shift = n, q, z, n_s, shift
        c = np.arange(n + 1)
        self.wp, self.wq = stats.binom.pmf(c, n - 1, q), stats.binom.pmf(c, n, q)

    def sigma(self, c: int) -> float:
        return self.z * math.sqrt(max(c, 1) / self.n_s)

    def log_p(self, c: int, y: np.ndarray) -> np.ndarray:
        return math.log(self.wp[c]) + stats.norm.logpdf(y, 0.0, self.sigma(c))

    def log_q(self, c: int, y: np.ndarray) -> np.ndarray:
        pi, s = c / self.n, self.sigma(c)
        return math.log(self.wq[c]) + np.logaddexp(
            math.log1p(-pi) + stats.norm.logpdf(y, 0.0, s), math.log(pi) + stats.norm.logpdf(y, self.shift, s)
        )

    def q_cdf(self, c: int, y: np.ndarray) -> np.ndarray:
        pi, s = c / self.n, self.sigma(c)
        return (1 - pi) * ndtr(y / s) + pi * ndtr((y - self.shift) / s)

    def p_cdf(self, c: int, y: np.ndarray) -> np.ndarray:
        return ndtr(y / self.sigma(c))

    # -- one round, exactly

    def y_where_loss_is(self, c: int, eps: float) -> float:
        """The y at which log Q(c,y)/P(c,y) = eps (the loss increases with y): found by root
        finding on the densities, -inf/inf when the loss stays above/below eps."""
        s, pi = self.sigma(c), c / self.n
        lo, hi = -80 * s, self.shift + 80 * s
        log_w = math.log(self.wq[c]) - math.log(self.wp[c])
        # log_q − log_p with the Gaussians' common normalisation cancelled (scalar, fast)
        f = lambda y: log_w + float(np.logaddexp(  # noqa: E731
            math.log1p(-pi), math.log(pi) + (y * y - (y - self.shift) ** 2) / (2 * s * s))) - eps
        if f(lo) >= 0:
            return -math.inf
        if f(hi) <= 0:
            return math.inf
        return optimize.brentq(f, lo, hi, xtol=1e-13, rtol=1e-15)

    def delta(self, eps: float) -> float:
        """The hockey-stick divergence of one round at eps, both directions: for each count, the
        region where one density exceeds e^eps times the other is a half-line in y."""
        e = math.exp(eps)
        remove = self.wq[self.n]  # every client sampled: impossible without the target
        add = 0.0
        for c in range(self.n):
            if c == 0:  # only the target could be in: the loss is log(1 − q) wherever y is
                remove += max(0.0, self.wq[0] - e * self.wp[0])
                add += max(0.0, self.wp[0] - e * self.wq[0])
                continue
            y = self.y_where_loss_is(c, eps)
            remove += self.wq[c] * (1 - self.q_cdf(c, y)) - e * self.wp[c] * (1 - self.p_cdf(c, y))
            y = self.y_where_loss_is(c, -eps)
            add += self.wp[c] * self.p_cdf(c, y) - e * self.wq[c] * self.q_cdf(c, y)
        return max(remove, add)

    def epsilon_one_round(self, delta: float) -> float:
        return optimize.brentq(lambda e: self.delta(e) - delta, 0.0, 300.0, xtol=1e-12)

    # -- T rounds: dp-accounting composes a discretization built on a fine y grid

    def pld(self, h: float, pessimistic: bool, points: int = 100_001) -> Any:
        """The privacy loss evaluated from the densities on a y grid; each cell's mass goes to the
        largest (pessimistic) or smallest (optimistic) loss on it, rounded up or down to h. The
        true PLD lies between the two, so dp-accounting's ε of the two brackets the exact one."""
        rnd = np.ceil if pessimistic else np.floor
        lq = math.log1p(-self.q)
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"remove": [], "add": []}
        inf = {"remove": float(self.wq[self.n]), "add": 0.0}

        def put(side: str, losses: np.ndarray, masses: np.ndarray) -> None:
            parts[side].append((rnd(losses / h).astype(np.int64), masses))

        def pmf(side: str) -> dict[int, float]:
            k = np.concatenate([k for k, _ in parts[side]])
            lo = int(k.min())
            m = np.bincount(k - lo, weights=np.concatenate([m for _, m in parts[side]]))
            return {lo + int(i): float(m[i]) for i in np.flatnonzero(m)}

        put("remove", np.array([lq]), np.array([self.wq[0]]))
        put("add", np.array([-lq]), np.array([self.wp[0]]))
        for c in range(1, self.n):
            s = self.sigma(c)
            y = np.linspace(-12 * s, self.shift + 12 * s, points)
            loss = self.log_q(c, y) - self.log_p(c, y)
            assert np.all(np.diff(loss) > -1e-9)  # monotone: each cell's extreme losses are at its ends
            hi_l, lo_l = np.maximum(loss[1:], loss[:-1]), np.minimum(loss[1:], loss[:-1])
            if not pessimistic:
                hi_l, lo_l = lo_l, hi_l
            # remove: under Q; the lower tail's losses are below loss[0], the upper tail's above loss[-1]
            qc = self.wq[c] * self.q_cdf(c, y)
            put("remove", hi_l, np.diff(qc))
            put("remove", np.array([loss[0] if pessimistic else lq]), qc[:1])
            if pessimistic:
                inf["remove"] += self.wq[c] - qc[-1]
            else:
                put("remove", loss[-1:], np.array([self.wq[c] - qc[-1]]))
            # add: under P, loss −loss; the lower y tail has the largest add loss (at most −log(1 − q))
            pc = self.wp[c] * self.p_cdf(c, y)
            put("add", -lo_l, np.diff(pc))
            put("add", np.array([-lq if pessimistic else -loss[0]]), pc[:1])
            put("add", np.array([-loss[-1]]), np.array([self.wp[c] - pc[-1]]))
        return pld.privacy_loss_distribution.PrivacyLossDistribution.create_from_rounded_probability(
            pmf("remove"), inf["remove"], h, pessimistic, pmf("add"), inf["add"], symmetric=False
        )

    def epsilon_bracket(self, rounds: int, delta: float, h: float) -> tuple[float, float]:
        return tuple(self.pld(h, p).self_compose(rounds).get_epsilon_for_delta(delta) for p in (False, True))


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Balle & Wang 2018, Thm 8: a Gaussian mechanism with sensitivity/σ = μ is (ε, δ)-DP iff
    Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) ≤ δ; the smallest such ε."""
    def delta_of(eps: float) -> float:
        return ndtr(mu / 2 - eps / mu) - math.exp(eps + log_ndtr(-mu / 2 - eps / mu))

    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 500.0, xtol=1e-12)


def per_client_server_reference(z_by_round: dict[int, float], members: dict[int, set[int]],
                                sensitivity: float = 1.0) -> tuple[float, float]:
    """ε against the server: for each client, the Gaussians of the rounds its update was in,
    composed by dp-accounting's PLD (fine interval) and in closed form (one Gaussian with
    μ² = Σ (sensitivity/z_t)²); the largest over clients, (closed form, PLD)."""
    rounds_of: dict[int, list[int]] = defaultdict(list)
    for t, ids in members.items():
        for cid in ids:
            rounds_of[cid].append(t)
    best = max(rounds_of, key=lambda c: sum(z_by_round[t] ** -2 for t in rounds_of[c]))
    zs = [z_by_round[t] for t in rounds_of[best]]
    mu = sensitivity * math.sqrt(sum(z**-2 for z in zs))
    rel = NR.ADD_OR_REMOVE_ONE if sensitivity == 1.0 else NR.REPLACE_ONE
    acc = pld.PLDAccountant(rel, value_discretization_interval=1e-4)
    for z in zs:
        acc.compose(dpa.GaussianDpEvent(z))
    return analytic_gaussian_epsilon(mu, DELTA), acc.get_epsilon(DELTA)


# --------------------------------------------------------------------------- the references themselves


def test_reference_reproduces_the_issue_figure_and_the_worst_case() -> None:
    # The issue's exact PLD (others' updates at 0: shift C) gives 6.99 after 30 rounds.
    lo, hi = CountRevealed(40, 0.25, 1.3, 10, 1.0).epsilon_bracket(30, DELTA, 5e-4)
    assert lo <= 6.99 <= hi and hi - lo < 0.02
    # The others at u = −x (shift 2C): a dataset pair DP must cover; the same run's ε is ≈ 22.65.
    lo2, hi2 = CountRevealed(40, 0.25, 1.3, 10, 2.0).epsilon_bracket(30, DELTA, 5e-4)
    assert 22.6 < lo2 <= hi2 < 22.7 and hi2 - lo2 < 0.03


def test_released_round_pld_matches_the_exact_one_round_epsilon() -> None:
    for n, q, z, n_s in [(40, 0.25, 1.3, 10), (12, 0.3, 2.0, 6), (100, 0.05, 0.9, 5)]:
        exact = CountRevealed(n, q, z, n_s, 2.0).epsilon_one_round(DELTA)
        for h in (1e-2, 1e-3):
            rec = accounting.make_round_record(z, q, "poisson", n, noise_shares=n_s)
            got = accounting.distributed_round_pld(rec, h).get_epsilon_for_delta(DELTA)
            assert exact - 1e-9 <= got <= exact + 2 * h  # pessimistic: above, by at most the rounding
    # 12 clients at q = 0.5: all 12 in the sum (probability 2^-12 > δ) only happens with the target
    assert CountRevealed(12, 0.5, 2.0, 6, 2.0).delta(300.0) == pytest.approx(0.5**12)
    rec = accounting.make_round_record(2.0, 0.5, "poisson", 12, noise_shares=6)
    assert accounting.distributed_round_pld(rec, 1e-2).get_epsilon_for_delta(DELTA) == math.inf


# --------------------------------------------------------------------------- the engine


def test_issue_run_reports_a_bound_against_each_observer() -> None:
    fed = Federation(cfg())
    members = spy_included(fed)
    fed.run()
    rows = fed.rows
    last = rows[-1]
    z_by_round = {r["round"]: r["effective_noise_multiplier"] for r in rows}
    closed, dpa_pld = per_client_server_reference(z_by_round, members)
    # The headline is the server's figure, and it is a valid bound against the server.
    assert last["epsilon"] >= closed - 1e-9
    assert last["epsilon"] == last["epsilon_server"]
    assert closed - 1e-9 <= last["epsilon_server"] <= min(dpa_pld, closed + 1e-6)
    # Against the released model: the count-revealing mixture, worst case over the others.
    lo, hi = CountRevealed(40, 0.25, 1.3, 10, 2.0).epsilon_bracket(30, DELTA, 1e-3)
    assert lo <= last["epsilon_released"] <= 1.01 * hi
    # The old figure (realised counts, amplified) held against neither.
    counts = [max(r["dp_noise_shares"], 1) for r in rows]
    old = pld.PLDAccountant(value_discretization_interval=2e-3)
    for n in counts:
        old.compose(dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(1.3 * math.sqrt(n / 10))))
    assert old.get_epsilon(DELTA) < min(closed, lo)


def test_summary_names_the_headline_observer(tmp_path) -> None:
    run_experiment(cfg(rounds=4, eval_every=2), tmp_path / "d", quiet=True)
    s = read_summary(tmp_path / "d")
    assert s["epsilon_observer"] == "server" and s["epsilon"] == s["epsilon_server"]
    assert s["epsilon_released"] > 0
    run_experiment(cfg(rounds=4, eval_every=2, **{"dp.placement": "central"}), tmp_path / "c", quiet=True)
    s = read_summary(tmp_path / "c")
    assert s["epsilon_observer"] == "released" and "epsilon_server" not in s and "epsilon_released" not in s


def test_byzantine_clients_shrink_the_honest_population() -> None:
    # 6 of 40 are Byzantine: the count is over the 34 honest clients, the target one of them.
    c = cfg(**{"attack.name": "gaussian", "attack.f": 6, "rounds": 8, "eval_every": 8})
    fed = Federation(c)
    members = spy_included(fed)
    fed.run()
    last = fed.rows[-1]
    lo, hi = CountRevealed(34, 0.25, 1.3, 10, 2.0).epsilon_bracket(8, DELTA, 1e-3)
    assert lo <= last["epsilon_released"] <= 1.01 * hi
    z_by_round = {r["round"]: r["effective_noise_multiplier"] for r in fed.rows}
    closed, _ = per_client_server_reference(z_by_round, members)
    assert last["epsilon_server"] == pytest.approx(closed, abs=1e-6)


def test_dropouts_void_the_released_bound_not_the_server_one() -> None:
    c = cfg(**{"protocol": "secagg", "secagg.dropout": 0.1, "secagg.dropout_stages": ["mask"],
               "rounds": 8, "eval_every": 1})
    fed = Federation(c)
    members = spy_included(fed)
    fed.run()
    rows = fed.rows
    first = next(r["round"] for r in rows if r["dp_noise_shares"] < r["participants"] - r["byzantine"])
    assert all("epsilon_released" in r for r in rows if r["round"] < first)
    assert not any("epsilon_released" in r for r in rows if r["round"] >= first)
    z_by_round = {r["round"]: r["effective_noise_multiplier"] for r in rows}
    closed, _ = per_client_server_reference(z_by_round, members)
    assert rows[-1]["epsilon"] == rows[-1]["epsilon_server"] == pytest.approx(closed, abs=1e-6)
    s = fed.summary()
    assert "epsilon_released" not in s and f"round {first}" in s["epsilon_released_note"]


def test_fixed_sampling_with_byzantine_clients_accounts_each_realised_honest_sample() -> None:
    # Fixed-size samples of m = 10 from 40, 5 Byzantine: given the realised number h_t of honest
    # clients in the sum (independent of the target's data under replace-one), the honest ones are
    # a uniform h_t-subset of the 35: a sampled-without-replacement Gaussian with z·√(h_t/n_s).
    c = cfg(**{"clients.sampling": "fixed", "clients.sample_size": 10, "clients.sample_rate": None, "dp.accountant": "rdp",
               "attack.name": "gaussian", "attack.f": 5, "rounds": 10, "eval_every": 10})
    fed = Federation(c)
    members = spy_included(fed)
    fed.run()
    rows = fed.rows
    probe = rdp.RdpAccountant([2.0], NR.REPLACE_ONE)
    probe.compose(dpa.SampledWithoutReplacementDpEvent(1, 1, dpa.GaussianDpEvent(1.0)))
    halve = probe.rdp[0] == pytest.approx(1.0)  # dp-accounting ≤ 0.6 reads z as std/sensitivity
    acc = rdp.RdpAccountant(list(accounting.RDP_ORDERS), NR.REPLACE_ONE)
    for r in rows:
        h, z_t = r["dp_noise_shares"], r["effective_noise_multiplier"]
        assert h == len(members[r["round"]])
        acc.compose(dpa.SampledWithoutReplacementDpEvent(35, h, dpa.GaussianDpEvent(z_t / 2 if halve else z_t)))
    assert any(r["dp_noise_shares"] < 10 for r in rows)
    assert rows[-1]["epsilon_released"] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    # Against the server, with accountant = "rdp": the client whose rounds give the largest ε, its
    # Gaussians (sensitivity 2C under replace-one) on dp-accounting's RDP accountant; above the exact.
    z_by_round = {r["round"]: r["effective_noise_multiplier"] for r in rows}
    closed, _ = per_client_server_reference(z_by_round, members, sensitivity=2.0)
    rounds_of = defaultdict(list)
    for t, ids in members.items():
        for cid in ids:
            rounds_of[cid].append(t)
    best = max(rounds_of.values(), key=lambda ts: sum(z_by_round[t] ** -2 for t in ts))
    server = rdp.RdpAccountant(list(accounting.RDP_ORDERS), NR.REPLACE_ONE)
    for t in best:
        probe = rdp.RdpAccountant([2.0], NR.REPLACE_ONE).compose(dpa.GaussianDpEvent(1.0))
        server.compose(dpa.GaussianDpEvent(z_by_round[t] / 2 if probe.rdp[0] == pytest.approx(1.0) else z_by_round[t]))
    assert rows[-1]["epsilon_server"] == pytest.approx(server.get_epsilon(DELTA), rel=1e-9)
    assert rows[-1]["epsilon_server"] > closed


def test_checkpointed_distributed_accountant_resumes_exactly() -> None:
    # As the engine does: ε every 3 rounds, a checkpoint at round 4; the resumed accountant
    # replays the checkpointed steps and then reports exactly the uninterrupted figures.
    plan = cfg().dp.plan(sampling="poisson", rounds=30, num_clients=40, q=0.25)
    a, b = plan.new_accountant(), None
    rng = np.random.default_rng(0)
    for t in range(1, 13):
        ids = set(map(int, np.flatnonzero(rng.random(40) < 0.25)))
        z_t = plan.round_multiplier(len(ids))
        for acc in (a, b) if b is not None else (a,):
            plan.compose_round(acc, z_t, shares=len(ids), sampled=len(ids), clients=ids)
            if t % 3 == 0:
                got = acc.epsilons()
        if t % 3 == 0 and b is not None:
            assert got == a.epsilons()
        if t == 4:
            b = plan.new_accountant()
            b.load_state_dict(a.state_dict())
    assert set(a.epsilons()) == {"epsilon", "epsilon_server", "epsilon_released"}
    assert a.epsilons()["epsilon_released"] > a.epsilons()["epsilon_server"] > 0


def test_distributed_empty_round_still_counts_for_the_outsider() -> None:
    # An empty Poisson sample: nobody's update is in (the server bound is unchanged) but the round
    # is a round of the mechanism for the outsider (the released bound grows).
    plan = cfg().dp.plan(sampling="poisson", rounds=30, num_clients=40, q=0.25)
    acc = plan.new_accountant()
    plan.compose_round(acc, plan.round_multiplier(10), shares=10, sampled=10, clients=set(range(10)))
    before = acc.epsilons()
    plan.compose_round(acc, plan.round_multiplier(0), shares=0, sampled=0, clients=set())
    after = acc.epsilons()
    assert after["epsilon_server"] == before["epsilon_server"]
    assert after["epsilon_released"] > before["epsilon_released"]
    assert torch.isfinite(torch.tensor(after["epsilon_released"]))


def test_released_round_at_a_population_whose_empty_sample_underflows() -> None:
    """(1 − q)^N underflows to 0 from N ≈ 8,000 at q = 0.09: δ(ε) at large ε was ∞·0 = NaN and
    the released-model ε ∞ for every such population. δ(ε) stays a number in [0, 1] that does
    not grow with ε, and ε moves smoothly with N across the underflow (the mechanism at fixed q
    and n_s = qN changes little: 19.10 at N = 5,000, 19.09 at 10⁴)."""
    deltas = accounting.distributed._distributed_round_deltas
    eps = np.array([0.0, 0.5, 1.0, 5.0, 50.0, 1e4])
    for n in (10_000, 100_000):
        for direction in ("remove", "add"):
            d = deltas(n, 0.09, 1.0, int(0.09 * n), direction, eps)
            assert np.all(np.isfinite(d)) and np.all((0 <= d) & (d <= 1)) and np.all(np.diff(d) <= 1e-15)
    values = {}
    for n in (5_000, 10_000):
        rec = accounting.make_round_record(1.0, 0.09, "poisson", n, noise_shares=int(0.09 * n))
        values[n] = accounting.distributed_interval(rec, 40, DELTA).epsilon
    assert math.isfinite(values[10_000]) and values[10_000] == pytest.approx(values[5_000], rel=5e-3)
