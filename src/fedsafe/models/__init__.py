"""Small torch models used by the papers, and their flat-parameter view.

- ``logreg``, ``mlp`` (SABLE model 1, 79,510 parameters on MNIST),
  ``cnn_fmnist`` (SABLE model 2, 431,080 on Fashion-MNIST),
  ``cnn_cifar`` (SABLE model 3, 712,854 on CIFAR-10),
  ``lenet`` (BAFFLE's shallow model, 26,730 on MNIST; optional GroupNorm and Hardswish).

Models output logits; train them with cross-entropy (= SABLE's log-softmax + NLL).
Parameters are drawn from an explicit ``torch.Generator`` (:func:`init_parameters`; a user's
own module: :func:`seed_parameters`).
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "MODELS": "build",
    "ModelError": "custom",
    "check_model": "custom",
    "ModelConfig": "config",
    "ParamLayout": "params",
    "build_model": "build",
    "count_parameters": "build",
    "flatten_params": "params",
    "init_parameters": "initialization",
    "load_trained": "saved",
    "save_trained": "saved",
    "seed_parameters": "initialization",
    "uninitialisable": "initialization",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
