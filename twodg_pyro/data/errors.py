"""Errors raised by the data loaders."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


class DatasetNotFoundError(FileNotFoundError):
    """A data set's files are missing from the folder they were looked for in.

    Data sets are never downloaded at run time; the message says which folder
    was searched, which files or sub-folders are expected there (and which of
    them are missing), and where to obtain the data.

    Args:
        dataset: human-readable data set name, e.g. ``"CIFAR-10"``.
        folder: the folder that was searched.
        expected: files / sub-folders expected in ``folder`` (relative paths).
        url: the data set's official page.
        missing: the subset of ``expected`` found missing (defaults to all).
        hint: optional extra instructions (e.g. how to unpack the archive).

    Attributes:
        dataset, folder, expected, missing, url, hint: as passed in.
    """

    def __init__(
        self,
        dataset: str,
        folder: str | os.PathLike[str],
        expected: Sequence[str],
        url: str,
        missing: Sequence[str] | None = None,
        hint: str | None = None,
    ) -> None:
        self.dataset = dataset
        self.folder = os.fspath(folder)
        self.expected = list(expected)
        self.missing = list(self.expected if missing is None else missing)
        self.url = url
        self.hint = hint
        lines = [
            f"{dataset} data set not found in folder '{self.folder}'.",
            "Expected there: " + ", ".join(self.expected) + ".",
        ]
        if self.missing and self.missing != self.expected:
            lines.append("Missing: " + ", ".join(self.missing) + ".")
        lines.append(f"Get the data from the official page {url} and place it in that folder.")
        if hint:
            lines.append(hint)
        lines.append("Nothing is downloaded at run time.")
        super().__init__(" ".join(lines))

    @classmethod
    def check(cls, dataset, folder: Path, expected, url, hint=None, present=Path.is_file) -> None:
        """Raise the error (arguments as above) unless every ``folder / e`` of ``expected``
        is ``present`` (a file, by default)."""
        missing = [e for e in expected if not present(folder / e)]
        if missing:
            raise cls(dataset, folder, expected, url, missing=missing, hint=hint)

    def __reduce__(self):  # keep the error picklable despite the custom signature
        return (
            type(self),
            (self.dataset, self.folder, self.expected, self.url, self.missing, self.hint),
        )


class DatasetFormatError(ValueError):
    """A data set's file is there but is not what it should be: truncated, another
    format (a wrong magic number, still gzip-compressed), inconsistent counts, labels out
    of range.  The message names the file and what is wrong.

    Attributes:
        path: the file.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"data file '{self.path}' {problem}")

    def __reduce__(self):
        return (type(self), (self.path, self.problem))
