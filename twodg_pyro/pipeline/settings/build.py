"""From settings to objects: data loaders, networks, priors, models."""

from __future__ import annotations

import math
import random

import numpy as np
import pyro
import torch
from torch import nn

from ...bnn import BNNModel
from ...data import DataSplit, load_dataset, make_loader
from ...likelihoods import Categorical
from ...nn.sites import DEFAULT_LAYER_TYPES
from ...priors import Prior, prior_class
from ...settings import ConfigError
from .sections import DataConfig, NetworkConfig, PriorConfig, torch_dtype


def check_device(device: str | torch.device, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` when this machine has it (``name``: the setting or
    option, for messages).

    Raises:
        ConfigError: a CUDA device on a machine without CUDA, or a GPU index beyond the
            GPUs present (naming the value and what there is).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"{name} = {device!r}: not a torch device ({e})") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{name} = {str(device)!r}, but CUDA is not available here "
                "(torch.cuda.is_available() is False); use device = 'cpu'"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(
                f"{name} = {str(device)!r}, but this machine has {count} GPU(s) "
                f"(cuda:0 to cuda:{count - 1})"
            )
    elif dev.type != "cpu":
        raise ConfigError(f"{name} = {str(device)!r}: must be 'cpu' or 'cuda[:i]'")
    return dev


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy, torch and Pyro."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)


def load_data(cfg: DataConfig, image: bool) -> DataSplit:
    """The configured data set (digits as flat vectors or 1x8x8 images)."""
    kw = {"test_fraction": cfg.test_fraction, "image": image} if cfg.name == "digits" else {}
    if cfg.name.startswith("cifar"):
        kw["augment"] = cfg.augment
    return load_dataset(
        cfg.name, cfg.root, val_fraction=cfg.val_fraction, seed=cfg.split_seed, **kw
    )


def train_loader(split: DataSplit, cfg: DataConfig, seed: int):
    """Shuffled, seeded training batches."""
    return make_loader(split.train, cfg.batch_size, shuffle=True, seed=seed)


#: examples per batch when a dataset that holds no tensors is evaluated
EVAL_BATCH = 512


def eval_data(dataset, device=None):
    """A dataset to evaluate on: its ``(X, y)`` tensors when it holds them (a
    ``TensorDataset``; moved to ``device`` when given), else its batches of
    :data:`EVAL_BATCH` in order (moved when they are used)."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is None:
        return torch.utils.data.DataLoader(dataset, batch_size=EVAL_BATCH)
    x, y = tensors[0], tensors[1]
    return (x, y) if device is None else (x.to(device), y.to(device))


def network_spec(cfg: NetworkConfig, split: DataSplit) -> dict:
    """``{"name", "kwargs"}`` of :func:`twodg_pyro.models.build_network` for ``split``'s
    input shape and classes (JSON-serialisable: a model file stores it)."""
    shape = tuple(int(d) for d in split.input_shape)
    kwargs = {"num_classes": int(split.num_classes)}
    if cfg.arch == "mlp":
        kwargs = {"in_features": math.prod(shape), "hidden": [int(h) for h in cfg.hidden], **kwargs}
    elif cfg.arch == "lenet5":
        kwargs.update(in_channels=shape[0], input_size=shape[-1])
    else:
        kwargs["in_channels"] = shape[0]
    return {"name": cfg.arch, "kwargs": kwargs}


def build_net(cfg: NetworkConfig, split: DataSplit) -> nn.Module:
    """The deterministic network of :func:`network_spec`, its parameters in ``cfg.dtype``
    (initialised in float32, then cast: the same start in either dtype)."""
    from ...models import build_network

    spec = network_spec(cfg, split)
    return build_network(spec["name"], **spec["kwargs"]).to(torch_dtype(cfg.dtype))


def build_prior(cfg: PriorConfig, net: nn.Module | None = None) -> Prior:
    """The configured prior: the one registered as ``cfg.kind``
    (:func:`~twodg_pyro.priors.prior_class`), built by its ``from_settings``;
    ``kind = "pretrained"`` is centred at ``net``'s current (e.g. pretrained) parameters."""
    return prior_class(cfg.kind).from_settings(cfg.scale, cfg.delta, net)


def build_model(
    net: nn.Module,
    prior: PriorConfig | Prior,
    n_train: int,
    norm_stats: str = "batch",
    layer_types: tuple[type[nn.Module], ...] = DEFAULT_LAYER_TYPES,
) -> BNNModel:
    """A categorical-likelihood BNN model over ``net`` with the configured prior (whose
    current values centre a ``pretrained`` prior), or a given :class:`Prior`; its Bayesian
    sites are the parameters of the ``layer_types`` modules
    (:func:`~twodg_pyro.nn.find_sites`)."""
    if isinstance(prior, PriorConfig):
        prior = build_prior(prior, net)
    lik = Categorical(n_train)
    return BNNModel(
        net, prior=prior, likelihood=lik, layer_types=layer_types, norm_stats=norm_stats
    )
