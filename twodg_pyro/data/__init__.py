"""Data sets and loaders.

Nothing is ever downloaded: the sklearn digits and diabetes data ship with
scikit-learn, the 1-D gap problem is generated (:mod:`twodg_pyro.data.regression`), and
the image data sets are read from local folders (see :mod:`twodg_pyro.data.vision`
for the expected layouts); a missing folder raises :class:`DatasetNotFoundError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .digits import DataSplit, load_digits_split, stratified_split
from .errors import DatasetFormatError, DatasetNotFoundError
from .regression import load_diabetes_split, load_gap1d_split
from .transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    cifar_eval_transform,
    cifar_train_transform,
    imagenet_eval_transform,
    imagenet_train_transform,
)
from .vision import load_cifar10, load_cifar100, load_fashion_mnist, load_imagenet, load_mnist

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "BUNDLED",
    "DATASETS",
    "DEFAULT_ROOT",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DataSplit",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "REGRESSION",
    "available_datasets",
    "cifar_eval_transform",
    "cifar_train_transform",
    "imagenet_eval_transform",
    "imagenet_train_transform",
    "load_cifar10",
    "load_cifar100",
    "load_dataset",
    "load_diabetes_split",
    "load_digits_split",
    "load_fashion_mnist",
    "load_gap1d_split",
    "load_imagenet",
    "load_mnist",
    "make_loader",
    "stratified_split",
]

#: Folder used by :func:`load_dataset` for file-based data sets when ``root`` is None.
DEFAULT_ROOT = "data"

#: Loaders by name; those of :data:`BUNDLED` take no ``root``.
DATASETS: dict[str, Callable[..., DataSplit]] = {
    "digits": load_digits_split,
    "mnist": load_mnist,
    "fashion_mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "imagenet": load_imagenet,
    "diabetes": load_diabetes_split,
    "gap1d": load_gap1d_split,
}


#: The data sets made here, without files (no ``root``): ``digits``, and the regression
#: sets ``diabetes`` and ``gap1d`` (:mod:`twodg_pyro.data.regression`).
BUNDLED = ("digits", "diabetes", "gap1d")
#: The regression data sets (``DataSplit.task == "regression"``).
REGRESSION = ("diabetes", "gap1d")


def available_datasets() -> list[str]:
    """Return the names accepted by :func:`load_dataset`."""
    return list(DATASETS)


def load_dataset(name: str, root: str | os.PathLike[str] | None = None, **kw: Any) -> DataSplit:
    """Load the data set ``name`` and return its :class:`DataSplit`.

    Args:
        name: one of :func:`available_datasets` (case-insensitive, ``-`` may
            stand for ``_``).
        root: data folder for the file-based data sets (default
            :data:`DEFAULT_ROOT`, ``./data``); ignored for the :data:`BUNDLED` ones.
        **kw: passed on to the loader (``val_fraction``, ``seed``, ...).

    Raises:
        ValueError: for an unknown name; the message lists the known names.
        DatasetNotFoundError: if the data set's files are not under ``root``.
    """
    key = name.strip().lower().replace("-", "_")
    if key not in DATASETS:
        raise ValueError(
            f"unknown data set {name!r}; known data sets: {', '.join(available_datasets())}"
        )
    if key in BUNDLED:
        return DATASETS[key](**kw)
    return DATASETS[key](DEFAULT_ROOT if root is None else root, **kw)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    drop_last: bool = False,
) -> DataLoader:
    """Return a :class:`~torch.utils.data.DataLoader` whose randomness is fixed by ``seed``.

    A dedicated :class:`torch.Generator` seeded with ``seed`` drives the
    shuffling order and the base seed of the worker processes, so the batch
    order is reproducible and independent of the global RNG.  With
    ``num_workers=0`` random augmentations run in the main process and draw
    from the global torch RNG (seed it with :func:`torch.manual_seed`); with
    workers they are seeded from the generator as well.
    """
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset, batch_size, shuffle, num_workers=num_workers, drop_last=drop_last, generator=gen
    )
