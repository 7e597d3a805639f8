"""Which parameter tensors of a network are Bayesian.

A *site* is one parameter tensor (a Linear or Conv weight or bias) that becomes one
Pyro ``sample`` statement.  Pyro costs about half a millisecond per sample site and
step, so sites are whole tensors, never single weights or clusters.  Normalisation
layers (BatchNorm, LayerNorm, ...) stay deterministic unless their class is named in
``layer_types``.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

DEFAULT_LAYER_TYPES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)

_NORM_TYPES = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
)


@dataclass(frozen=True)
class BayesianSite:
    """One Bayesian parameter tensor of a network.

    Attributes:
        name: the parameter's qualified name in the network (``"layers.0.weight"``);
            it is also the Pyro sample-site name.
        module_name: qualified name of the owning module.
        param_name: ``"weight"`` or ``"bias"``.
        shape: the tensor's shape.
        layer_type: class name of the owning module.
        fan_in: number of inputs of one output unit (``in_features`` or
            ``in_channels / groups * prod(kernel_size)``), used by fan-in priors.
    """

    name: str
    module_name: str
    param_name: str
    shape: torch.Size
    layer_type: str
    fan_in: int

    @property
    def numel(self) -> int:
        """Number of scalar weights in the tensor."""
        return math.prod(self.shape)

    @property
    def event_dim(self) -> int:
        """Number of dimensions of the tensor (the Pyro ``event_dim`` of the site)."""
        return len(self.shape)


def _fan_in(module: nn.Module, weight: torch.Tensor) -> int:
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return int(weight.shape[0] // module.groups * math.prod(weight.shape[2:]))
    return int(math.prod(weight.shape[1:])) if weight.dim() > 1 else int(weight.shape[0])


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _selected(name: str, include: Sequence[str] | None, exclude: Sequence[str]) -> bool:
    """Whether a parameter name matches ``include`` (all when ``None``) and no ``exclude``."""
    return (include is None or _matches(name, include)) and not _matches(name, exclude)


def find_sites(
    net: nn.Module,
    layer_types: Iterable[type[nn.Module]] = DEFAULT_LAYER_TYPES,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    bias: bool = True,
) -> list[BayesianSite]:
    r"""List the Bayesian parameter tensors of ``net``.

    A parameter is selected when its module is an instance of ``layer_types``, its
    qualified name matches one of the glob patterns in ``include`` (all when
    ``None``) and none in ``exclude``.  The affine parameters of normalisation layers
    are selected only when a normalisation class is named in ``layer_types`` (e.g.
    ``nn.BatchNorm2d``; a base such as ``nn.Module`` does not select them); each scales
    or shifts one normalised input, so its ``fan_in`` is 1 (a layer-wise prior
    :math:`\mathcal N(0, 1/\text{fan\_in})` puts :math:`\mathcal N(0, 1)` on it).

    Args:
        net: any ``torch.nn.Module``.
        layer_types: module classes whose ``weight``/``bias`` become Bayesian.
        include: glob patterns on parameter names, e.g. ``["features.*"]``.
        exclude: glob patterns on parameter names to leave deterministic.
        bias: whether biases are Bayesian too.

    Raises:
        ValueError: when no parameter is selected (e.g. a network with no Linear or
            Conv layer), naming the network class and the types looked for.
    """
    layer_types = tuple(layer_types)
    if not layer_types or not all(isinstance(t, type) for t in layer_types):
        raise ValueError(f"layer_types must be a non-empty tuple of classes, got {layer_types!r}")
    norms = tuple(t for t in layer_types if issubclass(t, _NORM_TYPES))
    sites: list[BayesianSite] = []
    for module_name, module in net.named_modules():
        norm = isinstance(module, _NORM_TYPES)
        if not isinstance(module, layer_types) or (norm and not isinstance(module, norms)):
            continue
        weight = getattr(module, "weight", None)
        for param_name in ("weight", "bias"):
            param = module._parameters.get(param_name)
            if param is None or (param_name == "bias" and not bias):
                continue
            name = f"{module_name}.{param_name}" if module_name else param_name
            if not _selected(name, include, exclude):
                continue
            if norm:  # scales or shifts one normalised input
                fan_in = 1
            elif isinstance(weight, torch.Tensor):
                fan_in = _fan_in(module, weight)
            else:
                fan_in = param.numel()
            layer = type(module).__name__
            sites.append(
                BayesianSite(name, module_name, param_name, param.shape, layer, max(fan_in, 1))
            )
    if not sites:
        kinds = ", ".join(t.__name__ for t in layer_types)
        raise ValueError(
            f"{type(net).__name__} has no Bayesian parameter: no {kinds} layer matched "
            f"(include={include!r}, exclude={list(exclude)!r}). A BNN needs at least one "
            "Linear or Conv layer."
        )
    return sites
