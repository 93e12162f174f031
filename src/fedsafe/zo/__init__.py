"""Backpropagation-free clients (Feng et al., "BAFFLE"): K forward passes, K scalars uploaded.

- :mod:`~fedsafe.zo.perturbations`: ``PerturbationSource`` — δ_k = σ z_k regenerated from
  (seed, key, k) in any process; ``num_directions``, ``upload_bytes``.
- :mod:`~fedsafe.zo.estimator`: ``loss_differences`` (batched with ``vmap`` over perturbed
  models, memory bounded by ``chunk``), ``loss_differences_many`` (n clients at once),
  ``reconstruct`` (streaming server decode), ``estimate_gradient``, ``expected_cosine``.
- :mod:`~fedsafe.zo.fedsgd`: ``ZOSettings``, ``client_messages``, ``ZODecoder`` (message = M
  scalars; the server decodes the aggregate), ``DecodedMomentum`` (client momentum and weight
  decay, on the decoded direction).
- :mod:`~fedsafe.zo.local`: ``zo_local_steps[_many]`` (FedAvg mode, message = model delta).
- BAFFLE's training guidelines: ``Adam`` (server optimizer), ``clip_inf``, ``EMA`` (evaluate
  the moving average of the global model). Hardswish and GroupNorm are model options
  (``ModelConfig(name="lenet", activation="hardswish", norm="group")``).

K counts perturbed forward passes per client per round: the forward (twice-FD) scheme uses K
directions and uploads K scalars; the central scheme uses K/2 ± pairs and uploads K/2.
"""

from fedsafe.zo.adam import Adam, AdamState
from fedsafe.zo.clip import clip_inf
from fedsafe.zo.ema import EMA
from fedsafe.zo.estimator import (
    decode_scale,
    estimate_gradient,
    expected_cosine,
    loss_differences,
    loss_differences_many,
    loss_differences_reference,
    reconstruct,
)
from fedsafe.zo.fedsgd import DecodedMomentum, ZODecoder, ZOSettings, client_messages
from fedsafe.zo.local import LocalZOResult, zo_local_steps, zo_local_steps_many
from fedsafe.zo.perturbations import SCHEMES, PerturbationSource, num_directions, upload_bytes

__all__ = [
    "SCHEMES",
    "EMA",
    "Adam",
    "AdamState",
    "DecodedMomentum",
    "LocalZOResult",
    "PerturbationSource",
    "ZODecoder",
    "ZOSettings",
    "clip_inf",
    "client_messages",
    "decode_scale",
    "estimate_gradient",
    "expected_cosine",
    "loss_differences",
    "loss_differences_many",
    "loss_differences_reference",
    "num_directions",
    "reconstruct",
    "upload_bytes",
    "zo_local_steps",
    "zo_local_steps_many",
]
