"""Image data sets read from local files with torchvision (never downloaded).

Every loader first checks that the expected files exist under ``root`` and
raises :class:`~twodg_pyro.data.errors.DatasetNotFoundError` naming them if
not; torchvision is always called with ``download=False``.

The MNIST and CIFAR files are then read and checked here, not by torchvision's
asserts: an idx file must have the right magic number (``0x00000803`` images,
``0x00000801`` labels, unsigned bytes), exactly the size its header announces,
28x28 images and as many labels as images, all in ``[0, 10)``; a CIFAR batch must
unpickle (restricted to NumPy arrays and plain data: no code runs) to a table with
``data`` (``N x 3072`` bytes) and ``N`` labels in range.  A file that fails raises
:class:`~twodg_pyro.data.errors.DatasetFormatError` naming it and the problem.

Each loader returns a :class:`~twodg_pyro.data.digits.DataSplit` whose
``val`` set is carved out of the official training set (stratified by class,
fixed by ``seed``) and whose ``test`` set is the official test set (for
ImageNet: the official validation set).  ``train`` and ``val`` are
:class:`~torch.utils.data.Subset` views of two copies of the same training
data that differ only in their transform, so the validation images are never
augmented.

Transforms (paper App. I.2):

* CIFAR-10/100 train: ``RandomCrop(32, padding=4, padding_mode="reflect")``,
  ``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize(mean, std)``;
  val/test: ``ToTensor()``, ``Normalize(mean, std)``.
* ImageNet train: ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``,
  ``ColorJitter(0.4, 0.4, 0.4, 0.1)``, ``ToTensor()``, ``Normalize``;
  val/test: ``Resize(256)``, ``CenterCrop(224)``, ``ToTensor()``, ``Normalize``.
* MNIST / Fashion-MNIST (no augmentation): ``ToTensor()`` and, by default,
  ``Normalize(mean, std)``.

Random augmentations draw from torch's global RNG in the process that loads
the images (see :func:`twodg_pyro.data.make_loader`).
"""

from __future__ import annotations

import codecs
import copy
import math
import os
import pickle
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset
from torchvision import datasets, transforms
from torchvision.datasets.utils import check_integrity
from torchvision.datasets.vision import StandardTransform, VisionDataset

from .digits import DataSplit, stratified_split
from .errors import DatasetFormatError, DatasetNotFoundError

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MNIST_MEAN",
    "MNIST_STD",
    "cifar_eval_transform",
    "cifar_train_transform",
    "imagenet_eval_transform",
    "imagenet_train_transform",
    "load_cifar10",
    "load_cifar100",
    "load_fashion_mnist",
    "load_imagenet",
    "load_mnist",
]

PathLike = str | os.PathLike[str]

#: Per-channel statistics of the training sets, used by ``Normalize``.
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

MNIST_URL = "http://yann.lecun.com/exdb/mnist/"
FASHION_MNIST_URL = "https://github.com/zalandoresearch/fashion-mnist"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
IMAGENET_URL = "https://www.image-net.org/download.php"

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


# --------------------------------------------------------------------------- transforms
def cifar_train_transform(
    mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD
) -> transforms.Compose:
    """CIFAR training augmentation: reflect-pad 4, random crop 32, flip, normalise."""
    return transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4, padding_mode="reflect"),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


def cifar_eval_transform(
    mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD
) -> transforms.Compose:
    """CIFAR evaluation transform: normalise only."""
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])


