r"""Rank-1 factors of Linear and Conv layers (Dusenberry et al., ICML 2020): the layer math.

A rank-1 layer keeps the network's weight :math:`W` (deterministic, shared by every
ensemble member) and multiplies it elementwise by the outer product of two vectors,

.. math::
    W' = W \circ (r\, s^\top), \qquad r \in \mathbb R^{\text{out}},\; s \in \mathbb R^{\text{in}}.

For a Linear layer :math:`W \in \mathbb R^{\text{out} \times \text{in}}`, and

.. math:: W' x + b = r \circ \big(W (s \circ x)\big) + b,

so the factors never have to be multiplied into :math:`W`: the input is scaled by
:math:`s`, the output (before the bias) by :math:`r`.  This is what makes batch-ensemble
routing cheap: every example ``i`` of a batch can use its own pair
:math:`(r_{c(i)}, s_{c(i)})` in one matrix product.  For a convolution with weight
:math:`W \in \mathbb R^{C_\text{out} \times C_\text{in}/g \times k_1 \times \dots}` the
factors act on channels: :math:`s \in \mathbb R^{C_\text{in}}` scales the input channels,
:math:`r \in \mathbb R^{C_\text{out}}` the output channels, i.e.
:math:`W'_{o, j, \cdot} = W_{o, j, \cdot}\, r_o\, s_{\gamma(o) C_\text{in}/g + j}` with
:math:`\gamma(o) = \lfloor o g / C_\text{out} \rfloor` the group of output channel ``o``
(:func:`rank1_weight`).  Biases are not multiplied (they stay deterministic).  With
unit factors a rank-1 layer is the deterministic layer, bit for bit.

Nothing here modifies a network: :func:`rank1_factors` swaps the ``forward`` of the
selected modules for the rank-1 forward inside a ``with`` block only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .sites import _fan_in, _selected

#: Layer types that can carry rank-1 factors.
RANK1_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Rank1Layer:
    """One layer with rank-1 factors.

    Attributes:
        module_name: qualified name of the module in the network.
        layer_type: its class name.
        in_features: length of :math:`s` (``in_features`` or ``in_channels``).
        out_features: length of :math:`r` (``out_features`` or ``out_channels``).
        fan_in: inputs of one output unit (``in_features`` or ``in/groups * prod(kernel)``).
    """

    module_name: str
    layer_type: str
    in_features: int
    out_features: int
    fan_in: int


def find_rank1_layers(
    net: nn.Module,
    layer_types: Iterable[type[nn.Module]] = RANK1_LAYER_TYPES,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
) -> list[Rank1Layer]:
    """The layers of ``net`` that get rank-1 factors, in network order.

    A module is selected when it is an instance of ``layer_types`` and the name of its
    weight (``"fc1.weight"``) matches a glob of ``include`` (all when ``None``) and none
    of ``exclude`` -- the same patterns as :func:`~twodg_pyro.nn.find_sites`.

    Raises:
        ValueError: for a layer type without a rank-1 form (transposed convolutions),
            or when nothing is selected.
    """
    layer_types = tuple(layer_types)
    unsupported = [t.__name__ for t in layer_types if not issubclass(t, RANK1_LAYER_TYPES)]
    if unsupported:
        raise ValueError(
            f"rank-1 factors are defined for Linear and Conv1d/2d/3d layers; "
            f"{unsupported} is not supported (leave it out of layer_types)"
        )
    layers: list[Rank1Layer] = []
    for name, module in net.named_modules():
        if not isinstance(module, layer_types) or not isinstance(module, RANK1_LAYER_TYPES):
            continue
        wname = f"{name}.weight" if name else "weight"
        if not _selected(wname, include, exclude):
            continue
        if isinstance(module, nn.Linear):
            n_in, n_out = module.in_features, module.out_features
        else:
            n_in, n_out = module.in_channels, module.out_channels
        fan_in = _fan_in(module, module.weight)
        layers.append(Rank1Layer(name, type(module).__name__, int(n_in), int(n_out), fan_in))
    if not layers:
        raise ValueError(
            f"{type(net).__name__} has no layer for rank-1 factors: no "
            f"{', '.join(t.__name__ for t in layer_types)} matched "
            f"(include={include!r}, exclude={list(exclude)!r})"
        )
    return layers


def rank1_weight(weight: torch.Tensor, r: torch.Tensor, s: torch.Tensor, groups: int = 1):
    r"""The explicit weight :math:`W \circ (r s^\top)` (for checks and export).

    ``weight`` is ``(out, in)`` or ``(out, in / groups, *kernel)``; ``r`` is ``(out,)``
    and ``s`` is ``(in,)``.  For grouped convolutions output channel ``o`` sees the
    input channels of its group only.
    """
    out_ch, in_per_group = weight.shape[0], weight.shape[1]
    if groups == 1:
        s_mat = s.expand(out_ch, in_per_group)
    else:
        group_of = torch.arange(out_ch, device=weight.device) // (out_ch // groups)
        cols = group_of[:, None] * in_per_group + torch.arange(in_per_group, device=weight.device)
        s_mat = s[cols]
    scale = r[:, None] * s_mat
    return weight * scale.reshape(*scale.shape, *([1] * (weight.dim() - 2)))


def _per_example(factor: torch.Tensor, like: torch.Tensor, channel_dim: int) -> torch.Tensor:
    """Reshape a factor ``(dim,)`` or ``(B, dim)`` to broadcast against ``like``.

    Linear layers have features last (``channel_dim = -1``, with any middle dims); conv
    layers have channels at dimension 1 followed by spatial dims.
    """
    if channel_dim == -1:
        if factor.dim() == 1:
            return factor
        return factor.reshape(factor.shape[0], *([1] * (like.dim() - 2)), factor.shape[-1])
    return factor.reshape(*factor.shape, *([1] * (like.dim() - 2)))


def _rank1_forward(module: nn.Module, r: torch.Tensor, s: torch.Tensor, x: torch.Tensor):
    r""":math:`y = r \circ (W (s \circ x)) + b` for a Linear layer, or the convolution
    :math:`r \circ \operatorname{conv}(s \circ x, W) + b` on channels (``x`` is
    ``(B, C, *spatial)``), with ``r``/``s`` shared ``(dim,)`` or per example ``(B, dim)``.

    With a bias it is evaluated as :math:`r \circ (W (s \circ x) + b) + (1 - r) \circ b`
    (the bias inside the layer), which keeps the deterministic layer's fused kernel: unit
    factors reproduce the layer bit for bit.
    """
    weight, bias = module.weight, module.bias
    if isinstance(module, nn.Linear):
        out = F.linear(x * _per_example(s, x, -1), weight, bias)
        r = _per_example(r, out, -1)
    else:
        out = module._conv_forward(x * _per_example(s, x, 1), weight, bias)
        r = _per_example(r, out, 1)
        bias = None if bias is None else bias.reshape(-1, *([1] * (out.dim() - 2)))
    return out * r if bias is None else out * r + bias * (1 - r)


_MISSING = object()


@contextmanager
def rank1_factors(
    net: nn.Module,
    factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
) -> Iterator[nn.Module]:
    r"""Run ``net`` with rank-1 factors inside a ``with`` block.

    Args:
        net: the network; it is not modified outside the block.
        factors: ``{module_name: (r, s)}`` with ``r`` of shape ``(out,)`` or ``(B, out)``
            and ``s`` of shape ``(in,)`` or ``(B, in)``; per-example factors route example
            ``i`` of the batch through its own pair.

    Inside the block each listed module computes :math:`r \circ (W (s \circ x)) + b`
    (:func:`_rank1_forward`); every other module is untouched.
    """
    modules = dict(net.named_modules())
    saved: list[tuple[nn.Module, object]] = []
    try:
        for name, (r, s) in factors.items():
            if name not in modules:
                raise KeyError(f"no module {name!r} in {type(net).__name__}")
            module = modules[name]
            saved.append((module, module.__dict__.get("forward", _MISSING)))
            module.forward = partial(_rank1_forward, module, r, s)
        yield net
    finally:
        for module, old in reversed(saved):
            if old is _MISSING:
                del module.forward
            else:
                module.forward = old
