"""Network architectures (installed as ``twodg_pyro.models``).

All networks are plain, deterministic :class:`torch.nn.Module` objects that
return logits; the library later turns their ``Linear``/``Conv`` weights into
Bayesian sample sites.  :func:`build_network` builds one by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .lenet import LeNet5, lenet5_shapes
from .mlp import ACTIVATIONS, MLP
from .resnet_cifar import (
    BasicBlock,
    CifarResNet,
    PadShortcut,
    resnet20,
    resnet32,
    resnet44,
    resnet56,
    resnet_cifar,
)
from .torchvision_nets import resnet18, resnet50, resnet101, vit_b_16

__all__ = [
    "ACTIVATIONS",
    "NETWORKS",
    "BasicBlock",
    "CifarResNet",
    "LeNet5",
    "MLP",
    "PadShortcut",
    "available_networks",
    "build_network",
    "lenet5_shapes",
    "resnet18",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet50",
    "resnet56",
    "resnet101",
    "resnet_cifar",
    "vit_b_16",
]

#: Registry of network builders by name, used by :func:`build_network`.
NETWORKS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "lenet5": LeNet5,
    "resnet20": resnet20,
    "resnet32": resnet32,
    "resnet44": resnet44,
    "resnet56": resnet56,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet101": resnet101,
    "vit_b_16": vit_b_16,
}


def available_networks() -> list[str]:
    """Return the names accepted by :func:`build_network`, in registry order."""
    return list(NETWORKS)


def build_network(name: str, **kwargs: Any) -> nn.Module:
    """Build the network registered under ``name`` with keyword arguments ``kwargs``.

    Names are case-insensitive and ``-`` may stand for ``_`` (``"ViT-B_16"`` works).

    Example:
        >>> net = build_network("mlp", in_features=64, hidden=(128,), num_classes=10)

    Raises:
        ValueError: if ``name`` is not registered; the message lists the known names.
    """
    key = name.strip().lower().replace("-", "_")
    if key not in NETWORKS:
        raise ValueError(
            f"unknown network {name!r}; known networks: {', '.join(available_networks())}"
        )
    return NETWORKS[key](**kwargs)
