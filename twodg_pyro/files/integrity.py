r"""Content checksums and finiteness checks for the library's files.

A file's *content digest* is a SHA-256 over a canonical encoding of everything the
file holds: every tensor (dtype, shape and raw bytes), every string (the JSON
header included), number, list and dictionary key, in a fixed order.  Model files
(:mod:`~twodg_pyro.io.model_format`) and checkpoints (:mod:`~twodg_pyro.infer.checkpoint`)
store it under the top-level key :data:`CHECKSUM_KEY` (``"sha256:<64 hex digits>"``)
when written (:func:`seal`) and verify it when read (:func:`verify_checksum`): a
changed byte anywhere in the content is a ``ValueError`` naming the file, not a model
that silently predicts something else.

The digest is of the *content*, not of the bytes on disk: two saves of the same tensors
give the same digest, and the container (``torch.save``'s zip archive) may change
without changing it.  Changed container bytes either make the file unreadable (a
``ValueError`` from :func:`~twodg_pyro.files.atomic.safe_torch_load`) or leave the content,
and so every result, unchanged.

Other file formats use the same helper: :func:`content_digest` takes any nesting of
dicts, lists, tuples, tensors, NumPy arrays, ``bytes``, strings, numbers, booleans and
``None`` (a format that writes raw bytes can pass them as ``bytes``), and
:func:`check_finite` refuses NaN/inf in loaded parameters.

Encoding (version 1, prefixed with ``b"twodg_pyro-content-v1\0"``): each value is a
one-byte type tag followed by its content; lengths are 8-byte little-endian
integers; dictionaries are encoded as their items sorted by the encoding of the key;
floats by ``float.hex``; tensors by dtype name, shape and their bytes in C order
(little-endian, as on every platform torch supports).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The top-level key under which files store their content digest.
CHECKSUM_KEY = "checksum"
_ALGORITHM = "sha256"
_DOMAIN = b"twodg_pyro-content-v1\0"


class ChecksumError(ValueError):
    """A file's content does not match the checksum stored in it (or the checksum is
    missing or malformed); the message names the file."""


def _length(n: int) -> bytes:
    return struct.pack("<Q", n)


def _tensor_bytes(t: torch.Tensor) -> memoryview | bytes:
    t = t.detach().cpu()
    if t.layout != torch.strided:  # sparse
        t = t.to_dense()
    if t.numel() == 0:
        return b""
    flat = t.contiguous().view(-1)
    if flat.stride(0) != 1:  # a one-element view may keep any stride
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return memoryview(flat.view(torch.uint8).numpy())


def _chunks(obj: Any) -> Iterator[bytes | memoryview]:
    """The canonical encoding of ``obj`` as a stream of byte chunks."""
    if obj is None:
        yield b"N"
    elif isinstance(obj, bool):
        yield b"T" if obj else b"F"
    elif isinstance(obj, int):
        raw = str(obj).encode()
        yield b"I" + _length(len(raw)) + raw
    elif isinstance(obj, float):
        raw = obj.hex().encode() if math.isfinite(obj) else repr(obj).encode()
        yield b"D" + _length(len(raw)) + raw
    elif isinstance(obj, str):
        raw = obj.encode("utf-8", "surrogatepass")
        yield b"S" + _length(len(raw)) + raw
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        raw = bytes(obj)
        yield b"B" + _length(len(raw)) + raw
    elif torch.is_tensor(obj):
        head = f"{obj.dtype}|{list(obj.shape)}".encode()
        data = _tensor_bytes(obj)
        yield b"X" + _length(len(head)) + head + _length(len(data))
        yield data
    elif isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        head = f"{arr.dtype.str}|{list(arr.shape)}".encode()
        data = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else b""
        yield b"A" + _length(len(head)) + head + _length(len(data))
        yield data
    elif isinstance(obj, np.generic):
        yield from _chunks(obj.item())
    elif isinstance(obj, Mapping):
        items = [(b"".join(bytes(c) for c in _chunks(k)), v) for k, v in obj.items()]
        items.sort(key=lambda kv: kv[0])
        yield b"M" + _length(len(items))
        for key, v in items:
            yield key
            yield from _chunks(v)
    elif isinstance(obj, (list, tuple)):
        yield (b"L" if isinstance(obj, list) else b"U") + _length(len(obj))
        for v in obj:
            yield from _chunks(v)
    elif isinstance(obj, torch.dtype):
        raw = str(obj).encode()
        yield b"Y" + _length(len(raw)) + raw
    else:
        raise TypeError(f"cannot checksum a value of type {type(obj).__name__}")


def bytes_digest(data: bytes | memoryview) -> bytes:
    """The raw 32-byte SHA-256 of ``data``: the checksum of a byte-level format (the
    compact ``.2dgz`` file appends it to its content), where the bytes are the content."""
    return hashlib.sha256(data).digest()


def content_digest(obj: Any, exclude: tuple[str, ...] = (CHECKSUM_KEY,)) -> str:
    """``"sha256:<hex>"`` of ``obj``'s content (see the module docstring).

    Args:
        obj: nested dicts/lists/tuples of tensors, arrays, bytes, strings and numbers.
        exclude: top-level keys left out when ``obj`` is a mapping (the stored
            checksum itself).

    Raises:
        TypeError: a value of a type the encoding does not cover.
    """
    if isinstance(obj, Mapping) and exclude:
        obj = {k: v for k, v in obj.items() if k not in exclude}
    h = hashlib.sha256(_DOMAIN)
    for chunk in _chunks(obj):
        h.update(chunk)
    return f"{_ALGORITHM}:{h.hexdigest()}"


def seal(payload: dict) -> dict:
    """Store the content digest of ``payload`` in it (in place) under
    :data:`CHECKSUM_KEY`; returns ``payload``."""
    payload.pop(CHECKSUM_KEY, None)
    payload[CHECKSUM_KEY] = content_digest(payload)
    return payload


def verify_checksum(payload: Mapping, where: str | Path, required: bool = True) -> bool:
    """Check the digest stored in ``payload`` against its content.

    Args:
        payload: a loaded file's top-level dictionary.
        where: the file, for messages.
        required: a missing checksum is an error (else ``False`` is returned).

    Returns:
        ``True`` when a checksum was present and matched, ``False`` when there was none
        and ``required`` is false.

    Raises:
        ChecksumError: (a ``ValueError``) the content differs from what was written, or
            the stored checksum is malformed, or missing while ``required``.
    """
    where = str(where)
    stored = payload.get(CHECKSUM_KEY) if isinstance(payload, Mapping) else None
    if stored is None:
        if required:
            raise ChecksumError(
                f"{where!r} has no content checksum although its format version requires "
                "one: the file was edited or damaged"
            )
        return False
    if not (isinstance(stored, str) and stored.startswith(f"{_ALGORITHM}:")):
        raise ChecksumError(f"{where!r}: its stored checksum is malformed ({stored!r:.80})")
    try:
        actual = content_digest(payload)
    except TypeError as e:
        raise ChecksumError(f"{where!r} holds content that cannot be checked: {e}") from e
    if actual != stored:
        raise ChecksumError(
            f"{where!r} is corrupted: its content does not match the checksum stored in it "
            "(the file was changed after it was written: a damaged copy, a disk error or "
            "a hand edit); restore it from a good copy or write it again"
        )
    return True


def _non_finite(obj: Any, prefix: str = "") -> list[tuple[str, int, int, float]]:
    """``[(name, n_bad, numel, first bad value), ...]`` of the tensors holding NaN/inf."""
    out: list[tuple[str, int, int, float]] = []
    if torch.is_tensor(obj):
        if (obj.is_floating_point() or obj.is_complex()) and obj.numel():
            t = obj.detach()
            wide = torch.complex128 if t.is_complex() else torch.float64
            if torch.isfinite(t.sum(dtype=wide)):  # fast path: NaN/inf would propagate
                return out
            bad = ~torch.isfinite(t)
            n = int(bad.sum())
            if n:
                out.append((prefix or "<tensor>", n, t.numel(), float(t[bad][0].real)))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            out += _non_finite(v, f"{prefix}/{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += _non_finite(v, f"{prefix}[{i}]")
    return out


def check_finite(obj: Any, where: str | Path, what: str = "parameters") -> None:
    """Refuse NaN/inf in the floating-point tensors of ``obj`` (a loaded section).

    Raises:
        ValueError: naming the file, the first tensors with non-finite values and how
            many values are bad.
    """
    bad = _non_finite(obj)
    if not bad:
        return
    total = sum(b[1] for b in bad)
    listed = ", ".join(f"{name} ({n} of {numel}, first {v})" for name, n, numel, v in bad[:3])
    more = f" and {len(bad) - 3} more tensor(s)" if len(bad) > 3 else ""
    raise ValueError(
        f"{str(where)!r} holds {total} non-finite (NaN/inf) value(s) in its {what}: "
        f"{listed}{more}; the model diverged before it was saved, or the file was edited. "
        "Refusing to load it"
    )


#: The largest magnitude a stored floating-point field of a model may hold (checked where
#: a loader checks a field's range): 2**30, far above any trained weight, centre or scale,
#: far below what overflows a forward pass (a single bit of a float's exponent flipped
#: multiplies it by 2**64 or more, or makes it inf).
MAX_MAGNITUDE = 2.0**30


class FieldError(ValueError):
    """A stored field holds a value outside its range (or of the wrong kind); the message
    names the field and the value."""


def check_field(
    name: str,
    t: torch.Tensor,
    low: float | None = None,
    high: float | None = None,
    shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """``t`` when every value of the stored field ``name`` is in ``[low, high]`` (an unset
    bound is not checked) and its shape is ``shape`` (if given): for a floating-point
    field, finite and of magnitude at most :data:`MAX_MAGNITUDE` too; for an integer
    field the bounds are those of an index, e.g. ``low=0, high=K - 1``.

    Raises:
        FieldError: naming the field, the first bad value and its position.
    """
    if not torch.is_tensor(t):
        raise FieldError(f"{name} is a {type(t).__name__}, not a tensor")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise FieldError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.is_floating_point():
        bad = ~torch.isfinite(t)
        low = -MAX_MAGNITUDE if low is None else max(low, -MAX_MAGNITUDE)
        high = MAX_MAGNITUDE if high is None else min(high, MAX_MAGNITUDE)
    elif t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        bad = torch.zeros_like(t, dtype=torch.bool)
    else:
        raise FieldError(f"{name} has dtype {t.dtype}, not a number")
    if low is not None:
        bad |= t < low
    if high is not None:
        bad |= t > high
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        value = t[at].item() if at else t.item()
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        raise FieldError(
            f"{name} holds {value!r} at {list(at)} ({int(bad.sum())} bad value(s)): it must "
            f"be in [{lo}, {hi}]"
        )
    return t
