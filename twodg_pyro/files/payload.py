"""Reading the library's tensor files: a JSON ``header`` plus named tensor sections.

Model files (:mod:`twodg_pyro.io.bnn_file`) and training checkpoints
(:mod:`twodg_pyro.files.checkpoint`) share one layout: a dictionary of plain data whose
``"header"`` entry is a JSON string naming the file's ``kind`` and ``format_version``,
and whose other entries are keyed ``"<section>/<name>"`` (``"guide/locs.w"``, ...).
Since format version 2 they also hold a content checksum (SHA-256 over every tensor and
the header, :mod:`twodg_pyro.files.integrity`) under ``"checksum"``.

:func:`write_payload` seals and writes such a file atomically; :func:`read_payload`
loads one without executing code, verifies its checksum, checks its header and refuses
NaN/inf in its parameters; :func:`payload_section` takes one section out of it.

Files of an earlier format version without a checksum (``legacy_versions``) still load,
with a :class:`UnverifiedFileWarning` saying that their integrity cannot be checked
(NaN/inf are still refused); saving them again adds the checksum.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_torch_save, safe_torch_load
from .integrity import CHECKSUM_KEY, check_finite, seal, verify_checksum

__all__ = [
    "PayloadFormat",
    "UnverifiedFileWarning",
    "payload_section",
    "read_payload",
    "write_payload",
]


class UnverifiedFileWarning(UserWarning):
    """A file of an earlier format version, without a content checksum, was loaded."""


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
        legacy_versions: earlier format versions, written without a checksum, that
            still load (with an :class:`UnverifiedFileWarning`).
        finite_prefixes: the sections (key prefixes) whose floating-point tensors must
            be finite.
    """

    kind: str
    version: int
    noun: str
    header_noun: str
    kind_noun: str
    version_noun: str = "format version"
    legacy_versions: tuple[int, ...] = ()
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
            its checksum (:class:`~twodg_pyro.files.integrity.ChecksumError`), no or invalid
            header, another ``kind`` than ``fmt.kind``, another format version than
            ``fmt.version`` (or one of ``fmt.legacy_versions``), or NaN/inf in the
            sections ``fmt.finite_prefixes``.
    """
    payload = safe_torch_load(path) if loaded is None else loaded
    where = str(path)
    checked = False
    if isinstance(payload, dict) and CHECKSUM_KEY in payload:
        checked = verify_checksum(payload, where)  # first: a damaged header is "corrupted"
    if not isinstance(payload, dict) or not isinstance(payload.get("header"), str):
        raise ValueError(f"{where!r} is not {fmt.noun} (no header)")
    try:
        header = json.loads(payload["header"])
    except (json.JSONDecodeError, RecursionError) as e:  # (nested too deep)
        raise ValueError(f"{where!r}: {fmt.header_noun} is not valid JSON: {e}") from e
    if not isinstance(header, dict) or header.get("kind") != fmt.kind:
        kind = header.get("kind") if isinstance(header, dict) else None
        raise ValueError(f"{where!r} is not {fmt.kind_noun} (kind {kind!r})")
    version = header.get("format_version")
    if version != fmt.version and version not in fmt.legacy_versions:
        readable = sorted({fmt.version, *fmt.legacy_versions})
        raise ValueError(
            f"{where!r} has {fmt.version_noun} {version!r}; this version of twodg_pyro "
            f"reads version{'s' if len(readable) > 1 else ''} "
            f"{', '.join(str(v) for v in readable)}"
        )
    if not checked:
        if version == fmt.version:
            verify_checksum(payload, where)  # raises: the current version requires one
        warnings.warn(
            f"{where!r} was written by an earlier twodg_pyro ({fmt.version_noun} {version}) "
            "without a content checksum: its integrity cannot be verified (NaN/inf are "
            "still refused); save it again to add one",
            UnverifiedFileWarning,
            stacklevel=3,
        )
    if fmt.finite_prefixes:
        checked_sections = {k: v for k, v in payload.items() if k.startswith(fmt.finite_prefixes)}
        check_finite(checked_sections, where, "parameters")
    return payload, header


def write_payload(payload: dict, path: str | Path) -> Path:
    """Seal ``payload`` with its content checksum and write it atomically to ``path``."""
    return atomic_torch_save(seal(payload), path)


def payload_section(payload: Mapping, prefix: str) -> dict:
    """The entries of ``payload`` whose key starts with ``prefix``, keyed without it."""
    n = len(prefix)
    return {k[n:]: v for k, v in payload.items() if k.startswith(prefix)}
