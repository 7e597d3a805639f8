"""Atomic tensor files and safe loading.

Files are written to a temporary file in the same folder and renamed into place,
so a reader (or a run killed mid-write) never sees half a file.  A write that fails
removes its temporary file and leaves the destination's previous content; a full disk
(or quota) is :class:`NoSpaceError`, ``"no space left on device (writing <path>)"``.
Loading uses ``torch.load(weights_only=True)``: tensors, numbers, strings, lists and
dicts only, never arbitrary pickled code.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

#: errno values of a full disk or an exhausted quota
_FULL = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if e is not None)
#: a full disk in the messages of writers that give no errno: torch's own file writer
#: (``unexpected pos N vs M``: the archive's end is not where it wrote to; ``PytorchStream
#: Writer failed writing``; ``basic_ios::clear: iostream error``) and HDF5 (``errno = 28``)
_SHORT_WRITE = re.compile(
    r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing|"
    r"basic_ios::clear: iostream error|No space left on device|"
    r"errno = (?:" + "|".join(str(e) for e in sorted(_FULL)) + r")\b"
)


class NoSpaceError(OSError):
    """The disk (or the quota) is full: ``"no space left on device (writing <path>)"``.

    ``errno`` is ``ENOSPC`` and ``filename`` the destination (not the temporary file)."""

    def __init__(self, path: str | Path, detail: str = "") -> None:
        super().__init__(errno.ENOSPC, f"no space left on device (writing {path}{detail})")
        self.filename = str(path)

    def __str__(self) -> str:
        return str(self.strerror)


def _is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or what it was raised from) says the disk or the quota is full."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL:
            return True
        if isinstance(e, (RuntimeError, OSError)) and _SHORT_WRITE.search(str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _free_bytes(folder: Path) -> int:
    """Bytes free for this process in ``folder``'s file system."""
    return shutil.disk_usage(folder).free


def _check_destination(path: Path) -> None:
    """Refuse to replace a folder or anything that is not a regular file (a device, a
    pipe, a socket): ``os.replace`` would put a file in its place."""
    try:
        mode = path.stat().st_mode
    except OSError:  # missing, a dangling link, or no permission: the write names it
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, f"{str(path)!r} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"{str(path)!r} is not a regular file; refusing to replace it")


def atomic_write(
    path: str | Path, write: Callable[[str], None], size_hint: int | None = None
) -> Path:
    """Call ``write(tmp_path)`` on a temporary file in ``path``'s folder, flush it to disk
    and rename it over ``path``: readers and killed runs never see half a file.

    The file gets the mode a plain ``open`` would give it (``mkstemp`` makes 0600).  On
    any failure the temporary file is removed and ``path`` keeps its previous content.
    ``size_hint``: about how many bytes ``write`` writes; with fewer free, nothing is
    written (for writers that cannot fail cleanly on a full disk, e.g. HDF5's).

    Raises:
        NoSpaceError: the disk or quota is full (or, with ``size_hint``, too full).
        IsADirectoryError, OSError: ``path`` is a folder or not a regular file.
    """
    path = Path(path)
    _check_destination(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if size_hint is not None:
        free = _free_bytes(path.parent)
        if free < size_hint:
            raise NoSpaceError(path, f": needs about {size_hint:,} bytes, {free:,} free")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
        if isinstance(e, Exception) and not isinstance(e, NoSpaceError) and _is_disk_full(e):
            raise NoSpaceError(path) from e
        raise
    return path


def _torch_save(obj, tmp: str) -> None:
    # through a Python file object: a full disk is then OSError(ENOSPC) from its write,
    # not torch's errno-less "unexpected pos" of its own writer
    with open(tmp, "wb") as f:
        torch.save(obj, f)


def atomic_torch_save(obj, path: str | Path) -> Path:
    """``torch.save(obj, path)``, atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: _torch_save(obj, tmp))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def _load_error(e: BaseException) -> str:
    """The gist of a ``torch.load`` error: for a refused object, the object (torch's
    message is a page of advice on ``weights_only``), else its first line, cut short."""
    text = str(e)
    m = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global|\n|$)", text)
    if m:
        return m.group(1).strip()
    line = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."


#: what a path can be besides a regular file, as messages name it
_NOT_FILES = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_size(path: str | Path) -> int:
    """The size in bytes of the regular file ``path``, which a reader may then open.

    Raises:
        FileNotFoundError: nothing there, or a symbolic link to nothing (``"no such
            file: <path>"``).
        ValueError: a folder, a named pipe, a device (``/dev/zero``), a socket or a
            symbolic link loop, named as such (``"<path> is a named pipe (FIFO), not a
            file"``).
        OSError: the path cannot be examined (e.g. permission denied), naming it.
    """
    where = repr(str(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        link = f" (a symbolic link to {os.readlink(path)!r})" if os.path.islink(path) else ""
        raise FileNotFoundError(f"no such file: {where}{link}") from None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise ValueError(
            f"{where} is a symbolic link loop (it leads back to itself), not a file"
        ) from None
    what = next((what for test, what in _NOT_FILES if test(st.st_mode)), None)
    if what is not None:
        raise ValueError(f"{where} is {what}, not a file")
    return st.st_size


def safe_torch_load(path: str | Path, map_location="cpu"):
    """Load a file written by :func:`atomic_torch_save` without executing code.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is truncated, corrupted, or holds anything but plain data
            (e.g. a pickle payload with code), or ``path`` is not a regular file
            (:func:`file_size`).
    """
    path = Path(path)
    if file_size(path) == 0:
        raise ValueError(f"{str(path)!r} is not a readable twodg_pyro file: it is empty")
    try:
        with warnings.catch_warnings():  # e.g. about the pickle protocol of a foreign file
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # any failure of the restricted unpickler, on any bytes
        raise ValueError(
            f"{str(path)!r} is not a readable twodg_pyro file (truncated, corrupted, or it "
            f"holds objects other than plain tensors and data): {type(e).__name__}: "
            f"{_load_error(e)}"
        ) from e


def jsonable(obj):
    """``obj`` as JSON takes it: string keys, lists for tuples, Python numbers for 0-d
    tensors and arrays, and ``"inf"``, ``"-inf"``, ``"nan"`` for the floats JSON lacks."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return jsonable(obj.item())
    return obj
