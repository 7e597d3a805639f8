"""Reading the library's tensor files: a JSON ``header`` plus named tensor sections.

Model files (:mod:`twodg_pyro.io.bnn_file`) and training checkpoints
(:mod:`twodg_pyro.io.checkpoint`) share one layout: a dictionary of plain data whose
``"header"`` entry is a JSON string naming the file's ``kind`` and ``format_version``,
and whose other entries are keyed ``"<section>/<name>"`` (``"guide/locs.w"``, ...).
:func:`read_payload` loads such a file without executing code and checks its header;
:func:`payload_section` takes one section out of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .files import safe_torch_load

__all__ = ["PayloadFormat", "payload_section", "read_payload"]


@dataclass(frozen=True)
class PayloadFormat:
    """A kind of file, and how error messages name it.

    Attributes:
        kind: the header's ``kind``.
        version: the ``format_version`` this version of the library reads.
        noun: what the file should be, e.g. ``"a twodg_pyro checkpoint"``
            (``"<path> is not <noun> (no header)"``).
        header_noun: its header, e.g. ``"the checkpoint header"``.
        kind_noun: what the file should be when its ``kind`` is wrong.
        version_noun: its version, e.g. ``"checkpoint format version"``.
    """

    kind: str
    version: int
    noun: str
    header_noun: str
    kind_noun: str
    version_noun: str = "format version"


def read_payload(path: str | Path, fmt: PayloadFormat) -> tuple[dict, dict]:
    """Load ``path`` (:func:`~twodg_pyro.io.files.safe_torch_load`) and check its header.

    Returns:
        ``(payload, header)``: the whole dictionary and its decoded JSON header.

    Raises:
        FileNotFoundError: no such file.
        ValueError: truncated, corrupted or foreign file, no or invalid header, another
            ``kind`` than ``fmt.kind``, or another format version than ``fmt.version``.
    """
    payload = safe_torch_load(path)
    where = str(path)
    if not isinstance(payload, dict) or not isinstance(payload.get("header"), str):
        raise ValueError(f"{where!r} is not {fmt.noun} (no header)")
    try:
        header = json.loads(payload["header"])
    except json.JSONDecodeError as e:
        raise ValueError(f"{where!r}: {fmt.header_noun} is not valid JSON: {e}") from e
    if not isinstance(header, dict) or header.get("kind") != fmt.kind:
        kind = header.get("kind") if isinstance(header, dict) else None
        raise ValueError(f"{where!r} is not {fmt.kind_noun} (kind {kind!r})")
    if header.get("format_version") != fmt.version:
        raise ValueError(
            f"{where!r} has {fmt.version_noun} {header.get('format_version')!r}; this "
            f"version of twodg_pyro reads version {fmt.version}"
        )
    return payload, header


def payload_section(payload: Mapping, prefix: str) -> dict:
    """The entries of ``payload`` whose key starts with ``prefix``, keyed without it."""
    n = len(prefix)
    return {k[n:]: v for k, v in payload.items() if k.startswith(prefix)}
