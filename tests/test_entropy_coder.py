"""The entropy coder of the compact files: exact on any stream, near the entropy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from twodg_pyro.io.bits import pack_bits, read_varints, unpack_bits, write_varints
from twodg_pyro.io.entropy import (
    decode_index,
    empirical_entropy_bits,
    encode_index,
    quantise_frequencies,
    rans_decode,
    rans_encode,
)


# ---------------------------------------------------------------------------- the coder
def _skewed(n: int, alphabet: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(alphabet, 0.3))
    return rng.choice(alphabet, n, p=p)


@pytest.mark.parametrize(
    ("n", "alphabet", "kind", "lanes"),
    [
        (1, 3, "uniform", None),
        (2, 2, "uniform", 5),  # more lanes than symbols
        (777, 40, "uniform", 7),  # a partial last step
        (5000, 26, "skewed", None),
        (5000, 300, "skewed", 64),
        (3000, 10, "constant", None),  # zero entropy: no words at all
    ],
)
@pytest.mark.parametrize("mode", ["global", "per_site", "auto"])
def test_index_coder_is_exact(n, alphabet, kind, lanes, mode):
    rng = np.random.default_rng(n)
    if kind == "uniform":
        sym = rng.integers(0, alphabet, n)
    elif kind == "skewed":
        sym = _skewed(n, alphabet, n)
    else:
        sym = np.full(n, alphabet - 1)
    segments = [n // 3, 0, n - n // 3] if n > 2 else [n]  # an empty layer too
    code = encode_index(sym, segments, alphabet, mode, lanes=lanes)
    assert code.mode == mode or (mode == "auto" and code.mode in ("global", "per_site"))
    if mode == "auto":
        assert len(code.data) == min(code.sizes.values()) and len(code.sizes) == 2
    if kind == "constant" and mode != "per_site":
        assert code.n_words == 0
    back = decode_index(code.data, segments, alphabet, code.mode, code.lanes, code.n_words)
    np.testing.assert_array_equal(back, sym)


def test_index_bits_within_five_percent_of_the_entropy_on_a_large_skewed_sample():
    # 200,000 symbols over 66 values (64 components, outlier, ellipse), heavy-tailed
    sym = _skewed(200_000, 66, 1)
    h = empirical_entropy_bits(sym)
    code = encode_index(sym, [200_000], 66, "global")
    bits = 8 * len(code.data) / sym.size
    assert h <= bits <= 1.05 * h, (bits, h)
    # three layers with different distributions: per-layer tables beat the global entropy
    parts = [_skewed(60_000, 66, s) for s in (2, 3, 4)]
    sym = np.concatenate(parts)
    ctx = np.repeat(np.arange(3), 60_000)
    h_layer = empirical_entropy_bits(sym, ctx)
    assert h_layer < empirical_entropy_bits(sym)
    code = encode_index(sym, [60_000] * 3, 66, "auto")
    assert code.mode == "per_site"
    assert 8 * len(code.data) / sym.size <= 1.05 * h_layer


def test_rans_stream_damage_is_detected():
    sym = _skewed(4000, 20, 5)
    ctx = np.zeros(sym.size, dtype=np.int64)
    counts = np.bincount(sym, minlength=20)
    f = quantise_frequencies(counts, 12)[None]
    assert f.sum() == 4096 and (f[0][counts > 0] >= 1).all()
    states, words = rans_encode(sym, ctx, f, np.array([12]), lanes=3)
    np.testing.assert_array_equal(rans_decode(states, words, ctx, f, np.array([12])), sym)
    with pytest.raises(ValueError, match="rANS stream"):
        rans_decode(states, words[:-1], ctx, f, np.array([12]))
    with pytest.raises(ValueError, match="rANS stream"):
        rans_decode(states, np.append(words, 7), ctx, f, np.array([12]))
    code = encode_index(sym, [4000], 20, "global")
    with pytest.raises(ValueError, match="layout needs"):
        decode_index(code.data[:-2], [4000], 20, "global", code.lanes, code.n_words)


def test_bit_packing_and_varints_round_trip():
    rng = np.random.default_rng(0)
    for bits in (1, 3, 8, 13):
        v = rng.integers(0, 2**bits, 1001)
        packed = pack_bits(v, bits)
        assert len(packed) == math.ceil(1001 * bits / 8)
        np.testing.assert_array_equal(unpack_bits(packed, 1001, bits), v)
    with pytest.raises(ValueError, match="does not fit in 3 bits"):
        pack_bits(np.array([8]), 3)
    vals = np.array([0, 1, 127, 128, 300, 2**40])
    data = write_varints(vals)
    back, pos = read_varints(data, 0, len(vals))
    np.testing.assert_array_equal(back, vals)
    assert pos == len(data) == 1 + 1 + 1 + 2 + 2 + 6
