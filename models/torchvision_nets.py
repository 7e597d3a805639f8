"""ImageNet-scale networks from :mod:`torchvision.models`, always randomly initialised.

The builders call torchvision with ``weights=None``, so nothing is ever
downloaded; the classification head is sized for ``num_classes`` and, where
``in_channels != 3``, the stem convolution is replaced by one with the
requested number of input channels.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torchvision import models as tvm

__all__ = ["resnet18", "resnet50", "resnet101", "vit_b_16"]


def _resnet(builder: Callable[..., tvm.ResNet], num_classes: int, in_channels: int) -> tvm.ResNet:
    model = builder(weights=None, num_classes=num_classes)
    if in_channels != 3:
        old = model.conv1
        model.conv1 = nn.Conv2d(
            in_channels,
            old.out_channels,
            kernel_size=old.kernel_size,
            stride=old.stride,
            padding=old.padding,
            bias=False,
        )
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


def resnet18(num_classes: int = 1000, in_channels: int = 3) -> tvm.ResNet:
    """Torchvision ResNet-18 (11.7M parameters at 1000 classes), random init.

    Args:
        num_classes: size of the final ``fc`` layer.
        in_channels: input channels of the 7x7 stem convolution.
    """
    return _resnet(tvm.resnet18, num_classes, in_channels)


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> tvm.ResNet:
    """Torchvision ResNet-50 (25.6M parameters at 1000 classes), random init.

    Args:
        num_classes: size of the final ``fc`` layer.
        in_channels: input channels of the 7x7 stem convolution.
    """
    return _resnet(tvm.resnet50, num_classes, in_channels)


def resnet101(num_classes: int = 1000, in_channels: int = 3) -> tvm.ResNet:
    """Torchvision ResNet-101 (44.5M parameters at 1000 classes), random init.

    Args:
        num_classes: size of the final ``fc`` layer.
        in_channels: input channels of the 7x7 stem convolution.
    """
    return _resnet(tvm.resnet101, num_classes, in_channels)


def vit_b_16(
    num_classes: int = 1000, image_size: int = 224, in_channels: int = 3
) -> tvm.VisionTransformer:
    """Torchvision ViT-B/16 (86.6M parameters at 1000 classes), random init.

    Args:
        num_classes: size of the classification head ``heads.head``.
        image_size: input side in pixels; must be a multiple of the patch size 16.
        in_channels: input channels of the patch-embedding convolution ``conv_proj``.
    """
    if image_size % 16 != 0:
        raise ValueError(f"vit_b_16 needs image_size divisible by 16, got {image_size}")
    model = tvm.vit_b_16(weights=None, num_classes=num_classes, image_size=image_size)
    if in_channels != 3:
        old = model.conv_proj
        model.conv_proj = nn.Conv2d(
            in_channels, old.out_channels, kernel_size=old.kernel_size, stride=old.stride
        )
        fan_in = in_channels * old.kernel_size[0] * old.kernel_size[1]
        nn.init.trunc_normal_(model.conv_proj.weight, std=(1.0 / fan_in) ** 0.5)
        nn.init.zeros_(model.conv_proj.bias)
    return model
