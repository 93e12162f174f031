"""Adam over flat parameter vectors, as a pure function (BAFFLE's server optimizer).

BAFFLE's code steps the global model with Adam, betas (0.9, 0.99), weight decay 5e-4, on the
zeroth-order gradient estimate. This is ``torch.optim.Adam`` (amsgrad=False, maximize=False)
without the module: weight decay is L2 added to the gradient (torch Adam's ``weight_decay``,
not AdamW's decoupled decay), with bias correction:

    g ← g + λw;  t ← t + 1;  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²
    w ← w − (γ/(1−β₁ᵗ)) · m / (√v/√(1−β₂ᵗ) + ε)

Inputs are never modified; the state is returned anew, so a round can be replayed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AdamState:
    """First and second moments and the step count t (number of steps taken)."""

    m: Tensor
    v: Tensor
    t: int

    @classmethod
    def zeros(cls, params: Tensor) -> AdamState:
        return cls(torch.zeros_like(params), torch.zeros_like(params), 0)

    def state_dict(self) -> dict[str, object]:
        return {"m": self.m.clone(), "v": self.v.clone(), "t": self.t}

    @classmethod
    def from_state_dict(cls, state: dict[str, object]) -> AdamState:
        return cls(state["m"].clone(), state["v"].clone(), int(state["t"]))  # type: ignore[union-attr]


@dataclass(frozen=True)
class Adam:
    """``step(params, direction, state) -> (params, state)``, like the engine's ``ServerSGD``.

    ``direction`` is the descent direction (a gradient estimate, or minus the mean delta);
    ``state=None`` starts from zero moments.
    """

    lr: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 5e-4

    def __post_init__(self) -> None:
        b1, b2 = self.betas
        if not self.lr > 0:
            raise ValueError(f"Adam lr must be > 0, got {self.lr}")
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"Adam betas must lie in [0, 1), got {self.betas}")
        if not self.eps > 0 or self.weight_decay < 0:
            raise ValueError(f"Adam needs eps > 0 and weight_decay >= 0, got {self.eps}, {self.weight_decay}")

    def step(self, params: Tensor, direction: Tensor, state: AdamState | None) -> tuple[Tensor, AdamState]:
        if direction.shape != params.shape:
            raise ValueError(f"direction shape {tuple(direction.shape)} != params shape {tuple(params.shape)}")
        if state is None:
            state = AdamState.zeros(params)
        b1, b2 = self.betas
        g = direction if self.weight_decay == 0 else direction + self.weight_decay * params
        t = state.t + 1
        m = b1 * state.m + (1 - b1) * g
        v = b2 * state.v + (1 - b2) * g * g
        step_size = self.lr / (1 - b1**t)
        denom = v.sqrt() / math.sqrt(1 - b2**t) + self.eps
        return params - step_size * m / denom, AdamState(m, v, t)
