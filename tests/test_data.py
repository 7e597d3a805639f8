"""Tests for ``twodg_pyro.data``: digits split, local vision loaders, errors, loaders."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch.utils.data import Subset, TensorDataset
from torchvision import transforms

from twodg_pyro.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DatasetFormatError,
    DatasetNotFoundError,
    DataSplit,
    available_datasets,
    load_cifar10,
    load_cifar100,
    load_dataset,
    load_digits_split,
    load_fashion_mnist,
    load_imagenet,
    load_mnist,
    make_loader,
    stratified_split,
)
from twodg_pyro.data.transforms import (
    CIFAR100_MEAN,
    CIFAR100_STD,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    MNIST_MEAN,
    MNIST_STD,
)

# --------------------------------------------------------------------------- digits


def test_digits_split_sizes_and_types() -> None:
    split = load_digits_split()
    assert isinstance(split, DataSplit)
    sizes = [len(split.train), len(split.val), len(split.test)]
    assert sizes == [1258, 180, 359]
    assert sum(sizes) == 1797
    x, y = split.train.tensors
    assert isinstance(split.train, TensorDataset)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.shape == (1258, 64)
    assert split.num_classes == 10 and split.input_shape == (64,) and split.name == "digits"
    # the three index sets partition the data set
    idx = np.concatenate([split.info["train_idx"], split.info["val_idx"], split.info["test_idx"]])
    assert np.array_equal(np.sort(idx), np.arange(1797))


def test_digits_split_is_stratified() -> None:
    split = load_digits_split(val_fraction=0.1, test_fraction=0.2, seed=3)
    y_all = torch.from_numpy(load_digits().target)
    totals = torch.bincount(y_all, minlength=10).double()
    for ds, frac in ((split.val, 0.1), (split.test, 0.2), (split.train, 0.7)):
        counts = torch.bincount(ds.tensors[1], minlength=10).double()
        assert (counts - frac * totals).abs().max() <= 1.5
        assert counts.min() > 0


def test_digits_split_deterministic_under_seed() -> None:
    a = load_digits_split(seed=7)
    b = load_digits_split(seed=7)
    c = load_digits_split(seed=8)
    for name in ("train", "val", "test"):
        for ta, tb in zip(getattr(a, name).tensors, getattr(b, name).tensors, strict=True):
            assert torch.equal(ta, tb)
    assert not np.array_equal(a.info["test_idx"], c.info["test_idx"])


def test_digits_standardized_with_train_stats_only() -> None:
    split = load_digits_split(seed=1)
    raw = torch.from_numpy(load_digits().data.astype(np.float32) / 16.0)
    train_raw = raw[torch.from_numpy(split.info["train_idx"])]
    mean, std = train_raw.mean(0), train_raw.std(0)
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    assert torch.allclose(split.info["mean"], mean) and torch.allclose(split.info["std"], std)
    x_train = split.train.tensors[0]
    assert x_train.mean(0).abs().max() < 1e-5
    varying = train_raw.std(0) > 1e-8
    assert torch.allclose(x_train.std(0)[varying], torch.ones(int(varying.sum())), atol=1e-4)
    # val/test use the train statistics, not their own
    test_raw = raw[torch.from_numpy(split.info["test_idx"])]
    assert torch.allclose(split.test.tensors[0], (test_raw - mean) / std, atol=1e-5)
    assert split.test.tensors[0].mean(0).abs().max() > 1e-3


def test_digits_unstandardized_and_image() -> None:
    plain = load_digits_split(standardize=False)
    assert plain.train.tensors[0].min() >= 0.0 and plain.train.tensors[0].max() <= 1.0
    assert "mean" not in plain.info
    img = load_digits_split(image=True)
    assert img.input_shape == (1, 8, 8)
    assert img.train.tensors[0].shape == (1258, 1, 8, 8)
    x = img.train.tensors[0]
    assert abs(float(x.mean())) < 1e-5 and abs(float(x.std()) - 1.0) < 1e-4
    assert torch.equal(img.train.tensors[1], plain.train.tensors[1])


def test_digits_fraction_edge_cases() -> None:
    split = load_digits_split(val_fraction=0.0)
    assert len(split.val) == 0 and len(split.train) + len(split.test) == 1797
    for kwargs in (
        {"val_fraction": -0.1},
        {"test_fraction": 1.0},
        {"val_fraction": 0.5, "test_fraction": 0.5},
    ):
        with pytest.raises(ValueError):
            load_digits_split(**kwargs)


def test_stratified_split_falls_back_on_tiny_classes() -> None:
    rest, out = stratified_split([0, 1, 2, 3], 0.5, seed=0)  # one item per class
    assert len(out) == 2 and sorted(np.concatenate([rest, out]).tolist()) == [0, 1, 2, 3]


# --------------------------------------------------------------------------- missing data

MISSING_CASES = [
    ("mnist", "MNIST/raw/train-images-idx3-ubyte"),
    ("fashion_mnist", "FashionMNIST/raw/t10k-labels-idx1-ubyte"),
    ("cifar10", "cifar-10-batches-py/data_batch_1"),
    ("cifar100", "cifar-100-python/train"),
    ("imagenet", "train/<wnid>/*.JPEG"),
]


@pytest.mark.parametrize(("name", "expected"), MISSING_CASES)
def test_missing_data_folder_raises(tmp_path: Path, name: str, expected: str) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name, root=root)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    message = str(err)
    assert str(root) in message
    assert expected in message
    assert "http" in message
    assert "downloaded" in message
    assert err.folder == str(root) and expected in err.expected
    # picklable (e.g. across worker processes)
    assert str(pickle.loads(pickle.dumps(err))) == message


def test_partially_missing_cifar_names_missing_file(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path, per_batch=2)
    (tmp_path / "cifar-10-batches-py" / "data_batch_5").unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        load_cifar10(tmp_path)
    assert info.value.missing == ["cifar-10-batches-py/data_batch_5"]
    assert "Missing: cifar-10-batches-py/data_batch_5" in str(info.value)


def test_default_root_is_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="'data'"):
        load_dataset("cifar10")


def test_unknown_dataset_name() -> None:
    with pytest.raises(ValueError) as info:
        load_dataset("svhn")
    for name in ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "imagenet"):
        assert name in str(info.value)
    assert available_datasets() == [
        "digits",
        "mnist",
        "fashion_mnist",
        "cifar10",
        "cifar100",
        "imagenet",
        "diabetes",
        "gap1d",
    ]


def test_load_dataset_digits_passes_kwargs() -> None:
    split = load_dataset("Digits", root="ignored", seed=2, image=True)
    assert split.input_shape == (1, 8, 8) and len(split.test) == 359


# --------------------------------------------------------------------------- fake CIFAR


def _cifar_images(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random images in the CIFAR row format: uint8 (n, 3072), R then G then B planes."""
    return rng.integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)