def imagenet_train_transform(image_size: int = 224) -> transforms.Compose:
    """ImageNet training augmentation: random-resized crop, flip, colour jitter, normalise."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.4, 0.4, 0.4, 0.1),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def imagenet_eval_transform(image_size: int = 224, resize_size: int = 256) -> transforms.Compose:
    """ImageNet evaluation transform: resize 256, centre crop 224, normalise."""
    return transforms.Compose(
        [
            transforms.Resize(resize_size),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _mnist_transform(mean: Sequence[float], std: Sequence[float], normalize: bool) -> Callable:
    steps: list[Callable] = [transforms.ToTensor()]
    if normalize:
        steps.append(transforms.Normalize(mean, std))
    return transforms.Compose(steps)


# --------------------------------------------------------------------------- helpers
def _require(
    dataset: str,
    root: Path,
    expected: Sequence[str],
    url: str,
    hint: str | None = None,
    present: Callable[[Path], bool] = Path.is_file,
) -> None:
    """Raise DatasetNotFoundError unless every ``root / e`` for ``e`` in ``expected`` exists."""
    missing = [e for e in expected if not present(root / e)]
    if missing:
        raise DatasetNotFoundError(dataset, root, expected, url, missing=missing, hint=hint)


def _with_transform(ds: Any, transform: Callable | None) -> Any:
    """Shallow copy of a torchvision data set (sharing its data) with another transform."""
    new = copy.copy(ds)
    new.transform = transform
    new.transforms = StandardTransform(transform, getattr(ds, "target_transform", None))
    return new


def _carve_val(
    train_ds: Dataset,
    eval_ds: Dataset,
    targets: Sequence[int] | np.ndarray | Any,
    val_fraction: float,
    seed: int,
) -> tuple[Subset, Subset]:
    """Split the training set into (train Subset of ``train_ds``, val Subset of ``eval_ds``)."""
    train_idx, val_idx = stratified_split(targets, val_fraction, seed)
    return Subset(train_ds, train_idx.tolist()), Subset(eval_ds, val_idx.tolist())


# --------------------------------------------------------------------------- idx files
#: idx type code of unsigned bytes (the only one MNIST-family files use).
_IDX_UBYTE = 0x08


def read_idx(path: PathLike, ndim: int) -> np.ndarray:
    """Read an idx file of unsigned bytes with ``ndim`` dimensions, checking it.

    The format (LeCun's MNIST page): a 4-byte magic number ``0x00 0x00 0x08 ndim``,
    ``ndim`` big-endian 32-bit sizes, then the bytes in C order.

    Raises:
        DatasetFormatError: empty, too short, a wrong magic number (e.g. a file still
            gzip-compressed), or a size other than the header announces.
    """
    path = Path(path)
    try:
        raw = bytearray(path.read_bytes())
    except OSError as e:
        raise DatasetFormatError(path, f"cannot be read: {e.strerror or e}") from e
    head = 4 + 4 * ndim
    if not raw:
        raise DatasetFormatError(path, "is empty (0 bytes); expected an idx file")
    if raw[:2] == b"\x1f\x8b":
        raise DatasetFormatError(path, "is gzip-compressed: decompress it (gunzip) first")
    if len(raw) < head:
        raise DatasetFormatError(
            path, f"is too short for an idx file ({len(raw)} bytes; its header alone is {head})"
        )
    magic = struct.unpack(">I", bytes(raw[:4]))[0]
    expected = (_IDX_UBYTE << 8) | ndim
    if magic != expected:
        raise DatasetFormatError(
            path,
            f"has magic number {magic:#010x}, expected {expected:#010x} (an idx file of "
            f"unsigned bytes with {ndim} dimension(s)): not the right file, or damaged",
        )
    dims = struct.unpack(f">{ndim}I", bytes(raw[4:head]))
    size = head + math.prod(dims)
    if len(raw) != size:
        what = "truncated" if len(raw) < size else f"{len(raw) - size} byte(s) too long"
        raise DatasetFormatError(
            path,
            f"has {len(raw)} bytes, its header announces {' x '.join(map(str, dims))} values "
            f"({size} bytes with the header): {what}",
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(dims)


def read_idx_pair(
    folder: PathLike, prefix: str, num_classes: int = 10, image_size: tuple[int, int] = (28, 28)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The images (``uint8``, ``N x H x W``) and labels (``int64``, ``N``) of the idx
    files ``<prefix>-images-idx3-ubyte`` and ``<prefix>-labels-idx1-ubyte``, checked
    (:func:`read_idx`; image size, equal counts, labels in ``[0, num_classes)``).

    Raises:
        DatasetFormatError: naming the file and the problem.
    """
    folder = Path(folder)
    image_path = folder / f"{prefix}-images-idx3-ubyte"
    label_path = folder / f"{prefix}-labels-idx1-ubyte"
    images = read_idx(image_path, 3)
    labels = read_idx(label_path, 1)
    if tuple(images.shape[1:]) != tuple(image_size):
        raise DatasetFormatError(
            image_path,
            f"holds images of {images.shape[1]}x{images.shape[2]} pixels, expected "
            f"{image_size[0]}x{image_size[1]}",
        )
    if images.shape[0] != labels.shape[0]:
        raise DatasetFormatError(
            label_path,
            f"holds {labels.shape[0]} labels, but '{image_path}' holds {images.shape[0]} images",
        )
    if labels.size and int(labels.max()) >= num_classes:
        i = int(np.argmax(labels >= num_classes))
        raise DatasetFormatError(
            label_path,
            f"holds label {int(labels[i])} at index {i} "
            f"({int((labels >= num_classes).sum())} bad label(s)); labels must be in "
            f"[0, {num_classes})",
        )
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


class _CheckedIdxMixin:
    """Reads a torchvision MNIST-family data set with :func:`read_idx_pair` (checked) and
    keeps torchvision's folder layout (``ROOT/<torchvision class name>/raw``)."""

    _folder: str = "MNIST"

    @property
    def raw_folder(self) -> str:
        return os.path.join(self.root, self._folder, "raw")

    @property
    def processed_folder(self) -> str:
        return os.path.join(self.root, self._folder, "processed")

    def _load_data(self):
        return read_idx_pair(self.raw_folder, "train" if self.train else "t10k")

    def _load_legacy_data(self):
        path = os.path.join(
            self.processed_folder, self.training_file if self.train else self.test_file
        )
        try:
            data = torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any failure on foreign bytes
            raise DatasetFormatError(path, f"cannot be read: {type(e).__name__}: {e}") from e
        ok = (
            isinstance(data, (tuple, list))
            and len(data) == 2
            and all(torch.is_tensor(t) for t in data)
            and data[0].dim() == 3
            and data[1].dim() == 1
            and data[0].shape[0] == data[1].shape[0]
        )
        if not ok:
            raise DatasetFormatError(path, "is not an (images N x H x W, labels N) pair")
        return data[0], data[1].long()


def _checked_mnist_class(cls: type[datasets.MNIST]) -> type[datasets.MNIST]:
    return type(f"Checked{cls.__name__}", (_CheckedIdxMixin, cls), {"_folder": cls.__name__})


# --------------------------------------------------------------------------- MNIST family
@dataclass(frozen=True)
class _MnistVariant:
    """One member of the MNIST family: its torchvision class and its statistics.

    Every member has the same four idx files, in ``ROOT/<class name>/raw``.
    """

    cls: type[datasets.MNIST]
    name: str  # DataSplit.name
    title: str  # in error messages
    url: str
    mean: Sequence[float]
    std: Sequence[float]


_MNIST = _MnistVariant(datasets.MNIST, "mnist", "MNIST", MNIST_URL, MNIST_MEAN, MNIST_STD)
_FASHION_MNIST = _MnistVariant(
    datasets.FashionMNIST,
    "fashion_mnist",
    "Fashion-MNIST",
    FASHION_MNIST_URL,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
)


def _load_mnist_like(
    variant: _MnistVariant, root: PathLike, val_fraction: float, seed: int, normalize: bool
) -> DataSplit:
    cls, mean, std = variant.cls, variant.mean, variant.std
    root = Path(root)
    folder = cls.__name__  # torchvision looks in ROOT/<class name>/raw
    expected = [f"{folder}/raw/{f}" for f in _MNIST_FILES]
    legacy = root / folder / "processed"
    has_legacy = (legacy / "training.pt").is_file() and (legacy / "test.pt").is_file()
    if not has_legacy:
        _require(
            variant.title,
            root,
            expected,
            variant.url,
            hint=f"Put the four files, decompressed (gunzip), in '{root / folder / 'raw'}'.",
        )
    tf = _mnist_transform(mean, std, normalize)
    reader = _checked_mnist_class(cls)
    full = reader(str(root), train=True, transform=tf, download=False)
    test = reader(str(root), train=False, transform=tf, download=False)
    train, val = _carve_val(full, full, full.targets, val_fraction, seed)
    return DataSplit(
        train=train,
        val=val,
        test=test,
        num_classes=10,
        input_shape=(1, 28, 28),
        name=variant.name,
        info={"mean": mean, "std": std, "classes": list(full.classes), "seed": seed},
    )


def load_mnist(
    root: PathLike, val_fraction: float = 0.1, seed: int = 0, normalize: bool = True
) -> DataSplit:
    """Load MNIST from ``root/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``.

    Args:
        root: folder holding the ``MNIST`` sub-folder.
        val_fraction: fraction of the 60,000 training images held out for validation.
        seed: seed of the stratified validation split.
        normalize: normalise with the MNIST mean/std (else pixels are in [0, 1]).

    Raises:
        DatasetNotFoundError: if any of the four files is missing.
        DatasetFormatError: a file that is not a valid idx file (named).
    """
    return _load_mnist_like(_MNIST, root, val_fraction, seed, normalize)


def load_fashion_mnist(
    root: PathLike, val_fraction: float = 0.1, seed: int = 0, normalize: bool = True
) -> DataSplit:
    """Load Fashion-MNIST from ``root/FashionMNIST/raw/`` (same file names as MNIST).

    Args:
        root: folder holding the ``FashionMNIST`` sub-folder.
        val_fraction: fraction of the 60,000 training images held out for validation.
        seed: seed of the stratified validation split.
        normalize: normalise with the Fashion-MNIST mean/std (else pixels are in [0, 1]).

    Raises:
        DatasetNotFoundError: if any of the four files is missing.
        DatasetFormatError: a file that is not a valid idx file (named).
    """
    return _load_mnist_like(_FASHION_MNIST, root, val_fraction, seed, normalize)


# --------------------------------------------------------------------------- CIFAR
class _PlainUnpickler(pickle.Unpickler):
    """Unpickles NumPy arrays and plain data only: any other class is refused, so a
    crafted file cannot run code."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (not plain data)")
        if module == "_codecs":
            return codecs.encode
        if module == "numpy":
            return getattr(np, name)
        from numpy._core import multiarray

        return getattr(multiarray, name)


def _plain_pickle(path: Path) -> Any:
    """Unpickle ``path`` (Python 2 strings as latin-1, as torchvision does) with
    :class:`_PlainUnpickler`."""
    try:
        with open(path, "rb") as f:
            return _PlainUnpickler(f, encoding="latin1").load()
    except OSError as e:
        raise DatasetFormatError(path, f"cannot be read: {e.strerror or e}") from e
    except Exception as e:  # noqa: BLE001 - truncated, foreign or crafted bytes
        raise DatasetFormatError(
            path,
            f"is not a CIFAR python batch file (truncated or damaged?): {type(e).__name__}: {e}",
        ) from e


def read_cifar_batch(path: PathLike, num_classes: int) -> tuple[np.ndarray, list[int]]:
    """The images (``uint8``, ``N x 3072``, R, G, B planes) and labels of one CIFAR
    python batch file, checked: a table with ``data`` and ``labels`` (CIFAR-10) or
    ``fine_labels`` (CIFAR-100), as many labels as images, all in ``[0, num_classes)``.

    Raises:
        DatasetFormatError: naming the file and the problem.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        raise DatasetFormatError(path, "is empty (0 bytes); expected a CIFAR python batch file")
    entry = _plain_pickle(path)
    if not isinstance(entry, dict):
        raise DatasetFormatError(path, f"holds a {type(entry).__name__}, not a CIFAR batch table")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    data = entry.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise DatasetFormatError(path, "has no 'data' array of bytes (N x 3072)")
    if data.shape[1] != 3 * 32 * 32:
        raise DatasetFormatError(
            path, f"holds images of {data.shape[1]} bytes, expected 3072 (3 x 32 x 32)"
        )
    key = "labels" if "labels" in entry else "fine_labels"
    labels = entry.get(key)
    if not isinstance(labels, (list, tuple, np.ndarray)):
        raise DatasetFormatError(path, "has no 'labels' (CIFAR-10) or 'fine_labels' (CIFAR-100)")
    try:
        labels = [int(v) for v in labels]
    except (TypeError, ValueError) as e:
        raise DatasetFormatError(path, f"holds a label that is not an integer: {e}") from e
    if len(labels) != data.shape[0]:
        raise DatasetFormatError(
            path, f"holds {data.shape[0]} images but {len(labels)} labels ('{key}')"
        )
    bad = [i for i, v in enumerate(labels) if not 0 <= v < num_classes]
    if bad:
        raise DatasetFormatError(
            path,
            f"holds label {labels[bad[0]]} at index {bad[0]} ({len(bad)} bad label(s)); "
            f"labels must be in [0, {num_classes})",
        )
    return data, labels


class _LocalCIFAR10(datasets.CIFAR10):
    """CIFAR-10 reader that checks file presence (MD5 only on request) and reads every
    batch file with :func:`read_cifar_batch` (checked, no code runs).

    torchvision checks the MD5 sums of every batch file; that is optional here
    (``verify_checksums``) so that subsets or re-pickled copies in the same
    format can be read.  A missing or unverified ``batches.meta`` falls back
    to the standard class names.
    """

    default_classes: Sequence[str] = CIFAR10_CLASSES
    num_classes: int = 10

    def __init__(self, root: str, train: bool, transform: Callable | None, verify: bool) -> None:
        self._verify = verify
        VisionDataset.__init__(self, root, transform=transform, target_transform=None)
        self.train = train
        if not self._check_integrity():
            raise RuntimeError("Dataset not found or corrupted (MD5 check failed)")
        data, targets = [], []
        for name, _ in self.train_list if train else self.test_list:
            x, y = read_cifar_batch(
                os.path.join(self.root, self.base_folder, name), self.num_classes
            )
            data.append(x)
            targets.extend(y)
        self.data = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
        self.targets = targets
        self._load_meta()

    def _check_integrity(self) -> bool:
        if self._verify:
            return super()._check_integrity()
        return all(
            os.path.isfile(os.path.join(self.root, self.base_folder, f))
            for f, _ in self.train_list + self.test_list
        )

    def _load_meta(self) -> None:
        path = os.path.join(self.root, self.base_folder, self.meta["filename"])
        self.classes = list(self.default_classes)
        if os.path.isfile(path) and (not self._verify or check_integrity(path, self.meta["md5"])):
            meta = _plain_pickle(Path(path))
            names = meta.get(self.meta["key"]) if isinstance(meta, dict) else None
            if isinstance(names, (list, tuple)) and len(names) == self.num_classes:
                self.classes = [str(n) for n in names]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}


