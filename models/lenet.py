"""LeNet-5 (LeCun et al. 1998), modern variant with ReLU and max pooling.

Layer shapes (``C`` = ``in_channels``, ``S`` = ``input_size``)::

    conv1  Conv2d(C, 6, 5, padding=p1)    p1 = 2 if S < 32 else 0
    pool   MaxPool2d(2)
    conv2  Conv2d(6, 16, 5, padding=p2)   p2 = 0 if the pooled map is >= 10 wide else 2
    pool   MaxPool2d(2)
    fc1    Linear(16 * s * s, 120)
    fc2    Linear(120, 84)
    fc3    Linear(84, num_classes)

with ReLU after conv1, conv2, fc1 and fc2.  Feature maps for the intended sizes
(after conv1 -> pool -> conv2 -> pool, then the fc1 input width)::

    1 x  8 x  8:  6x8x8   -> 6x4x4   -> 16x4x4   -> 16x2x2  ->  64
    1 x 28 x 28:  6x28x28 -> 6x14x14 -> 16x10x10 -> 16x5x5  -> 400
    3 x 32 x 32:  6x28x28 -> 6x14x14 -> 16x10x10 -> 16x5x5  -> 400

so 28x28 (padding 2) and 32x32 (no padding) give the classic 16x5x5 map,
and the 8x8 sklearn digits keep a 2x2 map thanks to the padded conv2.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LeNet5", "lenet5_shapes"]


def lenet5_shapes(input_size: int) -> tuple[int, int, int]:
    """Return ``(conv1 padding, conv2 padding, final map side)`` for a square input.

    Raises:
        ValueError: if the input is too small to leave a feature map of at least 1x1.
    """
    size = int(input_size)
    p1 = 2 if size < 32 else 0
    s = (size + 2 * p1 - 4) // 2
    p2 = 0 if s >= 10 else 2
    s = (s + 2 * p2 - 4) // 2
    if s < 1:
        raise ValueError(f"LeNet5 needs input_size >= 4, got {input_size}")
    return p1, p2, s


class LeNet5(nn.Module):
    """LeNet-5 for square ``in_channels x input_size x input_size`` images.

    See the module docstring for the exact layer shapes.  Returns logits.

    Args:
        num_classes: number of output logits.
        in_channels: image channels (1 for digits/MNIST, 3 for CIFAR).
        input_size: image side in pixels (8, 28 and 32 are the intended sizes;
            any side >= 4 works).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, input_size: int = 28) -> None:
        super().__init__()
        p1, p2, side = lenet5_shapes(input_size)
        self.num_classes = int(num_classes)
        self.in_channels = int(in_channels)
        self.input_size = int(input_size)
        self.conv1 = nn.Conv2d(self.in_channels, 6, kernel_size=5, padding=p1)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5, padding=p2)
        self.pool = nn.MaxPool2d(2)
        self.act = nn.ReLU()
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, self.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(batch, num_classes)`` for images ``(batch, C, S, S)``.

        A flat batch ``(batch, C * S * S)`` is reshaped to images first.
        """
        if x.dim() == 2:
            x = x.view(x.shape[0], self.in_channels, self.input_size, self.input_size)
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)
