"""Example-level DP at each client: DP-SGD local steps (``dp.unit = "example"``).

Every local step of every honest client is one DP-SGD step (Abadi et al. 2016) on that client's
own records, as Opacus computes it:

    sample a batch of the client's n_i records       Poisson, rate q_i = B/n_i (or B of n_i
                                                     without replacement: ``example_sampling``)
    g_j   = ∇ℓ(w; x_j, y_j)                          per example (never assembled: below)
    ḡ_j   = g_j · min(1, C / (‖g_j‖₂ + 1e-6))        Opacus's clipping factor
    g̃     = (Σ_j ḡ_j + N(0, (zC)² I_d)) / B         divided by the EXPECTED batch size B

How Σ_j ḡ_j and the norms ‖g_j‖ are computed (:func:`per_example_clipped_sums`; the same numbers
up to float rounding either way, tested against each other and against Opacus):

- **hooks** (the default wherever it applies: every parameter an ``nn.Linear`` / ``nn.Conv2d``
  weight or bias, as in all of fedsafe's models but ``lenet`` with GroupNorm): one forward of the
  batch with hooks keeping each layer's input a, one backward of the summed losses to the layer
  outputs (output gradients G, no weight gradient). A linear layer's per-example gradient is the
  outer product G_j a_jᵀ, so its norm is ‖a_j‖·‖G_j‖ ("ghost" norm, never materialised; Li et
  al. 2022, Bu et al. 2023) and the clipped sum one product (c ⊙ G)ᵀ a; a convolution's
  per-example weight gradients (G_j times its unfolded input; 25k numbers per example for
  SABLE's CNN, against its 431k parameters) are materialised and clipped-summed in one
  product. About the cost of the non-private step (``benchmarks/dpsgd.py``).
- **vmap** (any model): per-example gradients by ``vmap(grad_and_value(functional_call))`` in
  chunks of at most 64 MiB, clipped and summed per parameter tensor. The ``auto`` method falls
  back to it for other layers, and for a model whose forward the hook path would misread (a
  layer called twice, a parameter used outside its module, examples that interact): checked once
  per model against this path.

and the client algorithm (``dsgd``: momentum on g̃; ``fedavg``: local SGD on g̃) uses g̃ where it
would use the minibatch gradient. Everything the client sends is post-processing of the g̃, so
each record of client i is protected against everyone who sees its messages — the server
included — whatever robust rule, attack or protocol follows (Byzantine clients are not bound by
DP: they train without it).

Accounting, per client (``ExampleAccounting``): each step is a sampled Gaussian mechanism with
multiplier z on the client's dataset — ``PoissonSampledDpEvent(q_i, GaussianDpEvent(z))``
(add/remove one record) or ``SampledWithoutReplacementDpEvent(n_i, B, GaussianDpEvent(z))``
(replace one record; RDP) — composed over every step of every round the client took part in
(the server sees who takes part, so client sampling amplifies nothing). The clients' ε differ
with their dataset sizes and the rounds they were sampled in; the headline ``epsilon`` is the
worst client's. The events are composed by fedsafe's :class:`~fedsafe.privacy.dp.accounting.
Accountant` (dp-accounting's RDP or PLD).

Randomness: the record sample and the noise of client i at (round, step) come from the
streams ``("dp.example_sample", round, client, step)`` and ``("dp.example_noise", round, client,
step)`` of the run's :class:`~fedsafe.core.randomness.RandomSource` — secret unless the user
opts into seeded randomness (``secure_randomness = false``).
"""

from __future__ import annotations

import math
import statistics
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedsafe.core.plugins import ClientTransform, Observer
from fedsafe.core.randomness import RandomSource, sample_subset
from fedsafe.models.params import ParamLayout

#: Opacus's stabiliser in the clipping factor min(1, C / (‖g‖ + 1e-6)).
CLIP_STABILISER = 1e-6
#: Per-example gradients are computed in vmap calls whose (E, d) output takes at most this.
CHUNK_BYTES = 64 << 20
EXAMPLE_SAMPLINGS = ("poisson", "fixed")

#: A training loss ``criterion(logits[b, C], labels[b]) -> scalar`` (the batch mean); None: cross-entropy.
Criterion = Callable[[Tensor, Tensor], Tensor] | None


def _split_rows(layout: ParamLayout, rows: Tensor) -> dict[str, Tensor]:
    """``{name: (E, *shape)}`` views of the (E, d) flat models ``rows`` (outside any transform:
    a gradient taken with respect to these pieces never runs ``split``'s backward)."""
    e = rows.shape[0]
    return {n: part.view(e, *shape) for n, part, shape in zip(layout.names, torch.split(rows, layout.numel, dim=1),
                                                            layout.shapes)}


