r"""Corrupted test inputs at five severities, computed on the fly (MNIST-C / CIFAR-10-C style).

Each family corrupts un-normalised images :math:`u \in [0, 1]^{N \times C \times H \times W}`;
:func:`corrupt` takes normalised test inputs, de-normalises them (:mod:`._pixels`),
corrupts, clamps to :math:`[0, 1]` and normalises again.  Every random choice comes from
a ``torch.Generator`` seeded with ``seed`` (the global RNG is never touched), and the
severities of one family share their random numbers, so a higher severity moves each
image at least as far from the clean one.

==============  ===========================================  ==============================
family          corruption                                   severity 1 / 2 / 3 / 4 / 5
==============  ===========================================  ==============================
gaussian_noise  :math:`u + \sigma \varepsilon`,              :math:`\sigma` = 0.1 / 0.2 /
                :math:`\varepsilon \sim \mathcal N(0, 1)`    0.3 / 0.4 / 0.5
impulse_noise   a fraction :math:`p` of the values set to    :math:`p` = 0.03 / 0.06 /
                0 or 1 (salt and pepper, half each)          0.09 / 0.17 / 0.27
gaussian_blur   separable Gaussian filter, radius            :math:`\sigma` = 0.5 / 1 / 1.5
                :math:`\lceil 3\sigma\rceil`, edges           / 2 / 2.5 px
                replicated
rotation        rotation about the centre by :math:`\pm`     15 / 30 / 45 / 60 / 75
                the angle (random sign per image),           degrees
                bilinear, black outside
translation     shift by :math:`d` px up, down, left or      :math:`d` = 1 / 2 / 3 / 4 / 5
                right (random per image), black fill         px
contrast        :math:`(u - \bar u) c + \bar u`,             :math:`c` = 0.75 / 0.5 / 0.4 /
                :math:`\bar u` the image's channel mean      0.3 / 0.15
brightness      :math:`u + b` on every channel               :math:`b` = 0.1 / 0.2 / 0.3 /
                                                             0.4 / 0.5
==============  ===========================================  ==============================

The contrast factors are CIFAR-10-C's; the other parameters are chosen for 28 px digits
(stated per family in :data:`SEVERITY_PARAMETERS`).  :func:`load_cifar10c` reads the
published CIFAR-10-C arrays instead, when a folder has them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.errors import DatasetFormatError, DatasetNotFoundError
from ..data.transforms import CIFAR10_MEAN, CIFAR10_STD, MNIST_MEAN, MNIST_STD
from ._pixels import Stat, from_pixels, to_pixels

#: The severities of every family.
SEVERITIES = (1, 2, 3, 4, 5)

#: Each family's parameter at severities 1..5 (see the module docstring's table).
SEVERITY_PARAMETERS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.1, 0.2, 0.3, 0.4, 0.5),  # noise std
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),  # fraction of values hit
    "gaussian_blur": (0.5, 1.0, 1.5, 2.0, 2.5),  # blur std in px
    "rotation": (15.0, 30.0, 45.0, 60.0, 75.0),  # degrees
    "translation": (1.0, 2.0, 3.0, 4.0, 5.0),  # px
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # contrast factor
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),  # added brightness
}

#: A family: ``fn(images in [0, 1] (N, C, H, W), severity, generator) -> images``.
Corruption = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]


def _check_severity(severity: int) -> int:
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
    return int(severity)


def _parameter(family: str, severity: int) -> float:
    return SEVERITY_PARAMETERS[family][_check_severity(severity) - 1]


def gaussian_noise(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    r""":math:`u + \sigma\varepsilon`, :math:`\sigma` = 0.1 .. 0.5."""
    sigma = _parameter("gaussian_noise", severity)
    eps = torch.randn(u.shape, generator=generator, dtype=torch.float64).to(u.dtype)
    return u + sigma * eps


def impulse_noise(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    r"""A fraction :math:`p` = 0.03 .. 0.27 of the values set to 0 or 1 (each with
    probability 1/2); the hit values of a severity include those of the lower ones."""
    p = _parameter("impulse_noise", severity)
    hit = torch.rand(u.shape, generator=generator, dtype=torch.float64) < p
    salt = torch.rand(u.shape, generator=generator, dtype=torch.float64) < 0.5
    return torch.where(hit.to(u.device), salt.to(u), u)


def gaussian_blur(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    r"""Separable Gaussian filter of std :math:`\sigma` = 0.5 .. 2.5 px, radius
    :math:`\lceil 3\sigma\rceil`, edges replicated (no randomness)."""
    sigma = _parameter("gaussian_blur", severity)
    r = math.ceil(3 * sigma)
    t = torch.arange(-r, r + 1, dtype=torch.float64)
    k = torch.exp(-(t**2) / (2 * sigma**2))
    k = (k / k.sum()).to(u)
    c = u.shape[1]
    x = F.pad(u, (r, r, r, r), mode="replicate")
    x = F.conv2d(x, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return F.conv2d(x, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)


def rotation(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    """Rotation about the image centre by 15 .. 75 degrees, clockwise or counter-clockwise
    at random per image (the same signs at every severity); bilinear, black outside."""
    angle = math.radians(_parameter("rotation", severity))
    n, _, h, w = u.shape
    sign = torch.randint(0, 2, (n,), generator=generator).to(torch.float64) * 2 - 1
    a = sign * angle
    cos, sin = torch.cos(a), torch.sin(a)
    zero = torch.zeros_like(a)
    # in grid_sample's normalised coordinates, a rotation of the pixel plane of an
    # H x W image is [[cos, -sin H/W], [sin W/H, cos]]
    theta = torch.stack(
        [torch.stack([cos, -sin * h / w, zero], -1), torch.stack([sin * w / h, cos, zero], -1)], 1
    ).to(u)
    grid = F.affine_grid(theta, list(u.shape), align_corners=False)
    return F.grid_sample(u, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _shift(u: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``u`` moved by ``dy`` rows down and ``dx`` columns right, zeros let in."""
    h, w = u.shape[-2:]
    out = torch.zeros_like(u)
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    out[..., yd, xd] = u[..., ys, xs]
    return out


