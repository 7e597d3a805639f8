r"""Out-of-distribution input sets, in the normalised input space of the test data.

Every set comes back as a tensor laid out as the in-distribution test inputs (images
``(N, C, H, W)``, or flat ``(N, D)`` with ``image_shape``) and normalised with the same
statistics, :math:`x = (u - m)/s` (:mod:`._pixels`): a network sees them exactly as it
sees its test data.  Pixels :math:`u` are in :math:`[0, 1]` (the noise excepted, see
below).  For the library's MNIST loader the statistics are ``MNIST_MEAN`` /
``MNIST_STD`` (:mod:`twodg_pyro.data.vision`), for the flattened digits the per-feature
``info["mean"]`` / ``info["std"]`` of :func:`~twodg_pyro.data.load_digits_split` with
``image_shape=(1, 8, 8)``.

Built in (no files; :data:`BUILTIN_OOD_SETS`, each ``fn(test_inputs, pixel_mean,
pixel_std, seed, image_shape=None) -> tensor``):

=================  ====================================================================
name               the set
=================  ====================================================================
rotated90          the test images rotated by 90 degrees (counter-clockwise)
vflip              the test images flipped upside down
inverted           the test images in negative, :math:`1 - u`
uniform_noise      i.i.d. :math:`u \sim \mathcal U(m - \sqrt3 s, m + \sqrt3 s)` per pixel:
                   the in-distribution pixel mean :math:`m` and std :math:`s` (not
                   clamped, so the moments hold exactly; normalised, it is
                   :math:`\mathcal U(-\sqrt3, \sqrt3)`, mean 0 and std 1), ``N`` images
gaussian_blobs     ``N`` images of 1 to 4 random Gaussian bumps (centres uniform, widths
                   :math:`\sigma \in [1, 4]` px at 28 px, scaled with the side), peak 1
digits_upsampled   scikit-learn's 8x8 digits, scaled from 0..16 to :math:`[0, 1]`,
                   upsampled bilinearly to ``H x W``, repeated over the channels:
                   ``min(N, 1797)`` of them (a seeded subset); OOD for MNIST-size
                   inputs (for a model of the digits themselves it is in-distribution)
=================  ====================================================================

:func:`folder_ood_set` reads a test set from a torchvision-format folder
(Fashion-MNIST, KMNIST, SVHN, CIFAR-100; never downloaded), converts it to the
in-distribution channels and size and normalises it the same way.
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
from ..data.readers import read_cifar_batch, read_idx
from ..data.transforms import MNIST_MEAN, MNIST_STD
from ._pixels import Stat, from_pixels, image_shape_of, stat, to_pixels

OODSet = Callable[..., torch.Tensor]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _subset(t: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """A subset of at most ``n`` rows of ``t`` drawn with ``seed``, kept in their order."""
    if n >= t.shape[0]:
        return t
    return t[torch.randperm(t.shape[0], generator=_generator(seed))[:n].sort().values]


def resize_images(u: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Images ``(N, c, h, w)`` in :math:`[0, 1]` converted to ``shape = (C, H, W)``:
    bilinear resizing (antialiased when shrinking), grey to colour by repetition, colour
    to grey by the ITU-R 601 luma :math:`0.299 R + 0.587 G + 0.114 B`."""
    c, h, w = (int(v) for v in shape)
    if u.shape[1] != c:
        if u.shape[1] == 1:
            u = u.expand(-1, c, -1, -1)
        elif u.shape[1] == 3 and c == 1:
            luma = torch.tensor([0.299, 0.587, 0.114], dtype=u.dtype).view(1, 3, 1, 1)
            u = (u * luma).sum(1, keepdim=True)
        else:
            raise ValueError(f"cannot convert {u.shape[1]} channels to {c}")
    if tuple(u.shape[-2:]) != (h, w):
        shrink = u.shape[-2] > h or u.shape[-1] > w
        u = F.interpolate(u, size=(h, w), mode="bilinear", align_corners=False, antialias=shrink)
    return u.clamp(0.0, 1.0)


def _ood_set(pixels: Callable[..., torch.Tensor]) -> OODSet:
    """The OOD set ``fn(test_inputs, pixel_mean, pixel_std, seed, image_shape=None)`` whose
    images in pixel space are ``pixels(test_inputs, (C, H, W), pixel_mean, pixel_std,
    seed)``, normalised like ``test_inputs`` (name and docstring are those of ``pixels``)."""

    def ood_set(
        test_inputs: torch.Tensor,
        pixel_mean: Stat = MNIST_MEAN,
        pixel_std: Stat = MNIST_STD,
        seed: int = 0,
        image_shape: Sequence[int] | None = None,
    ) -> torch.Tensor:
        shape = image_shape_of(test_inputs, image_shape)
        u = pixels(test_inputs, shape, pixel_mean, pixel_std, seed)
        return from_pixels(u, pixel_mean, pixel_std, test_inputs)

    ood_set.__name__ = ood_set.__qualname__ = pixels.__name__
    ood_set.__doc__ = pixels.__doc__
    return ood_set


