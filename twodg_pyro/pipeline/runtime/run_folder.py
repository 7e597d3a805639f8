"""Run folders that never lose work.

A run writes its results, model file, diagnostics and checkpoints into one folder
(``--out``).  :class:`RunFolder` guards it for the duration of a run:

* **Checked before anything trains.**  ``--out`` must be a folder (not a file) that
  this process can create and write to; a folder that cannot be written is an error at
  the start, not after hours of training.
* **One run at a time.**  A lock file, ``RUN_DIR/.twodg-pyro.lock``, is held with
  ``fcntl.flock`` for the whole run and records the owner's pid, host, start time and
  command.  A second run into the same folder is refused, naming the owner.  The
  kernel releases the lock when its process dies (also on ``kill -9``), so a killed
  run never blocks the folder: the next run takes it over.  Where there are no file
  locks (a file system mounted without them, or no ``fcntl`` as on Windows) the run
  goes ahead with a warning that a second run into the folder is not detected.
* **No silent overwrite.**  A fresh run into a folder holding an earlier run's results
  or checkpoints (:data:`RUN_OUTPUTS`) is refused unless it resumes (``--resume``) or
  replaces them (``--overwrite``).  With ``overwrite`` the earlier run's files are
  removed once the new run's inputs are validated (:meth:`RunFolder.clear_previous`),
  so the folder never mixes two runs.
* **No leftovers.**  Temporary files of interrupted atomic writes (``.*.tmp``, see
  :func:`~twodg_pyro.files.atomic.atomic_write`) are removed when a run starts or resumes
  (under the lock, so never another live run's).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # no file locks on this platform (Windows)
    fcntl = None

#: The lock file in a run folder.
LOCK_NAME = ".twodg-pyro.lock"

#: Files a run writes into its folder (relative paths); any of them present means the
#: folder holds an earlier run.
RUN_OUTPUTS = (
    "results.json",
    "results.md",
    "model_2dg.pt",
    "model_2dg.2dgz",
    "model_laplace.2dgz",
    *(f"model_{m}.pt" for m in ("mean_field", "rank1", "ssvi")),
    *(f"inference_data{m}.nc" for m in ("", "_mean_field", "_2dg", "_rank1", "_ssvi")),
    "diagnostics.json",
    "posterior_summary.csv",
    *(f"{name}.png" for name in ("sharing_plane", "reliability", "elbo_terms", "merges")),
    *(f"checkpoints/{name}" for name in ("config.json", "stage1.pt", "stage3.pt")),
)


class RunFolderError(ValueError):
    """The output folder cannot take this run (a file, not writable, or it holds an
    earlier run); the message names the folder and what to do."""


class RunFolderLocked(RunFolderError):
    """Another live run holds the folder's lock."""


# ---------------------------------------------------------------------- writability
def _probe(folder: Path) -> None:
    """Create and remove a temporary file in ``folder`` (raises ``OSError`` if it cannot)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".twodg-probe.", suffix=".probe")
    os.close(fd)
    os.unlink(tmp)


def _describe(e: OSError) -> str:
    return e.strerror or type(e).__name__


def check_output_folder(path: str | Path, what: str = "output folder") -> Path:
    """Check, without creating anything, that ``path`` is or can become a writable
    folder: it is not a file, and it (or, when it does not exist yet, its nearest
    existing parent) is a folder this process can write to.

    Raises:
        RunFolderError: naming the path and the reason.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{what} {str(path)!r} is a file, not a folder")
    base = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not base.is_dir():
        raise RunFolderError(
            f"{what} {str(path)!r} cannot be created: {str(base)!r} is a file, not a folder"
        )
    try:
        _probe(base)
    except OSError as e:
        target = "" if base == path.absolute() else f" (in {str(base)!r})"
        raise RunFolderError(f"{what} {str(path)!r} is not writable{target}: {_describe(e)}") from e
    return path


def check_output_file(path: str | Path, what: str = "output file") -> Path:
    """Check, without creating anything, that a file can be written at ``path``: it is
    not a folder, nor an existing device, pipe or socket (which the write would replace
    with a file), and its folder is (or can become) writable.  An existing file is
    replaced.

    Raises:
        RunFolderError: naming the path and the reason.
    """
    path = Path(path)
    if path.is_dir():
        raise RunFolderError(f"{what} {str(path)!r} is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise RunFolderError(
            f"{what} {str(path)!r} is not a regular file (a device, pipe or socket); "
            "give a file name"
        )
    check_output_folder(path.absolute().parent, f"the folder of {what} {str(path)!r}:")
    return path


def model_files(path: str | Path) -> list[Path]:
    """The model files in the run folder ``path``, sorted: every ``model_<method>.pt``
    (``run``/``train``) and ``*.2dgz`` (``export``).

    Raises:
        FileNotFoundError: ``path`` holds none (the message names the folder).
    """
    path = Path(path)
    found = sorted(p for p in [*path.glob("model_*.pt"), *path.glob("*.2dgz")] if p.is_file())
    if not found:
        raise FileNotFoundError(
            f"{str(path)!r} is a folder with no model file (model_<method>.pt or *.2dgz): "
            "give a model file, or the run folder that holds them"
        )
    return found


