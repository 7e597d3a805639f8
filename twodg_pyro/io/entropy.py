r"""Entropy coding of integer symbol streams: interleaved static rANS, vectorised in NumPy.

Used by the compact model files (:mod:`twodg_pyro.io.compact`) for the per-weight
component index, whose zeroth-order empirical entropy

.. math:: H = -\sum_s \frac{n_s}{n} \log_2 \frac{n_s}{n} \quad\text{bits per symbol}

is the target: the stream costs :math:`n H` bits plus a frequency table per context,
the loss of rounding the frequencies to a power-of-two total and four bytes per lane.

**The coder** (range asymmetric numeral systems, Duda 2013, in the word-oriented form
with a 32-bit state and 16-bit output words).  A context :math:`c` (the whole stream, or
one layer) has frequencies :math:`f_s` summing to :math:`2^{M_c}` (:math:`M_c \le 16`)
and cumulative frequencies :math:`F_s`.  Encoding symbol :math:`s` in state :math:`x`:

.. math::
    x \ge f_s\,2^{32 - M_c} \Rightarrow \text{emit } x \bmod 2^{16},\ x \leftarrow
    \lfloor x / 2^{16} \rfloor; \qquad
    x \leftarrow 2^{M_c} \lfloor x / f_s \rfloor + (x \bmod f_s) + F_s

and decoding is the inverse (:math:`r = x \bmod 2^{M_c}` picks :math:`s` with
:math:`F_s \le r < F_s + f_s`, :math:`x \leftarrow f_s \lfloor x / 2^{M_c}\rfloor + r - F_s`,
then read one word while :math:`x < 2^{16}`).  States live in :math:`[2^{16}, 2^{32})`,
so at most one word moves per symbol.

**Vectorised**: the stream is split round-robin over ``L`` lanes (position
:math:`i` belongs to lane :math:`i \bmod L`), each lane with its own state; all lanes
advance in lock step, one NumPy operation per step for all of them, so decoding costs
:math:`\lceil n / L \rceil` steps rather than :math:`n` Python iterations.  The lanes
share one word stream: at each step the lanes that read take consecutive words in lane
order (the encoder, running backwards, emits them so).  Every lane starts and must end
in state :math:`2^{16}`, and the decoder must consume exactly the stream: a corrupted
stream is detected, not decoded into other symbols.

**Frequency tables** (:func:`encode_table`): one byte :math:`M_c`, a presence bitmap over
the alphabet (LSB first), then :math:`f_s - 1` of every present symbol but the last
(implied by the sum) as LEB128 varints.  :func:`choose_table` picks :math:`M_c` to
minimise table bytes plus coded bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .bits import read_varints, write_varints

#: Lower end of the rANS state interval [2^16, 2^32).
RANS_LOW = 1 << 16
_WORD = 16
_MAX_SCALE_BITS = 16
#: Symbols per lane the lane count aims at (fewer lanes: fewer 4-byte states; more: fewer
#: NumPy steps).
_SYMBOLS_PER_LANE = 2048
_MAX_LANES = 4096
_LOOKUP_SLOTS = 1 << 22  # the most slot-table entries decoding builds beyond one per symbol


# ------------------------------------------------------------------ entropy
def empirical_entropy_bits(symbols: np.ndarray, contexts: np.ndarray | None = None) -> float:
    r"""Zeroth-order empirical entropy in bits per symbol; with ``contexts`` (same length),
    the conditional entropy :math:`H(S \mid C) = \sum_c \frac{n_c}{n} H(S \mid c)`."""
    symbols = np.asarray(symbols).reshape(-1)
    n = symbols.size
    if n == 0:
        return 0.0
    ctx = np.zeros(n, np.int64) if contexts is None else np.asarray(contexts).reshape(-1)
    a, n_ctx = int(symbols.max()) + 1, int(ctx.max()) + 1
    counts = np.bincount(ctx.astype(np.int64) * a + symbols, minlength=n_ctx * a).reshape(n_ctx, a)
    total = 0.0
    for row in counts:
        row = row[row > 0].astype(np.float64)
        m = row.sum()
        total += float(-(row * np.log2(row / m)).sum()) if m else 0.0
    return total / n


# ------------------------------------------------------------------ tables
def quantise_frequencies(counts: np.ndarray, scale_bits: int) -> np.ndarray:
    r"""Integer frequencies :math:`f_s \ge 1` for every symbol with a count, 0 elsewhere,
    summing to :math:`2^{M}`, close to proportional (the rounding error is spread where it
    costs the fewest coded bits, :math:`n_s \log_2 \frac{f_s + 1}{f_s}`)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = 1 << scale_bits
    present = counts > 0
    n_present = int(present.sum())
    if n_present == 0:
        raise ValueError("no symbols to build a frequency table from")
    if n_present > total:
        raise ValueError(f"{n_present} symbols do not fit a table of total {total}")
    n = counts.sum()
    f = np.zeros_like(counts)
    f[present] = np.maximum(1, np.floor(counts[present] * total / n + 0.5)).astype(np.int64)
    diff = total - int(f.sum())
    c = counts.astype(np.float64)
    # rounding leaves |diff| <= n_present / 2 (plus the forced ones): one or two passes
    while diff > 0:  # add where one more unit saves the most bits
        gain = np.full(f.shape, -np.inf)
        gain[present] = c[present] * np.log2((f[present] + 1) / f[present])
        order = np.argsort(-gain, kind="stable")[: min(diff, n_present)]
        f[order] += 1
        diff = total - int(f.sum())
    while diff < 0:  # take away where one unit less costs the fewest bits
        can = present & (f > 1)
        loss = np.full(f.shape, np.inf)
        loss[can] = c[can] * np.log2(f[can] / (f[can] - 1))
        k = min(-diff, int(can.sum()))
        order = np.argsort(loss, kind="stable")[:k]
        f[order] -= 1
        diff = total - int(f.sum())
    return f