@_ood_set
def rotated90(x, shape, mean, std, seed) -> torch.Tensor:
    """The test images rotated by 90 degrees counter-clockwise (square images only)."""
    if shape[1] != shape[2]:
        raise ValueError(f"rotated90 needs square images, got H x W = {shape[1]} x {shape[2]}")
    return torch.rot90(to_pixels(x, mean, std, shape), 1, dims=(-2, -1))


@_ood_set
def vflip(x, shape, mean, std, seed) -> torch.Tensor:
    """The test images flipped upside down (rows reversed)."""
    return to_pixels(x, mean, std, shape).flip(-2)


@_ood_set
def inverted(x, shape, mean, std, seed) -> torch.Tensor:
    r"""The test images in negative: :math:`1 - u` (pixels clamped to :math:`[0, 1]` first)."""
    return 1.0 - to_pixels(x, mean, std, shape).clamp(0.0, 1.0)


@_ood_set
def uniform_noise(x, shape, mean, std, seed) -> torch.Tensor:
    r"""``N`` images of i.i.d. uniform noise with the in-distribution pixel mean and std:
    :math:`u = m + s\,v`, :math:`v \sim \mathcal U(-\sqrt3, \sqrt3)` (mean 0, variance 1),
    so the normalised inputs are :math:`v` itself.  Not clamped to :math:`[0, 1]`."""
    v = torch.rand((x.shape[0], *shape), generator=_generator(seed), dtype=torch.float64)
    v = ((2.0 * v - 1.0) * math.sqrt(3.0)).to(x.dtype)
    return stat(mean, shape, x, "pixel_mean") + stat(std, shape, x, "pixel_std") * v


@_ood_set
def gaussian_blobs(x, shape, mean, std, seed) -> torch.Tensor:
    r"""``N`` images, each the pixel-wise maximum of 1 to 4 isotropic Gaussian bumps
    :math:`\exp(-\lVert p - c\rVert^2 / 2\sigma^2)` with centres uniform over the image
    and :math:`\sigma` uniform in :math:`[1, 4]` px at 28 px (scaled with the side), the
    same on every channel: smooth blobs, digit-like in brightness, never strokes."""
    c, h, w = shape
    n, g = x.shape[0], _generator(seed)
    k = 4
    scale = max(h, w) / 28.0
    centres = torch.rand(n, k, 2, generator=g, dtype=torch.float64) * torch.tensor(
        [h - 1, w - 1], dtype=torch.float64
    )
    sigma = (1.0 + 3.0 * torch.rand(n, k, generator=g, dtype=torch.float64)) * scale
    present = torch.arange(k) < torch.randint(1, k + 1, (n, 1), generator=g)
    rows = torch.arange(h, dtype=torch.float64).view(1, 1, h, 1)
    cols = torch.arange(w, dtype=torch.float64).view(1, 1, 1, w)
    d2 = (rows - centres[..., 0, None, None]) ** 2 + (cols - centres[..., 1, None, None]) ** 2
    bumps = torch.exp(-d2 / (2.0 * sigma[..., None, None] ** 2)) * present[..., None, None]
    return bumps.amax(1, keepdim=True).expand(n, c, h, w).to(x.dtype)


@_ood_set
def digits_upsampled(x, shape, mean, std, seed) -> torch.Tensor:
    """scikit-learn's 8x8 digits (``load_digits``) scaled from 0..16 to [0, 1], upsampled
    bilinearly (``align_corners=False``) to the test images' ``H x W``, repeated over
    their channels and normalised like them; ``min(N, 1797)`` images, a subset drawn with
    ``seed`` when ``N < 1797``."""
    from sklearn.datasets import load_digits

    images = np.asarray(load_digits().images, dtype=np.float32) / 16.0
    u = torch.from_numpy(images).unsqueeze(1).to(x.dtype)
    return resize_images(_subset(u, x.shape[0], seed), shape)


#: The built-in OOD sets by name (see the module docstring).
BUILTIN_OOD_SETS: dict[str, OODSet] = {
    f.__name__: f
    for f in (rotated90, vflip, inverted, uniform_noise, gaussian_blobs, digits_upsampled)
}