def _piece_grads(model: nn.Module, layout: ParamLayout, criterion: Criterion, params: Tensor, x: Tensor, y: Tensor,
                 owner: Tensor | None) -> tuple[dict[str, Tensor], Tensor]:
    """One ``vmap(grad_and_value)`` call over the examples: ``({name: (E, *shape)}, losses[E])``.
    The gradient is taken with respect to the model's parameter tensors (not the flat vector:
    differentiating through the flat vector's ``split`` costs 3.5x on SABLE's MLP)."""
    crit = F.cross_entropy if criterion is None else criterion

    def one(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return crit(functional_call(model, p, (xb.unsqueeze(0),)), yb.unsqueeze(0))

    if params.ndim == 1:
        return vmap(grad_and_value(one), in_dims=(None, 0, 0))(layout.unflatten(params), x, y)
    return vmap(grad_and_value(one), in_dims=(0, 0, 0))(_split_rows(layout, params.index_select(0, owner)), x, y)


def _chunks(e: int, d: int, itemsize: int, chunk_bytes: int):
    step = max(1, chunk_bytes // (d * itemsize))
    for a in range(0, e, step):
        yield a, min(e, a + step)


def _check(params: Tensor, x: Tensor, y: Tensor, owner: Tensor | None) -> None:
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"x and y disagree on the number of examples: {x.shape[0]} vs {y.shape[0]}")
    if params.ndim == 2 and (owner is None or owner.shape[0] != x.shape[0]):
        raise ValueError("per-model params (n, d) need owner, one row index per example")


def per_example_gradients(
    model: nn.Module, layout: ParamLayout, params: Tensor, x: Tensor, y: Tensor, *, owner: Tensor | None = None,
    criterion: Criterion = None, chunk_bytes: int = CHUNK_BYTES,
) -> tuple[Tensor, Tensor]:
    """Per-example gradients and losses, ``(E, d)`` (flat layout) and ``(E,)``, in
    ``vmap(grad_and_value(functional_call))`` calls of at most ``chunk_bytes`` of gradients.

    ``params`` is one flat model ``(d,)`` shared by every example, or ``(n, d)`` models with
    ``owner[e]`` the row example ``e`` is evaluated at (a client's diverged local model). Each
    example is fed as a batch of one, so the loss is that example's loss."""
    _check(params, x, y, owner)
    e, d = x.shape[0], layout.dim
    grads, losses = params.new_empty((e, d)), params.new_empty((e,))
    for a, b in _chunks(e, d, params.element_size(), chunk_bytes):
        g, losses[a:b] = _piece_grads(model, layout, criterion, params, x[a:b], y[a:b],
                                      None if owner is None else owner[a:b])
        torch.cat([g[name].reshape(b - a, -1) for name in layout.names], dim=1, out=grads[a:b])
    return grads, losses


def clip_factors(norms: Tensor, clip: float) -> Tensor:
    """Opacus's per-example clipping factors ``min(1, C / (‖g‖ + 1e-6))``."""
    return (clip / (norms + CLIP_STABILISER)).clamp(max=1.0)


def _factor_matrix(owner: Tensor, n: int, factors: Tensor) -> Tensor:
    """The (n, E) matrix with ``factors[e]`` at (owner[e], e): its product with per-example
    gradients is each client's sum of clipped gradients."""
    e = owner.shape[0]
    w = factors.new_zeros((n, e))
    w[owner, torch.arange(e, device=owner.device)] = factors
    return w


def clipped_sums(grads: Tensor, owner: Tensor, n: int, clip: float) -> tuple[Tensor, Tensor]:
    """``(sums[n, d], norms[E])``: each client's sum of its examples' clipped gradients (row
    ``owner[e]`` gets example e) and the norms before clipping, from flat per-example gradients
    (not modified): the norms, then one product with the (n, E) matrix of clipping factors."""
    norms = torch.linalg.vector_norm(grads, dim=1)
    return _factor_matrix(owner, n, clip_factors(norms, clip)) @ grads, norms


def per_example_clipped_sums(
    model: nn.Module, layout: ParamLayout, params: Tensor, x: Tensor, y: Tensor, owner: Tensor, n: int, clip: float,
    *, criterion: Criterion = None, chunk_bytes: int = CHUNK_BYTES, method: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """``(sums[n, d], norms[E], losses[E])``: :func:`clipped_sums` of
    :func:`per_example_gradients` — each client's sum of its examples' clipped gradients, the
    norms before clipping and the per-example losses — without assembling the flat (E, d)
    matrix. ``params``: ``(d,)`` shared, or ``(n, d)`` rows indexed by ``owner``.

    ``method``:

    - ``"hooks"`` (:func:`hook_clipped_sums`): from each layer's inputs and output gradients,
      one forward and one backward of the batch (ghost norms for linear layers; Li et al. 2022,
      Bu et al. 2023) — about the cost of the non-private step. Only for models whose
      parameters all belong to ``nn.Linear`` / ``nn.Conv2d`` modules (:func:`hook_layers`).
    - ``"vmap"``: per-example gradients in ``vmap(grad_and_value)`` calls of at most
      ``chunk_bytes``, clipped and summed per parameter tensor as Opacus does (the norm of the
      per-tensor norms; each tensor's clipped sum one matrix product). Any model.
    - ``"auto"`` (the default): ``"hooks"`` where :func:`hook_layers` covers the model and a
      once-per-model check agrees with ``"vmap"`` (:func:`_hooks_agree`: no layer called twice,
      no parameter used outside its module, no example mixing with another in the forward),
      else ``"vmap"``."""
    if method not in ("auto", "hooks", "vmap"):
        raise ValueError(f"method must be auto, hooks or vmap, got {method!r}")
    _check(params, x, y, owner)
    if method != "vmap":
        layers = hook_layers(model, layout)
        if layers is None and method == "hooks":
            raise ValueError(f"the hook path covers only nn.Linear / nn.Conv2d parameters; {type(model).__name__} "
                             "has others: use method 'vmap'")
        if layers is not None and (method == "hooks" or _hooks_agree(model, layout, layers, params, x, y, owner, n,
                                                                      clip, criterion)):
            try:
                return hook_clipped_sums(model, layout, layers, params, x, y, owner, n, clip, criterion=criterion,
                                         chunk_bytes=chunk_bytes)
            except _NotCovered as e:
                if method == "hooks":
                    raise ValueError(f"the hook path cannot follow this model's forward: {e}; use method 'vmap'") from None
                _HOOK_CHECKED[model] = False  # e.g. a layer skipped on some inputs: vmap from now on
    return _vmap_clipped_sums(model, layout, params, x, y, owner, n, clip, criterion=criterion,
                              chunk_bytes=chunk_bytes)


def _vmap_clipped_sums(
    model: nn.Module, layout: ParamLayout, params: Tensor, x: Tensor, y: Tensor, owner: Tensor, n: int, clip: float,
    *, criterion: Criterion, chunk_bytes: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`per_example_clipped_sums`'s ``"vmap"`` method."""
    e, d = x.shape[0], layout.dim
    sums = params.new_zeros((n, d))
    norms, losses = params.new_empty((e,)), params.new_empty((e,))
    pieces = dict(zip(layout.names, torch.split(sums, layout.numel, dim=1)))
    for a, b in _chunks(e, d, params.element_size(), chunk_bytes):
        g, losses[a:b] = _piece_grads(model, layout, criterion, params, x[a:b], y[a:b],
                                      None if params.ndim == 1 else owner[a:b])
        flat = {name: g[name].reshape(b - a, -1) for name in layout.names}
        norms[a:b] = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(v, dim=1) for v in flat.values()], dim=1), dim=1)
        w = _factor_matrix(owner[a:b], n, clip_factors(norms[a:b], clip))
        for name, v in flat.items():
            pieces[name].addmm_(w, v)
    return sums, norms, losses


