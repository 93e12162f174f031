"""The ``[data]`` section of an experiment config: which dataset, how to split it over clients.

Single-field ranges are pydantic ``Field`` constraints (so pydantic names the field and the
valid range); cross-field rules are checked in :meth:`DataConfig._cross_field_checks` and name
every key involved, prefixed ``data.`` as they appear in the TOML.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fedsafe.core.registry import Registry, RegistryError

# name -> reader(cfg, num_clients, seed, **data.params) returning the raw splits
# (fedsafe.data.loader). The built-in readers are registered lazily (naming them imports
# nothing); users add their own with fedsafe.register_dataset (fedsafe.data.user).
DATASETS: Registry = Registry("dataset")
for _name, _summary in (
    ("digits", "scikit-learn's bundled handwritten digits: 1,797 images of 8x8 pixels, 10 classes (no download)"),
    ("synthetic", "synthetic(alpha, beta) of Li et al. (FedProx): one generator per client"),
    ("mnist", "MNIST: 28x28 grey digits, from `make data` (no data.path) or IDX files / mnist.pkl.gz in data.path"),
    ("fashion_mnist", "Fashion-MNIST from its IDX files (optionally .gz) in data.path: 28x28 grey clothes"),
    ("cifar10", "CIFAR-10 from the python pickle batches in data.path: 32x32 colour images, 10 classes"),
):
    DATASETS.register_lazy(_name, f"fedsafe.data.loader:_{_name}", _summary)
#: The datasets fedsafe ships (a user's registered dataset is none of these).
BUILTIN_DATASETS: frozenset[str] = frozenset(DATASETS.names())
PartitionName = Literal["iid", "dirichlet", "shards", "gamma", "natural"]

#: Datasets read from files under ``data.path``.
FILE_DATASETS: frozenset[str] = frozenset({"mnist", "fashion_mnist", "cifar10"})
#: File datasets that need no ``data.path``: read from fedsafe's data directory, where
#: ``make data`` / ``fedsafe data fetch`` put them (``fedsafe.data.store``).
STORED_DATASETS: frozenset[str] = frozenset({"mnist"})
#: Datasets whose samples are images of shape (channels, height, width).
IMAGE_DATASETS: frozenset[str] = frozenset({"digits", "mnist", "fashion_mnist", "cifar10"})


class DataConfig(BaseModel):
    """Dataset, federated partition, and optional subsetting / resizing.

    Partition parameters are read only by their partition (``alpha`` by ``dirichlet``,
    ``shards_per_client`` by ``shards``, ``gamma`` by ``gamma``); ``synthetic_*`` only by the
    ``synthetic`` dataset; ``test_fraction`` only by ``digits`` and ``synthetic`` (the file
    datasets have official test splits).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(
        "digits", description="a registered dataset: digits, synthetic, mnist, fashion_mnist, cifar10, or "
        "one registered with fedsafe.register_dataset"
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="parameters of a dataset registered with fedsafe.register_dataset"
    )
    path: str | None = Field(
        None, description="directory holding the dataset files (fashion_mnist, cifar10; mnist: optional, "
        "default the file `make data` fetched)"
    )
    partition: PartitionName = "iid"
    alpha: float = Field(0.5, gt=0, allow_inf_nan=False, description="Dirichlet concentration")
    shards_per_client: int = Field(2, ge=1)
    gamma: float = Field(
        0.5, ge=0, le=1, allow_inf_nan=False,
        description="fraction of each client's data drawn IID; the rest is label-sorted",
    )
    test_fraction: float = Field(0.2, gt=0, lt=1, allow_inf_nan=False)
    resize: int | None = Field(None, ge=1, le=4096, description="resize images to resize x resize")
    max_train: int | None = Field(None, ge=1)
    max_test: int | None = Field(None, ge=1)
    synthetic_alpha: float = Field(1.0, ge=0, allow_inf_nan=False, description="variance of u_k")
    synthetic_beta: float = Field(1.0, ge=0, allow_inf_nan=False, description="variance of B_k")
    synthetic_dim: int = Field(60, ge=1)
    synthetic_classes: int = Field(10, ge=2)
    synthetic_samples: int = Field(100, ge=2, description="mean samples per client")

    @field_validator("name")
    @classmethod
    def _registered(cls, v: str) -> str:
        if v not in DATASETS:
            raise ValueError(f"unknown dataset {v!r}; valid: {', '.join(DATASETS.names())}")
        return v

    @model_validator(mode="after")
    def _cross_field_checks(self) -> DataConfig:
        if self.params:
            if self.name in BUILTIN_DATASETS:
                raise ValueError(
                    f"data.params applies to datasets registered with fedsafe.register_dataset; "
                    f"data.name={self.name!r} takes its settings as data.* keys"
                )
            try:
                DATASETS.check_params(self.name, self.params)
            except RegistryError as e:
                raise ValueError(f"data.params: {e}") from None
        if self.name in FILE_DATASETS - STORED_DATASETS and not self.path:
            raise ValueError(
                f"data.path is required for data.name={self.name!r}: set it to the directory "
                f"holding the dataset files (no downloads at run time)"
            )
        if self.name not in FILE_DATASETS and self.path is not None:
            raise ValueError(
                f"data.path is not used by data.name={self.name!r} (only by "
                f"{', '.join(sorted(FILE_DATASETS))}); remove it"
            )
        if self.partition == "natural" and self.name != "synthetic":
            raise ValueError(
                f"data.partition='natural' needs a dataset that defines its own clients "
                f"(only data.name='synthetic'); data.name={self.name!r} supports "
                f"'iid', 'dirichlet', 'shards', 'gamma'"
            )
        if self.resize is not None and self.name not in IMAGE_DATASETS:
            raise ValueError(
                f"data.resize applies to image datasets ({', '.join(sorted(IMAGE_DATASETS))}); "
                f"data.name={self.name!r} is not images, remove data.resize"
            )
        return self
