"""Integers as bytes: LEB128 varints and fixed-width bit packing (LSB first), the raw
codings of the compact model files (:mod:`twodg_pyro.io.compact_format`) and of the
entropy coder's tables (:mod:`twodg_pyro.io.entropy`)."""

from __future__ import annotations

import math

import numpy as np


def write_varints(values: np.ndarray) -> bytes:
    """Non-negative integers as unsigned LEB128 varints (7 bits per byte, low first)."""
    out = bytearray()
    for v in np.asarray(values, dtype=np.uint64).reshape(-1).tolist():
        while v > 0x7F:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def read_varints(buf: bytes | memoryview, pos: int, count: int) -> tuple[np.ndarray, int]:
    """``count`` LEB128 varints from ``buf`` at ``pos``; returns ``(values, new_pos)``.

    Raises:
        ValueError: the buffer ends inside a varint or a varint exceeds 63 bits.
    """
    out = np.empty(count, dtype=np.int64)
    view = memoryview(buf)
    n = len(view)
    for i in range(count):
        value, shift = 0, 0
        while True:
            if pos >= n:
                raise ValueError("truncated varint")
            b = view[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 56:
                raise ValueError("varint too long")
        out[i] = value
    return out, pos


def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Unsigned integers ``< 2**bits`` packed at ``bits`` bits each, LSB first."""
    v = np.asarray(values, dtype=np.uint64).reshape(-1)
    if bits < 1 or bits > 32:
        raise ValueError(f"bits must be in [1, 32], got {bits}")
    if v.size and int(v.max()) >> bits:
        raise ValueError(f"a value {int(v.max())} does not fit in {bits} bits")
    planes = ((v[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def unpack_bits(buf: bytes | memoryview, count: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` values of ``bits`` bits (``int64``)."""
    need = math.ceil(count * bits / 8)
    if len(buf) != need:
        raise ValueError(f"{count} values of {bits} bits take {need} bytes, got {len(buf)}")
    flat = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), count=count * bits, bitorder="little")
    weights = (1 << np.arange(bits, dtype=np.int64))[None, :]
    return (flat.reshape(count, bits).astype(np.int64) * weights).sum(1)
