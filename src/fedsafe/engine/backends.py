"""Execution backends: where the clients' gradient computations run.

Every client algorithm is written once over batched tensors (``clients.py``); a backend only
supplies the primitive that differs, per-client minibatch gradients::

    gradients(params[n, d] | params[d], x[n, B, ...], y[n, B]) -> (grads[n, d], losses[n])

``serial`` computes one client after another; ``vectorized`` computes all of them in one
batched call (``torch.func.vmap`` over ``grad_and_value`` of a ``functional_call``). Both run the
same per-client function, so results agree to float rounding.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from fedsafe.models import ParamLayout

GradFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
#: A training loss: ``loss(logits[B, C], labels[B]) -> scalar`` (the batch mean).
LossFn = Callable[[Tensor, Tensor], Tensor]


def make_loss(
    model: torch.nn.Module, layout: ParamLayout, loss_fn: LossFn | None = None
) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``loss_fn`` (default: mean cross-entropy) of ``model`` with flat parameters ``flat`` on
    one batch."""
    criterion = F.cross_entropy if loss_fn is None else loss_fn

    def loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, layout.unflatten(flat), (x,))
        return criterion(logits, y)

    return loss


class SerialBackend:
    """One client after another with plain autograd on a private copy of the model whose
    parameters are views of one flat buffer: loading a model is one copy, and each client's
    gradient is written straight into its row of the output."""

    name = "serial"

    def __init__(self, model: torch.nn.Module, layout: ParamLayout, loss_fn: LossFn | None = None) -> None:
        self.model = model
        self.layout = layout
        self.loss_fn = loss_fn
        self._criterion = F.cross_entropy if loss_fn is None else loss_fn
        self._net = copy.deepcopy(model)
        self._flat = torch.cat([p.detach().reshape(-1) for p in self._net.parameters()])
        views = layout.unflatten(self._flat)
        for name, p in list(self._net.named_parameters()):
            module, _, attr = name.rpartition(".")
            owner = self._net.get_submodule(module) if module else self._net
            setattr(owner, attr, torch.nn.Parameter(views[name], requires_grad=True))
        self._params = [p for _, p in self._net.named_parameters()]

    def gradients(self, params: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        n, d = x.shape[0], params.shape[-1]
        grads = params.new_empty((n, d))
        losses = params.new_empty((n,))
        shared = params.ndim == 1
        with torch.no_grad():
            if shared:
                self._flat.copy_(params)
        for i in range(n):
            if not shared:
                with torch.no_grad():
                    self._flat.copy_(params[i])
            for p in self._params:
                p.grad = None
            loss = self._criterion(self._net(x[i]), y[i])
            loss.backward()
            torch.cat([p.grad.reshape(-1) for p in self._params], out=grads[i])
            losses[i] = loss.detach()
        return grads, losses


class VectorizedBackend:
    """Clients in batched ``vmap(grad_and_value)`` calls: all of them in one call while their
    (n, d) gradients take at most ``whole_bytes``, else calls of ``chunk`` clients written into
    one preallocated output (``chunk`` None: always one call)."""

    name = "vectorized"

    def __init__(
        self,
        model: torch.nn.Module,
        layout: ParamLayout,
        chunk: int | None = None,
        whole_bytes: int = 0,
        loss_fn: LossFn | None = None,
    ) -> None:
        self.model = model
        self.layout = layout
        self.chunk = chunk
        self.whole_bytes = whole_bytes
        self.loss_fn = loss_fn
        gv = grad_and_value(make_loss(model, layout, loss_fn))
        self._shared = vmap(gv, in_dims=(None, 0, 0))  # every client starts from the same model
        self._own = vmap(gv, in_dims=(0, 0, 0))  # clients hold diverged local models

    def gradients(self, params: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        n = x.shape[0]
        if n == 0:
            d = params.shape[-1]
            return params.new_zeros((0, d)), params.new_zeros((0,))
        shared = params.ndim == 1
        fn = self._shared if shared else self._own
        if self.chunk is None or n <= self.chunk or n * params.shape[-1] * params.element_size() <= self.whole_bytes:
            return fn(params, x, y)
        grads = params.new_empty((n, params.shape[-1]))
        losses = params.new_empty((n,))
        for a in range(0, n, self.chunk):
            b = min(n, a + self.chunk)
            g, l = fn(params if shared else params[a:b], x[a:b], y[a:b])
            grads[a:b], losses[a:b] = g, l
        return grads, losses


# ``auto``: the clients' gradients, chunk by chunk, should fit in about this many bytes. Measured
# (2 threads, batch 25, clients x parameters gradients in one call, median of 4, load < 1.5;
# benchmarks/engine_vs_reference.py times whole rounds): one vmap over every client is
# fastest while the (n, d) output is small (MLP 64-100-10, 7,510 parameters: 1,000 clients
# 19 ms in one call, 27 ms in chunks of 64, a loop 95 ms); past a few MiB per call it falls
# behind, where cache-sized chunks win (MLP 64-1000-10, 75,010 parameters, 1,000 clients:
# one call 306 ms, chunks of 16-26 clients 193-245 ms, a loop 250 ms; SABLE's CNN, 431,080
# parameters, 100 clients: one call 644 ms, chunks of 4 389 ms, a loop 397 ms).
AUTO_CHUNK_BYTES = 8 << 20
# ... but while the whole (n, d) output is at most this large, one call beats chunks (MLP
# 64-1000-10, 100 clients, 30 MB: one call 11.0 ms, chunks of 64 12.9 ms).
AUTO_WHOLE_BYTES = 64 << 20


def auto_chunk(dim: int, itemsize: int = 4) -> int:
    """Clients per vmap call under ``execution = "auto"``: as many (n, d) gradient rows as fit
    in :data:`AUTO_CHUNK_BYTES`, at least 1."""
    return max(1, AUTO_CHUNK_BYTES // (dim * itemsize))


def describe(backend) -> str:
    """``serial``, ``vectorized`` or ``vectorized(chunk=K)`` (rounds whose gradients exceed
    ``AUTO_WHOLE_BYTES`` run in chunks of K clients): what ran, for the summary."""
    chunk = getattr(backend, "chunk", None)
    return backend.name if chunk is None else f"{backend.name}(chunk={chunk})"


EXECUTIONS = ("auto", "serial", "vectorized")


def make_backend(name: str, model: torch.nn.Module, layout: ParamLayout, loss_fn: LossFn | None = None):
    """The backend ``name``: ``serial`` (a plain autograd loop), ``vectorized`` (one vmap call
    while the round's gradients take at most ``AUTO_WHOLE_BYTES``, else chunks of
    :func:`auto_chunk` clients, so memory stays bounded), or
    ``auto`` (the default): ``vectorized``, except a loop when not even two clients' gradients
    fit in a chunk (a chunk of one is a loop with vmap's overhead). ``loss_fn``: the training
    loss (default: mean cross-entropy)."""
    if name not in EXECUTIONS:
        raise ValueError(f"unknown execution backend {name!r}; valid: {', '.join(EXECUTIONS)}")
    chunk = auto_chunk(layout.dim)
    if name == "serial" or (name == "auto" and chunk < 2):
        return SerialBackend(model, layout, loss_fn)
    return VectorizedBackend(model, layout, chunk=chunk, whole_bytes=AUTO_WHOLE_BYTES, loss_fn=loss_fn)
