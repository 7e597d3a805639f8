r"""Between the network's normalised inputs and un-normalised pixels in :math:`[0, 1]`.

A data loader of the library hands the network :math:`x = (u - m) / s`, with :math:`u`
the pixels in :math:`[0, 1]` and :math:`(m, s)` the training statistics: one pair for all
pixels, one per channel (MNIST: ``MNIST_MEAN = (0.1307,)``, ``MNIST_STD = (0.3081,)``),
or one per input feature (the flattened scikit-learn digits, ``info["mean"]`` of shape
``(64,)``).  The OOD sets and corruptions work on the images :math:`u` of shape
``(N, C, H, W)``: :func:`to_pixels` is :math:`u = x s + m` (reshaping flat inputs to
``image_shape``), :func:`from_pixels` is its inverse back to the inputs' layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

#: A normalisation statistic: one number, one per channel, or one per input feature.
Stat = float | Sequence[float] | torch.Tensor


def check_inputs(x: torch.Tensor, name: str = "test_inputs") -> None:
    """Raise ``ValueError`` unless ``x`` is a non-empty floating tensor of finite values."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty batch (N, ...), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating (normalised inputs), got {x.dtype}")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or infinite values")


def image_shape_of(x: torch.Tensor, image_shape: Sequence[int] | None) -> tuple[int, int, int]:
    """``(C, H, W)`` of one input of the inputs ``x`` (checked by :func:`check_inputs`):
    ``image_shape`` if given (it must hold as many values as one input), else the shape of
    ``x[0]``, which must then be an image."""
    check_inputs(x)
    if image_shape is not None:
        shape = tuple(int(v) for v in image_shape)
        if len(shape) != 3 or math.prod(shape) != math.prod(x.shape[1:]):
            raise ValueError(
                f"image_shape {shape} does not hold one input of shape {tuple(x.shape[1:])}"
            )
        return shape  # type: ignore[return-value]
    if x.dim() != 4:
        raise ValueError(
            f"inputs of shape {tuple(x.shape)} are not images (N, C, H, W): pass image_shape, "
            "e.g. (1, 8, 8) for the flattened digits"
        )
    return tuple(x.shape[1:])  # type: ignore[return-value]


def stat(value: Stat, shape: Sequence[int], like: torch.Tensor, name: str) -> torch.Tensor:
    """A statistic as a tensor broadcastable to images ``(N, *shape)``: one number, one per
    channel (``shape[0]`` values) or one per pixel (``prod(shape)`` values)."""
    t = torch.as_tensor(value, dtype=like.dtype).to(like.device).flatten()
    c = int(shape[0])
    # where two sizes coincide (one channel, 1 x 1 images) so do their views
    views = {math.prod(shape): (1, *shape), c: (1, c, 1, 1), 1: (1, 1, 1, 1)}
    if t.numel() in views:
        return t.view(*views[t.numel()])
    raise ValueError(
        f"{name} has {t.numel()} values: expected 1, {c} (per channel) or "
        f"{math.prod(shape)} (per pixel) for inputs of image shape {tuple(shape)}"
    )


def to_pixels(
    x: torch.Tensor, mean: Stat, std: Stat, image_shape: Sequence[int] | None = None
) -> torch.Tensor:
    """Un-normalised images :math:`u = x s + m`, shape ``(N, C, H, W)``."""
    shape = image_shape_of(x, image_shape)
    img = x.reshape(x.shape[0], *shape)
    return img * stat(std, shape, x, "pixel_std") + stat(mean, shape, x, "pixel_mean")


def from_pixels(
    u: torch.Tensor, mean: Stat, std: Stat, like: torch.Tensor, clamp: bool = False
) -> torch.Tensor:
    """Normalised inputs :math:`(u - m) / s` of images ``u`` in the layout of ``like``
    (flattened back when ``like`` is flat); ``clamp``: clamp ``u`` to :math:`[0, 1]` first."""
    if clamp:
        u = u.clamp(0.0, 1.0)
    shape = tuple(u.shape[1:])
    x = (u - stat(mean, shape, u, "pixel_mean")) / stat(std, shape, u, "pixel_std")
    return x.reshape(u.shape[0], *like.shape[1:]).to(like.dtype)
