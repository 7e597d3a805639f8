"""Atomic tensor files and safe loading.

Files are written to a temporary file in the same folder and renamed into place,
so a reader (or a run killed mid-write) never sees half a file.  Loading uses
``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts only,
never arbitrary pickled code.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import torch

__all__ = ["atomic_torch_save", "safe_torch_load"]


def atomic_torch_save(obj, path: str | Path) -> None:
    """``torch.save(obj, path)`` through a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def safe_torch_load(path: str | Path, map_location="cpu"):
    """Load a file written by :func:`atomic_torch_save` without executing code.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is truncated, corrupted, or holds anything but plain data
            (e.g. a pickle payload with code).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, OSError) as e:
        raise ValueError(
            f"{str(path)!r} is not a readable twodg_pyro file (truncated, corrupted, or it "
            f"holds objects other than plain tensors and data): {e}"
        ) from e
