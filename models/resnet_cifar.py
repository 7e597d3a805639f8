"""CIFAR ResNets of He et al. (2016), "Deep Residual Learning", Sec. 4.2.

Depth ``6n + 2``: a 3x3 stem convolution with 16 channels, three stages of
``n`` basic blocks with 16, 32 and 64 channels (the first block of stages 2
and 3 has stride 2), global average pooling and a linear classifier.
``n = 3, 5, 7, 9`` give ResNet-20/32/44/56.  Every convolution is 3x3 without
bias and is followed by BatchNorm.

Shortcuts: by default **option A** of the paper, as used for its CIFAR
experiments: an identity shortcut that, where a block halves the resolution
and doubles the channels, subsamples the input with stride 2 and appends
zero-valued channels (so the shortcut has no parameters).  Option B
(``shortcut="B"``: 1x1 convolution + BatchNorm on the projecting shortcuts)
is available too.

Parameter counts for 10 classes (BatchNorm affine parameters included),
option A: ResNet-20 269,722 (the paper's 0.27M), ResNet-32 464,154,
ResNet-44 658,586, ResNet-56 853,018; option B adds 2,752 (ResNet-20: 272,474).

Any input size works (global average pooling): 3x32x32 CIFAR and, with
``in_channels=1``, 1x28x28 MNIST (feature maps 28 -> 14 -> 7).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BasicBlock",
    "CifarResNet",
    "PadShortcut",
    "resnet20",
    "resnet32",
    "resnet44",
    "resnet56",
    "resnet_cifar",
]


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample spatially by ``stride`` and append zero channels.

    Args:
        in_planes: input channels.
        planes: output channels (``>= in_planes``); the extra channels are zeros.
        stride: spatial subsampling factor.
    """

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        if planes < in_planes:
            raise ValueError(f"option-A shortcut cannot reduce channels ({in_planes} -> {planes})")
        self.extra = planes - in_planes
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x[:, :, ::stride, ::stride]`` with ``extra`` zero channels appended."""
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.extra:
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra))
        return x

    def extra_repr(self) -> str:
        return f"stride={self.stride}, extra_channels={self.extra}"


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual shortcut and ReLU after the sum.

    Args:
        in_planes: input channels.
        planes: output channels.
        stride: stride of the first convolution.
        shortcut: ``"A"`` (zero-padding identity) or ``"B"`` (1x1 conv projection).
    """

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1, shortcut: str = "A") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module
        if stride == 1 and in_planes == planes:
            self.shortcut = nn.Identity()
        elif shortcut == "A":
            self.shortcut = PadShortcut(in_planes, planes, stride)
        elif shortcut == "B":
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        else:
            raise ValueError(f"shortcut must be 'A' or 'B', got {shortcut!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual block forward pass."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images (see the module docstring).

    Args:
        depth: total depth, ``6n + 2`` (20, 32, 44, 56, 110, ...).
        num_classes: number of output logits.
        in_channels: image channels (3 for CIFAR, 1 for MNIST).
        shortcut: ``"A"`` (default, as in the paper) or ``"B"``.
        widths: channels of the three stages.
    """

    def __init__(
        self,
        depth: int = 20,
        num_classes: int = 10,
        in_channels: int = 3,
        shortcut: str = "A",
        widths: tuple[int, int, int] = (16, 32, 64),
    ) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"CIFAR ResNet depth must be 6n + 2 with n >= 1, got {depth}")
        shortcut = shortcut.upper()
        if shortcut not in ("A", "B"):
            raise ValueError(f"shortcut must be 'A' or 'B', got {shortcut!r}")
        n = (depth - 2) // 6
        self.depth = depth
        self.num_classes = int(num_classes)
        self.in_channels = int(in_channels)
        self.shortcut_type = shortcut

        self.conv1 = nn.Conv2d(self.in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        in_planes = widths[0]
        stages = []
        for i, planes in enumerate(widths):
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(in_planes, planes, stride, shortcut))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, self.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(batch, num_classes)`` for images ``(batch, C, H, W)``."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet_cifar(
    depth: int, num_classes: int = 10, in_channels: int = 3, shortcut: str = "A"
) -> CifarResNet:
    """Build a CIFAR ResNet of the given depth (``6n + 2``)."""
    return CifarResNet(depth, num_classes=num_classes, in_channels=in_channels, shortcut=shortcut)


def resnet20(num_classes: int = 10, in_channels: int = 3, shortcut: str = "A") -> CifarResNet:
    """ResNet-20 (3 blocks per stage, 0.27M parameters with option A)."""
    return resnet_cifar(20, num_classes, in_channels, shortcut)


def resnet32(num_classes: int = 10, in_channels: int = 3, shortcut: str = "A") -> CifarResNet:
    """ResNet-32 (5 blocks per stage, 0.46M parameters with option A)."""
    return resnet_cifar(32, num_classes, in_channels, shortcut)


def resnet44(num_classes: int = 10, in_channels: int = 3, shortcut: str = "A") -> CifarResNet:
    """ResNet-44 (7 blocks per stage, 0.66M parameters with option A)."""
    return resnet_cifar(44, num_classes, in_channels, shortcut)


def resnet56(num_classes: int = 10, in_channels: int = 3, shortcut: str = "A") -> CifarResNet:
    """ResNet-56 (9 blocks per stage, 0.85M parameters with option A)."""
    return resnet_cifar(56, num_classes, in_channels, shortcut)
