"""The loaded, partitioned dataset every other subsystem consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class FederatedDataset:
    """Train/test tensors plus each client's share of the training set.

    ``client_indices[k]`` are int64 indices into ``x_train``/``y_train``; clients are pairwise
    disjoint and non-empty. Images are (n, c, h, w) standardised per channel with the training
    split's statistics (``pixel_mean``/``pixel_std``, in [0, 1] pixel units; None for
    non-image data, which is left as generated). Construction validates all of this.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    client_indices: list[np.ndarray]
    num_classes: int
    input_shape: tuple[int, ...]
    pixel_mean: tuple[float, ...] | None = None
    pixel_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.input_shape)
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if x.dtype != torch.float32:
                raise ValueError(f"FederatedDataset.x_{split} must be float32, got {x.dtype}")
            if y.dtype != torch.int64 or y.ndim != 1:
                raise ValueError(
                    f"FederatedDataset.y_{split} must be a 1-D int64 tensor, got {y.dtype} {tuple(y.shape)}"
                )
            if tuple(x.shape[1:]) != self.input_shape or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"FederatedDataset.x_{split} has shape {tuple(x.shape)} but y_{split} has "
                    f"{y.shape[0]} labels and input_shape is {self.input_shape}"
                )
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"FederatedDataset.y_{split} has labels in {int(y.min())}..{int(y.max())}, "
                    f"outside 0..{self.num_classes - 1}"
                )
        if not self.client_indices:
            raise ValueError("FederatedDataset.client_indices is empty: need at least one client")
        n = self.x_train.shape[0]
        for k, idx in enumerate(self.client_indices):
            if not isinstance(idx, np.ndarray) or idx.dtype != np.int64 or idx.ndim != 1:
                raise ValueError(f"FederatedDataset.client_indices[{k}] must be a 1-D int64 numpy array")
        # The rest in a few vectorised passes over all the indices (a population of 10^5 clients
        # is checked in milliseconds), reporting the first client, in id order, that fails.
        sizes = np.fromiter((idx.size for idx in self.client_indices), dtype=np.int64, count=len(self.client_indices))
        if (sizes == 0).any():
            k = int(np.argmax(sizes == 0))
            raise ValueError(f"FederatedDataset.client_indices[{k}] is empty; every client needs data")
        flat = np.concatenate(self.client_indices)
        owner_end = np.cumsum(sizes)  # client k holds flat[owner_end[k] - sizes[k] : owner_end[k]]
        bad = (flat < 0) | (flat >= n)
        if bad.any():
            k = int(np.searchsorted(owner_end, int(np.argmax(bad)), side="right"))
            raise ValueError(
                f"FederatedDataset.client_indices[{k}] holds indices outside 0..{n - 1}"
            )
        order = np.argsort(flat, kind="stable")
        repeat = flat[order[1:]] == flat[order[:-1]]
        if repeat.any():  # the later occurrence of the earliest-repeated position names the client
            k = int(np.searchsorted(owner_end, int(order[1:][repeat].min()), side="right"))
            raise ValueError(
                f"FederatedDataset.client_indices[{k}] overlaps an earlier client or repeats an index"
            )

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def client_data(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) of client k's training samples (a copy, by advanced indexing)."""
        idx = torch.from_numpy(self.client_indices[k])
        return self.x_train[idx], self.y_train[idx]
