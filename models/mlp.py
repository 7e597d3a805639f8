"""Fully connected network (multi-layer perceptron)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["ACTIVATIONS", "MLP"]

#: Activation names accepted by :class:`MLP`, mapped to their module constructors.
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
    "silu": nn.SiLU,
}


class MLP(nn.Module):
    """Multi-layer perceptron ``in_features -> hidden[0] -> ... -> num_classes``.

    The input is flattened from dimension 1 on, so images of any shape whose
    elements number ``in_features`` can be fed directly.  The network returns
    logits (no softmax).

    Layers live in ``self.layers`` (an :class:`torch.nn.Sequential` of
    ``Linear`` and activation modules, ending with the output ``Linear``).

    Args:
        in_features: number of input features after flattening (64 for the
            8x8 digits, 784 for MNIST).
        hidden: widths of the hidden layers; an empty sequence gives
            multinomial logistic regression.
        num_classes: number of output logits.
        activation: one of :data:`ACTIVATIONS` (``"relu"``, ``"tanh"``, ...).
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (128,),
        num_classes: int = 10,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if in_features <= 0 or num_classes <= 0:
            raise ValueError(
                f"in_features and num_classes must be positive, got {in_features}, {num_classes}"
            )
        hidden = tuple(int(h) for h in hidden)
        if any(h <= 0 for h in hidden):
            raise ValueError(f"hidden widths must be positive, got {hidden}")
        key = activation.lower()
        if key not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; known: {', '.join(sorted(ACTIVATIONS))}"
            )
        self.in_features = int(in_features)
        self.hidden = hidden
        self.num_classes = int(num_classes)
        self.activation = key

        layers: list[nn.Module] = []
        width = self.in_features
        for h in hidden:
            layers.append(nn.Linear(width, h))
            layers.append(ACTIVATIONS[key]())
            width = h
        layers.append(nn.Linear(width, self.num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape ``(batch, num_classes)`` for input ``(batch, ...)``."""
        return self.layers(torch.flatten(x, 1))
