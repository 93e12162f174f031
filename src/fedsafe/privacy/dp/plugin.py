"""Client-level DP-FedAvg in the round (McMahan et al. 2018; Andrew et al. 2021), as a plugin.

Placement of each step (the engine's named placements, ``fedsafe.core.plugins``):

- client side (``transform_honest``): flat L2 clipping to C; ``local`` adds N(0, (zC)²) per
  client; ``distributed`` adds a share N(0, (z_Δ C)²/n_s) per client (n_s = the expected
  number of clients, rounded; meant for secure aggregation); with adaptive clipping the client
  appends its bit 1[‖x‖ ≤ C] as one extra message coordinate, so it is summed (securely, under
  secagg) with the update — under ``distributed`` with its own share N(0, σ_b²/n_s) of the
  count noise, so the server never sees the exact count either.
- server side, before aggregation (``transform_messages``, only where the server sees
  individual messages): every received message is clipped again, since a Byzantine client
  cannot be trusted to clip.
- server side, after aggregation (``transform_aggregate``): the protocol's mean times the count
  it averaged is the clipped sum; ``central`` adds N(0, (z_Δ C)²) (and σ_b on the count); the
  sum is divided by the EXPECTED number of clients m (q·N, the sample size, or N), so the
  sensitivity is C/m whatever the realised sample. Adaptive clipping then updates C
  geometrically towards the target quantile from the noised bit count.
- observer (``on_round_end``): every round is composed into the accountant with its own noise
  multiplier (``DPPlan.round_multiplier``: under ``distributed``, from the honest shares inside
  the released sum, which the protocol reports as ``Aggregate.included``); ε at δ goes into the
  metrics row — every round with RDP (milliseconds), on evaluation rounds and the last round
  with PLD (the rows in between carry no ``epsilon``). Under ``distributed`` the row also has
  ``epsilon_server`` (= ``epsilon``) and ``epsilon_released``: ``accounting.DistributedAccountant``.

An empty Poisson sample still releases noise, so emptiness reveals nothing: ``central`` the
full noise; ``distributed``, where no client share exists, the server adds one share's noise
(value and count) — exactly what the round would carry had one honest client, the target,
taken part, which is how the round is accounted (``round_multiplier`` with n_t = 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedsafe.core.plugins import ClientTransform, Observer, RoundHost, ServerTransform
from fedsafe.core.randomness import RandomSource
from fedsafe.core.types import Aggregate, Message, RoundContext
from fedsafe.privacy.dp.config import DPPlan
from fedsafe.privacy.dp.mechanisms import (
    client_noise,
    clip_updates,
    server_noise,
    update_clip,
)


class DPPlugin(ClientTransform, ServerTransform, Observer):
    name = "dp"

    def __init__(self, plan: DPPlan, source: RandomSource) -> None:
        self.plan = plan
        self.source = source
        self.clip = plan.clip
        self.accountant = plan.new_accountant()
        self._last: dict[str, float] = {}
        self._honest: frozenset[int] = frozenset()  # this round's honest clients that added noise
        self._shares = 0  # honest noise shares inside this round's released sum (distributed)
        self._included: frozenset[int] = frozenset()  # honest clients whose updates are in it (distributed)

    def message_dim(self, dim: int) -> int:
        return dim + 1 if self.plan.adaptive else dim

    def message_ranges(self, dim: int) -> list[tuple[int, float, float, float]]:
        """What an honest message of ``dim`` coordinates holds, for a protocol that encodes it in
        a bounded range (secagg): runs of ``(length, lo, hi, noise std)``. The update's
        coordinates lie in [-C, C] (its L2 norm is at most C) and each client adds N(0, σ²) to
        them (σ = z_Δ C/√n_s for a distributed share, zC for local noise, 0 for central); with
        adaptive clipping, the last coordinate is the bit, in [0, 1], with σ_b/√n_s."""
        p = self.plan
        shares = p.noise_shares if p.placement == "distributed" else 1
        std = 0.0 if p.placement == "central" else p.value_z * self.clip / math.sqrt(shares)
        if not p.adaptive:
            return [(dim, -self.clip, self.clip, std)]
        std_b = p.count_stddev / math.sqrt(shares) if p.placement == "distributed" else 0.0
        return [(dim - 1, -self.clip, self.clip, std), (1, 0.0, 1.0, std_b)]

    def transform_honest(self, updates: Tensor, ctx: RoundContext, ids: np.ndarray) -> Tensor:
        """Clip each row to C; add each client's noise (local, distributed) from its own stream
        ``("dp.client_noise", round, client id)`` of this instance's source (secret unless the
        run is seeded), so that a remote client computes its row alone (``fedsafe.flower``:
        with its own secret)."""
        p = self.plan
        self._honest = frozenset(int(i) for i in ids)
        clipped, norms = clip_updates(updates, self.clip)
        self._last["clipped_fraction"] = float((norms > self.clip).float().mean()) if len(ids) else 0.0
        if p.placement == "central" and not p.adaptive:
            return clipped
        rows = []
        for i, cid in enumerate(ids):
            gen = self.source.stream("dp.client_noise", ctx.round, int(cid))
            row = clipped[i : i + 1]
            if p.placement != "central":
                row = row + client_noise(
                    1, updates.shape[1], clip=self.clip, z=p.value_z, placement=p.placement,
                    n_expected=p.noise_shares if p.placement == "distributed" else None,
                    generator=gen, dtype=updates.dtype,
                ).to(row.device)
            if p.adaptive:
                bit = (norms[i : i + 1] <= self.clip).to(updates.dtype)
                if p.placement == "distributed":
                    # the client's share of the count noise: Σ over n_s shares is N(0, σ_b²)
                    std = p.count_stddev / math.sqrt(p.noise_shares)
                    bit = bit + (gen.normal(1, updates.dtype) * std).to(bit.device)
                row = torch.cat([row, bit.unsqueeze(1)], dim=1)
            rows.append(row)
        return torch.cat(rows) if rows else updates.new_zeros((0, self.message_dim(updates.shape[1])))

    def client_reports(self) -> dict[str, float]:
        """Whether the client clipped: only under ``central`` placement, where the server is
        trusted; under local or distributed noise that bit would leak past the guarantee."""
        if self.plan.placement != "central":
            return {}
        return {"clipped": self._last.get("clipped_fraction", 0.0)}

    def client_state(self) -> dict[str, float]:
        return {"clip": self.clip}

    def load_client_state(self, state: dict[str, float]) -> None:
        if "clip" in state:
            clip = float(state["clip"])
            if not math.isfinite(clip) or clip <= 0:
                raise ValueError(f"dp clip norm from the server must be finite and > 0, got {clip}")
            self.clip = clip

    def observe_honest(self, ctx: RoundContext, ids: np.ndarray, reports: list[dict[str, float]]) -> None:
        self._honest = frozenset(int(i) for i in ids)
        clipped = [r["clipped"] for r in reports if "clipped" in r]
        if clipped:
            self._last["clipped_fraction"] = float(np.mean(clipped))

    def transform_messages(self, messages: list[Message], ctx: RoundContext) -> list[Message]:
        if self.plan.placement != "central":
            return messages  # local/distributed noise is already in the messages: re-clipping would remove it
        out = []
        for m in messages:
            v = m.vector
            if not bool(torch.isfinite(v).all()):
                out.append(m)  # the protocol excludes and counts it
                continue
            head = v[:-1] if self.plan.adaptive else v
            clipped, _ = clip_updates(head.unsqueeze(0), self.clip)
            if self.plan.adaptive:
                bit = v[-1:].clamp(0.0, 1.0)  # a bit is a bit, whatever a Byzantine client sends
                clipped = torch.cat([clipped[0], bit]).unsqueeze(0)
            out.append(Message(m.client_id, clipped[0], m.weight))
        return out

    def _honest_shares(self, agg: Aggregate | None) -> int:
        """Honest clients whose noise share is inside the aggregate. A protocol that does not
        say which vectors it aggregated (``included`` None) gets no credit: 0. Shares the
        protocol's encoding may have clipped (secagg with an explicit range too narrow for the
        noise: ``metrics["secagg_uncredited_shares"]``) are not credited either."""
        if agg is None or agg.included is None:
            return 0
        n = len(self._honest.intersection(int(i) for i in agg.included))
        return max(0, n - int(agg.metrics.get("secagg_uncredited_shares", 0)))

    def transform_aggregate(self, vector: Tensor, ctx: RoundContext, agg: Aggregate | None) -> Tensor:
        p = self.plan
        count = 0 if agg is None else agg.count
        total = vector * count
        if p.adaptive:
            total, bit_sum = total[:-1], float(total[-1])
        gen = self.source.stream("dp.server_noise", ctx.round)
        stand_in = p.placement == "distributed" and agg is None
        if p.placement == "distributed":
            self._shares = self._honest_shares(agg)
            # whose updates are in the sum (every honest one where the protocol does not say)
            self._included = self._honest if agg is None or agg.included is None else (
                self._honest.intersection(int(i) for i in agg.included))
            if stand_in:  # nobody sampled: the server adds the one share a lone client would have
                total = total + client_noise(
                    1, total.shape[0], clip=self.clip, z=p.value_z, placement="distributed",
                    n_expected=p.noise_shares, generator=gen, dtype=total.dtype,
                )[0]
        noised = total + server_noise(total.shape[0], clip=self.clip, z=p.value_z, placement=p.placement, generator=gen, dtype=total.dtype)
        out = noised / p.expected_clients
        if p.adaptive:
            # b̃ = (Σ(b_i − ½) + N(0, σ_b²)) / m + ½  (Andrew et al. 2021, centred count); under
            # distributed placement the clients' shares of N(0, σ_b²) are already in bit_sum.
            noise_b = 0.0
            if p.placement == "central" or stand_in:
                std_b = p.count_stddev if p.placement == "central" else p.count_stddev / math.sqrt(p.noise_shares)
                noise_b = float(gen.normal(1, torch.float64)) * std_b
            frac = (bit_sum - count / 2 + noise_b) / p.expected_clients + 0.5
            self._last["noised_unclipped_fraction"] = frac
            self.clip = update_clip(self.clip, frac, target_quantile=p.target_quantile, clip_lr=p.clip_lr)
        return out

    def empty_aggregate(self, ctx: RoundContext, dim: int) -> Tensor:
        """An empty Poisson sample still releases (noise)/m, so emptiness reveals nothing."""
        zero = torch.zeros(self.message_dim(dim))
        return self.transform_aggregate(zero, ctx, None)

    def on_round_end(self, fed: RoundHost, row: dict[str, Any]) -> dict[str, Any]:
        p = self.plan
        z_t = p.round_multiplier(self._shares)
        sampled = row.get("participants", 0) - row.get("byzantine", 0)
        p.compose_round(self.accountant, z_t, shares=self._shares, sampled=sampled, clients=self._included)
        out: dict[str, Any] = {
            "delta": p.delta,
            "clip": self.clip,
            "noise_multiplier": p.z,
            "effective_noise_multiplier": z_t,
        }
        if p.placement == "distributed":
            out["dp_noise_shares"] = self._shares
        t, cfg = row["round"], fed.cfg
        if p.engine.epsilon_every_round or t % cfg.eval_every == 0 or t >= cfg.rounds:
            out.update(self.accountant.epsilons())  # distributed: epsilon_server, epsilon_released too
        out.update(self._last)
        self._last, self._honest, self._shares, self._included = {}, frozenset(), 0, frozenset()
        return out

    def summary(self, fed: RoundHost) -> dict[str, Any]:
        return {
            "noise_multiplier": self.plan.z,
            "dp_placement": self.plan.placement,
            "accountant": self.plan.accountant,
            "neighboring": self.plan.neighboring,
            "epsilon_observer": self.plan.epsilon_observer,
            **self.accountant.summary(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"clip": self.clip, "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.clip = float(state["clip"])
            self.accountant.load_state_dict(state["accountant"])


def expected_noise_std(plan: DPPlan, clip: float) -> float:
    """Std of the noise on each coordinate of the released mean: z_Δ·C/m."""
    return plan.value_z * clip / plan.expected_clients if plan.expected_clients else math.inf
