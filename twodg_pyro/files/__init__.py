"""File plumbing at the bottom of the library, knowing no guide: atomic writes and loading
without executing code (:mod:`.atomic`), content checksums and finiteness checks
(:mod:`.integrity`) and the JSON-header-plus-tensors container of every model file and
checkpoint (:mod:`.payload`).  It imports nothing of the library except the
architectures of :mod:`twodg_pyro.models`."""

from .atomic import (
    NoSpaceError,
    atomic_torch_save,
    atomic_write,
    atomic_write_text,
    jsonable,
    safe_torch_load,
)
from .integrity import ChecksumError, content_digest, seal, verify_checksum
from .payload import PayloadFormat, read_payload, write_payload

__all__ = [
    "ChecksumError",
    "NoSpaceError",
    "PayloadFormat",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_text",
    "content_digest",
    "jsonable",
    "read_payload",
    "safe_torch_load",
    "seal",
    "verify_checksum",
    "write_payload",
]