class _LocalCIFAR100(_LocalCIFAR10):
    base_folder = datasets.CIFAR100.base_folder
    train_list = datasets.CIFAR100.train_list
    test_list = datasets.CIFAR100.test_list
    meta = datasets.CIFAR100.meta
    default_classes = tuple(str(i) for i in range(100))
    num_classes = 100


@dataclass(frozen=True)
class _CifarVariant:
    """CIFAR-10 or CIFAR-100: the local reader (file names, folder), archive and statistics."""

    cls: type[_LocalCIFAR10]
    name: str  # DataSplit.name
    title: str  # in error messages
    num_classes: int
    archive: str  # the official python-version archive
    mean: Sequence[float]
    std: Sequence[float]


_CIFAR10 = _CifarVariant(
    _LocalCIFAR10,
    "cifar10",
    "CIFAR-10",
    10,
    datasets.CIFAR10.filename,
    CIFAR10_MEAN,
    CIFAR10_STD,
)
_CIFAR100 = _CifarVariant(
    _LocalCIFAR100,
    "cifar100",
    "CIFAR-100",
    100,
    datasets.CIFAR100.filename,
    CIFAR100_MEAN,
    CIFAR100_STD,
)


def _load_cifar(
    variant: _CifarVariant,
    root: PathLike,
    val_fraction: float,
    seed: int,
    augment: bool,
    verify_checksums: bool,
) -> DataSplit:
    cls, title, mean, std = variant.cls, variant.title, variant.mean, variant.std
    root = Path(root)
    files = [f for f, _ in cls.train_list + cls.test_list]
    expected = [f"{cls.base_folder}/{f}" for f in files]
    _require(
        title,
        root,
        expected,
        CIFAR_URL,
        hint=f"Download the python version ({variant.archive}) and unpack it there (tar xzf).",
    )
    eval_tf = cifar_eval_transform(mean, std)
    train_tf = cifar_train_transform(mean, std) if augment else eval_tf
    try:
        full = cls(str(root), train=True, transform=train_tf, verify=verify_checksums)
        test = cls(str(root), train=False, transform=eval_tf, verify=verify_checksums)
    except RuntimeError as err:
        if not verify_checksums:
            raise
        raise DatasetFormatError(
            root / cls.base_folder,
            f"({title}) failed the MD5 check against the official files: {err}",
        ) from err
    train, val = _carve_val(full, _with_transform(full, eval_tf), full.targets, val_fraction, seed)
    return DataSplit(
        train=train,
        val=val,
        test=test,
        num_classes=variant.num_classes,
        input_shape=(3, 32, 32),
        name=variant.name,
        info={"mean": mean, "std": std, "classes": list(full.classes), "seed": seed},
    )


