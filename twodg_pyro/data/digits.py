"""The sklearn 8x8 digits data set (bundled with scikit-learn, no files needed).

Also defines :class:`DataSplit`, the container returned by every loader of
:mod:`twodg_pyro.data`, and :func:`stratified_split`, the seeded split they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, TensorDataset


@dataclass
class DataSplit:
    """Train / validation / test data sets of one data set.

    Attributes:
        train: training set (augmented where the loader augments).
        val: validation set (never augmented); may be empty.
        test: test set (never augmented).
        num_classes: number of classes (0 for regression).
        input_shape: shape of one input tensor, e.g. ``(64,)``, ``(1, 28, 28)``.
        name: data set name, e.g. ``"digits"``, ``"cifar10"``.
        info: extra facts (normalisation statistics, class names, seed, ...).
        task: ``"classification"`` (integer labels) or ``"regression"`` (float targets).
    """

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    info: dict[str, Any] = field(default_factory=dict)
    task: Literal["classification", "regression"] = "classification"


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def stratified_split(
    targets: Sequence[int] | np.ndarray | torch.Tensor, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split indices ``0..len(targets)-1`` into ``(rest, held_out)``, stratified by class.

    ``held_out`` holds ``round(fraction * len(targets))`` indices, drawn with the
    given seed so the class proportions match those of ``targets``.  Where the
    counts are too small for stratification (fewer held-out items than
    classes, or a class with a single member) a seeded uniform split is used.
    Both index arrays are sorted.
    """
    _check_fraction("fraction", fraction)
    y = np.asarray(targets.cpu() if isinstance(targets, torch.Tensor) else targets)
    n = len(y)
    idx = np.arange(n)
    n_out = int(round(fraction * n))
    if n_out == 0:
        return idx, idx[:0]
    if n_out >= n:
        raise ValueError(f"fraction {fraction} leaves no items out of {n}")
    try:
        rest, out = train_test_split(idx, test_size=n_out, random_state=seed, stratify=y)
    except ValueError:  # too few items per class to stratify
        rest, out = train_test_split(idx, test_size=n_out, random_state=seed)
    return np.sort(rest), np.sort(out)


def three_way_split(
    targets: np.ndarray, val_fraction: float, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, val, test)`` index arrays of :func:`stratified_split`: the test set
    (``round(test_fraction * n)`` items) drawn first, then the validation set
    (``round(val_fraction * n)``) from the rest, both stratified by ``targets``.

    Raises:
        ValueError: a fraction outside [0, 1), or fractions that leave no training data.
    """
    _check_fraction("val_fraction", val_fraction)
    _check_fraction("test_fraction", test_fraction)
    if val_fraction + test_fraction >= 1.0:
        raise ValueError("val_fraction + test_fraction must be < 1")
    rest, test = stratified_split(targets, test_fraction, seed)
    n_val = int(round(val_fraction * len(targets)))
    if not n_val:
        return rest, rest[:0], test
    # round(n_val / len(rest) * len(rest)) == n_val, so sizes are exact
    keep, held = stratified_split(targets[rest], n_val / len(rest), seed)
    return rest[keep], rest[held], test


def load_digits_split(
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    image: bool = False,
    standardize: bool = True,
) -> DataSplit:
    """Load sklearn's digits (1797 images, 8x8, 10 classes) as a seeded stratified split.

    Pixels (0..16) are scaled to [0, 1].  The test set (``round(test_fraction *
    1797)`` images) is drawn first, then the validation set (``round(val_fraction
    * 1797)`` images) from the rest; both are stratified by class and fixed by
    ``seed``.

    Args:
        val_fraction: fraction of all images used for validation (may be 0).
        test_fraction: fraction of all images used for testing (may be 0).
        seed: seed of the split.
        image: if False the inputs are flat 64-vectors; if True they are
            ``(1, 8, 8)`` images.
        standardize: standardise with statistics of the TRAIN set only.  Flat
            vectors are standardised per feature (pixels constant in the train
            set get std 1, i.e. are only centred); images are standardised with
            one mean and std over all train pixels (per-channel normalisation),
            which keeps the spatial structure.

    Returns:
        :class:`DataSplit` of :class:`~torch.utils.data.TensorDataset` (float32
        inputs, int64 labels) with name ``"digits"``; ``info`` holds ``mean``
        and ``std`` (tensors, broadcastable to one input) when standardised,
        and the index arrays ``train_idx``, ``val_idx``, ``test_idx`` into
        :func:`sklearn.datasets.load_digits`.
    """
    bunch = load_digits()
    x_all = np.asarray(bunch.data, dtype=np.float32) / 16.0
    y_all = np.asarray(bunch.target, dtype=np.int64)
    n = len(y_all)
    train_idx, val_idx, test_idx = three_way_split(y_all, val_fraction, test_fraction, seed)

    x, y = torch.from_numpy(x_all), torch.from_numpy(y_all)
    info: dict[str, Any] = {
        "train_idx": train_idx,
        "val_idx": val_idx,
        "test_idx": test_idx,
        "seed": seed,
        "class_names": [str(c) for c in bunch.target_names],
    }
    if image:
        x = x.view(n, 1, 8, 8)
    if standardize:
        x_train = x[torch.from_numpy(train_idx)]
        if image:
            mean = x_train.mean().view(1, 1, 1)
            std = x_train.std().view(1, 1, 1)
        else:
            mean = x_train.mean(dim=0)
            std = x_train.std(dim=0)
        std = torch.where(std > 1e-8, std, torch.ones_like(std))
        x = (x - mean) / std
        info["mean"], info["std"] = mean, std

    def subset(idx: np.ndarray) -> TensorDataset:
        t = torch.from_numpy(idx)
        return TensorDataset(x[t].contiguous(), y[t].contiguous())

    return DataSplit(
        train=subset(train_idx),
        val=subset(val_idx),
        test=subset(test_idx),
        num_classes=10,
        input_shape=(1, 8, 8) if image else (64,),
        name="digits",
        info=info,
    )
