"""Checks before any training, each error naming the bad value: the data split, and the
sizes of the 2DG settings against the network's number of Bayesian weights."""

from __future__ import annotations

import torch
from torch.utils.data import Subset, TensorDataset

from ...metrics import check_labels
from ...nn import find_sites
from .config import ConfigError


def _targets(ds):
    """The labels of a file-backed data set (or a ``Subset`` of one) without loading any
    image, or ``None`` when the data set does not list them (``targets``)."""
    if isinstance(ds, Subset):
        inner = _targets(ds.dataset)
        return None if inner is None else inner[torch.as_tensor(ds.indices, dtype=torch.long)]
    targets = getattr(ds, "targets", None)
    return None if targets is None else torch.as_tensor(targets)


def _tensors(ds):
    """``(x, y)`` of a TensorDataset (or a Subset of one), else ``None``."""
    if isinstance(ds, TensorDataset) and len(ds.tensors) >= 2:
        return ds.tensors[0], ds.tensors[1]
    if isinstance(ds, Subset) and isinstance(ds.dataset, TensorDataset):
        idx = torch.as_tensor(ds.indices, dtype=torch.long)
        x, y = ds.dataset.tensors[:2]
        return x[idx], y[idx]
    return None


def check_split(split) -> None:
    """Validate a :class:`~twodg_pyro.data.DataSplit` before training.

    Checks that the training and test sets are not empty; and, for in-memory data
    (``TensorDataset``), that every input is finite, inputs have the split's
    ``input_shape`` and labels are integers in ``[0, num_classes)``.  For file-backed
    data sets (and ``Subset`` views of them, as the train and val sets are) the first
    example's shape and every label (``targets``, when the data set has them) are
    checked.

    Raises:
        ValueError: naming the set, the bad value and where it is.
    """
    if int(split.num_classes) < 1:
        raise ValueError(f"num_classes must be at least 1, got {split.num_classes!r}")
    shape = tuple(split.input_shape)
    for name in ("train", "val", "test"):
        ds = getattr(split, name)
        n = len(ds)
        if n == 0:
            if name == "val":
                continue
            raise ValueError(f"the {name} set of {split.name!r} is empty (0 examples)")
        tensors = _tensors(ds)
        if tensors is None:
            x0, _ = ds[0][:2]
            if torch.is_tensor(x0) and tuple(x0.shape) != shape:
                raise ValueError(
                    f"{name} example 0 has shape {tuple(x0.shape)}, the split declares "
                    f"input shape {shape}"
                )
            targets = _targets(ds)
            if targets is not None:
                check_labels(targets, split.num_classes, what=name)
            continue
        x, y = tensors
        if tuple(x.shape[1:]) != shape:
            raise ValueError(
                f"{name} inputs have shape {tuple(x.shape[1:])} per example, the split "
                f"declares input shape {shape}"
            )
        if x.dtype.is_floating_point:
            bad = ~torch.isfinite(x)
            if bad.any():
                rows = bad.reshape(n, -1).any(1)
                first = int(rows.nonzero()[0, 0])
                value = x.reshape(n, -1)[first][bad.reshape(n, -1)[first]][0].item()
                raise ValueError(
                    f"{name} inputs hold {int(bad.sum())} non-finite value(s) ({value} first, "
                    f"in example {first}; {int(rows.sum())} example(s) affected)"
                )
        if y.shape[0] != n:
            raise ValueError(f"{name} has {n} inputs but {y.shape[0]} labels")
        check_labels(y, split.num_classes, what=name)


def check_sharing_sizes(sharing, net: torch.nn.Module) -> None:
    r"""Validate the 2DG sizes of ``sharing`` (a
    :class:`~twodg_pyro.sharing.SharingConfig`) against the network's
    :math:`n_w` Bayesian weights (those of :func:`~twodg_pyro.nn.find_sites`, as the run's
    model takes them), before stage 1 trains.

    Stage 2 clusters at most :math:`n_w` points (the inliers are fewer), so a mixture of
    :math:`K > n_w` components, or a minimum cluster size :math:`N_\min > n_w`, can only
    fail -- after stage 1 has trained.  (``k_nearest <= K`` is a rule of the settings
    themselves.)

    Raises:
        ConfigError: naming the setting, its value and :math:`n_w`.
    """
    n_weights = sum(site.numel for site in find_sites(net))
    for name, value in (("n_components", sharing.n_components), ("n_min", sharing.n_min)):
        if value > n_weights:
            raise ConfigError(
                f"sharing.{name} = {value}: larger than the network's {n_weights:,} Bayesian "
                f"weights (stage 2 clusters at most that many points); lower {name} or use "
                "a larger network"
            )
