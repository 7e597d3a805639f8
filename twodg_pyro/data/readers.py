"""Readers of the image data sets' files, checked here rather than by torchvision: MNIST's
idx files and CIFAR's pickled batches (read without executing code), and the dataset
classes that use them."""

from __future__ import annotations

import codecs
import math
import os
import pickle
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision import datasets
from torchvision.datasets.utils import check_integrity
from torchvision.datasets.vision import VisionDataset

from .errors import DatasetFormatError
from .transforms import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD

PathLike = str | os.PathLike[str]

CIFAR10_CLASSES = tuple("airplane automobile bird cat deer dog frog horse ship truck".split())

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
    images, labels = read_idx(image_path, 3), read_idx(label_path, 1)
    return _check_pair(image_path, label_path, images, labels, num_classes, image_size)


def _check_pair(image_path, label_path, images, labels, num_classes: int, image_size):
    """``(images, labels)`` as tensors (``uint8``, ``int64``) once checked: ``N x H x W``
    images of ``image_size``, ``N`` labels in ``[0, num_classes)``."""
    if images.ndim != 3 or tuple(images.shape[1:]) != tuple(image_size):
        raise DatasetFormatError(
            image_path,
            f"holds images of {'x'.join(map(str, images.shape[1:]))} pixels, expected "
            f"{image_size[0]}x{image_size[1]}",
        )
    if labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise DatasetFormatError(
            label_path,
            f"holds {labels.shape[0]} labels, but '{image_path}' holds {images.shape[0]} images",
        )
    _check_label_range(label_path, labels, num_classes)
    return torch.as_tensor(images), torch.as_tensor(labels).long()


def _check_label_range(path: Path, labels, num_classes: int) -> None:
    labels = np.asarray(labels)
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        raise DatasetFormatError(
            path,
            f"holds label {int(labels[bad[0]])} at index {bad[0]} ({bad.size} bad label(s)); "
            f"labels must be in [0, {num_classes})",
        )


class _CheckedIdxMixin:
    """Reads a torchvision MNIST-family data set with :func:`read_idx_pair` (checked) and
    keeps torchvision's folder layout (``ROOT/<torchvision class name>/raw``: the checked
    class has torchvision's name, :func:`_checked_mnist_class`).  Its legacy cache
    (``processed/training.pt``, ``test.pt``) is read only without the raw files, and
    checked like them (a pair of ``uint8`` images and labels, loaded without executing
    code)."""

    def _load_data(self):
        return read_idx_pair(self.raw_folder, "train" if self.train else "t10k")

    def _check_legacy_exist(self) -> bool:  # the raw files, when there, win
        return not self._check_exists() and super()._check_legacy_exist()

    def _load_legacy_data(self):
        from ..files.atomic import safe_torch_load

        path = Path(self.processed_folder, self.training_file if self.train else self.test_file)
        try:
            data = safe_torch_load(path)
        except ValueError as e:
            raise DatasetFormatError(path, f"cannot be read: {e}") from e
        if not (
            isinstance(data, (tuple, list))
            and len(data) == 2
            and all(torch.is_tensor(t) and t.dtype in (torch.uint8, torch.int64) for t in data)
        ):
            raise DatasetFormatError(path, "is not a pair of uint8 images and integer labels")
        images, labels = data
        if images.dtype != torch.uint8:
            raise DatasetFormatError(path, f"holds images of {images.dtype}, not uint8")
        return _check_pair(path, path, images, labels, len(self.classes), (28, 28))


def _checked_mnist_class(cls: type[datasets.MNIST]) -> type[datasets.MNIST]:
    # torchvision's name: its folders are ROOT/<class name>/raw and processed
    return type(cls.__name__, (_CheckedIdxMixin, cls), {})


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles NumPy arrays and plain data only: any other class is refused, so a
    crafted file cannot run code."""

    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")} | {
        (f"numpy.{core}.multiarray", name)
        for core in ("core", "_core")
        for name in ("_reconstruct", "scalar")
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
    _check_label_range(path, labels, num_classes)
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
    title, mean, std = "CIFAR-10", CIFAR10_MEAN, CIFAR10_STD

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


class _LocalCIFAR100(_LocalCIFAR10, datasets.CIFAR100):
    # the files (base_folder, train_list, test_list, meta) are CIFAR100's, the reading ours
    default_classes = tuple(str(i) for i in range(100))
    num_classes = 100
    title, mean, std = "CIFAR-100", CIFAR100_MEAN, CIFAR100_STD
