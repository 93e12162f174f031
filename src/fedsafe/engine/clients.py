"""Honest client work, written once over batched tensors for every backend.

:class:`ClientWork` holds what every client algorithm shares — the ``[clients]`` settings, the
backend (per-client minibatch gradients, serial or vectorized), the data, seeded minibatches,
each client's local step count and the ``[zo]`` section — and delegates the rest to the
algorithm registered for the configuration (``fedsafe.core.clients.CLIENT_ALGORITHMS``):
``dsgd`` and ``fedavg`` (:mod:`fedsafe.engine.algorithms`), their zeroth-order variants
(:mod:`fedsafe.zo.algorithms`: FedSGD uploads M loss differences, FedAvg takes forward-only
local steps), and ``inherent`` (:mod:`fedsafe.privacy.inherent.clients`).

Minibatches are drawn without replacement from the client's own data (with replacement when
the client holds fewer than ``B`` samples), from the counter-based stream
``("batches", client, round, step, position)``: the same client sees the same batches whatever
the backend, the participants, or the order of computation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedsafe.config import ClientsConfig
from fedsafe.core.clients import CLIENT_ALGORITHMS, LocalResult, algorithm_key
from fedsafe.core.streams import counter_base, counter_uniform
from fedsafe.data import FederatedDataset


try:  # numba is a dependency; without it the numpy path below is used
    from numba import njit
except ImportError:  # pragma: no cover - exercised only without numba
    njit = None


class FlatIndices(NamedTuple):
    """Every client's sample indices in one array: client c holds
    ``values[offsets[c] : offsets[c] + sizes[c]]`` (what the batch kernel reads)."""

    values: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray


def flatten_indices(client_indices: list[np.ndarray]) -> FlatIndices:
    sizes = np.array([len(ix) for ix in client_indices], dtype=np.int64)
    values = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in client_indices]) if len(sizes) else np.zeros(0, np.int64)
    return FlatIndices(values, np.cumsum(sizes) - sizes, sizes)


def draw_batches(
    seed: int,
    round_: int,
    step: int,
    client_ids: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
    *,
    flat: FlatIndices | None = None,
) -> np.ndarray:
    """Global sample indices, shape (len(client_ids), batch_size): for each client the
    ``batch_size`` positions of its data with the smallest keys
    ``counter_uniform(seed, "batches", client, round, step, position)``, in position order
    (a uniform subset without replacement); a client holding fewer samples than the batch
    draws position ``⌊u·size⌋`` for each of the first ``batch_size`` keys (with replacement).

    Computed by a numba kernel, one pass per client and no (n, width) intermediate
    (``flat``: :func:`flatten_indices` of ``client_indices``, which a caller drawing every
    round computes once); :func:`draw_batches_numpy` is the same draw in numpy, used
    without numba and as the tests' reference."""
    ids = np.asarray(client_ids, dtype=np.int64)
    if njit is None or len(ids) == 0:
        return draw_batches_numpy(seed, round_, step, ids, client_indices, batch_size)
    if min(round_, step, int(ids.min())) < 0:
        counter_uniform(seed, "batches", ids, round_, step)  # its error for negative keys
    flat = flat if flat is not None else flatten_indices(client_indices)
    out = np.empty((len(ids), batch_size), dtype=np.int64)
    _draw_kernel(np.uint64(counter_base(seed, "batches")), ids, np.uint64(round_), np.uint64(step),
                 flat.values, flat.offsets, flat.sizes, out)
    return out


def draw_batches_numpy(
    seed: int,
    round_: int,
    step: int,
    client_ids: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
) -> np.ndarray:
    """:func:`draw_batches` in numpy over an (n, largest client) matrix of keys."""
    n = len(client_ids)
    if n == 0:
        return np.zeros((0, batch_size), dtype=np.int64)
    sizes = np.array([len(client_indices[c]) for c in client_ids])
    width = int(max(sizes.max(), batch_size))
    u = counter_uniform(seed, "batches", client_ids[:, None], round_, step, np.arange(width)[None, :])
    padded = np.zeros((n, width), dtype=np.int64)
    for row, c in enumerate(client_ids):
        padded[row, : sizes[row]] = client_indices[c]
    positions = np.empty((n, batch_size), dtype=np.int64)
    big = sizes >= batch_size
    if big.any():
        keys = np.where(np.arange(width)[None, :] < sizes[big, None], u[big], 2.0)
        # The B smallest keys among the client's positions: a uniform subset without replacement.
        part = np.argpartition(keys, batch_size - 1, axis=1)[:, :batch_size]
        positions[big] = np.sort(part, axis=1)
    if (~big).any():
        positions[~big] = np.floor(u[~big, :batch_size] * sizes[~big, None]).astype(np.int64)
    return np.take_along_axis(padded, positions, axis=1)


