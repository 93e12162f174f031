"""Small torch models used by the papers, and their flat-parameter view.

- ``logreg``, ``mlp`` (SABLE model 1, 79,510 parameters on MNIST),
  ``cnn_fmnist`` (SABLE model 2, 431,080 on Fashion-MNIST),
  ``cnn_cifar`` (SABLE model 3, 712,854 on CIFAR-10),
  ``lenet`` (BAFFLE's shallow model, 26,730 on MNIST; optional GroupNorm and Hardswish).

Models output logits; train them with cross-entropy (= SABLE's log-softmax + NLL).
Parameters are drawn from an explicit ``torch.Generator`` (:func:`init_parameters`).
"""

from fedsafe.models.build import MODELS, build_model, count_parameters
from fedsafe.models.config import ModelConfig
from fedsafe.models.initialization import init_parameters
from fedsafe.models.params import ParamLayout, flatten_params
from fedsafe.models.saved import load_trained, save_trained

__all__ = [
    "MODELS",
    "ModelConfig",
    "ParamLayout",
    "build_model",
    "count_parameters",
    "flatten_params",
    "init_parameters",
    "load_trained",
    "save_trained",
]