def load_cifar10(
    root: PathLike,
    val_fraction: float = 0.1,
    seed: int = 0,
    augment: bool = True,
    verify_checksums: bool = False,
) -> DataSplit:
    """Load CIFAR-10 from ``root/cifar-10-batches-py/{data_batch_1..5,test_batch}``.

    Args:
        root: folder holding ``cifar-10-batches-py`` (the unpacked python version).
        val_fraction: fraction of the 50,000 training images held out for validation.
        seed: seed of the stratified validation split.
        augment: apply the paper's training augmentation to ``train``
            (reflect-pad 4, random crop 32, horizontal flip); val/test are only normalised.
        verify_checksums: also check the official MD5 sums of the files.

    Raises:
        DatasetNotFoundError: if a batch file is missing.
        DatasetFormatError: a batch file that is not a valid CIFAR batch, or one that
            fails the MD5 check (with ``verify_checksums``).
    """
    return _load_cifar(_CIFAR10, root, val_fraction, seed, augment, verify_checksums)


def load_cifar100(
    root: PathLike,
    val_fraction: float = 0.1,
    seed: int = 0,
    augment: bool = True,
    verify_checksums: bool = False,
) -> DataSplit:
    """Load CIFAR-100 (fine labels) from ``root/cifar-100-python/{train,test}``.

    Args:
        root: folder holding ``cifar-100-python`` (the unpacked python version).
        val_fraction: fraction of the 50,000 training images held out for validation.
        seed: seed of the stratified validation split.
        augment: apply the paper's training augmentation to ``train``.
        verify_checksums: also check the official MD5 sums of the files.

    Raises:
        DatasetNotFoundError: if ``train`` or ``test`` is missing.
        DatasetFormatError: a file that is not a valid CIFAR batch, or one that fails the
            MD5 check (with ``verify_checksums``).
    """
    return _load_cifar(_CIFAR100, root, val_fraction, seed, augment, verify_checksums)