# --------------------------------------------------------------------------- the hook path


class _NotCovered(Exception):
    """The forward did something the hook path cannot account for (a layer called twice or
    not at all)."""


@dataclass(frozen=True)
class HookLayer:
    """One module of the hook path and the layout names of its weight and bias (None: none)."""

    module: nn.Module
    weight: str
    bias: str | None


def hook_layers(model: nn.Module, layout: ParamLayout) -> tuple[HookLayer, ...] | None:
    """The modules the hook path computes per-example gradients of, or None when it cannot
    cover the model: every parameter must be the ``weight`` / ``bias`` of an ``nn.Linear`` or
    an ``nn.Conv2d`` (``groups = 1``, zero padding given as numbers) — exactly those types, a
    subclass may change ``forward`` — and the layout must name exactly those parameters (a
    tied weight, listed once, is refused). Anything else (GroupNorm, embeddings, custom layers)
    goes to the ``vmap`` path, which differentiates any model. Cached per (model, layout)."""
    cached = _HOOK_LAYERS.get(model)
    if cached is not None and cached[0] == layout:
        return cached[1]
    layers = _find_hook_layers(model, layout)
    _HOOK_LAYERS[model] = (layout, layers)
    return layers


def _find_hook_layers(model: nn.Module, layout: ParamLayout) -> tuple[HookLayer, ...] | None:
    out, names = [], set()
    for prefix, m in model.named_modules():
        own = dict(m.named_parameters(recurse=False))
        if not own:
            continue
        if type(m) not in (nn.Linear, nn.Conv2d) or set(own) - {"weight", "bias"} or "weight" not in own:
            return None
        if type(m) is nn.Conv2d and (m.groups != 1 or m.padding_mode != "zeros" or isinstance(m.padding, str)):
            return None
        full = {k: f"{prefix}.{k}" if prefix else k for k in own}
        names.update(full.values())
        out.append(HookLayer(m, full["weight"], full.get("bias")))
    if not out or names != set(layout.names) or len(names) != len(layout.names):
        return None
    return tuple(out)


def _example_losses(logits: Tensor, y: Tensor, criterion: Criterion) -> Tensor:
    """Each example's loss ``criterion(logits[e:e+1], y[e:e+1])`` (what the vmap path takes)."""
    if criterion is None:
        return F.cross_entropy(logits, y, reduction="none")
    return vmap(lambda lo, t: criterion(lo.unsqueeze(0), t.unsqueeze(0)))(logits, y)


