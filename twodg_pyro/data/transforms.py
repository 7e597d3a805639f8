"""Normalisation constants and transforms of the image data sets (paper App. I.2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torchvision import transforms

MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cifar_train_transform(
    mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD
) -> transforms.Compose:
    """CIFAR training augmentation: reflect-pad 4, random crop 32, flip, normalise."""
    return transforms.Compose(
        [
            transforms.RandomCrop(32, padding=4, padding_mode="reflect"),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


def cifar_eval_transform(
    mean: Sequence[float] = CIFAR10_MEAN, std: Sequence[float] = CIFAR10_STD
) -> transforms.Compose:
    """CIFAR evaluation transform: normalise only."""
    return transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])


def imagenet_train_transform(image_size: int = 224) -> transforms.Compose:
    """ImageNet training augmentation: random-resized crop, flip, colour jitter, normalise."""
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.4, 0.4, 0.4, 0.1),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def imagenet_eval_transform(image_size: int = 224, resize_size: int = 256) -> transforms.Compose:
    """ImageNet evaluation transform: resize 256, centre crop 224, normalise."""
    return transforms.Compose(
        [
            transforms.Resize(resize_size),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _mnist_transform(mean: Sequence[float], std: Sequence[float], normalize: bool) -> Callable:
    steps: list[Callable] = [transforms.ToTensor()]
    if normalize:
        steps.append(transforms.Normalize(mean, std))
    return transforms.Compose(steps)
