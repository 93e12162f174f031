"""load_federated on digits: split, subsetting, resizing, standardisation, determinism, errors."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from fedsafe.data import DataConfig, FederatedDataset, load_federated
from fedsafe.data.digits import _bundled, load_digits_images
from fedsafe.data.split import (
    random_subset,
    split_count,
    stratified_split,
    subset_keeping_groups,
)
from fedsafe.data.transforms import channel_stats, resize_images, standardise


def unstandardise(ds: FederatedDataset, x: torch.Tensor) -> np.ndarray:
    mean = np.asarray(ds.pixel_mean)[None, :, None, None]
    std = np.asarray(ds.pixel_std)[None, :, None, None]
    return x.numpy().astype(np.float64) * std + mean


def test_digits_match_scikit_learn() -> None:
    from sklearn.datasets import load_digits

    ref = load_digits()
    images, labels = load_digits_images()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.float32
    assert np.array_equal(images[:, 0] * 16, ref.images) and np.array_equal(labels, ref.target)


def test_digits_dataset_contract() -> None:
    ds = load_federated(DataConfig(), num_clients=10, seed=0)
    assert ds.name == "digits" and ds.num_classes == 10 and ds.input_shape == (1, 8, 8)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    n_test = round(0.2 * 1797)
    assert ds.x_test.shape == (n_test, 1, 8, 8) and ds.x_train.shape == (1797 - n_test, 1, 8, 8)
    assert ds.num_clients == 10 and sum(c.size for c in ds.client_indices) == 1797 - n_test
    x, y = ds.client_data(3)
    assert torch.equal(y, ds.y_train[torch.from_numpy(ds.client_indices[3])]) and x.shape[0] == y.shape[0]


def test_digits_split_is_stratified_and_loses_nothing() -> None:
    ds = load_federated(DataConfig(test_fraction=0.3), 5, seed=1)
    images, labels = load_digits_images()
    counts = np.bincount(labels, minlength=10)
    test_counts = np.bincount(ds.y_test.numpy(), minlength=10)
    assert np.all(np.abs(test_counts - 0.3 * counts) < 1)
    # Undoing the standardisation recovers exactly the original images, split in two.
    both = np.concatenate([unstandardise(ds, ds.x_train), unstandardise(ds, ds.x_test)])
    got = np.round(both.reshape(1797, 64) * 16).astype(int)
    ref = (images.reshape(1797, 64) * 16).astype(int)
    assert np.array_equal(np.sort(got.view([("", got.dtype)] * 64), axis=0),
                          np.sort(ref.view([("", ref.dtype)] * 64), axis=0))


def test_standardisation_uses_train_statistics() -> None:
    ds = load_federated(DataConfig(), 4, seed=0)
    x = ds.x_train.numpy().astype(np.float64)
    assert abs(x.mean()) < 1e-6 and abs(x.std() - 1) < 1e-6
    # Test images go through the same affine map, so they land back in [0, 1] pixel units.
    back = unstandardise(ds, ds.x_test)
    assert back.min() > -1e-5 and back.max() < 1 + 1e-5
    assert abs(ds.x_test.numpy().mean()) < 0.1  # close to, not exactly, zero


def test_resize_matches_pil_bilinear() -> None:
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for h, size in ((8, 28), (28, 8), (32, 28), (5, 3)):
        a = rng.random((h, h)).astype(np.float32)
        ref = np.asarray(Image.fromarray(a, mode="F").resize((size, size), Image.BILINEAR))
        out = resize_images(torch.from_numpy(a)[None, None], size)[0, 0].numpy()
        assert np.abs(out - ref).max() < 1e-5


def test_resize_hand_computed_upsampling() -> None:
    # 2 -> 4 with half-pixel centres: output coordinate s maps to (s + 0.5) / 2 - 0.5, i.e.
    # -0.25, 0.25, 0.75, 1.25, clamped to [0, 1] -> weights on [a, b]: 0, 0.25, 0.75, 1.
    x = torch.tensor([[[[0.0, 4.0], [8.0, 12.0]]]])
    row = torch.tensor([0.0, 1.0, 3.0, 4.0])
    expected = torch.stack([row, row + 2, row + 6, row + 8])
    assert torch.allclose(resize_images(x, 4)[0, 0], expected)


def test_load_with_resize_equals_resize_then_standardise() -> None:
    plain = load_federated(DataConfig(), 6, seed=3)
    big = load_federated(DataConfig(resize=28), 6, seed=3)
    assert big.input_shape == (1, 28, 28) and big.x_train.shape[1:] == (1, 28, 28)
    assert all(np.array_equal(a, b) for a, b in zip(plain.client_indices, big.client_indices))
    pixels = torch.from_numpy(unstandardise(plain, plain.x_train)).float()
    resized = resize_images(pixels, 28).double().numpy()
    expected = (resized - resized.mean()) / resized.std()
    assert np.abs(big.x_train.numpy() - expected).max() < 1e-4


def test_max_train_and_max_test_take_seeded_subsets() -> None:
    full = load_federated(DataConfig(), 3, seed=4)
    cfg = DataConfig(max_train=200, max_test=50, partition="dirichlet", alpha=1.0)
    a = load_federated(cfg, 7, seed=4)
    assert a.x_train.shape[0] == 200 and a.x_test.shape[0] == 50
    assert sorted(np.concatenate(a.client_indices).tolist()) == list(range(200))
    # The subset is drawn from the same split: every kept test image is one of the full test set.
    full_test = {tuple(np.round(r, 4)) for r in unstandardise(full, full.x_test).reshape(-1, 64)}
    kept = unstandardise(a, a.x_test).reshape(-1, 64)
    assert all(tuple(np.round(r, 4)) in full_test for r in kept)
    big = load_federated(DataConfig(max_train=10**6, max_test=10**6), 3, seed=4)
    assert torch.equal(big.x_train, full.x_train) and torch.equal(big.y_test, full.y_test)


def test_same_seed_same_dataset_different_seed_different_split() -> None:
    cfg = DataConfig(partition="gamma", gamma=0.3, max_train=500)
    a, b, c = (load_federated(cfg, 8, seed=s) for s in (11, 11, 12))
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert all(np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
    assert not torch.equal(a.y_train, c.y_train)


def test_accepts_a_mapping() -> None:
    ds = load_federated({"partition": "shards", "shards_per_client": 1}, 10, seed=0)
    assert ds.num_clients == 10


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_clients": 0}, "num_clients must be an int >= 1"),
        ({"num_clients": 2.0}, "num_clients must be an int"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"num_clients": 11, "cfg": DataConfig(max_train=10)},
         r"num_clients=11 exceeds the 10 training samples of data.name='digits' \(data.max_train=10\)"),
    ],
)
def test_clear_errors(kwargs: dict, match: str) -> None:
    args = {"cfg": DataConfig(), "num_clients": 2, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        load_federated(**args)


def test_digits_loads_fast() -> None:
    load_federated(DataConfig(), 10, seed=0)  # warm imports
    _bundled.cache_clear()
    start = time.perf_counter()
    load_federated(DataConfig(partition="dirichlet"), 10, seed=0)
    assert time.perf_counter() - start < 1.0


def _toy(**overrides: object) -> dict:
    fields = dict(
        name="toy", x_train=torch.zeros(4, 2), y_train=torch.tensor([0, 1, 0, 1]),
        x_test=torch.zeros(1, 2), y_test=torch.tensor([1]),
        client_indices=[np.array([0, 1]), np.array([2, 3])], num_classes=2, input_shape=(2,),
    )
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"x_train": torch.zeros(4, 2, dtype=torch.float64)}, "x_train must be float32"),
        ({"y_train": torch.tensor([0, 1, 0, 1], dtype=torch.int32)}, "y_train must be a 1-D int64"),
        ({"input_shape": (3,)}, "input_shape is"),
        ({"y_test": torch.tensor([2])}, r"outside 0\.\.1"),
        ({"client_indices": []}, "need at least one client"),
        ({"client_indices": [np.array([0, 1]), np.array([], dtype=np.int64)]}, r"client_indices\[1\] is empty"),
        ({"client_indices": [np.array([0, 1]), np.array([1, 2])]}, r"client_indices\[1\] overlaps"),
        ({"client_indices": [np.array([0, 4])]}, "outside 0..3"),
        ({"client_indices": [np.array([0, 1], dtype=np.int32)]}, "1-D int64 numpy array"),
    ],
)
def test_federated_dataset_validates_its_contract(overrides: dict, match: str) -> None:
    FederatedDataset(**_toy())
    with pytest.raises(ValueError, match=match):
        FederatedDataset(**_toy(**overrides))


def test_split_helpers() -> None:
    assert [split_count(n, 0.2) for n in (2, 3, 10, 11)] == [1, 1, 2, 2]
    assert split_count(2, 0.99) == 1
    with pytest.raises(ValueError, match="cannot split 1 sample"):
        split_count(1, 0.5)
    labels = np.array([0] * 7 + [1] * 2 + [2] * 1)
    train, test = stratified_split(labels, 0.5, np.random.default_rng(0))
    # T = 5; quotas 3.5, 1, 0.5 -> floors 3, 1, 0; one left over to the largest remainder (class 0,
    # ties broken by label).
    assert np.bincount(labels[test], minlength=3).tolist() == [4, 1, 0]
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(10))
    sub = random_subset(100, 10, np.random.default_rng(0))
    assert sub.size == 10 and np.all(np.diff(sub) > 0)
    groups = [np.arange(0, 50), np.arange(50, 51), np.arange(51, 60)]
    kept = subset_keeping_groups(groups, 4, np.random.default_rng(0))
    assert kept.size == 4 and all(np.intersect1d(g, kept).size for g in groups)


def test_channel_stats_and_standardise() -> None:
    x = torch.rand(10, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    x[:, 2] = 0.5  # constant channel: std 0 must not divide by zero
    mean, std = channel_stats(x)
    ref = x.double().transpose(0, 1).reshape(3, -1)
    assert torch.allclose(mean, ref.mean(1)) and torch.allclose(std, ref.std(1, correction=0))
    out = standardise(x, mean, std)
    assert torch.isfinite(out).all() and torch.equal(out[:, 2], torch.zeros(10, 4, 4))
    assert torch.equal(x[:, 2], torch.full((10, 4, 4), 0.5))  # input untouched
    # Several chunks (of 4096 samples) merged, with channels far from zero mean.
    big = torch.rand(9000, 2, 3, generator=torch.Generator().manual_seed(1)) + torch.tensor([[100.0], [-3.0]])
    mean, std = channel_stats(big)
    ref = big.double().transpose(0, 1).reshape(2, -1)
    assert torch.allclose(mean, ref.mean(1), rtol=1e-6, atol=0)  # float32 within a chunk
    assert torch.allclose(std, ref.std(1, correction=0), rtol=1e-5, atol=0)