# --------------------------------------------------------------------------- ImageNet
def _has_class_folders(path: Path) -> bool:
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


def load_imagenet(
    root: PathLike,
    val_fraction: float = 0.01,
    seed: int = 0,
    augment: bool = True,
    image_size: int = 224,
    resize_size: int = 256,
) -> DataSplit:
    """Load ImageNet (ILSVRC-2012) from an ImageFolder layout.

    Expected layout: ``root/train/<wnid>/*.JPEG`` and ``root/val/<wnid>/*.JPEG``
    (the official validation images sorted into one folder per class).  The
    official validation set becomes ``test``; ``val`` is carved from the
    training images.

    Args:
        root: folder holding ``train`` and ``val``.
        val_fraction: fraction of the training images held out for validation.
        seed: seed of the stratified validation split.
        augment: apply random-resized crop, flip and colour jitter to ``train``.
        image_size: crop size (224 in the paper).
        resize_size: resize before the centre crop for evaluation (256).

    Raises:
        DatasetNotFoundError: if ``train`` or ``val`` has no class sub-folders.
        ValueError: if ``train`` and ``val`` have different class folders.
    """
    root = Path(root)
    _require(
        "ImageNet (ILSVRC-2012)",
        root,
        ["train/<wnid>/*.JPEG", "val/<wnid>/*.JPEG"],
        IMAGENET_URL,
        hint="Unpack ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar there and sort the "
        "validation images into one sub-folder per class (wnid).",
        present=lambda p: _has_class_folders(p.parent.parent),
    )
    eval_tf = imagenet_eval_transform(image_size, resize_size)
    train_tf = imagenet_train_transform(image_size) if augment else eval_tf
    full = datasets.ImageFolder(str(root / "train"), transform=train_tf)
    test = datasets.ImageFolder(str(root / "val"), transform=eval_tf)
    if full.classes != test.classes:
        raise ValueError(
            f"ImageNet class folders differ between '{root / 'train'}' ({len(full.classes)}) "
            f"and '{root / 'val'}' ({len(test.classes)})"
        )
    train, val = _carve_val(full, _with_transform(full, eval_tf), full.targets, val_fraction, seed)
    return DataSplit(
        train=train,
        val=val,
        test=test,
        num_classes=len(full.classes),
        input_shape=(3, image_size, image_size),
        name="imagenet",
        info={
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
            "classes": list(full.classes),
            "seed": seed,
        },
    )
