"""The server optimizer: SGD with momentum and weight decay on flat parameter vectors."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fedsafe.core.types import vector_problem


@dataclass(frozen=True)
class ServerSGD:
    """``torch.optim.SGD`` semantics (no dampening, no Nesterov), as a pure function.

    d = g + λw;  b ← d on the first step, else b ← μb + d;  w ← w − γb  (b = d when μ = 0).
    ``g`` is the aggregated descent direction (a gradient estimate, or minus the mean delta).
    """

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def step(self, params: Tensor, direction: Tensor, buf: Tensor | None) -> tuple[Tensor, Tensor | None]:
        d = direction if self.weight_decay == 0 else direction + self.weight_decay * params
        if self.momentum == 0:
            return params - self.lr * d, None
        buf = d.clone() if buf is None else self.momentum * buf + d
        return params - self.lr * buf, buf

    def buffer_problem(self, buf: object, dim: int) -> str | None:
        """Why ``buf`` (e.g. from a checkpoint) cannot be this optimizer's buffer, else None."""
        if buf is None:
            return None
        if self.momentum == 0:
            return "a momentum buffer, but server.momentum = 0"
        return vector_problem(buf, dim)


@dataclass(frozen=True)
class ServerAdam:
    """Adam on the aggregated descent direction (BAFFLE's server optimizer), with the same
    ``step(params, direction, buf)`` shape as :class:`ServerSGD`; ``buf`` is the plain dict
    ``{"m", "v", "t"}`` so that it checkpoints as tensors. The math is ``fedsafe.engine.adam.Adam``
    (``torch.optim.Adam`` semantics, L2 weight decay, bias correction)."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def step(self, params: Tensor, direction: Tensor, buf: dict | None) -> tuple[Tensor, dict]:
        from fedsafe.engine.adam import Adam, AdamState

        adam = Adam(self.lr, tuple(self.betas), self.eps, self.weight_decay)
        state = None if buf is None else AdamState(buf["m"], buf["v"], int(buf["t"]))
        params, new = adam.step(params, direction, state)
        return params, {"m": new.m, "v": new.v, "t": new.t}

    def buffer_problem(self, buf: object, dim: int) -> str | None:
        """Why ``buf`` (e.g. from a checkpoint) cannot be this optimizer's state, else None."""
        if buf is None:
            return None
        if not isinstance(buf, dict) or set(buf) != {"m", "v", "t"}:
            return "not Adam's state {m, v, t}"
        t = buf["t"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            return f"Adam's step count t must be an integer >= 1, got {t!r}"
        problem = vector_problem(buf["m"], dim) or vector_problem(buf["v"], dim)
        if problem is None and bool((buf["v"] < 0).any()):
            problem = "Adam's second moment v has negative entries"
        return problem
