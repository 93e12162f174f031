"""A model's parameters as one flat vector, and back.

The engine, robust rules and zeroth-order clients work on flat ``d``-vectors; ``ParamLayout``
turns such a vector back into the ``{name: tensor}`` dict that ``torch.func.functional_call``
takes. Order is ``model.named_parameters()`` order throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


def flatten_params(model: nn.Module) -> Tensor:
    """A 1-D float32 copy of all parameters, concatenated in ``named_parameters()`` order."""
    params = [p.detach().reshape(-1) for p in model.parameters()]
    if not params:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat(params).to(torch.float32)


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and sizes of a model's parameters, in ``named_parameters()`` order.

    ``numel[i]`` is the size of parameter ``names[i]``; ``dim`` is their sum, d.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    numel: tuple[int, ...]

    @classmethod
    def from_model(cls, model: nn.Module) -> ParamLayout:
        named = list(model.named_parameters())
        return cls(
            names=tuple(n for n, _ in named),
            shapes=tuple(p.shape for _, p in named),
            numel=tuple(p.numel() for _, p in named),
        )

    @property
    def dim(self) -> int:
        return sum(self.numel)

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """``{name: view}`` of the 1-D ``flat`` (length ``dim``); the views share its storage.

        Works inside ``torch.func.vmap`` over a batch of flat vectors: vmap strips the batch
        dimension, and split + view are batched per sample.
        """
        if flat.dim() != 1 or flat.shape[0] != self.dim:
            raise ValueError(
                f"expected a 1-D parameter vector of length {self.dim}, got shape "
                f"{tuple(flat.shape)}"
            )
        parts = torch.split(flat, self.numel)
        return {n: part.view(s) for n, part, s in zip(self.names, parts, self.shapes)}

    def load_into(self, model: nn.Module, flat: Tensor) -> None:
        """Copy the flat vector ``flat`` into ``model``'s parameters, in place."""
        views = self.unflatten(flat)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(views[name])

    def flatten(self, params: dict[str, Tensor]) -> Tensor:
        """Inverse of :meth:`unflatten`: concatenate ``params`` in layout order."""
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"parameters missing: {', '.join(missing)}")
        return torch.cat([params[n].reshape(-1) for n in self.names])