if njit is not None:
    _G, _M1, _M2 = (np.uint64(v) for v in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))
    _S27, _S30, _S31, _S11 = (np.uint64(v) for v in (27, 30, 31, 11))

    @njit(cache=True, nogil=True, inline="always")
    def _mix(x):  # pragma: no cover - compiled; fedsafe.core.streams._splitmix64
        x = x + _G
        x = (x ^ (x >> _S30)) * _M1
        x = (x ^ (x >> _S27)) * _M2
        return x ^ (x >> _S31)

    @njit(cache=True, nogil=True)
    def _kth_smallest(a, n, k):  # pragma: no cover - compiled
        """The k-th smallest (0-based) of a[:n], by quickselect on a[:n] in place (reordered)."""
        lo, hi = 0, n - 1
        while lo < hi:
            pivot = a[(lo + hi) // 2]
            i, j = lo, hi
            while i <= j:
                while a[i] < pivot:
                    i += 1
                while a[j] > pivot:
                    j -= 1
                if i <= j:
                    a[i], a[j] = a[j], a[i]
                    i += 1
                    j -= 1
            if k <= j:
                hi = j
            elif k >= i:
                lo = i
            else:
                return a[k]
        return a[k]

    @njit(cache=True, nogil=True)
    def _draw_kernel(base, ids, round_, step, values, offsets, sizes, out):  # pragma: no cover
        """out[r] = the batch of client ids[r] (draw_batches), keys hashed as counter_uniform."""
        batch = out.shape[1]
        scale = 1.0 / 9007199254740992.0  # 2⁻⁵³
        width = batch
        for r in range(ids.shape[0]):
            width = max(width, sizes[ids[r]])
        keys = np.empty(width, dtype=np.float64)
        scratch = np.empty(width, dtype=np.float64)
        for r in range(ids.shape[0]):
            c = ids[r]
            size = sizes[c]
            off = offsets[c]
            h = _mix(_mix(_mix(base ^ np.uint64(c)) ^ round_) ^ step)
            if size >= batch:
                for j in range(size):
                    keys[j] = np.float64(_mix(_mix(h ^ np.uint64(j))) >> _S11) * scale
                    scratch[j] = keys[j]
                # the batch smallest keys, in position order (keys are distinct 53-bit draws)
                threshold = _kth_smallest(scratch, size, batch - 1)
                k = 0
                for j in range(size):
                    if keys[j] <= threshold and k < batch:
                        out[r, k] = values[off + j]
                        k += 1
            else:
                for j in range(batch):
                    u = np.float64(_mix(_mix(h ^ np.uint64(j))) >> _S11) * scale
                    # a client without data gets index 0, as the numpy path's zero padding
                    out[r, j] = values[off + np.int64(np.floor(u * size))] if size > 0 else 0


class ClientWork:
    """Runs the configured client algorithm for a set of clients through a backend."""

    def __init__(self, cfg: ClientsConfig, backend, data: FederatedDataset, seed: int, zo=None) -> None:
        self.cfg = cfg
        self.zo = zo  # the [zo] section, read by the zeroth-order algorithms
        self.backend = backend
        self.data = data
        self.seed = seed
        self.algorithm = CLIENT_ALGORITHMS.entry(algorithm_key(cfg.algorithm, cfg.gradient)).impl()
        self.algorithm.setup(self)  # its own settings (zeroth-order: BAFFLE's, from [zo])
        self._flat = flatten_indices(data.client_indices)
        sizes = self._flat.sizes
        if cfg.algorithm == "fedavg":
            if cfg.local_steps is not None:
                self.steps = np.full(len(sizes), cfg.local_steps)
            else:
                epochs = cfg.local_epochs or 1
                self.steps = epochs * -(-sizes // cfg.batch_size)
        else:
            self.steps = np.ones(len(sizes), dtype=np.int64)
        self.private_gradients = None  # example-level DP's oracle (use_private_gradients), if any

    def use_private_gradients(self, oracle) -> None:
        """Have the honest clients' steps compute their gradients with ``oracle(work, round,
        step, params, ids) -> (grads[n, d], losses[n])`` instead of the seeded minibatch
        gradient (example-level DP: ``fedsafe.privacy.dp.dpsgd.DPSGDClients``, handed over by the
        DP plugin's ``configure_clients``). Byzantine clients (those given a poison) are not
        bound by DP and keep the plain gradient."""
        self.private_gradients = oracle

    def gradients(self, round_: int, step: int, params: Tensor, ids: np.ndarray, poison=None) -> tuple[Tensor, Tensor]:
        """Clients ``ids``' gradients at local step ``step`` of round ``round_``, at ``params``
        (one flat model, or one row per client): the private oracle's for honest clients when
        one is set, else the backend's gradient of their seeded minibatches (:meth:`batch`)."""
        if self.private_gradients is not None and poison is None:
            return self.private_gradients(self, round_, step, params, ids)
        x, y = self.batch(round_, step, ids, poison)
        return self.backend.gradients(params, x, y)

    @property
    def keeps_momentum(self) -> bool:
        """Whether the engine keeps a momentum row per client (backprop dsgd)."""
        return self.algorithm.keeps_momentum

    def message_dim(self, dim: int) -> int:
        """Length of one client's message for a ``dim``-parameter model (M scalars for
        zeroth-order FedSGD, else ``dim``)."""
        return self.algorithm.message_dim(self, dim)

    def server_optimizer(self, inner):
        """The server step the decoded direction goes to: ``inner`` itself, except where the
        algorithm wraps it (zeroth-order FedSGD's client momentum and weight decay, which can
        only act on the decoded direction)."""
        return self.algorithm.server_optimizer(self, inner)

    def close(self) -> None:
        """Release execution resources (a no-op in-process)."""

    def decode(self, aggregate: Tensor, round_: int) -> Tensor:
        """The parameter-space descent direction for the server optimizer (the algorithm's
        ``decode``: the negated mean delta for fedavg, the decoded estimate for zeroth-order
        FedSGD, the aggregate itself otherwise)."""
        return self.algorithm.decode(self, aggregate, round_)

    def loss_fn(self):
        """``loss(params, x, y)`` of the backend's model: what forward-only clients evaluate."""
        from fedsafe.engine.backends import make_loss

        return make_loss(self.backend.model, self.backend.layout, self.backend.loss_fn)

    def batch(self, round_: int, step: int, ids: np.ndarray, poison) -> tuple[Tensor, Tensor]:
        """The minibatches of clients ``ids`` at (round, step), shapes (n, B, ...) and (n, B),
        poisoned by ``poison(x, y, num_classes)`` when given (a Byzantine client's label flip
        or backdoor: fedsafe.robust.backdoor.Poison)."""
        idx = torch.from_numpy(
            draw_batches(self.seed, round_, step, ids, self.data.client_indices, self.cfg.batch_size, flat=self._flat)
        )
        # index_select on the flat indices: the same rows as x_train[idx], 5x faster on CPU
        flat, shape = idx.reshape(-1), tuple(idx.shape)
        x = self.data.x_train.index_select(0, flat).view(*shape, *self.data.x_train.shape[1:])
        y = self.data.y_train.index_select(0, flat).view(shape)
        if poison is not None:  # a per-client poison (DBA's trigger parts) is told whose rows these are
            x, y = poison(x, y, self.data.num_classes, ids) if getattr(poison, "per_client", False) else poison(x, y, self.data.num_classes)
        return x, y

    def run(
        self,
        round_: int,
        params: Tensor,
        ids: np.ndarray,
        momentum: Tensor | None = None,
        poison: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]] | None = None,
    ) -> LocalResult:
        return self.algorithm.run(self, round_, params, ids, momentum, poison)