def _layer_pieces(layer: HookLayer, a: Tensor, g: Tensor) -> tuple[str, Tensor, Tensor, Tensor]:
    """``(kind, A, G, sq)`` of one layer on a chunk of E examples, from its input ``a`` and the
    gradient ``g`` of the examples' summed losses with respect to its output (row e: example
    e's own gradient, the examples being independent): ``sq[E]`` the squared norm of each
    example's weight-and-bias gradient, and what :func:`_add_clipped` needs:

    - ``"outer"`` (a linear layer on ``(E, in)``): ``A = a``, ``G = g``; example e's weight
      gradient is the outer product ``G[e] A[e]ᵀ``, so its squared norm is ``‖A[e]‖²‖G[e]‖²``
      (never materialised) and a weighted sum is the one product ``(c ⊙ G)ᵀ A``;
    - ``"each"`` (a convolution, or a linear layer on ``(E, ..., in)``): the per-example weight
      gradients ``A[E, out, p]`` (``G[e] U[e]ᵀ`` with U the unfolded input: the layer's own
      weight gradient, a few numbers per example for these layers), ``G[E, out]`` the bias
      gradients."""
    e = a.shape[0]
    m = layer.module
    if type(m) is nn.Linear and a.ndim == 2:
        ga = torch.linalg.vector_norm(g, dim=1).square_()
        sq = torch.linalg.vector_norm(a, dim=1).square_().mul_(ga)
        if layer.bias is not None:
            sq.add_(ga)
        return "outer", a, g, sq
    if type(m) is nn.Linear:
        gs = g.reshape(e, -1, g.shape[-1])
        pe = torch.bmm(gs.transpose(1, 2), a.reshape(e, -1, a.shape[-1]))
    else:
        u = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)  # (E, p, L)
        gs = g.reshape(e, g.shape[1], -1)  # (E, out, L)
        pe = torch.bmm(gs, u.transpose(1, 2))
        gs = gs.transpose(1, 2)
    gb = gs.sum(dim=1)
    sq = torch.linalg.vector_norm(pe.flatten(1), dim=1).square_()
    if layer.bias is not None:
        sq.add_(torch.linalg.vector_norm(gb, dim=1).square_())
    return "each", pe.flatten(1), gb, sq