def previous_outputs(path: str | Path) -> list[str]:
    """The files of :data:`RUN_OUTPUTS` present in the run folder ``path``."""
    path = Path(path)
    return [name for name in RUN_OUTPUTS if (path / name).exists()]


def _clean_temporaries(folder: Path) -> list[str]:
    """Remove ``.*.tmp`` files (interrupted atomic writes) in ``folder`` and
    ``folder/checkpoints``; returns their names."""
    folders = (folder, folder / "checkpoints")
    removed = [p for sub in folders for p in sub.glob(".*.tmp") if p.is_file()]
    for tmp in removed:
        tmp.unlink(missing_ok=True)
    return [str(p.relative_to(folder)) for p in removed]


def _read_owner(lock: Path) -> str:
    """The owner recorded in the lock file, for the message."""
    try:
        info = json.loads(lock.read_text())
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict):
        return "an unknown process"
    return (
        f"pid {info.get('pid')} on host {info.get('host')!r} since {info.get('started')} "
        f"({str(info.get('command', ''))[:120]!r})"
    )


# ---------------------------------------------------------------------- the folder
class RunFolder:
    """The output folder of one run, checked and locked (see the module docstring).

    Use as a context manager, or :meth:`acquire` / :meth:`release`::

        with RunFolder(out, resume=False, overwrite=False) as folder:
            ...  # validate inputs
            folder.clear_previous()  # only does anything with overwrite=True
            ...  # train, write

    Args:
        path: the run folder (created when missing).
        resume: the run continues the checkpoints in the folder (earlier files stay).
        overwrite: replace an earlier run's files (:meth:`clear_previous`).

    Raises:
        RunFolderError: ``path`` is a file or cannot be written, it holds an earlier run
            and neither ``resume`` nor ``overwrite`` is set, or both are set.
        RunFolderLocked: another live run holds it.
    """

    def __init__(self, path: str | Path, resume: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self.resume, self.overwrite = bool(resume), bool(overwrite)
        if self.resume and self.overwrite:
            raise RunFolderError(
                "resume and overwrite exclude each other: resuming keeps the folder's "
                "checkpoints, overwriting removes them"
            )
        self._lock_file = self.path / LOCK_NAME
        self._fd: int | None = None  # the locked lock file
        self.previous: list[str] = []
        self.removed_temporaries: list[str] = []
        self._created = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunFolder:
        """Check the folder, take its lock, refuse an earlier run's files (unless resuming
        or overwriting) and remove temporary files."""
        where = str(self.path)
        check_output_folder(self.path, "output folder")
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunFolderError(
                f"output folder {where!r} cannot be created: {_describe(e)}"
            ) from e
        try:
            self._lock()
        except OSError as e:
            raise RunFolderError(f"output folder {where!r} is not writable: {_describe(e)}") from e
        try:
            ckpt = self.path / "checkpoints"
            if ckpt.exists():
                check_output_folder(ckpt, "checkpoint folder")
            self.previous = previous_outputs(self.path)
            if self.previous and not (self.resume or self.overwrite):
                shown = ", ".join(self.previous[:4]) + (", ..." if len(self.previous) > 4 else "")
                raise RunFolderError(
                    f"output folder {where!r} holds an earlier run ({shown}); nothing was "
                    f"changed. Continue it with --resume {where} (resume=True), choose another "
                    "output folder, or replace it with --overwrite (overwrite=True)"
                )
            self.removed_temporaries = _clean_temporaries(self.path)
        except BaseException:
            self.release()
            raise
        return self

    def _lock(self) -> None:
        """``flock`` the lock file (the kernel releases it when this process dies) and
        record the owner in it."""
        for _ in range(20):  # retried only when the file was replaced under us
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    if fcntl is None:
                        raise OSError("this platform has no fcntl.flock")
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise RunFolderLocked(
                        f"another run is writing to {str(self.path)!r}: "
                        f"{_read_owner(self._lock_file)} holds {str(self._lock_file)!r}; wait "
                        "for it to finish or stop it, or choose another output folder"
                    ) from None
                except OSError as e:  # a file system without locks (e.g. NFS mounted nolock)
                    warnings.warn(
                        f"cannot lock {str(self._lock_file)!r} ({_describe(e)}): a second run "
                        f"into {str(self.path)!r} will not be detected",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                try:  # the file locked must still be the lock file (not removed meanwhile)
                    same = os.path.samestat(os.fstat(fd), os.stat(self._lock_file))
                except FileNotFoundError:
                    same = False
                if same:
                    owner = {
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "command": " ".join(sys.argv)[:500],
                    }
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps(owner).encode(), 0)
                    self._fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise RunFolderLocked(f"cannot take the lock {str(self._lock_file)!r}: it keeps changing")

    def clear_previous(self) -> list[str]:
        """With ``overwrite``: remove the earlier run's files (:data:`RUN_OUTPUTS`);
        returns what was removed.  Call it once the new run's inputs are validated."""
        if not (self.overwrite and self.held):
            return []
        removed = previous_outputs(self.path)
        for name in removed:
            (self.path / name).unlink(missing_ok=True)
        return removed

    def release(self) -> None:
        """Give the lock back (idempotent); a folder this run created and left empty (it
        failed before writing anything) is removed again."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self._lock_file.unlink(missing_ok=True)  # while still holding it
        finally:
            os.close(fd)
        if self._created:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only when empty

    def __enter__(self) -> RunFolder:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