def builtin_ood_sets(
    test_inputs: torch.Tensor,
    pixel_mean: Stat = MNIST_MEAN,
    pixel_std: Stat = MNIST_STD,
    seed: int = 0,
    *,
    image_shape: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """``{name: OOD inputs}`` for ``names`` (default: every set of
    :data:`BUILTIN_OOD_SETS`), all normalised like ``test_inputs``.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    names = list(BUILTIN_OOD_SETS) if names is None else list(names)
    unknown = [n for n in names if n not in BUILTIN_OOD_SETS]
    if unknown:
        raise ValueError(
            f"unknown OOD set(s) {unknown}; built-in sets: {', '.join(BUILTIN_OOD_SETS)}"
        )
    return {
        n: BUILTIN_OOD_SETS[n](test_inputs, pixel_mean, pixel_std, seed, image_shape) for n in names
    }


#: Folder sets: ``name -> (title, files expected under root, official page)``.
FOLDER_OOD_SETS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "fashion_mnist": (
        "Fashion-MNIST",
        ("FashionMNIST/raw/t10k-images-idx3-ubyte",),
        "https://github.com/zalandoresearch/fashion-mnist",
    ),
    "kmnist": (
        "KMNIST",
        ("KMNIST/raw/t10k-images-idx3-ubyte",),
        "https://github.com/rois-codh/kmnist",
    ),
    "svhn": ("SVHN", ("test_32x32.mat",), "http://ufldl.stanford.edu/housenumbers/"),
    "cifar100": (
        "CIFAR-100",
        ("cifar-100-python/test",),
        "https://www.cs.toronto.edu/~kriz/cifar.html",
    ),
}

_HINTS = {
    "fashion_mnist": "Put t10k-images-idx3-ubyte (decompressed with gunzip) in '{root}'.",
    "kmnist": "Put t10k-images-idx3-ubyte (decompressed with gunzip) in '{root}'.",
    "svhn": "Put the test split file test_32x32.mat (format 2, cropped digits) in '{root}'.",
    "cifar100": "Unpack cifar-100-python.tar.gz in '{root}' (it creates cifar-100-python/).",
}


def _read_folder_images(key: str, root: Path) -> torch.Tensor:
    """The test images of a folder set as uint8 ``(N, c, h, w)``."""
    path = root / FOLDER_OOD_SETS[key][1][0]
    if key in ("fashion_mnist", "kmnist"):
        return torch.from_numpy(read_idx(path, 3).copy()).unsqueeze(1)
    if key == "cifar100":
        data, _ = read_cifar_batch(path, 100)
        return torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    from torchvision.datasets import SVHN

    try:  # torchvision checks the file's MD5 and reads it with scipy
        ds = SVHN(str(root), split="test", download=False)
    except (RuntimeError, ValueError, OSError) as e:
        raise DatasetFormatError(path, f"is not SVHN's test_32x32.mat: {e}") from e
    return torch.from_numpy(np.ascontiguousarray(ds.data))  # (N, 3, 32, 32)


def folder_ood_set(
    name: str,
    root: str | os.PathLike[str],
    shape: Sequence[int] = (1, 28, 28),
    pixel_mean: Stat = MNIST_MEAN,
    pixel_std: Stat = MNIST_STD,
    *,
    max_examples: int | None = None,
    seed: int = 0,
    flatten: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The test split of a data set in a torchvision-format folder as OOD inputs.

    Read with the library's checked readers (``download=False`` semantics: nothing is
    ever fetched) from the file under ``root`` that :data:`FOLDER_OOD_SETS` names (where
    torchvision puts it: ``FashionMNIST/raw/t10k-images-idx3-ubyte``,
    ``cifar-100-python/test``, ...), scaled to [0, 1], converted to ``shape = (C, H, W)``
    by :func:`resize_images`, normalised with ``pixel_mean`` / ``pixel_std``.

    Args:
        name: one of :data:`FOLDER_OOD_SETS` (case, ``-`` and ``_`` ignored: ``CIFAR-100``).
        root: the folder.
        shape: the in-distribution image shape.
        pixel_mean, pixel_std: the in-distribution normalisation.
        max_examples: keep a seeded subset of at most this many images.
        seed: the subset's seed.
        flatten: return ``(N, C*H*W)`` (for a network of flat inputs).
        dtype: the returned dtype.

    Raises:
        DatasetNotFoundError: the files are missing (the message says what to put where).
        DatasetFormatError: a file is not what it should be.
        ValueError: an unknown name.
    """
    aliases = {k.replace("_", ""): k for k in FOLDER_OOD_SETS}
    key = aliases.get(name.strip().lower().replace("-", "").replace("_", ""), name)
    if key not in FOLDER_OOD_SETS:
        raise ValueError(f"unknown OOD data set {name!r}; known: {', '.join(FOLDER_OOD_SETS)}")
    title, expected, url = FOLDER_OOD_SETS[key]
    root = Path(root)
    hint_root = root / Path(expected[0]).parent if key in ("fashion_mnist", "kmnist") else root
    DatasetNotFoundError.check(title, root, expected, url, _HINTS[key].format(root=hint_root))
    raw = _read_folder_images(key, root)
    if max_examples is not None:
        raw = _subset(raw, int(max_examples), seed)
    u = resize_images(raw.to(dtype) / 255.0, shape)
    like = torch.empty((1, *shape), dtype=dtype)
    x = from_pixels(u, pixel_mean, pixel_std, like)
    return x.flatten(1) if flatten else x