def _hook_chunk(model: nn.Module, layers: tuple[HookLayer, ...], named: dict[str, Tensor], x: Tensor, y: Tensor,
                criterion: Criterion) -> tuple[list[tuple[str, Tensor, Tensor, Tensor]], Tensor]:
    """One forward and one backward of a chunk: each layer's :func:`_layer_pieces` and the
    examples' losses. The parameters do not require gradients, so the backward computes only
    the layer outputs' gradients (no weight gradient): each layer's output continues as
    ``output + probe`` with a zero ``probe`` that requires a gradient, whose gradient is the
    output's — also when the forward then modifies it in place (``ReLU(inplace=True)``)."""
    seen: dict[nn.Module, tuple[Tensor, Tensor]] = {}

    def record(mod: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> Tensor:
        if mod in seen:
            raise _NotCovered(f"{type(mod).__name__} called twice in one forward")
        probe = torch.zeros_like(out, requires_grad=True)
        seen[mod] = (args[0].detach(), probe)
        return out + probe

    handles = [layer.module.register_forward_hook(record) for layer in layers]
    try:
        with torch.enable_grad():
            logits = functional_call(model, named, (x,))
            losses = _example_losses(logits, y, criterion)
            if len(seen) != len(layers):
                raise _NotCovered("a layer was not called in the forward")
            outs = [seen[layer.module][1] for layer in layers]
            grads = torch.autograd.grad(losses.sum(), outs, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    pieces = [_layer_pieces(layer, seen[layer.module][0], torch.zeros_like(o) if gr is None else gr)
              for layer, o, gr in zip(layers, outs, grads)]
    return pieces, losses.detach()


def _add_clipped(pieces: dict[str, Tensor], layer: HookLayer, kind: str, a: Tensor, g: Tensor, c: Tensor,
                 groups: list[tuple[int, int, int]]) -> None:
    """Add each group's (client row k, examples [lo, hi) of the chunk) clipped sum of one
    layer's gradients, the examples weighted by their clipping factors ``c``."""
    w, b = pieces[layer.weight], None if layer.bias is None else pieces[layer.bias]
    for k, lo, hi in groups:
        ck = c[lo:hi]
        if kind == "outer":
            w[k].view(g.shape[1], a.shape[1]).addmm_((g[lo:hi] * ck[:, None]).T, a[lo:hi])
        else:
            w[k].addmv_(a[lo:hi].T, ck)
        if b is not None:
            b[k].addmv_(g[lo:hi].T, ck)


def hook_clipped_sums(
    model: nn.Module, layout: ParamLayout, layers: tuple[HookLayer, ...], params: Tensor, x: Tensor, y: Tensor,
    owner: Tensor, n: int, clip: float, *, criterion: Criterion = None, chunk_bytes: int = CHUNK_BYTES,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`per_example_clipped_sums` from the layers' inputs and output gradients (``layers``
    from :func:`hook_layers`): the batch's forward, with hooks keeping each layer's input, and
    one backward of the summed per-example losses to the layer outputs give every example's
    gradient norm (:func:`_layer_pieces`: ghost norms for linear layers, the small per-example
    weight gradient of a convolution); the clipping factors follow, and each client's clipped
    sum is one product per layer (:func:`_add_clipped`) — no second backward, no (E, d)
    matrix. The examples must not interact in the forward (no batch statistics): then row e of
    the summed losses' output gradient is example e's own. Chunks keep the saved activations
    near ``chunk_bytes``. ``params`` ``(n, d)`` (each client's own model): one forward per
    client. The hooks are registered on ``model`` for the duration of the call (and removed
    after it): not for a model another thread runs at the same time."""
    e, d = x.shape[0], layout.dim
    sums = params.new_zeros((n, d))
    norms, losses = params.new_zeros((e,)), params.new_zeros((e,))
    if e == 0:
        return sums, norms, losses
    pieces = dict(zip(layout.names, torch.split(sums, layout.numel, dim=1)))
    order = None
    if e > 1 and bool((owner[1:] < owner[:-1]).any()):  # group each client's examples together
        order = torch.argsort(owner, stable=True)
        x, y, owner = x.index_select(0, order), y.index_select(0, order), owner.index_select(0, order)
    keys, counts = torch.unique_consecutive(owner, return_counts=True)
    ends = counts.cumsum(0).tolist()
    runs = [(int(k), hi - int(c), hi) for k, c, hi in zip(keys.tolist(), counts.tolist(), ends)]
    shared = params.ndim == 1
    spans = [(None, 0, e)] if shared else [(k, lo, hi) for k, lo, hi in runs]
    named = layout.unflatten(params.detach()) if shared else None
    step = _HOOK_FIRST_CHUNK
    for k, lo, hi in spans:
        if not shared:
            named = layout.unflatten(params[k].detach())
        a = lo
        while a < hi:
            b = min(hi, a + step)
            layer_pieces, losses[a:b] = _hook_chunk(model, layers, named, x[a:b], y[a:b], criterion)
            sq = torch.stack([p[3] for p in layer_pieces]).sum(dim=0)
            norms[a:b] = sq.sqrt()
            c = clip_factors(norms[a:b], clip)
            groups = [(kk, max(lo2, a) - a, min(hi2, b) - a) for kk, lo2, hi2 in runs if lo2 < b and hi2 > a]
            for layer, (kind, pa, pg, _) in zip(layers, layer_pieces):
                _add_clipped(pieces, layer, kind, pa, pg, c, groups)
            held = sum(p[1].numel() + p[2].numel() for p in layer_pieces) * params.element_size()
            step = max(1, int(chunk_bytes * (b - a) // max(held, 1)))
            a = b
    if order is not None:
        norms = torch.empty_like(norms).index_copy_(0, order, norms)
        losses = torch.empty_like(losses).index_copy_(0, order, losses)
    return sums, norms, losses


#: :func:`hook_layers` of the models seen: ``model -> (layout, layers or None)``.
_HOOK_LAYERS: weakref.WeakKeyDictionary[nn.Module, tuple[ParamLayout, tuple[HookLayer, ...] | None]] = (
    weakref.WeakKeyDictionary())
#: Examples in the hook path's first chunk (later chunks are sized from what it held).
_HOOK_FIRST_CHUNK = 256
#: Models the ``auto`` method has checked (:func:`_hooks_agree`), and the verdict.
_HOOK_CHECKED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
#: Examples the check compares on, and its tolerance (float32 rounding is ~1e-6 relative).
_CHECK_EXAMPLES, _CHECK_RTOL = 8, 1e-3


def _hooks_agree(model: nn.Module, layout: ParamLayout, layers: tuple[HookLayer, ...], params: Tensor, x: Tensor,
                 y: Tensor, owner: Tensor, n: int, clip: float, criterion: Criterion) -> bool:
    """Whether the hook path may stand in for the vmap path on ``model``: decided once per model
    (on its first batch of at least two examples) by computing both on up to 8 of the examples
    and comparing norms, losses and clipped sums (to 1e-3 relative). It catches what
    :func:`hook_layers` cannot see from the module tree — a parameter also used outside its
    module, a module called twice, examples that interact in the forward (a batch mean), which
    would make row e of the output gradients depend on other examples. Not a proof for every
    input; ``method = "vmap"`` is exact for any model."""
    verdict = _HOOK_CHECKED.get(model)
    if verdict is not None:
        return verdict
    k = min(x.shape[0], _CHECK_EXAMPLES)
    if k < 2:
        return True  # one example cannot interact with another; decide on a larger batch
    xs, ys, os = x[:k], y[:k], owner[:k]
    try:
        got = hook_clipped_sums(model, layout, layers, params, xs, ys, os, n, clip, criterion=criterion)
    except (_NotCovered, RuntimeError):  # e.g. a forward the hooks cannot follow: the vmap path decides
        _HOOK_CHECKED[model] = False
        return False
    ref = _vmap_clipped_sums(model, layout, params, xs, ys, os, n, clip, criterion=criterion, chunk_bytes=CHUNK_BYTES)
    ok = all(
        bool(torch.allclose(a, b, rtol=_CHECK_RTOL, atol=_CHECK_RTOL * float(b.abs().max().clamp(min=1e-12))))
        for a, b in zip(got, ref)
    )
    _HOOK_CHECKED[model] = ok
    return ok


@dataclass(frozen=True)
class DPSGDSettings:
    """The numbers of one DP-SGD step: per-example ``clip`` C, noise multiplier ``z`` (noise
    std / C on the sum), the expected batch size ``batch_size`` B (the divisor) and how the
    records are sampled (``poisson``: each record with probability min(1, B/n_i); ``fixed``:
    B of the n_i without replacement)."""

    clip: float
    z: float
    batch_size: int
    sampling: str = "poisson"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"dp.clip must be a finite number > 0, got {self.clip}")
        if not (math.isfinite(self.z) and self.z >= 0):
            raise ValueError(f"dp.noise_multiplier must be a finite number >= 0, got {self.z}")
        if self.batch_size < 1:
            raise ValueError(f"clients.batch_size must be >= 1, got {self.batch_size}")
        if self.sampling not in EXAMPLE_SAMPLINGS:
            raise ValueError(f"dp.example_sampling must be one of {', '.join(EXAMPLE_SAMPLINGS)}, got {self.sampling!r}")

    def rate(self, records: int) -> float:
        """q_i = min(1, B/n_i): a record's chance of being in a Poisson batch."""
        return min(1.0, self.batch_size / records) if records > 0 else 0.0


class DPSGDClients:
    """The honest clients' private gradient oracle, which the DP plugin hands the client work
    (``ClientWork.use_private_gradients``): ``oracle(work, round, step, params, ids)`` returns
    each client's DP-SGD gradient g̃ ``(n, d)`` and its mean loss over the sampled records (for
    an empty Poisson batch, which has none, the mean over every client's sampled records of the
    step, so the row's ``train_loss`` stays a mean of losses; NaN when no client sampled any) — where a non-private client computes the
    gradient of its seeded minibatch. It counts every step each client took (``steps``): what
    the accountant composes."""

    def __init__(self, settings: DPSGDSettings, source: RandomSource, client_sizes: Sequence[int], *,
                 method: str = "auto") -> None:
        self.settings = settings
        self.method = method  # per_example_clipped_sums's: auto | hooks | vmap
        self.source = source
        self.sizes = np.asarray(client_sizes, dtype=np.int64)
        self.steps = np.zeros(len(self.sizes), dtype=np.int64)
        self._clipped = [0, 0]  # clipped examples, examples, since the plugin last read them
        if settings.sampling == "fixed":
            small = np.flatnonzero(self.sizes < settings.batch_size)
            if small.size:
                raise ValueError(
                    f"dp.example_sampling = 'fixed' samples clients.batch_size = {settings.batch_size} records "
                    f"without replacement, but {small.size} client(s) hold fewer (smallest: {int(self.sizes.min())}); "
                    "lower clients.batch_size or use dp.example_sampling = 'poisson'"
                )

    def sample(self, round_: int, step: int, cid: int) -> np.ndarray:
        """Positions (into the client's own records) of client ``cid``'s batch at (round, step)."""
        n = int(self.sizes[cid])
        stream = self.source.stream("dp.example_sample", round_, cid, step)
        if self.settings.sampling == "fixed":
            return sample_subset(stream, n, self.settings.batch_size)
        return np.flatnonzero(stream.uniform(n) < self.settings.rate(n))

    def noise(self, round_: int, step: int, cid: int, dim: int, dtype: torch.dtype) -> Tensor:
        """N(0, (zC)² I_d) of client ``cid`` at (round, step), from its own stream."""
        s = self.settings
        return self.source.stream("dp.example_noise", round_, cid, step).normal(dim, dtype) * (s.z * s.clip)

    def __call__(self, work: Any, round_: int, step: int, params: Tensor, ids: np.ndarray) -> tuple[Tensor, Tensor]:
        s, data = self.settings, work.data
        ids = np.asarray(ids, dtype=np.int64)
        n, d = len(ids), params.shape[-1]
        rows = [np.asarray(data.client_indices[c], dtype=np.int64)[self.sample(round_, step, int(c))] for c in ids]
        counts = np.array([len(r) for r in rows], dtype=np.int64)
        flat = torch.from_numpy(np.concatenate(rows) if n else np.zeros(0, np.int64))
        owner = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), counts))
        x = data.x_train.index_select(0, flat)
        y = data.y_train.index_select(0, flat)
        be = work.backend
        sums, norms, losses = per_example_clipped_sums(be.model, be.layout, params, x, y, owner, n, s.clip,
                                                       criterion=be.loss_fn, method=self.method)
        self._clipped[0] += int((norms + CLIP_STABILISER > s.clip).sum())
        self._clipped[1] += int(norms.numel())
        if s.z > 0:
            for i, c in enumerate(ids):
                sums[i].add_(self.noise(round_, step, int(c), d, sums.dtype).to(sums.device))
        sums.div_(s.batch_size)
        loss_sum = params.new_zeros((n,)).index_add_(0, owner, losses.detach())
        mean_loss = loss_sum / torch.from_numpy(counts).to(loss_sum.dtype)
        empty = torch.from_numpy(counts == 0)
        if bool(empty.any()) and losses.numel():  # no record, no loss: the step's mean over all sampled
            mean_loss[empty] = losses.detach().mean()
        self.steps[ids] += 1
        return sums, mean_loss

    def take_clipped_fraction(self) -> float | None:
        """The fraction of sampled examples clipped since the last call (None: none sampled)."""
        clipped, total = self._clipped
        self._clipped = [0, 0]
        return clipped / total if total else None