def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_fake_cifar10(root: Path, per_batch: int = 4, seed: int = 0) -> Path:
    """Write a tiny CIFAR-10 in the official python pickle format; return its folder."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"]
    for i, name in enumerate(names + ["test_batch"]):
        labels = [(i * per_batch + j) % 10 for j in range(per_batch)]
        _dump(
            folder / name,
            {
                "batch_label": f"fake batch {i}",
                "labels": labels,
                "data": _cifar_images(rng, per_batch),
                "filenames": [f"img_{i}_{j}.png" for j in range(per_batch)],
            },
        )
    _dump(folder / "batches.meta", {"label_names": [f"class{k}" for k in range(10)]})
    return folder


def test_fake_cifar10_loads_and_augments(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path, per_batch=4)
    split = load_cifar10(tmp_path, val_fraction=0.2, seed=0)
    assert (len(split.train), len(split.val), len(split.test)) == (16, 4, 4)
    assert split.num_classes == 10 and split.input_shape == (3, 32, 32)
    assert split.info["classes"] == [f"class{k}" for k in range(10)]  # read from batches.meta
    assert isinstance(split.train, Subset) and isinstance(split.val, Subset)
    assert not set(split.train.indices) & set(split.val.indices)

    full = split.train.dataset
    tf = full.transform.transforms
    assert isinstance(tf[0], transforms.RandomCrop)
    assert tf[0].padding == 4 and tf[0].padding_mode == "reflect" and tf[0].size == (32, 32)
    assert isinstance(tf[1], transforms.RandomHorizontalFlip)
    assert isinstance(tf[-1], transforms.Normalize)

    # the train item is augmented, the same image in an evaluation view is only normalised
    index = split.train.indices[0]
    raw = torch.from_numpy(full.data[index]).permute(2, 0, 1).float() / 255.0
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    expected_eval = (raw - mean) / std
    torch.manual_seed(0)
    draws = [split.train[0][0] for _ in range(8)]
    for x in draws:
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert any(not torch.allclose(x, expected_eval, atol=1e-5) for x in draws)
    assert any(not torch.allclose(draws[0], x) for x in draws[1:])

    # val and test are deterministic and only normalised
    v_index = split.val.indices[0]
    v_raw = torch.from_numpy(full.data[v_index]).permute(2, 0, 1).float() / 255.0
    assert torch.allclose(split.val[0][0], (v_raw - mean) / std, atol=1e-5)
    assert torch.equal(split.test[1][0], split.test[1][0])
    assert split.train[0][1] == full.targets[index]

    # a seeded loader yields augmented batches in a reproducible order
    def labels(seed: int) -> list[int]:
        loader = make_loader(split.train, batch_size=5, shuffle=True, seed=seed)
        return [int(t) for _, y in loader for t in y]

    batch_x, batch_y = next(iter(make_loader(split.train, batch_size=5, shuffle=True, seed=0)))
    assert batch_x.shape == (5, 3, 32, 32) and batch_y.dtype == torch.int64
    assert labels(0) == labels(0)
    orders = {tuple(labels(s)) for s in range(4)}
    assert len(orders) > 1


def test_fake_cifar10_without_augmentation_or_meta(tmp_path: Path) -> None:
    folder = write_fake_cifar10(tmp_path, per_batch=2)
    (folder / "batches.meta").unlink()
    split = load_dataset("cifar10", root=tmp_path, val_fraction=0.0, augment=False)
    assert len(split.train) == 10 and len(split.val) == 0 and len(split.test) == 2
    assert split.info["classes"][0] == "airplane"
    assert torch.equal(split.train[3][0], split.train[3][0])
    # the official MD5 sums obviously do not match the fake files
    with pytest.raises(DatasetFormatError, match="MD5"):
        load_cifar10(tmp_path, verify_checksums=True)


def write_fake_cifar100(root: Path, n_train: int = 6, n_test: int = 3, seed: int = 1) -> Path:
    """Write a tiny CIFAR-100 (no ``meta`` file) in the official pickle format."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        _dump(
            folder / name,
            {
                "data": _cifar_images(rng, n),
                "fine_labels": list(range(n)),
                "coarse_labels": [0] * n,
            },
        )
    return folder