def encode_table(freqs: np.ndarray, scale_bits: int) -> bytes:
    """``M`` (one byte), presence bitmap, varints ``f - 1`` of all present symbols but the
    last (see the module docstring)."""
    freqs = np.asarray(freqs, dtype=np.int64)
    present = freqs > 0
    vals = freqs[present][:-1] - 1
    bitmap = np.packbits(present.astype(np.uint8), bitorder="little").tobytes()
    return bytes([scale_bits]) + bitmap + write_varints(vals)


def decode_table(buf: bytes | memoryview, pos: int, alphabet: int) -> tuple[np.ndarray, int, int]:
    """Inverse of :func:`encode_table`; returns ``(freqs, scale_bits, new_pos)``.

    Raises:
        ValueError: a table that is cut off or does not sum to ``2**scale_bits``.
    """
    nb = (alphabet + 7) // 8
    if pos + 1 + nb > len(buf):
        raise ValueError("truncated frequency table")
    scale_bits = buf[pos]
    if not 0 <= scale_bits <= _MAX_SCALE_BITS:
        raise ValueError(f"frequency table with {scale_bits} scale bits")
    bitmap = np.frombuffer(bytes(buf[pos + 1 : pos + 1 + nb]), dtype=np.uint8)
    present = np.unpackbits(bitmap, count=alphabet, bitorder="little").astype(bool)
    n_present = int(present.sum())
    if n_present == 0:
        raise ValueError("empty frequency table")
    vals, pos = read_varints(buf, pos + 1 + nb, n_present - 1)
    freqs = np.zeros(alphabet, dtype=np.int64)
    idx = np.flatnonzero(present)
    freqs[idx[:-1]] = vals + 1
    last = (1 << scale_bits) - int(freqs.sum())
    if last < 1:
        raise ValueError("frequency table does not sum to its total")
    freqs[idx[-1]] = last
    return freqs, scale_bits, pos


