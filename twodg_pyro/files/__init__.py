"""File plumbing at the bottom of the library, knowing no guide: atomic writes and loading
without executing code, the size of a path that must be a regular file (:mod:`.atomic`),
content checksums, finiteness and range checks of stored fields (:mod:`.integrity`) and
the JSON-header-plus-tensors container of every model file and checkpoint
(:mod:`.payload`).  It imports nothing of the library except the
architectures of :mod:`twodg_pyro.models`."""

from .atomic import (
    NoSpaceError,
    atomic_torch_save,
    atomic_write,
    atomic_write_text,
    file_size,
    jsonable,
    safe_torch_load,
)
from .integrity import (
    MAX_MAGNITUDE,
    ChecksumError,
    FieldError,
    check_field,
    content_digest,
    seal,
    verify_checksum,
)
from .payload import PayloadFormat, read_payload, write_payload

__all__ = [
    "MAX_MAGNITUDE",
    "ChecksumError",
    "FieldError",
    "NoSpaceError",
    "PayloadFormat",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_text",
    "check_field",
    "content_digest",
    "file_size",
    "jsonable",
    "read_payload",
    "safe_torch_load",
    "seal",
    "verify_checksum",
    "write_payload",
]