def test_fake_cifar100_loads(tmp_path: Path) -> None:
    write_fake_cifar100(tmp_path)
    split = load_cifar100(tmp_path, val_fraction=0.0)
    assert split.num_classes == 100 and len(split.train) == 6 and len(split.test) == 3
    x, y = split.train[5]
    assert x.shape == (3, 32, 32) and y == 5


# --------------------------------------------------------------------------- fake MNIST / ImageNet


def _write_idx(folder: Path, prefix: str, n: int, rng: np.random.Generator) -> None:
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    (folder / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes()
    )
    labels = (np.arange(n) % 10).astype(np.uint8)
    (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">II", 2049, n) + labels.tobytes()
    )


def write_fake_mnist(root: Path, folder: str, n_train: int = 20, n_test: int = 10) -> Path:
    """Write tiny idx files in ``root/<folder>/raw`` (the torchvision layout); return it."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    _write_idx(raw, "train", n_train, rng)
    _write_idx(raw, "t10k", n_test, rng)
    return raw


@pytest.mark.parametrize(
    ("loader", "folder"), [(load_mnist, "MNIST"), (load_fashion_mnist, "FashionMNIST")]
)
def test_fake_mnist_loads(tmp_path: Path, loader, folder: str) -> None:
    write_fake_mnist(tmp_path, folder)
    split = loader(tmp_path, val_fraction=0.5, seed=0)
    assert (len(split.train), len(split.val), len(split.test)) == (10, 10, 10)
    assert split.input_shape == (1, 28, 28)
    x, y = split.test[3]
    assert x.shape == (1, 28, 28) and y == 3
    # stratified: each of the 10 classes (2 images each) lands once in train and once in val
    assert sorted(split.val[i][1] for i in range(10)) == list(range(10))


# --------------------------------------------------------------------------- data-set families

MNIST_RAW_FILES = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
]
MNIST_VARIANTS = [
    (load_mnist, "MNIST", "MNIST", "mnist", MNIST_MEAN, MNIST_STD),
    (
        load_fashion_mnist,
        "Fashion-MNIST",
        "FashionMNIST",
        "fashion_mnist",
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
    ),
]
CIFAR_VARIANTS = [
    (
        load_cifar10,
        "CIFAR-10",
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
        "cifar-10-python.tar.gz",
    ),
    (load_cifar100, "CIFAR-100", "cifar-100-python", ["train", "test"], "cifar-100-python.tar.gz"),
]


@pytest.mark.parametrize(("loader", "title", "folder", "name", "mean", "std"), MNIST_VARIANTS)
def test_missing_mnist_folder_names_files_and_place(
    tmp_path: Path, loader, title: str, folder: str, name: str, mean, std
) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        loader(tmp_path)
    err = info.value
    assert err.dataset == title and err.missing == err.expected
    assert err.expected == [f"{folder}/raw/{f}" for f in MNIST_RAW_FILES]
    where = tmp_path / folder / "raw"
    assert f"Put the four files, decompressed (gunzip), in '{where}'." in str(err)


@pytest.mark.parametrize(("loader", "title", "folder", "files", "archive"), CIFAR_VARIANTS)
def test_missing_cifar_folder_names_files_and_archive(
    tmp_path: Path, loader, title: str, folder: str, files: list[str], archive: str
) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        loader(tmp_path)
    err = info.value
    assert err.dataset == title and err.url == "https://www.cs.toronto.edu/~kriz/cifar.html"
    assert err.expected == [f"{folder}/{f}" for f in files]
    assert f"Download the python version ({archive}) and unpack it there (tar xzf)." in str(err)


@pytest.mark.parametrize(("loader", "title", "folder", "name", "mean", "std"), MNIST_VARIANTS)
def test_mnist_variants_metadata_and_normalisation(
    tmp_path: Path, loader, title: str, folder: str, name: str, mean, std
) -> None:
    write_fake_mnist(tmp_path, folder)
    split = loader(tmp_path, val_fraction=0.5, seed=3)
    assert split.name == name and split.num_classes == 10
    assert split.info["mean"] == mean and split.info["std"] == std and split.info["seed"] == 3
    assert len(split.info["classes"]) == 10
    plain = loader(tmp_path, val_fraction=0.5, seed=3, normalize=False)
    x = plain.test[0][0]
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    assert torch.allclose(split.test[0][0], (x - mean[0]) / std[0], atol=1e-5)
    assert plain.train.indices == split.train.indices


@pytest.mark.parametrize(
    ("loader", "write", "name", "num_classes", "mean", "std"),
    [
        (load_cifar10, write_fake_cifar10, "cifar10", 10, CIFAR10_MEAN, CIFAR10_STD),
        (load_cifar100, write_fake_cifar100, "cifar100", 100, CIFAR100_MEAN, CIFAR100_STD),
    ],
)
def test_cifar_variants_metadata_and_normalisation(
    tmp_path: Path, loader, write, name: str, num_classes: int, mean, std
) -> None:
    write(tmp_path)
    split = loader(tmp_path, val_fraction=0.0, seed=2, augment=False)
    assert split.name == name and split.num_classes == num_classes
    assert split.input_shape == (3, 32, 32)
    assert split.info["mean"] == mean and split.info["std"] == std and split.info["seed"] == 2
    assert len(split.info["classes"]) == num_classes
    raw = torch.from_numpy(split.test.data[0]).permute(2, 0, 1).float() / 255.0
    expected = (raw - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    assert torch.allclose(split.test[0][0], expected, atol=1e-5)


def test_fake_imagenet_loads(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for part, per_class in (("train", 3), ("val", 1)):
        for wnid in ("n01440764", "n01443537"):
            d = tmp_path / part / wnid
            d.mkdir(parents=True)
            for k in range(per_class):
                pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / f"{wnid}_{k}.JPEG", format="JPEG")
    split = load_imagenet(tmp_path, val_fraction=1 / 3, seed=0)
    assert split.num_classes == 2 and split.input_shape == (3, 224, 224)
    assert (len(split.train), len(split.val), len(split.test)) == (4, 2, 2)
    tf = split.train.dataset.transform.transforms
    assert isinstance(tf[0], transforms.RandomResizedCrop)
    jitter = tf[2]
    assert isinstance(jitter, transforms.ColorJitter)
    assert jitter.brightness == (0.6, 1.4) and jitter.hue == (-0.1, 0.1)
    for ds in (split.train, split.val, split.test):
        x, y = ds[0]
        assert x.shape == (3, 224, 224) and y in (0, 1)
    assert torch.equal(split.val[0][0], split.val[0][0])  # no augmentation on val


def test_imagenet_val_folder_missing(tmp_path: Path) -> None:
    (tmp_path / "train" / "n01440764").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError) as info:
        load_imagenet(tmp_path)
    assert info.value.missing == ["val/<wnid>/*.JPEG"]


# --------------------------------------------------------------------------- damaged files


def _rewrite(path: Path, change) -> None:
    path.write_bytes(change(path.read_bytes()))


@pytest.mark.parametrize(
    ("name", "change", "named"),
    [
        (  # a truncated image body
            "train-images-idx3-ubyte",
            lambda b: b[:-500],
            r"has 15196 bytes, its header announces 20 x 28 x 28 values \(15696 bytes with the "
            r"header\): truncated",
        ),
        ("t10k-labels-idx1-ubyte", lambda b: b + b"\x00\x01", "2 byte\\(s\\) too long"),
        (  # images and labels swapped: wrong magic number
            "train-images-idx3-ubyte",
            lambda b: struct.pack(">II", 2049, 20) + bytes(20),
            "has magic number 0x00000801, expected 0x00000803",
        ),
        ("train-labels-idx1-ubyte", lambda b: b"", r"is empty \(0 bytes\)"),
        ("t10k-images-idx3-ubyte", lambda b: b[:10], "is too short for an idx file"),
        ("train-images-idx3-ubyte", lambda b: b"\x1f\x8b" + b[2:], "is gzip-compressed"),
        (  # 10 labels for 20 images
            "train-labels-idx1-ubyte",
            lambda b: struct.pack(">II", 2049, 10) + bytes(10),
            "holds 10 labels, but .*train-images-idx3-ubyte' holds 20 images",
        ),
        (  # a label out of range (was an IndexError mid-training)
            "train-labels-idx1-ubyte",
            lambda b: b[:13] + bytes([200]) + b[14:],
            r"holds label 200 at index 5 \(1 bad label\(s\)\); labels must be in \[0, 10\)",
        ),
        (  # 27x28 images
            "t10k-images-idx3-ubyte",
            lambda b: struct.pack(">IIII", 2051, 10, 27, 28) + bytes(10 * 27 * 28),
            "holds images of 27x28 pixels, expected 28x28",
        ),
    ],
)
def test_damaged_idx_files_are_named(tmp_path: Path, name: str, change, named: str) -> None:
    raw = write_fake_mnist(tmp_path, "MNIST")
    _rewrite(raw / name, change)
    with pytest.raises(DatasetFormatError, match=named) as info:
        load_mnist(tmp_path)
    assert info.value.path == str(raw / name) and str(raw / name) in str(info.value)


def test_damaged_cifar_files_are_named_and_run_no_code(tmp_path: Path) -> None:
    folder = write_fake_cifar10(tmp_path, per_batch=4)
    batch = folder / "data_batch_3"
    good = batch.read_bytes()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    rng = np.random.default_rng(0)
    cases = [
        (good[: len(good) // 2], "is not a CIFAR python batch file"),
        (b"", r"is empty \(0 bytes\)"),
        (pickle.dumps({"data": Payload(), "labels": [0]}, protocol=2), "refusing to load"),
        (pickle.dumps([1, 2, 3], protocol=2), "holds a list, not a CIFAR batch table"),
        (
            pickle.dumps({"data": _cifar_images(rng, 4)[:, :3000], "labels": [0] * 4}, protocol=2),
            "holds images of 3000 bytes, expected 3072",
        ),
        (
            pickle.dumps({"data": _cifar_images(rng, 4), "labels": [0] * 3}, protocol=2),
            r"holds 4 images but 3 labels \('labels'\)",
        ),
        (
            pickle.dumps({"data": _cifar_images(rng, 4), "labels": [0, 1, 10, 2]}, protocol=2),
            r"holds label 10 at index 2 .* must be in \[0, 10\)",
        ),
        (pickle.dumps({"labels": [0] * 4}, protocol=2), "has no 'data' array"),
    ]
    for content, named in cases:
        batch.write_bytes(content)
        with pytest.raises(DatasetFormatError, match=named) as info:
            load_cifar10(tmp_path)
        assert info.value.path == str(batch)
    assert not marker.exists()
    batch.write_bytes(good)
    assert len(load_cifar10(tmp_path, val_fraction=0.0).train) == 20
    # CIFAR-100 reads "fine_labels" and checks them against 100 classes
    folder100 = write_fake_cifar100(tmp_path)
    data = _cifar_images(rng, 2)
    _dump(folder100 / "test", {"data": data, "fine_labels": [5, 100], "coarse_labels": [0, 0]})
    with pytest.raises(DatasetFormatError, match=r"label 100 at index 1 .* \[0, 100\)"):
        load_cifar100(tmp_path)


def _write_cache(root: Path, train: tuple[int, int], test: tuple[int, int]) -> Path:
    """torchvision's legacy ``MNIST/processed`` cache: ``(images, labels)`` pairs of
    ``train`` and ``test`` = (images, labels) counts."""
    processed = root / "MNIST" / "processed"
    processed.mkdir(parents=True)
    for name, (n, m) in (("training.pt", train), ("test.pt", test)):
        images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8)
        torch.save((images, torch.arange(m) % 10), processed / name)
    return processed


def test_the_mnist_cache_is_checked_like_the_raw_files(tmp_path: Path) -> None:
    """Without the raw files, the processed cache is read: with 150 labels for 200
    training images it is refused (it trained on 150 before), and so is a test file of
    50 images and 40 labels (an IndexError before); a good cache loads."""
    processed = _write_cache(tmp_path, train=(200, 150), test=(50, 50))
    with pytest.raises(DatasetFormatError, match="holds 150 labels, but .* holds 200 images"):
        load_mnist(tmp_path)
    (processed / "training.pt").unlink()
    (processed / "test.pt").unlink()
    processed.rmdir()
    _write_cache(tmp_path, train=(200, 200), test=(50, 40))
    with pytest.raises(DatasetFormatError, match=r"test\.pt.* holds 40 labels"):
        load_mnist(tmp_path)
    torch.save(({"not": "images"}, 3), tmp_path / "MNIST" / "processed" / "test.pt")
    with pytest.raises(DatasetFormatError, match="is not a pair of uint8 images"):
        load_mnist(tmp_path)
    torch.save(
        (torch.zeros(50, 28, 28, dtype=torch.uint8), torch.arange(50) % 10),
        tmp_path / "MNIST" / "processed" / "test.pt",
    )
    split = load_mnist(tmp_path, val_fraction=0.1)
    assert len(split.train) + len(split.val) == 200 and len(split.test) == 50


def test_the_raw_mnist_files_win_over_a_stale_cache(tmp_path: Path) -> None:
    write_fake_mnist(tmp_path, "MNIST", n_train=20, n_test=10)
    _write_cache(tmp_path, train=(200, 150), test=(50, 40))
    split = load_mnist(tmp_path, val_fraction=0.1)
    assert len(split.train) + len(split.val) == 20 and len(split.test) == 10
