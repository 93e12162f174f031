"""Exponential moving average of the global model, used for evaluation (BAFFLE guideline).

The zeroth-order estimate is the true gradient plus zero-mean white noise (Feng et al.,
Thm 3.1); averaging the iterates smooths it out. BAFFLE's code uses ``torch_ema``'s
``ExponentialMovingAverage(decay=0.995)``, whose default ``use_num_updates=True`` warms the
decay up; this class reproduces it on flat vectors:

    shadow ← params₀ (at construction or on the first ``update``), n ← 0
    each update:  n ← n + 1;  β = min(decay, (1 + n)/(10 + n)) if warmup else decay
                  shadow ← shadow − (1 − β)(shadow − params)

Without the warm-up, 20 FedAvg rounds at 0.995 would leave ~90% of the weight on the random
initialisation; with it the average tracks the model early and settles to 0.995.
"""

from __future__ import annotations

from torch import Tensor


class EMA:
    def __init__(self, decay: float = 0.995, warmup: bool = True, params: Tensor | None = None) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"EMA decay must lie in [0, 1), got {decay}")
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.num_updates = 0
        self.shadow: Tensor | None = None if params is None else params.detach().clone()

    def current_decay(self) -> float:
        """β used by the next update."""
        n = self.num_updates + 1
        return min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay

    def update(self, params: Tensor) -> Tensor:
        """Fold ``params`` into the average and return the average (a new tensor)."""
        if self.shadow is None:
            self.shadow = params.detach().clone()
            return self.shadow.clone()
        if params.shape != self.shadow.shape:
            raise ValueError(f"EMA holds shape {tuple(self.shadow.shape)}, got {tuple(params.shape)}")
        beta = self.current_decay()
        self.num_updates += 1
        self.shadow = self.shadow - (1 - beta) * (self.shadow - params.detach())
        return self.shadow.clone()

    @property
    def value(self) -> Tensor:
        if self.shadow is None:
            raise ValueError("EMA has no value before the first update")
        return self.shadow.clone()

    def state_dict(self) -> dict[str, object]:
        return {
            "decay": self.decay,
            "warmup": self.warmup,
            "num_updates": self.num_updates,
            "shadow": None if self.shadow is None else self.shadow.clone(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.decay = float(state["decay"])  # type: ignore[arg-type]
        self.warmup = bool(state["warmup"])
        self.num_updates = int(state["num_updates"])  # type: ignore[arg-type]
        shadow = state["shadow"]
        self.shadow = None if shadow is None else shadow.clone()  # type: ignore[union-attr]
