r"""What the CLI writes besides its own lines, kept in its voice.

:func:`cli_output` wraps a command: stdout and stderr write any path the file system
accepts (a name that is not valid in the locale's encoding, e.g. a Latin-1 byte under
UTF-8, is written with a backslash escape, ``caf\udce9``, instead of failing after
the work is done); third-party caches get a writable folder when their defaults are not
writable (a read-only ``HOME``: matplotlib would make a temporary one on every run and
say so, ArviZ would fail to import: :func:`writable_caches`), and matplotlib's log
messages become the CLI's one-line warnings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def _writable(folder: Path) -> bool:
    """Whether ``folder`` is (made if need be, as its library would) a writable folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return folder.is_dir() and os.access(folder, os.W_OK)


def writable_caches() -> None:
    """Point third-party caches at ``<tmp>/twodg-pyro-<uid>`` (kept between runs) where
    their defaults cannot be written (a read-only ``HOME``): ``XDG_CACHE_HOME`` when
    ``$XDG_CACHE_HOME`` or ``~/.cache`` cannot be (ArviZ fails to import without it,
    matplotlib keeps its font cache there), ``MPLCONFIGDIR`` when matplotlib's
    configuration folder cannot."""
    if not sys.platform.startswith("linux"):
        return
    home = Path(os.environ.get("HOME") or "/")
    wanted = {}
    if not _writable(Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache")):
        wanted["XDG_CACHE_HOME"] = "cache"
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib"
    if not os.environ.get("MPLCONFIGDIR") and not _writable(config):
        wanted["MPLCONFIGDIR"] = "matplotlib"
    if not wanted:
        return
    folder = Path(tempfile.gettempdir()) / f"twodg-pyro-{os.getuid()}"
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.lstat() if folder.is_dir() and not folder.is_symlink() else None
    if st is None or st.st_uid != os.getuid() or not os.access(folder, os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="twodg-pyro-"))  # not ours: a fresh one
    for variable, name in wanted.items():
        (folder / name).mkdir(exist_ok=True)
        os.environ[variable] = str(folder / name)


class _Restate(logging.Handler):
    """A logger's warnings as ``say("warning: <one line>")``."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say("warning: " + " ".join(record.getMessage().split()))


@contextlib.contextmanager
def cli_output(say: Callable[[str], None]) -> Iterator[None]:
    """Within it: the streams write any path (and keep doing so), third-party caches are
    writable and matplotlib's log messages are ``say``'s warnings (see the module
    docstring)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    writable_caches()
    log = logging.getLogger("matplotlib")
    handler, propagate = _Restate(say), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