def translation(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    """Shift by 1 .. 5 px up, down, left or right (at random per image, the same
    directions at every severity); the pixels let in are black."""
    d = int(_parameter("translation", severity))
    direction = torch.randint(0, 4, (u.shape[0],), generator=generator).to(u.device)
    out = torch.empty_like(u)
    for i, (dy, dx) in enumerate(((d, 0), (-d, 0), (0, d), (0, -d))):
        rows = direction == i
        if rows.any():
            out[rows] = _shift(u[rows], dy, dx)
    return out


def contrast(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    r""":math:`(u - \bar u)\,c + \bar u`, :math:`\bar u` each image's mean per channel,
    :math:`c` = 0.75 .. 0.15 (no randomness)."""
    c = _parameter("contrast", severity)
    mean = u.mean(dim=(-2, -1), keepdim=True)
    return (u - mean) * c + mean


def brightness(u: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    """:math:`u + b`, :math:`b` = 0.1 .. 0.5, on every channel (no randomness)."""
    return u + _parameter("brightness", severity)


#: The corruption families by name (see the module docstring's table).
CORRUPTIONS: dict[str, Corruption] = {
    f.__name__: f
    for f in (
        gaussian_noise,
        impulse_noise,
        gaussian_blur,
        rotation,
        translation,
        contrast,
        brightness,
    )
}


def corrupt(
    test_inputs: torch.Tensor,
    family: str,
    severity: int,
    pixel_mean: Stat = MNIST_MEAN,
    pixel_std: Stat = MNIST_STD,
    seed: int = 0,
    *,
    image_shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """Normalised ``test_inputs`` corrupted by ``family`` at ``severity`` (1..5):
    de-normalised, corrupted, clamped to [0, 1], normalised again, in the inputs' layout
    (flat inputs need ``image_shape``, e.g. ``(1, 8, 8)``).

    Raises:
        ValueError: an unknown family (listing the known ones), a severity outside
            1..5, or inputs that are not a non-empty finite floating batch.
    """
    if family not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {family!r}; known: {', '.join(CORRUPTIONS)}")
    _parameter(family, severity)
    u = to_pixels(test_inputs, pixel_mean, pixel_std, image_shape)
    generator = torch.Generator().manual_seed(int(seed))
    out = CORRUPTIONS[family](u.clamp(0.0, 1.0), int(severity), generator)
    return from_pixels(out, pixel_mean, pixel_std, test_inputs, clamp=True)


CIFAR10C_URL = "https://zenodo.org/record/2535967"


def load_cifar10c(
    root: str | os.PathLike[str],
    family: str,
    severity: int,
    pixel_mean: Stat = CIFAR10_MEAN,
    pixel_std: Stat = CIFAR10_STD,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)`` of one CIFAR-10-C corruption at one severity from its published arrays:
    ``root/<family>.npy`` (``5 n x 32 x 32 x 3`` bytes, severities 1..5 in blocks of
    ``n`` = 10,000) and ``root/labels.npy``; ``X`` is ``(n, 3, 32, 32)`` normalised with
    ``pixel_mean`` / ``pixel_std`` (CIFAR-10's by default).

    Raises:
        DatasetNotFoundError: a file is missing (the message says what to put where).
        DatasetFormatError: an array of the wrong shape or type.
        ValueError: a severity outside 1..5.
    """
    severity = _check_severity(severity)
    root = Path(root)
    expected = [f"{family}.npy", "labels.npy"]
    hint = f"Unpack CIFAR-10-C.tar so that '{root}' holds <corruption>.npy and labels.npy."
    DatasetNotFoundError.check("CIFAR-10-C", root, expected, CIFAR10C_URL, hint)
    images = np.load(root / f"{family}.npy", mmap_mode="r", allow_pickle=False)
    labels = np.load(root / "labels.npy", mmap_mode="r", allow_pickle=False)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise DatasetFormatError(
            root / f"{family}.npy",
            f"holds {images.dtype} of shape {images.shape}, expected uint8 (5 n, 32, 32, 3)",
        )
    if images.shape[0] % 5 or labels.shape != (images.shape[0],):
        raise DatasetFormatError(
            root / "labels.npy",
            f"has shape {labels.shape}; expected one label per image of {images.shape[0]} "
            "(five severities of n images each)",
        )
    n = images.shape[0] // 5
    block = slice((severity - 1) * n, severity * n)
    u = torch.from_numpy(np.array(images[block])).permute(0, 3, 1, 2).float() / 255.0
    y = torch.from_numpy(np.array(labels[block], dtype=np.int64))
    return from_pixels(u, pixel_mean, pixel_std, torch.empty((1, 3, 32, 32))), y
