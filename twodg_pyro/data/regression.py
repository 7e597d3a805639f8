r"""Regression data sets, nothing downloaded: scikit-learn's bundled diabetes data and a
1-D problem with a gap, generated deterministically.

Both return a :class:`~twodg_pyro.data.DataSplit` with ``task = "regression"``,
``num_classes = 0``, float32 inputs and targets of shape ``(N,)``, standardised with the
statistics of the data that are not held out for testing (``info["target_mean"]``,
``info["target_std"]``: a
prediction :math:`\mu, \sigma` in standard units is :math:`m + s\mu, s\sigma` in the
data's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_diabetes
from torch.utils.data import TensorDataset

from .digits import DataSplit, _check_fraction, three_way_split

__all__ = ["GAP", "load_diabetes_split", "load_gap1d_split"]

#: The gap of :func:`load_gap1d_split`: no training input lies in this open interval.
GAP = (-0.5, 0.5)


def _split(
    x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], name: str, info: dict[str, Any]
) -> DataSplit:
    """Standardise ``x`` and ``y`` by the statistics of ``parts[0]`` and ``parts[1]`` (the
    training and validation sets: so the test set does not depend on ``val_fraction``) and
    return the split of the index arrays ``parts`` (train, val, test)."""
    train = np.concatenate(parts[:2])
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    x_std = np.where(x_std > 1e-8, x_std, 1.0)
    y_mean, y_std = float(y[train].mean()), float(y[train].std())
    xs = torch.from_numpy(((x - x_mean) / x_std).astype(np.float32))
    ys = torch.from_numpy(((y - y_mean) / y_std).astype(np.float32))
    sets = [TensorDataset(xs[torch.from_numpy(i)], ys[torch.from_numpy(i)]) for i in parts]
    info.update(
        input_mean=torch.from_numpy(x_mean.astype(np.float32)),
        input_std=torch.from_numpy(x_std.astype(np.float32)),
        target_mean=y_mean,
        target_std=y_std,
    )
    return DataSplit(*sets, 0, (x.shape[1],), name, info, task="regression")


def load_diabetes_split(
    val_fraction: float = 0.0, test_fraction: float = 0.2, seed: int = 0
) -> DataSplit:
    """scikit-learn's diabetes data (442 patients, 10 features, a disease-progression
    score one year on) as a seeded random split, standardised by the non-test patients.

    Args:
        val_fraction: fraction of all patients held out for validation (may be 0).
        test_fraction: fraction of all patients held out for testing.
        seed: seed of the split.

    Returns:
        a :class:`~twodg_pyro.data.DataSplit` named ``"diabetes"``; ``info`` holds the
        index arrays into :func:`sklearn.datasets.load_diabetes` and the statistics.

    Raises:
        ValueError: a fraction outside [0, 1), or fractions that leave no training data.
    """
    x, y = load_diabetes(return_X_y=True)
    rest, val, test = three_way_split(np.zeros(len(y)), val_fraction, test_fraction, seed)
    info = {"train_idx": rest, "val_idx": val, "test_idx": test, "seed": seed}
    return _split(x, y.astype(np.float64), [rest, val, test], "diabetes", info)


def load_gap1d_split(
    n_train: int = 80, noise: float = 0.1, seed: int = 0, val_fraction: float = 0.0
) -> DataSplit:
    r"""A 1-D regression with a gap in its inputs, generated deterministically from
    ``seed``: :math:`y = \sin(3x) + \epsilon`, :math:`\epsilon \sim \mathcal N(0,
    \text{noise}^2)`, with inputs drawn uniformly from :math:`[-1.5, -0.5] \cup [0.5, 1.5]`
    (half on each side of the gap :data:`GAP`).

    The test set is ``n_train // 2`` fresh points of the same kind (``val_fraction`` of
    the ``n_train`` points, the last ones, are the validation set); ``info["gap_x"]``
    holds 49 inputs evenly inside the gap and ``info["grid_x"]`` 301 inputs over
    :math:`[-2.5, 2.5]`, in the standardised units of the inputs (a model's spread there
    is what the gap measures: :math:`\sigma_{\text{epi}}` in the gap against on the data).

    Raises:
        ValueError: ``n_train < 4``, a negative noise, a ``val_fraction`` outside [0, 1).
    """
    if int(n_train) < 4:
        raise ValueError(f"n_train must be at least 4, got {n_train!r}")
    _check_fraction("val_fraction", val_fraction)
    if not float(noise) >= 0:
        raise ValueError(f"noise must be >= 0, got {noise!r}")
    rng = np.random.default_rng(seed)
    n_test = int(n_train) // 2
    m = int(n_train) + n_test
    side = np.where(np.arange(m) % 2 == 0, -1.0, 1.0)
    x = side * rng.uniform(0.5, 1.5, m)
    y = np.sin(3 * x) + float(noise) * rng.standard_normal(m)
    idx = np.arange(m)
    n_fit = int(n_train) - int(round(val_fraction * int(n_train)))
    parts = [idx[:n_fit], idx[n_fit : int(n_train)], idx[int(n_train) :]]
    split = _split(x[:, None], y, parts, "gap1d", {"seed": seed, "gap": GAP, "noise": noise})
    mean, std = float(split.info["input_mean"]), float(split.info["input_std"])
    gap = np.linspace(*GAP, 51)[1:-1]
    for key, raw in (("gap_x", gap), ("grid_x", np.linspace(-2.5, 2.5, 301))):
        split.info[key] = torch.from_numpy(((raw[:, None] - mean) / std).astype(np.float32))
    return split
