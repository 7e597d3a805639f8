"""Image data sets read from local files with torchvision (never downloaded).

Every loader first checks that the expected files exist under ``root`` and
raises :class:`~twodg_pyro.data.errors.DatasetNotFoundError` naming them if
not; torchvision is always called with ``download=False``.

The MNIST and CIFAR files are then read and checked (:mod:`.readers`), not by torchvision's
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

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Subset
from torchvision import datasets
from torchvision.datasets.vision import StandardTransform

from .digits import DataSplit, stratified_split
from .errors import DatasetFormatError, DatasetNotFoundError
from .readers import _checked_mnist_class, _LocalCIFAR10, _LocalCIFAR100
from .transforms import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MNIST_MEAN,
    MNIST_STD,
    _mnist_transform,
    cifar_eval_transform,
    cifar_train_transform,
    imagenet_eval_transform,
    imagenet_train_transform,
)

PathLike = str | os.PathLike[str]

MNIST_URL = "http://yann.lecun.com/exdb/mnist/"
FASHION_MNIST_URL = "https://github.com/zalandoresearch/fashion-mnist"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
IMAGENET_URL = "https://www.image-net.org/download.php"

_MNIST_FILES = [f"{s}-{k}-ubyte" for s in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]


def _with_transform(ds: Any, transform: Callable | None) -> Any:
    """Shallow copy of a torchvision data set (sharing its data) with another transform."""
    new = copy.copy(ds)
    new.transform = transform
    new.transforms = StandardTransform(transform, getattr(ds, "target_transform", None))
    return new


def _split(name, full, val_view, test, input_shape, mean, std, val_fraction, seed) -> DataSplit:
    """The :class:`DataSplit` of ``full`` (train: a stratified share of it, val: the rest
    seen through ``val_view``, ``full`` with the evaluation transform) and ``test``."""
    train_idx, val_idx = stratified_split(full.targets, val_fraction, seed)
    return DataSplit(
        train=Subset(full, train_idx.tolist()),
        val=Subset(val_view, val_idx.tolist()),
        test=test,
        num_classes=len(full.classes),
        input_shape=input_shape,
        name=name,
        info={"mean": mean, "std": std, "classes": list(full.classes), "seed": seed},
    )


#: the MNIST family: torchvision class -> (title, url, mean, std)
_MNIST_FAMILY = {
    datasets.MNIST: ("MNIST", MNIST_URL, MNIST_MEAN, MNIST_STD),
    datasets.FashionMNIST: (
        "Fashion-MNIST",
        FASHION_MNIST_URL,
        FASHION_MNIST_MEAN,
        FASHION_MNIST_STD,
    ),
}


def _load_mnist_like(
    cls: type[datasets.MNIST], root: PathLike, val_fraction: float, seed: int, normalize: bool
) -> DataSplit:
    """An MNIST-family member: the four idx files in ``ROOT/<torchvision class name>/raw``."""
    title, url, mean, std = _MNIST_FAMILY[cls]
    root = Path(root)
    folder = cls.__name__  # torchvision looks in ROOT/<class name>/raw
    expected = [f"{folder}/raw/{f}" for f in _MNIST_FILES]
    legacy = root / folder / "processed"
    has_legacy = (legacy / "training.pt").is_file() and (legacy / "test.pt").is_file()
    if not has_legacy:
        hint = f"Put the four files, decompressed (gunzip), in '{root / folder / 'raw'}'."
        DatasetNotFoundError.check(title, root, expected, url, hint)
    tf = _mnist_transform(mean, std, normalize)
    reader = _checked_mnist_class(cls)
    full = reader(str(root), train=True, transform=tf, download=False)
    test = reader(str(root), train=False, transform=tf, download=False)
    name = title.lower().replace("-", "_")
    return _split(name, full, full, test, (1, 28, 28), mean, std, val_fraction, seed)


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
    return _load_mnist_like(datasets.MNIST, root, val_fraction, seed, normalize)


def load_fashion_mnist(
    root: PathLike, val_fraction: float = 0.1, seed: int = 0, normalize: bool = True
) -> DataSplit:
    """Load Fashion-MNIST from ``root/FashionMNIST/raw/``: the file names, arguments and
    errors of :func:`load_mnist` (``normalize``: with the Fashion-MNIST mean/std)."""
    return _load_mnist_like(datasets.FashionMNIST, root, val_fraction, seed, normalize)


def _load_cifar(
    cls: type[_LocalCIFAR10],
    root: PathLike,
    val_fraction: float,
    seed: int,
    augment: bool,
    verify_checksums: bool,
) -> DataSplit:
    title, mean, std = cls.title, cls.mean, cls.std
    root = Path(root)
    expected = [f"{cls.base_folder}/{f}" for f, _ in cls.train_list + cls.test_list]
    hint = f"Download the python version ({cls.filename}) and unpack it there (tar xzf)."
    DatasetNotFoundError.check(title, root, expected, CIFAR_URL, hint)
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
    name, view = title.lower().replace("-", ""), _with_transform(full, eval_tf)
    return _split(name, full, view, test, (3, 32, 32), mean, std, val_fraction, seed)


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
    return _load_cifar(_LocalCIFAR10, root, val_fraction, seed, augment, verify_checksums)


def load_cifar100(
    root: PathLike,
    val_fraction: float = 0.1,
    seed: int = 0,
    augment: bool = True,
    verify_checksums: bool = False,
) -> DataSplit:
    """Load CIFAR-100 (fine labels) from ``root/cifar-100-python/{train,test}``: the
    arguments and errors of :func:`load_cifar10`."""
    return _load_cifar(_LocalCIFAR100, root, val_fraction, seed, augment, verify_checksums)


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
    DatasetNotFoundError.check(
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
    view, shape = _with_transform(full, eval_tf), (3, image_size, image_size)
    return _split(
        "imagenet", full, view, test, shape, IMAGENET_MEAN, IMAGENET_STD, val_fraction, seed
    )
