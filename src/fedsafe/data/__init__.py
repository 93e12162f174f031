"""Datasets and federated partitions.

``load_federated(cfg, num_clients, seed)`` reads one of ``digits`` (scikit-learn's bundled
8 x 8 digits), ``synthetic`` (FedProx's synthetic(α, β)), ``mnist`` / ``fashion_mnist`` (IDX
files) or ``cifar10`` (pickle batches, read with a restricted unpickler), keeps an optional
random subset, splits the training set over clients (``iid``, ``dirichlet``, ``shards``,
``gamma``, or ``natural`` for synthetic), optionally resizes images, and standardises them per
channel with training-split statistics. Every random draw comes from a named stream of
``seed``. Configuration is :class:`DataConfig`, the ``[data]`` section of an experiment.
"""


from fedsafe.core.lazy import lazy_exports

# Public names -> the submodule defining each, imported on first use (fedsafe.core.lazy).
_EXPORTS = {
    "DataConfig": "config",
    "DataFormatError": "errors",
    "FederatedDataset": "dataset",
    "PARTITIONERS": "partition",
    "UnsafePickleError": "errors",
    "load_federated": "loader",
    "partition": "partition",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
