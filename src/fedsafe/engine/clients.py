"""Honest client work, written once over batched tensors for every backend.

``dsgd`` (Robust-DSGD / SABLE): each client takes one minibatch gradient per round at the
global model and sends its local momentum ``m ← βm + (1−β)(g + λw)``.
``fedavg``: each client runs local SGD steps ``w ← w − η(g + λw)`` and sends ``w − w_global``.
With ``local_epochs = E`` a client of ``n_i`` samples runs ``E·⌈n_i/B⌉`` steps; clients that
finish early are masked out of later steps, so all clients still move in one batched call.

With ``gradient = "zeroth_order"`` (BAFFLE) both algorithms use only forward passes. fedavg
takes the same local steps with the zeroth-order estimate, each rescaled to ∞-norm
``zo.clip_inf`` before λw is added (BAFFLE's clip, per local step). dsgd is FedSGD: a client
uploads M loss differences, the server decodes their aggregate, clips it to ``zo.clip_inf``,
and applies ``momentum`` and ``weight_decay`` to the decoded direction
(:class:`fedsafe.zo.DecodedMomentum`, through :meth:`ClientWork.server_optimizer`).

Minibatches are drawn without replacement from the client's own data (with replacement when
the client holds fewer than ``B`` samples), from the counter-based stream
``("batches", client, round, step, position)``: the same client sees the same batches whatever
the backend, the participants, or the order of computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedsafe.config import ClientsConfig
from fedsafe.data import FederatedDataset
from fedsafe.core.streams import counter_uniform


def draw_batches(
    seed: int,
    round_: int,
    step: int,
    client_ids: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
) -> np.ndarray:
    """Global sample indices, shape (len(client_ids), batch_size)."""
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


@dataclass
class LocalResult:
    updates: Tensor  # (n, d), in the message space of the algorithm
    losses: Tensor  # (n,), each client's minibatch loss at the global model
    momentum: Tensor | None  # (n, d) new dsgd momentum rows, else None
    survivors: np.ndarray | None = None  # (n,) bool; False = the client dropped out (None: all ok)


class ClientWork:
    """Runs the configured local algorithm for a set of clients through a backend."""

    def __init__(self, cfg: ClientsConfig, backend, data: FederatedDataset, seed: int, inherent=None, zo=None) -> None:
        self.cfg = cfg
        self.zo = zo  # ZOConfig when cfg.gradient = "zeroth_order"
        if cfg.gradient == "zeroth_order":
            from fedsafe.zo import ZOSettings

            if zo is None:
                raise ValueError("clients.gradient = 'zeroth_order' needs the [zo] settings")
            self.zo_settings = ZOSettings(zo.k, zo.sigma, zo.scheme, zo.chunk, zo.decode_chunk)
        self.inherent = inherent  # (InherentConfig, sigma²) for algorithm = "inherent"
        self.backend = backend
        self.data = data
        self.seed = seed
        sizes = np.array([len(ix) for ix in data.client_indices])
        if cfg.algorithm == "fedavg":
            if cfg.local_steps is not None:
                self.steps = np.full(len(sizes), cfg.local_steps)
            else:
                epochs = cfg.local_epochs or 1
                self.steps = epochs * -(-sizes // cfg.batch_size)
        else:
            self.steps = np.ones(len(sizes), dtype=np.int64)

    def _zeroth_order(self, round_: int, params: Tensor, ids: np.ndarray, label_transform) -> LocalResult:
        """BAFFLE clients: forward passes only (no backpropagation anywhere on the client)."""
        from fedsafe.engine.backends import make_loss
        from fedsafe.zo import client_messages, zo_local_steps_many

        loss = make_loss(self.backend.model, self.backend.layout)
        if self.cfg.algorithm == "dsgd":  # FedSGD: K loss differences at shared perturbations
            x, y = self._batch(round_, 0, ids, label_transform)
            msgs, losses = client_messages(loss, params, x, y, self.zo_settings, self.seed, round_)
            return LocalResult(msgs, losses, None)
        res = zo_local_steps_many(
            loss, params, lambda s, active: self._batch(round_, s, ids[active], label_transform),
            clients=ids, steps=self.steps[ids], lr=self.cfg.lr, k=self.zo.k, sigma=self.zo.sigma,
            seed=self.seed, round=round_, scheme=self.zo.scheme, chunk=self.zo.chunk,
            weight_decay=self.cfg.weight_decay, clip=self.zo.clip_inf,
        )
        return LocalResult(res.delta, res.losses, None)

    @property
    def zo_fedsgd(self) -> bool:
        return self.cfg.gradient == "zeroth_order" and self.cfg.algorithm == "dsgd"

    def message_dim(self, dim: int) -> int:
        """Length of one client's message for a ``dim``-parameter model (M scalars for
        zeroth-order FedSGD, else ``dim``)."""
        return self.zo_settings.message_dim if self.zo_fedsgd else dim

    def server_optimizer(self, inner):
        """The server step the decoded direction goes to: ``inner`` itself, except for
        zeroth-order FedSGD with ``momentum`` or ``weight_decay``, whose client momentum and
        weight decay can only act on the decoded direction (:class:`fedsafe.zo.DecodedMomentum`)."""
        if not self.zo_fedsgd or (self.cfg.momentum == 0 and self.cfg.weight_decay == 0):
            return inner
        from fedsafe.zo import DecodedMomentum

        return DecodedMomentum(inner, self.cfg.momentum, self.cfg.weight_decay)

    def close(self) -> None:
        """Release execution resources (a no-op in-process)."""

    def decode(self, aggregate: Tensor, round_: int) -> Tensor:
        """The parameter-space descent direction for the server optimizer.

        dsgd messages are momentum and inherent ones gradient estimates (descent directions
        already); fedavg messages are model deltas, so the direction is their negation (server
        lr 1 = plain FedAvg). Zeroth-order FedSGD messages are K loss differences: the server
        regenerates the round's shared perturbations and decodes ĝ = (1/K) Σ δ_k s_k / σ²,
        then (BAFFLE's guideline) rescales it to ∞-norm ``zo.clip_inf``; its momentum and
        weight decay come after, in :meth:`server_optimizer`.
        """
        if self.cfg.algorithm == "fedavg":
            return -aggregate
        if self.cfg.gradient == "zeroth_order":
            from fedsafe.core.types import RoundContext
            from fedsafe.zo import ZODecoder, clip_inf

            dim = self.backend.layout.dim
            g = ZODecoder(dim, self.zo_settings)(aggregate, RoundContext(round_, self.seed, (), 0)).to(torch.float32)
            return g if self.zo.clip_inf is None else clip_inf(g, self.zo.clip_inf)
        return aggregate

    def _batch(self, round_: int, step: int, ids: np.ndarray, label_transform) -> tuple[Tensor, Tensor]:
        idx = torch.from_numpy(
            draw_batches(self.seed, round_, step, ids, self.data.client_indices, self.cfg.batch_size)
        )
        x = self.data.x_train[idx]
        y = self.data.y_train[idx]
        if label_transform is not None:
            y = label_transform(y, self.data.num_classes)
        return x, y

    def run(
        self,
        round_: int,
        params: Tensor,
        ids: np.ndarray,
        momentum: Tensor | None = None,
        label_transform: Callable[[Tensor, int], Tensor] | None = None,
    ) -> LocalResult:
        cfg = self.cfg
        if cfg.algorithm == "inherent":
            from fedsafe.privacy.inherent.plugin import inherent_updates

            icfg, sigma2 = self.inherent
            updates, norms = inherent_updates(
                self.backend.model, params, self.data, ids, icfg, sigma2, self.seed, round_
            )
            return LocalResult(updates, norms, None)
        if cfg.gradient == "zeroth_order":
            return self._zeroth_order(round_, params, ids, label_transform)
        if cfg.algorithm == "dsgd":
            x, y = self._batch(round_, 0, ids, label_transform)
            g, losses = self.backend.gradients(params, x, y)
            if cfg.weight_decay:
                g = g + cfg.weight_decay * params
            if momentum is None:
                raise ValueError("dsgd needs the clients' momentum rows")
            m = cfg.momentum * momentum + (1 - cfg.momentum) * g
            return LocalResult(m, losses, m)

        steps = self.steps[ids]
        local = params.expand(len(ids), -1).clone()
        losses = params.new_zeros(len(ids))
        for s in range(int(steps.max(initial=0))):
            active = np.flatnonzero(steps > s)
            x, y = self._batch(round_, s, ids[active], label_transform)
            rows = torch.from_numpy(active)
            w = local[rows]
            g, l = self.backend.gradients(params if s == 0 else w, x, y)
            if s == 0:
                losses[rows] = l
            if cfg.weight_decay:
                g = g + cfg.weight_decay * w
            local[rows] = w - cfg.lr * g
        return LocalResult(local - params, losses, None)
