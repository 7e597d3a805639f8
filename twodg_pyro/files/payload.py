"""The library's tensor files: a JSON ``header`` plus named tensor sections.

Model files (:mod:`twodg_pyro.io.model_format`) and training checkpoints
(:mod:`twodg_pyro.infer.checkpoint`) share one layout: a dictionary of plain data whose
``"header"`` entry is a JSON string naming the file's ``kind`` and ``format_version``,
whose other entries are keyed ``"<section>/<name>"`` (``"guide/locs.w"``, ...), and
whose ``"checksum"`` is a content checksum (SHA-256 over every tensor and the header,
:mod:`twodg_pyro.files.integrity`): :func:`write_payload` writes one,
:func:`read_payload` reads and checks one, :func:`payload_section` takes a section out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_torch_save, safe_torch_load
from .integrity import CHECKSUM_KEY, check_finite, seal, verify_checksum

_RETRAIN = (
    "an earlier twodg_pyro wrote it; re-save it with a twodg_pyro that still reads it "
    "(loading and saving it writes the current version), or retrain the model"
)


@dataclass(frozen=True)
class PayloadFormat:
    """A kind of file, and how error messages name it.

    Attributes:
        kind: the header's ``kind``.
        version: the ``format_version`` this version of the library reads (the only one).
        kind_noun: what the file should be, e.g. ``"a twodg_pyro checkpoint"``
            (``"<path> is not <kind_noun> (no header)"``).
        version_noun: its version, e.g. ``"checkpoint format version"``.
        older: what to do with a file of an earlier format version.
        finite_prefixes: the sections (key prefixes) whose floating-point tensors must
            be finite.
    """

    kind: str
    version: int
    kind_noun: str = "a twodg_pyro model file"
    version_noun: str = "format version"
    older: str = _RETRAIN
    finite_prefixes: tuple[str, ...] = ()


def read_payload(path: str | Path, fmt: PayloadFormat, loaded=None) -> tuple[dict, dict]:
    """Load ``path`` (:func:`~twodg_pyro.files.atomic.safe_torch_load`) and check its header.

    ``loaded``: the file's content when the caller has loaded it already (to tell
    formats apart), so that it is not read twice.

    Returns:
        ``(payload, header)``: the whole dictionary and its decoded JSON header.

    Raises:
        FileNotFoundError: no such file.
        ValueError: truncated, corrupted or foreign file, a content that does not match
            its checksum or no checksum
            (:class:`~twodg_pyro.files.integrity.ChecksumError`), no or invalid header,
            another ``kind`` than ``fmt.kind``, another format version than
            ``fmt.version`` (the message says what to do), or NaN/inf in the sections
            ``fmt.finite_prefixes``.
    """
    payload = safe_torch_load(path) if loaded is None else loaded
    where = str(path)
    checked = False
    if isinstance(payload, dict) and CHECKSUM_KEY in payload:
        checked = verify_checksum(payload, where)  # first: a damaged header is "corrupted"
    if not isinstance(payload, dict) or not isinstance(payload.get("header"), str):
        raise ValueError(f"{where!r} is not {fmt.kind_noun} (no header)")
    try:
        header = json.loads(payload["header"])
    except (json.JSONDecodeError, RecursionError) as e:  # (nested too deep)
        raise ValueError(f"{where!r}: its header is not valid JSON: {e}") from e
    if not isinstance(header, dict) or header.get("kind") != fmt.kind:
        kind = header.get("kind") if isinstance(header, dict) else None
        raise ValueError(f"{where!r} is not {fmt.kind_noun} (kind {kind!r})")
    version = header.get("format_version")
    if version != fmt.version:
        todo = ""
        if isinstance(version, int) and not isinstance(version, bool):
            todo = f": {fmt.older}" if version < fmt.version else ": update twodg_pyro to read it"
        raise ValueError(
            f"{where!r} has {fmt.version_noun} {version!r}; this version of twodg_pyro reads "
            f"{fmt.version_noun} {fmt.version} only{todo}"
        )
    if not checked:
        verify_checksum(payload, where)  # raises: the format requires one
    check_finite({k: v for k, v in payload.items() if k.startswith(fmt.finite_prefixes)}, where)
    return payload, header


def write_payload(payload: dict, path: str | Path) -> Path:
    """Seal ``payload`` with its content checksum and write it atomically to ``path``."""
    return atomic_torch_save(seal(payload), path)


def payload_section(payload: Mapping, prefix: str) -> dict:
    """The entries of ``payload`` whose key starts with ``prefix``, keyed without it."""
    return {k.removeprefix(prefix): v for k, v in payload.items() if k.startswith(prefix)}