class ExampleAccounting:
    """Per-client ε of example-level DP: client i's steps composed as its sampled Gaussian events
    by fedsafe's :class:`~fedsafe.privacy.dp.accounting.Accountant` (one per distinct
    (n_i, steps), cached: clients of equal size and participation share one)."""

    def __init__(self, settings: DPSGDSettings, client_sizes: Sequence[int], *, delta: float, accountant: str) -> None:
        from fedsafe.privacy.dp import accounting

        self.settings = settings
        self.sizes = np.asarray(client_sizes, dtype=np.int64)
        self.delta = float(delta)
        self.accountant = accountant
        self.neighboring = accounting.natural_neighboring(self.sampling_for(int(self.sizes.max(initial=1))))
        self._cache: dict[tuple[int, int], float] = {}

    def sampling_for(self, records: int) -> str:
        """The accounting sampling of one step on ``records`` records."""
        if self.settings.sampling == "fixed":
            return "fixed"
        return "none" if self.settings.rate(records) >= 1.0 else "poisson"

    def new_accountant(self) -> Any:
        from fedsafe.privacy.dp import accounting

        return accounting.Accountant(self.delta, self.accountant, self.neighboring)

    def compose(self, acc: Any, records: int, steps: int) -> Any:
        """Compose ``steps`` DP-SGD steps on a client of ``records`` records into ``acc``."""
        s = self.settings
        sampling = self.sampling_for(records)
        if sampling == "fixed":
            return acc.compose_round(s.z, None, "fixed", num_clients=records, sample_size=s.batch_size, count=steps)
        q = s.rate(records) if sampling == "poisson" else None
        return acc.compose_round(s.z, q, sampling, count=steps)

    def check(self) -> None:
        """Raise ValueError if the accountant cannot account these clients' steps."""
        from fedsafe.privacy.dp import accounting

        acc = self.new_accountant()
        for records in sorted(set(int(v) for v in self.sizes)):
            sampling = self.sampling_for(records)
            fixed = sampling == "fixed"
            rec = accounting.make_round_record(
                max(self.settings.z, 1e-9), self.settings.rate(records) if sampling == "poisson" else None, sampling,
                records if fixed else None, self.settings.batch_size if fixed else None,
            )
            acc.check_supported(rec)

    def client_epsilon(self, records: int, steps: int) -> float:
        """ε at δ of a client of ``records`` records after ``steps`` DP-SGD steps."""
        if steps <= 0:
            return 0.0
        key = (int(records), int(steps))
        if key not in self._cache:
            self._cache[key] = float(self.compose(self.new_accountant(), records, steps).epsilon())
        return self._cache[key]

    def epsilons(self, steps: np.ndarray) -> dict[int, float]:
        """{client id: ε} for every client that has taken at least one step."""
        return {int(c): self.client_epsilon(int(self.sizes[c]), int(steps[c])) for c in np.flatnonzero(steps > 0)}

    def report(self, steps: np.ndarray) -> dict[str, float]:
        """The metrics row's figures: ``epsilon`` (the worst client's, the headline),
        ``epsilon_min`` / ``epsilon_median`` / ``epsilon_max`` over the clients that took a step,
        ``epsilon_worst_client`` (its id, lowest on ties) and ``private_clients`` (how many)."""
        eps = self.epsilons(steps)
        if not eps:
            return {"epsilon": 0.0, "epsilon_min": 0.0, "epsilon_median": 0.0, "epsilon_max": 0.0, "private_clients": 0}
        values = list(eps.values())
        worst = max(eps, key=lambda c: (eps[c], -c))
        return {
            "epsilon": eps[worst],
            "epsilon_min": min(values),
            "epsilon_median": float(statistics.median(values)),
            "epsilon_max": eps[worst],
            "epsilon_worst_client": worst,
            "private_clients": len(values),
        }


