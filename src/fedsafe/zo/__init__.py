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
- BAFFLE's training guidelines: ``clip_inf`` here; the server's ``Adam`` and the ``EMA`` of the
  global model it evaluates are server options (:mod:`fedsafe.engine.adam`, :mod:`fedsafe.engine.ema`). Hardswish and GroupNorm are model options
  (``ModelConfig(name="lenet", activation="hardswish", norm="group")``).

K counts perturbed forward passes per client per round: the forward (twice-FD) scheme uses K
directions and uploads K scalars; the central scheme uses K/2 ± pairs and uploads K/2.
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "DecodedMomentum": "fedsgd",
    "LocalZOResult": "local",
    "PerturbationSource": "perturbations",
    "SCHEMES": "perturbations",
    "ZOConfig": "config",
    "ZODecoder": "fedsgd",
    "ZOSettings": "fedsgd",
    "client_messages": "fedsgd",
    "clip_inf": "clip",
    "decode_scale": "estimator",
    "estimate_gradient": "estimator",
    "expected_cosine": "estimator",
    "loss_differences": "estimator",
    "loss_differences_many": "estimator",
    "loss_differences_reference": "estimator",
    "num_directions": "perturbations",
    "reconstruct": "estimator",
    "upload_bytes": "perturbations",
    "zo_local_steps": "local",
    "zo_local_steps_many": "local",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