def choose_table(counts: np.ndarray) -> tuple[np.ndarray, int, int, float]:
    """The table of a context that minimises table bytes plus coded bits.

    Returns:
        ``(freqs, scale_bits, table_bytes, coded_bits)``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    present = counts > 0
    n_present = int(present.sum())
    lo = max(0, math.ceil(math.log2(max(n_present, 1))))
    best = None
    for m in range(lo, _MAX_SCALE_BITS + 1):
        f = quantise_frequencies(counts, m)
        tb = len(encode_table(f, m))
        bits = float((counts[present] * (m - np.log2(f[present]))).sum())
        cost = 8 * tb + bits
        if best is None or cost < best[0]:
            best = (cost, f, m, tb, bits)
        if n_present == 1:
            break
    _, f, m, tb, bits = best
    return f, m, tb, bits


# ------------------------------------------------------------------ rANS
def _context_arrays(freqs: np.ndarray, scale_bits: np.ndarray):
    freqs = np.asarray(freqs, dtype=np.int64)
    cum = np.concatenate([np.zeros((freqs.shape[0], 1), np.int64), freqs.cumsum(1)[:, :-1]], 1)
    return freqs, cum, np.asarray(scale_bits, dtype=np.int64)


def rans_encode(
    symbols: np.ndarray,
    contexts: np.ndarray,
    freqs: np.ndarray,
    scale_bits: np.ndarray,
    lanes: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Encode ``symbols`` (context ``contexts[i]`` each) over ``lanes`` interleaved states.

    Args:
        freqs: ``(n_contexts, alphabet)``, row ``c`` summing to ``2**scale_bits[c]`` and
            positive for every symbol that occurs in context ``c``.

    Returns:
        ``(states, words)``: the final ``uint32`` state of every lane and the ``uint16``
        word stream, in the order :func:`rans_decode` reads them.
    """
    sym = np.asarray(symbols, dtype=np.int64).reshape(-1)
    ctx = np.asarray(contexts, dtype=np.int64).reshape(-1)
    f_tab, c_tab, m_tab = _context_arrays(freqs, scale_bits)
    n = sym.size
    f = f_tab[ctx, sym].astype(np.uint64)
    if n and int(f.min()) == 0:
        bad = int(np.flatnonzero(f == 0)[0])
        raise ValueError(f"symbol {int(sym[bad])} at {bad} has frequency 0 in its context")
    c = c_tab[ctx, sym].astype(np.uint64)
    m = m_tab[ctx].astype(np.uint64)
    x_max = f << (np.uint64(32) - m)
    x = np.full(lanes, RANS_LOW, dtype=np.uint64)
    chunks = []
    mask16 = np.uint64(0xFFFF)
    for lo in reversed(range(0, n, lanes)):
        hi = min(lo + lanes, n)
        xs = x[: hi - lo]
        emit = xs >= x_max[lo:hi]
        if emit.any():
            chunks.append((xs[emit] & mask16).astype(np.uint16))
            xs[emit] >>= np.uint64(_WORD)
        fs = f[lo:hi]
        xs[:] = ((xs // fs) << m[lo:hi]) + (xs % fs) + c[lo:hi]
    words = np.concatenate(chunks[::-1]) if chunks else np.zeros(0, np.uint16)
    return x.astype(np.uint32), words


def rans_decode(
    states: np.ndarray,
    words: np.ndarray,
    contexts: np.ndarray,
    freqs: np.ndarray,
    scale_bits: np.ndarray,
) -> np.ndarray:
    """Inverse of :func:`rans_encode` (``len(contexts)`` symbols, ``len(states)`` lanes).

    Raises:
        ValueError: the stream is inconsistent (wrong length, or a lane does not end in
            its initial state): corrupted data, never silently other symbols.
    """
    ctx = np.asarray(contexts, dtype=np.int64).reshape(-1)
    f_tab, c_tab, m_tab = _context_arrays(freqs, scale_bits)
    n, lanes = ctx.size, int(len(states))
    n_ctx, alphabet = f_tab.shape
    # per context a slot -> symbol table of size 2^M_c in one flat array (unless too big)
    sizes = np.left_shift(1, m_tab)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if (f_tab.sum(1) != sizes).any():
        raise ValueError("a frequency table does not sum to its total")
    if int(sizes.sum()) <= max(_LOOKUP_SLOTS, n):
        find = np.concatenate(
            [np.repeat(np.arange(alphabet, dtype=np.int64), f_tab[k]) for k in range(n_ctx)]
        ).__getitem__
    else:  # the symbol of the last start at or below each slot
        keys = np.flatnonzero(f_tab.reshape(-1))
        starts, symbols = (offsets[:, None] + c_tab).reshape(-1)[keys], keys % alphabet

        def find(slots):
            return symbols[np.searchsorted(starts, slots, side="right") - 1]

    flat_f = f_tab.reshape(-1).astype(np.uint64)
    flat_c = c_tab.reshape(-1).astype(np.uint64)
    words = np.asarray(words, dtype=np.uint64)
    x = np.asarray(states, dtype=np.uint64).copy()
    if lanes < 1 or (x < RANS_LOW).any():
        raise ValueError("invalid rANS lane states")
    out = np.empty(n, dtype=np.int64)
    ptr, n_words = 0, words.size
    single = n_ctx == 1  # one context (a global table): no per-symbol table gathers
    if single:
        m0 = np.uint64(m_tab[0])
        mask0 = np.uint64((1 << int(m_tab[0])) - 1)
    for lo in range(0, n, lanes):
        hi = min(lo + lanes, n)
        xs = x[: hi - lo]
        if single:
            slot = xs & mask0
            s = find(slot.astype(np.int64))
            xs = f_tab[0][s].astype(np.uint64) * (xs >> m0) + slot - flat_c[s]
        else:
            cc = ctx[lo:hi]
            mc = m_tab[cc].astype(np.uint64)
            slot = xs & ((np.uint64(1) << mc) - np.uint64(1))
            s = find(offsets[cc] + slot.astype(np.int64))
            key = cc * alphabet + s
            xs = flat_f[key] * (xs >> mc) + slot - flat_c[key]
        out[lo:hi] = s
        need = xs < RANS_LOW
        k = int(need.sum())
        if k:
            if ptr + k > n_words:
                raise ValueError("the rANS stream ends early (truncated or corrupted)")
            xs[need] = (xs[need] << np.uint64(_WORD)) | words[ptr : ptr + k]
            ptr += k
        x[: hi - lo] = xs
    if ptr != n_words or not bool((x == RANS_LOW).all()):
        raise ValueError("the rANS stream does not decode consistently (corrupted)")
    return out


# ------------------------------------------------------------------ index streams
@dataclass
class IndexCode:
    """An encoded symbol stream and what it cost.

    Attributes:
        data: the bytes (tables, lane states, words; see :func:`encode_index`).
        mode: ``"global"`` (one table) or ``"per_site"`` (one table per segment).
        lanes: number of interleaved rANS lanes.
        n_words: number of 16-bit words.
        table_bytes: bytes of the frequency tables.
        sizes: ``{"global": bytes, "per_site": bytes}`` of every mode tried.
    """

    data: bytes
    mode: str
    lanes: int
    n_words: int
    table_bytes: int
    sizes: dict


def _segment_contexts(segments: list[int], mode: str) -> tuple[np.ndarray, int]:
    n = int(sum(segments))
    if mode == "global":
        return np.zeros(n, dtype=np.int64), 1
    return np.repeat(np.arange(len(segments), dtype=np.int64), segments), len(segments)


def _encode_mode(sym, segments, alphabet, mode, lanes) -> IndexCode:
    ctx, n_ctx = _segment_contexts(segments, mode)
    counts = np.bincount(ctx * alphabet + sym, minlength=n_ctx * alphabet).reshape(n_ctx, alphabet)
    tables, freqs, bits = [], np.zeros((n_ctx, alphabet), np.int64), np.zeros(n_ctx, np.int64)
    for k in range(n_ctx):
        empty = np.eye(1, alphabet, dtype=np.int64)[0]  # an empty segment: any valid table
        freqs[k], bits[k], _, _ = choose_table(counts[k] if counts[k].any() else empty)
        tables.append(encode_table(freqs[k], bits[k]))
    states, words = rans_encode(sym, ctx, freqs, bits, lanes)
    table_bytes = b"".join(tables)
    data = table_bytes + states.astype("<u4").tobytes() + words.astype("<u2").tobytes()
    return IndexCode(data, mode, lanes, int(words.size), len(table_bytes), {})


def encode_index(
    symbols: np.ndarray,
    segments: list[int],
    alphabet: int,
    mode: str = "auto",
    lanes: int | None = None,
) -> IndexCode:
    """Entropy-code a stream of symbols in ``[0, alphabet)`` made of ``segments`` (the
    lengths of consecutive parts, e.g. layers).

    Layout of :attr:`IndexCode.data`: the frequency tables (one, or one per segment, in
    order; :func:`encode_table`), ``lanes`` little-endian ``uint32`` final states, then
    the little-endian ``uint16`` words.

    Args:
        mode: ``"global"``, ``"per_site"`` or ``"auto"`` (encode both, keep the smaller).
        lanes: interleaved lanes (default: one per 2048 symbols, 1 to 4096).
    """
    sym = np.asarray(symbols, dtype=np.int64).reshape(-1)
    if sym.size != int(sum(segments)):
        raise ValueError(f"{sym.size} symbols but the segments cover {sum(segments)}")
    if sym.size and (int(sym.min()) < 0 or int(sym.max()) >= alphabet):
        raise ValueError(f"symbols must lie in [0, {alphabet})")
    if mode not in ("auto", "global", "per_site"):
        raise ValueError(f"index coding must be 'auto', 'global' or 'per_site', got {mode!r}")
    lanes = min(_MAX_LANES, max(1, sym.size // _SYMBOLS_PER_LANE)) if lanes is None else int(lanes)
    modes = ["global", "per_site"] if mode == "auto" else [mode]
    codes = {m: _encode_mode(sym, segments, alphabet, m, lanes) for m in modes}
    best = min(codes.values(), key=lambda c: len(c.data))
    best.sizes = {m: len(c.data) for m, c in codes.items()}
    return best


def decode_index(
    data: bytes | memoryview,
    segments: list[int],
    alphabet: int,
    mode: str,
    lanes: int,
    n_words: int,
) -> np.ndarray:
    """Inverse of :func:`encode_index` (the symbols, ``int64``).

    Raises:
        ValueError: the data do not have the announced layout or do not decode
            consistently.
    """
    if mode not in ("global", "per_site"):
        raise ValueError(f"unknown index coding {mode!r}")
    n_ctx = 1 if mode == "global" else len(segments)
    least = n_ctx * (1 + (alphabet + 7) // 8) + 4 * lanes + 2 * n_words  # before allocating
    if lanes < 1 or n_words < 0 or least > len(data):
        raise ValueError(
            f"the index section holds {len(data)} bytes, fewer than its {n_ctx} tables over "
            f"{alphabet} symbols, {lanes} lanes and {n_words} words need ({least})"
        )
    ctx, n_ctx = _segment_contexts(segments, mode)
    pos = 0
    freqs = np.zeros((n_ctx, alphabet), np.int64)
    bits = np.zeros(n_ctx, np.int64)
    for k in range(n_ctx):
        freqs[k], bits[k], pos = decode_table(data, pos, alphabet)
    need = pos + 4 * lanes + 2 * n_words
    if need != len(data):
        raise ValueError(f"the index section holds {len(data)} bytes, its layout needs {need}")
    states = np.frombuffer(bytes(data[pos : pos + 4 * lanes]), dtype="<u4")
    words = np.frombuffer(bytes(data[pos + 4 * lanes :]), dtype="<u2")
    return rans_decode(states, words, ctx, freqs, bits)