def planned_steps(algorithm: str, client_sizes: Sequence[int], batch_size: int, local_steps: int | None,
                  local_epochs: int | None) -> np.ndarray:
    """The local steps each client takes per round (as ``ClientWork.steps``: fedavg's
    ``local_steps``, or ``E·⌈n_i/B⌉`` for ``local_epochs = E``; one for dsgd)."""
    sizes = np.asarray(client_sizes, dtype=np.int64)
    if algorithm != "fedavg":
        return np.ones(len(sizes), dtype=np.int64)
    if local_steps is not None:
        return np.full(len(sizes), int(local_steps), dtype=np.int64)
    return (local_epochs or 1) * -(-sizes // batch_size)


def calibrate_example_noise(
    target: float, settings: DPSGDSettings, client_sizes: Sequence[int], steps_per_round: np.ndarray, rounds: int,
    *, delta: float, accountant: str,
) -> float:
    """The smallest z whose worst client's ε after ``rounds`` rounds, taking part in every one,
    is at most ``target``. Calibrated for the largest sampling rate and the most steps (an upper
    bound on every client's: ε grows with both), with ``accounting.calibrate_noise``."""
    from fedsafe.privacy.dp import accounting

    sizes = np.asarray(client_sizes, dtype=np.int64)
    acc = ExampleAccounting(settings, sizes, delta=delta, accountant=accountant)
    small = int(sizes.min())
    sampling = acc.sampling_for(small)
    total = int(np.max(steps_per_round)) * int(rounds)
    fixed = sampling == "fixed"
    return accounting.calibrate_noise(
        target, settings.rate(small) if sampling == "poisson" else None, total, delta, sampling, accountant,
        small if fixed else None, sample_size=settings.batch_size if fixed else None, neighboring=acc.neighboring,
    )


class ExampleDPPlugin(ClientTransform, Observer):
    """The ``[dp]`` round plugin with ``unit = "example"``: hands the client work the DP-SGD
    oracle (``configure_clients``), leaves the messages as the clients made them (they are
    already private: no client-level clipping, no server noise) and accounts each client's steps
    (``on_round_end``: the worst client's ε and the distribution into the row; the step counts
    into the checkpoint, so a resumed run reports the same ε)."""

    name = "dp"

    def __init__(self, settings: DPSGDSettings, source: RandomSource, client_sizes: Sequence[int], *,
                 delta: float, accountant: str) -> None:
        self.settings = settings
        self.source = source
        self.oracle = DPSGDClients(settings, source, client_sizes)
        self.accounting = ExampleAccounting(settings, client_sizes, delta=delta, accountant=accountant)
        self.accounting.check()
        self._configured = False  # whether a client work took the oracle (configure_clients)
        self._remote_steps: np.ndarray | None = None  # remote clients: each one's local steps a round

    def _require_clients(self) -> None:
        """A round whose clients never took the DP-SGD oracle would release non-private updates
        (a Flower strategy, which has no in-process client work): refuse it."""
        if not self._configured:
            from fedsafe.core.errors import ConfigError

            raise ConfigError([
                "dp.unit = 'example' needs the in-process client work to run DP-SGD (the engine's "
                "Federation); Flower clients do not run it: use dp.unit = 'client'"
            ])

    # -- client side
    def message_dim(self, dim: int) -> int:
        return dim

    def configure_clients(self, work: Any) -> None:
        """Hand ``work`` the DP-SGD oracle. Remote clients (fedsafe's Flower ClientApp, whose
        nodes configure their own client work with this plugin) run DP-SGD themselves: the
        server then counts each honest client's local steps in the rounds it replied to, the
        steps the run's schedule fixes (``work.steps``: a dsgd client takes 1, fedavg its
        ``local_steps`` or epochs of batches), and the clients report nothing about their data."""
        from fedsafe.core.errors import ConfigError

        if getattr(work, "remote_clients", False):
            steps = getattr(work, "steps", None)
            if steps is None or len(steps) != len(self.oracle.steps):
                raise ConfigError([
                    f"dp.unit = 'example': these remote clients ({type(work).__name__}) do not say how many "
                    "local steps each takes, which the accountant needs"
                ])
            self._remote_steps = np.asarray(steps, dtype=np.int64).copy()
            self._configured = True
            return
        use = getattr(work, "use_private_gradients", None)
        if use is None:
            raise ConfigError([
                "dp.unit = 'example' runs DP-SGD inside the client work; these clients "
                f"({type(work).__name__}) cannot run it: use execution = 'auto', 'serial' or 'vectorized'"
            ])
        use(self.oracle)
        self._configured = True

    def transform_honest(self, updates: Tensor, ctx: Any, ids: np.ndarray) -> Tensor:
        self._require_clients()
        return updates  # each step was already private: what the client sends is post-processing

    def observe_honest(self, ctx: Any, ids: np.ndarray, reports: list[dict[str, float]]) -> None:
        self._require_clients()
        if self._remote_steps is not None:  # the honest clients that replied ran their steps on their nodes
            ids = np.asarray(ids, dtype=np.int64)
            self.oracle.steps[ids] += self._remote_steps[ids]

    # -- observer
    def on_round_end(self, fed: Any, row: dict[str, Any]) -> dict[str, Any]:
        self._require_clients()
        s = self.settings
        out: dict[str, Any] = {"delta": self.accounting.delta, "clip": s.clip, "noise_multiplier": s.z}
        t, cfg = row["round"], fed.cfg
        from fedsafe.privacy.dp.accounting import engine_class

        if engine_class(self.accounting.accountant).epsilon_every_round or t % cfg.eval_every == 0 or t >= cfg.rounds:
            out.update(self.accounting.report(self.oracle.steps))
        frac = self.oracle.take_clipped_fraction()
        if frac is not None:
            out["clipped_fraction"] = frac
        return out

    def summary(self, fed: Any) -> dict[str, Any]:
        eps = self.accounting.epsilons(self.oracle.steps)
        report = self.accounting.report(self.oracle.steps)
        return {
            "dp_unit": "example",
            "noise_multiplier": self.settings.z,
            "example_sampling": self.settings.sampling,
            "accountant": self.accounting.accountant,
            "neighboring": self.accounting.neighboring,
            "epsilon_observer": "server",
            **{k: v for k, v in report.items() if k != "epsilon"},
            "epsilon_per_client": {str(c): e for c, e in sorted(eps.items())},
        }

    def state_dict(self) -> dict[str, Any]:
        return {"unit": "example", "steps": [int(v) for v in self.oracle.steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        steps = np.asarray(state.get("steps", ()), dtype=np.int64)
        if state.get("unit") != "example" or steps.shape != self.oracle.steps.shape:
            raise ValueError(
                "dp: the checkpoint's DP state is not example-level DP over this run's clients "
                f"(unit {state.get('unit', 'client')!r}, {steps.size} clients; this run: {self.oracle.steps.size})"
            )
        self.oracle.steps[:] = steps
