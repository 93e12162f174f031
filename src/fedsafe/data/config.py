"""The ``[data]`` section of an experiment config: which dataset, how to split it over clients.

Single-field ranges are pydantic ``Field`` constraints (so pydantic names the field and the
valid range); cross-field rules are checked in :meth:`DataConfig._cross_field_checks` and name
every key involved, prefixed ``data.`` as they appear in the TOML.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DatasetName = Literal["digits", "synthetic", "mnist", "fashion_mnist", "cifar10"]
PartitionName = Literal["iid", "dirichlet", "shards", "gamma", "natural"]

#: Datasets read from files under ``data.path``.
FILE_DATASETS: frozenset[str] = frozenset({"mnist", "fashion_mnist", "cifar10"})
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

    name: DatasetName = "digits"
    path: str | None = Field(
        None, description="directory holding the dataset files (mnist, fashion_mnist, cifar10)"
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

    @model_validator(mode="after")
    def _cross_field_checks(self) -> DataConfig:
        if self.name in FILE_DATASETS and not self.path:
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
