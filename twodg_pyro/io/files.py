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
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["atomic_torch_save", "atomic_write", "atomic_write_text", "safe_torch_load"]


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file in ``path``'s folder, flush it to disk
    and rename it over ``path``: readers and killed runs never see half a file.

    The file gets the mode a plain ``open`` would give it (``mkstemp`` makes 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_torch_save(obj, path: str | Path) -> Path:
    """``torch.save(obj, path)``, atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


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
    if path.stat().st_size == 0:
        raise ValueError(f"{str(path)!r} is not a readable twodg_pyro file: it is empty")
    try:
        with warnings.catch_warnings():  # e.g. about the pickle protocol of a foreign file
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, OSError) as e:
        raise ValueError(
            f"{str(path)!r} is not a readable twodg_pyro file (truncated, corrupted, or it "
            f"holds objects other than plain tensors and data): {type(e).__name__}: {e}"
        ) from e
    except Exception as e:  # any other failure of the restricted unpickler on foreign bytes
        raise ValueError(
            f"{str(path)!r} is not a readable twodg_pyro file (corrupted or foreign): "
            f"{type(e).__name__}: {e}"
        ) from e
