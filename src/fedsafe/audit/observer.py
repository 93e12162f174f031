"""Canary clients for one DP-FedAvg run, as the engine needs them (engine-independent).

The engine drives a :class:`CanaryAudit` through three calls per run:

1. each round ``t``, before aggregation: ``ids, rows = audit.round_updates(t, clip_norm)`` and
   append ``rows`` as extra client messages (already exactly at the clip norm, Algorithm 1
   line 7), counted in the averaging denominator ``m`` like any participant;
2. after aggregation: ``audit.observe_round(aggregate)`` with the round's *noised* aggregate in
   the message space (ρ̄_t of Algorithm 2, same sign convention as the canary rows);
3. at the end: ``audit.finish(final_vector, delta, noise_multiplier=z)`` with the final model
   ``θ_T`` oriented so that a message ``+v`` moves it by ``+v`` (DP-FedAvg: the params), then
   ``audit.write(out_dir, result)`` for the cosines and histograms.

``state_dict()`` / ``load_state_dict()`` (plain tensors) go into the checkpoint's ``extra``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch import Tensor

from fedsafe.audit.canaries import CanaryBank, CanaryTracker
from fedsafe.audit.estimators import audit_summary
from fedsafe.audit.figures import plot_histogram

__all__ = ["AuditResult", "CanaryAudit"]


@dataclass
class AuditResult:
    summary: dict  # audit_summary(...): eps_est_final, eps_est_all, eps_lo_valid_final, ...
    final_obs: np.ndarray
    final_unobs: np.ndarray
    all_obs: np.ndarray
    all_unobs: np.ndarray
    dim: int
    files: list[Path] = field(default_factory=list)


class CanaryAudit:
    """Bank + schedule + tracker for a run of ``num_rounds`` rounds on a ``dim``-parameter model.

    ``cache_bytes``: canaries are materialized once if they fit (default 256 MiB), otherwise
    regenerated from their seeds chunk by chunk every round.
    """

    def __init__(
        self,
        seed: int,
        dim: int,
        num_rounds: int,
        *,
        canaries: int,
        unobserved: int = 0,
        repetitions: int = 1,
        chunk_size: int = 256,
        cache_bytes: int = 256 * 2**20,
    ) -> None:
        if canaries < 2:
            raise ValueError(f"audit.canaries must be >= 2 (a mean and a spread are fitted), got {canaries}")
        if unobserved == 1:
            raise ValueError("audit.unobserved must be 0 (final-model only) or >= 2")
        self.bank = CanaryBank(seed, dim, canaries, unobserved, cache_bytes=cache_bytes)
        self.repetitions = int(repetitions)
        self.schedule = self.bank.presentations(num_rounds, repetitions)
        self.tracker = CanaryTracker(self.bank, chunk_size)

    def participants(self, round_: int) -> list[int]:
        """Observed canary ids presented in round ``round_`` (1-based)."""
        return self.schedule.get(int(round_), [])

    def round_updates(self, round_: int, clip_norm: float) -> tuple[list[int], Tensor]:
        """``(ids, rows)``: this round's canary messages ``clip_norm · c_j`` (``(n, dim)``)."""
        ids = self.participants(round_)
        return ids, self.bank.updates(ids, clip_norm)

    def observe_round(self, aggregate: Tensor, round_: int | None = None) -> dict[str, float]:
        """Fold the round's noised aggregate into the max-over-rounds cosines; returns metrics
        for the round's row (mean cosine of the canaries present, if ``round_`` is given)."""
        cos = self.tracker.update(aggregate)
        ids = self.participants(round_) if round_ is not None else []
        if ids:
            return {"canary_cos_present": float(cos[ids].mean())}
        return {}

    def finish(
        self, final_vector: Tensor, delta: float, *, noise_multiplier: float | None = None, alpha: float = 0.05
    ) -> AuditResult:
        """Cosines with the final model and every ε of Andrew et al.'s Table 3."""
        fo, fu = self.tracker.split(self.tracker.final(final_vector))
        ao, au = self.tracker.split(self.tracker.max_cos)
        has_all = self.bank.unobserved >= 2 and self.tracker.rounds > 0
        summary = audit_summary(
            fo,
            fu if fu.size >= 2 else None,
            ao if has_all else None,
            au if has_all else None,
            self.bank.dim,
            delta,
            alpha=alpha,
            noise_multiplier=noise_multiplier,
            repetitions=self.repetitions,
        )
        summary["repetitions"] = self.repetitions
        return AuditResult(summary, fo, fu, ao, au, self.bank.dim)

    @staticmethod
    def write(out_dir: Path | str, result: AuditResult) -> list[Path]:
        """``audit_cosines.npz`` and histogram PNGs (``audit_final.png``, and ``audit_all.png``
        when unobserved canaries were tracked) in ``out_dir``; returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        npz = out / "audit_cosines.npz"
        np.savez(npz, final_obs=result.final_obs, final_unobs=result.final_unobs,
                 all_obs=result.all_obs, all_unobs=result.all_unobs, dim=result.dim)
        s = result.summary

        def fmt(key: str) -> str:
            v = s.get(key)
            return "—" if v is None else f"{v:.3g}"

        files = [npz, plot_histogram(
            out / "audit_final.png", result.final_obs, result.final_unobs if result.final_unobs.size else None,
            result.dim,
            title=f"final model: ε_est {fmt('eps_est_final')}, 95% lower bound {fmt('eps_lo_valid_final')}",
        )]
        if s.get("eps_est_all") is not None or s.get("eps_lo_all") is not None:
            files.append(plot_histogram(
                out / "audit_all.png", result.all_obs, result.all_unobs, result.dim, null_curve=False,
                title=f"max over rounds: ε_est {fmt('eps_est_all')}, 95% lower bound {fmt('eps_lo_valid_all')}",
            ))
        result.files = files
        return files

    def state_dict(self) -> dict[str, Tensor]:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.tracker.load_state_dict(state)
