"""The model, the data and local training: what any Flower PyTorch project has."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def load_partition(partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's share of the digits (an IID split; your project reads its own data)."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    mine = np.array_split(order, num_partitions)[partition_id]
    return torch.tensor(x[mine] / 16.0, dtype=torch.float32), torch.tensor(y[mine])


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    loss = torch.zeros(())
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(32):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    return loss.item()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(x)
        return float(nn.functional.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
