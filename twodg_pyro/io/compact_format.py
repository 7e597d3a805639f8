r"""The byte format of compact model files (``.2dgz``): the container (magic, header,
sections, checksum) and the codings of its pieces; what the files hold and why is in
:mod:`twodg_pyro.io.compact`.

Byte layout (all integers little-endian)
----------------------------------------
::

    offset     size  field
    0          8     magic  b"2DGZ\r\n\x1a\n"
    8          2     uint16 container format version (1)
    10         4     uint32 H: length of the header
    14         H     header: zlib-compressed UTF-8 JSON (kind, format_version, the
                     network, likelihood, prior, tying, sites, counts, dtypes, bit
                     widths, index coding, and "sections": [[name, length], ...])
    14+H       8     uint64 P: length of the payload
    22+H       P     payload: the sections back to back, in the header's order
    22+H+P     32    SHA-256 of bytes [0, 22+H+P)

Sections of a 2DG file (kind ``twodg_pyro.Compact2DG``), in this order:

``centres``      ``K x 2`` floats (``centre_dtype``), rows :math:`(\mu_k, m_{k,1})`
``covariances``  ``K x 3`` floats (``cov_dtype``), only when ``covariances`` is true
``index``        rANS stream: frequency tables, ``lanes`` ``uint32`` states, ``uint16``
                 words (:func:`~twodg_pyro.io.entropy.encode_index`)
``outliers``     ``n_layers_with_outliers x 3`` ``float32`` (scale, log-sigma low, step),
                 ``n_out`` means (``int16``, or ``int8`` with ``outlier_mu_bits`` 8),
                 ``n_out`` sigma codes packed at ``outlier_sigma_bits``
``ellipses``     the ``n_e x k`` components, then the ``n_e x (k - 1)`` cumulative-alpha
                 codes; each either packed row by row (``component_bits``,
                 ``alpha_bits``) or an rANS stream of the table read column by column
                 (header ``ellipse_components`` / ``ellipse_alphas``: coding, bytes)
``net``          the deterministic tensors back to back (names, dtypes, shapes in the
                 header)

A 2DG + Laplace file (kind ``twodg_pyro.Compact2DGLaplace``) has the 2DG file's sections
and ``laplace``: the tensors of a Laplace approximation around the 2DG BNN's posterior
means (its prior precision and Kronecker factors or diagonal) back to back at their own
dtypes (the header's ``laplace`` table: the approximation's settings, and names, dtypes
and shapes in ``laplace.tensors``).

An INT8 mean-field file (kind ``twodg_pyro.CompactINT8MeanField``) has the sections
``params`` (``n_sites x 3`` ``float32``: scale, log-sigma low, step), ``mu`` (``n_w``
``int8``), ``sigma`` (``n_w`` codes packed at ``sigma_bits``) and ``net``.

Bit packing is LSB first.  Loading checks the length of every part and the SHA-256
before it parses anything: a truncated, extended or modified file is a ``ValueError``
naming it, never a different model.  The SHA-256 is not keyed, so a file edited on
purpose and re-sealed passes it; what the loader checks beyond it
(:mod:`twodg_pyro.io.compact_load`): every size the header declares (components,
weights, outliers, ellipse tables, index lanes and words, network tensors) against the
bytes of its section, or :data:`~twodg_pyro.io.network_size.MAX_NETWORK_VALUES` where
bytes cannot bound it, before anything is allocated or any network built (the network
first on the meta device); every field's kind and range; and finite centres,
covariances, outliers and network tensors.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from ..files.atomic import atomic_write, file_size
from ..files.integrity import ChecksumError, bytes_digest
from .bits import pack_bits, unpack_bits
from .entropy import decode_index, encode_index

COMPACT_MAGIC = b"2DGZ\r\n\x1a\n"
COMPACT_FORMAT_VERSION = 1
KIND_2DG = "twodg_pyro.Compact2DG"
KIND_INT8 = "twodg_pyro.CompactINT8MeanField"
KIND_2DG_LAPLACE = "twodg_pyro.Compact2DGLaplace"
_PREFIX = struct.Struct("<8sHI")  # magic, version, header length
_PAYLOAD_LEN = struct.Struct("<Q")
_DIGEST = 32
_MAX_HEADER = 4 << 20  # decompressed header bound (a crafted file cannot exhaust memory)
_SECTIONS = {  # the sections of each kind of file, in order
    KIND_2DG: ("centres", "covariances", "index", "outliers", "ellipses", "net"),
    KIND_INT8: ("params", "mu", "sigma", "net"),
}
_SECTIONS[KIND_2DG_LAPLACE] = (*_SECTIONS[KIND_2DG], "laplace")
_FLOAT_DTYPES = {"float16": np.dtype("<f2"), "float32": np.dtype("<f4")}
_TENSOR_DTYPES = {  # torch dtype -> NumPy dtype code of the net section
    getattr(torch, n): np.dtype(n).newbyteorder("<").str
    for n in ("float32", "float64", "float16", "int64", "int32", "uint8", "int8", "bool")
}


# ---------------------------------------------------------------------------- container
def _write_container(path: str | Path, header: dict, sections: list[tuple[str, bytes]]) -> dict:
    """Write header + sections + checksum atomically; returns the bytes of each part."""
    header = dict(header, sections=[[name, len(data)] for name, data in sections])
    head = zlib.compress(json.dumps(header, separators=(",", ":")).encode(), 9)
    payload = b"".join(data for _, data in sections)
    body = (
        _PREFIX.pack(COMPACT_MAGIC, COMPACT_FORMAT_VERSION, len(head))
        + head
        + _PAYLOAD_LEN.pack(len(payload))
        + payload
    )
    blob = body + bytes_digest(body)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(blob))
    sizes = {name: len(data) for name, data in sections}
    sizes["header"] = len(blob) - len(payload)  # framing, JSON header and checksum
    sizes["total"] = len(blob)
    return sizes


def is_compact_file(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts with the compact format's magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(len(COMPACT_MAGIC)) == COMPACT_MAGIC


def read_compact(path: str | Path) -> tuple[dict, dict[str, memoryview]]:
    """Read and verify a compact file: ``(header, {section: bytes})``.

    The lengths the file declares are checked against its size before the parts they
    announce are read, and no more than they declare is read (a file padded to
    gigabytes is refused by its size, not loaded).

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a regular file, not a compact file, another
            format version, a truncated or extended file, a checksum mismatch
            (corrupted or modified), or a header that does not describe the payload.
    """
    where = repr(str(path))
    size = file_size(path)
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[: len(COMPACT_MAGIC)] != COMPACT_MAGIC:
            raise ValueError(f"{where} is not a compact twodg_pyro model file (no 2DGZ magic)")
        _, version, h_len = _PREFIX.unpack(prefix)
        if version != COMPACT_FORMAT_VERSION:
            raise ValueError(
                f"{where} has compact format version {version}; this version of twodg_pyro "
                f"reads version {COMPACT_FORMAT_VERSION}"
            )
        p_at = _PREFIX.size + h_len
        if h_len > _MAX_HEADER:
            raise ValueError(f"{where} declares a header of {h_len} bytes, over {_MAX_HEADER}")
        if size < p_at + _PAYLOAD_LEN.size + _DIGEST:
            raise ValueError(
                f"{where} is truncated: {size} bytes, its header alone announces "
                f"{p_at + _PAYLOAD_LEN.size + _DIGEST}"
            )
        head = f.read(h_len)
        (p_len,) = _PAYLOAD_LEN.unpack(f.read(_PAYLOAD_LEN.size))
        end = p_at + _PAYLOAD_LEN.size + p_len
        if size != end + _DIGEST:
            state = "truncated" if size < end + _DIGEST else "longer than its content"
            raise ValueError(f"{where} is {state}: {size} bytes, its layout says {end + _DIGEST}")
        body = prefix + head + _PAYLOAD_LEN.pack(p_len) + f.read(p_len)
        digest = f.read(_DIGEST)
    if len(body) != end or bytes_digest(body) != digest:
        raise ChecksumError(
            f"{where} fails its SHA-256 checksum: the file is corrupted or was modified"
        )
    try:
        d = zlib.decompressobj()
        text = d.decompress(head, _MAX_HEADER)
        if d.unconsumed_tail:
            raise ValueError("header too large")
        header = json.loads(text.decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{where}: the header cannot be read: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("sections"), list):
        raise ValueError(f"{where}: the header lists no sections")
    view = memoryview(body)
    sections: dict[str, memoryview] = {}
    pos = p_at + _PAYLOAD_LEN.size
    for item in header["sections"]:
        name, length = item if isinstance(item, list) and len(item) == 2 else (item, None)
        if not isinstance(name, str) or name in sections:
            what = "appears twice" if isinstance(name, str) else "is not a string"
            raise ValueError(f"{where}: the header's section name {name!r:.60} {what}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"{where}: section {name!r} has length {length!r:.60}")
        sections[name] = view[pos : pos + length]
        pos += length
    if pos != end:
        raise ValueError(f"{where}: the sections cover {pos - p_at - 8} of {p_len} bytes")
    return header, sections


def compact_summary(path: str | Path) -> dict:
    """Kind, counts and the bytes of every part of a compact file (verified first)."""
    header, sections = read_compact(path)
    total = Path(path).stat().st_size
    sizes = {name: len(v) for name, v in sections.items()}
    sizes["header"] = total - sum(sizes.values())
    keep = (
        "kind",
        "format_version",
        "tying",
        "n_weights",
        "n_components",
        "n_outliers",
        "n_ellipses",
        "ellipse_k",
        "centre_dtype",
        "cov_dtype",
        "outlier_sigma_bits",
        "alpha_bits",
        "sigma_bits",
        "index",
    )
    out = {k: header[k] for k in keep if k in header}
    out.update(total_bytes=total, section_bytes=sizes)
    return out


# ---------------------------------------------------------------------------- pieces
def _float_bytes(values: torch.Tensor, dtype: str) -> tuple[bytes, str]:
    """``values`` at ``dtype``; ``float16`` falls back to ``float32`` for an array it
    cannot hold (non-zero magnitudes outside ``[6.1e-5, 65504]``)."""
    a = values.detach().cpu().double().numpy()
    if not np.isfinite(a).all():
        raise ValueError("cannot store non-finite centres or covariances")
    if dtype == "float16":
        mag = np.abs(a[a != 0])
        if mag.size and (mag.min() < np.finfo(np.float16).tiny or mag.max() > 65504):
            dtype = "float32"
    return a.astype(_FLOAT_DTYPES[dtype]).tobytes(), dtype


def _read_floats(buf, dtype: str, shape: tuple[int, ...], what: str) -> torch.Tensor:
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{what} has unknown dtype {dtype!r}")
    need = math.prod(shape) * _FLOAT_DTYPES[dtype].itemsize
    if len(buf) != need:
        raise ValueError(f"{what} holds {len(buf)} bytes, {shape} at {dtype} needs {need}")
    a = np.frombuffer(bytes(buf), dtype=_FLOAT_DTYPES[dtype]).astype(np.float32)
    return torch.from_numpy(a.reshape(shape).copy())


def _net_section(model) -> tuple[bytes, list]:
    """The network's deterministic tensors (everything but the Bayesian sites)."""
    sites = set(model.site_names)
    return _tensor_section((n, t) for n, t in model.net.state_dict().items() if n not in sites)


def _tensor_section(items) -> tuple[bytes, list]:
    """Named tensors ``(name, tensor)`` back to back at their own dtypes, and their
    ``[name, dtype code, shape]`` header entries."""
    chunks, spec = [], []
    for name, t in items:
        if t.dtype not in _TENSOR_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}, not storable")
        code = _TENSOR_DTYPES[t.dtype]
        a = t.detach().cpu().contiguous().numpy().astype(np.dtype(code), copy=False)
        chunks.append(a.tobytes())
        spec.append([name, code, list(t.shape)])
    return b"".join(chunks), spec


def _shapes(items: list, what: str, n: int) -> list[list[int]]:
    """The shapes of the header's ``[name, shape]`` (``n = 2``) or ``[name, dtype code,
    shape]`` (``n = 3``) ``items``, each checked."""
    form = "[name, shape]" if n == 2 else "[name, dtype, shape]"
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == n
            and isinstance(item[0], str)
            and (n == 2 or item[1] in _TENSOR_DTYPES.values())
            and isinstance(item[-1], list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in item[-1])
        ):
            raise ValueError(
                f"the header's {what} {item!r:.80} is not {form} with a shape of "
                "non-negative integers"
            )
    return [item[-1] for item in items]


def _net_shapes(spec, n_bytes: int) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the header's net tensors, checked against the ``n_bytes`` of
    the net section before anything is read."""
    items = spec if isinstance(spec, list) else [spec]
    _shapes(items, "net tensor", 3)
    total = sum(math.prod(shape) * np.dtype(code).itemsize for _, code, shape in items)
    if total != n_bytes:
        raise ValueError(f"the header's net tensors take {total} bytes, its net section {n_bytes}")
    return {name: tuple(shape) for name, _, shape in items}


def _read_tensors(buf, spec: list, what: str = "network tensor") -> dict[str, torch.Tensor]:
    """The tensors of a section written by :func:`_tensor_section` (its ``spec`` checked
    against the section's bytes first: :func:`_net_shapes`), each finite."""
    state, pos = {}, 0
    for name, code, shape in spec:
        dt = np.dtype(code)
        n = math.prod(shape) * dt.itemsize
        a = np.frombuffer(bytes(buf[pos : pos + n]), dtype=dt).reshape(shape)
        if dt.kind == "f" and not np.isfinite(a).all():
            kind = "NaN" if np.isnan(a).any() else "inf"
            raise ValueError(f"{what} {name!r} contains {kind}")
        state[name] = torch.from_numpy(a.copy())
        pos += n
    return state


def _load_net(net, buf, spec: list, site_names: list[str]) -> None:
    state = _read_tensors(buf, spec)
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise ValueError(
            f"the network does not match the saved one: {' '.join(str(e).split())}"
        ) from e
    missing = sorted(set(missing) - set(site_names))
    if missing or unexpected:
        raise ValueError(
            f"the network does not match the saved one: missing {missing}, "
            f"unexpected {sorted(unexpected)}"
        )


_MU_DTYPES = {8: np.dtype(np.int8), 16: np.dtype("<i2")}


def _quantise_sites(pairs, bits: int, mu_bits: int = 8) -> tuple[bytes, bytes, bytes]:
    r"""The quantised baseline's scheme for every non-empty tensor of ``pairs`` (``(mu,
    sigma)`` each): symmetric ``mu_bits``-bit means (``int8``: exactly
    :func:`~twodg_pyro.baselines.quantized.quantize_mean_field`'s) and ``bits``-bit codes
    of :math:`\log\sigma`; returns the bytes of the ``float32`` rows ``[scale, lo, step]``,
    of the means and of the packed codes."""
    from ..baselines.quantized import _quantize_mu, _quantize_sigma

    params, qs, codes = [], [], []
    for mu, sigma in pairs:
        if mu.numel():
            q, scale = _quantize_mu(mu.detach().float().cpu(), mu_bits)
            code, lo_step = _quantize_sigma(sigma.detach().float().cpu(), bits)
            params.append(torch.stack([scale, lo_step[0], lo_step[1]]).float())
            qs.append(q)
            codes.append(code)
    if not params:
        return b"", b"", b""
    return (
        torch.stack(params).numpy().astype("<f4").tobytes(),
        torch.cat(qs).numpy().astype(_MU_DTYPES[mu_bits]).tobytes(),
        pack_bits(torch.cat(codes).numpy(), bits),
    )


def _dequantise_sites(buf, counts, bits: int, mu_bits: int, what: str, unit: str):
    """Inverse of :func:`_quantise_sites` (its bytes back to back in ``buf``) for tensors
    of ``counts`` values: ``(means, scales)``, flat."""
    from ..baselines.quantized import dequantize

    counts = [int(n) for n in counts if n]
    n, mu_dt = sum(counts), _MU_DTYPES[mu_bits]
    q_at = 12 * len(counts)
    code_at = q_at + n * mu_dt.itemsize
    need = code_at + math.ceil(n * bits / 8)
    if len(buf) != need:
        raise ValueError(f"the {what} holds {len(buf)} bytes, {n} {unit} need {need}")
    if not n:
        return torch.zeros(0), torch.ones(0)
    params = torch.tensor(np.frombuffer(bytes(buf[:q_at]), dtype="<f4").reshape(-1, 3))
    q = torch.from_numpy(np.frombuffer(bytes(buf[q_at:code_at]), dtype=mu_dt).astype(np.int16))
    codes = torch.from_numpy(unpack_bits(buf[code_at:], n, bits))
    rows = zip(q.split(counts), params, codes.split(counts), strict=True)
    loc, scale = zip(*(dequantize(qi, p[0], c, p[1:3]) for qi, p, c in rows), strict=True)
    return torch.cat(loc), torch.cat(scale)


def _check_bits(name: str, bits: int, lo: int, hi: int) -> int:
    if not isinstance(bits, int) or isinstance(bits, bool) or not lo <= bits <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {bits!r}")
    return bits


def index_symbols(s) -> np.ndarray:
    """The per-weight symbol: component, ``K`` (outlier) or ``K + 1`` (ellipse)."""
    K = s.n_gaussians
    sym = np.empty(s.num_weights, dtype=np.int64)
    sym[s.plain_index.numpy()] = s.plain_component.numpy()
    sym[s.outlier_index.numpy()] = K
    sym[s.ellipse_index.numpy()] = K + 1
    return sym


def _site_counts(index: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the sorted flat ``index`` fall into each site (``ends``: site ends)."""
    return np.diff(np.searchsorted(index, ends), prepend=0)


def _encode_columns(values: np.ndarray, alphabet: int, bits: int) -> tuple[bytes, dict]:
    """A small ``(n, c)`` table of codes: bit-packed row-major at ``bits`` bits, or rANS by
    column (column-major, one table per column or one for all), whichever is smaller."""
    n, c = values.shape
    if c == 0:
        return b"", {"coding": "packed", "bytes": 0}
    packed = pack_bits(values.reshape(-1), bits)
    code = encode_index(values.T.reshape(-1), [n] * c, alphabet, "auto")
    if len(code.data) < len(packed):
        info = {"coding": code.mode, "lanes": code.lanes, "words": code.n_words}
        return code.data, dict(info, bytes=len(code.data))
    return packed, {"coding": "packed", "bytes": len(packed)}


def _decode_columns(buf, info: dict, n: int, c: int, alphabet: int, bits: int) -> np.ndarray:
    """Inverse of :func:`_encode_columns`: the ``(n, c)`` codes."""
    if c == 0:
        return np.zeros((n, 0), dtype=np.int64)
    if info["coding"] == "packed":
        return unpack_bits(buf, n * c, bits).reshape(n, c)
    flat = decode_index(buf, [n] * c, alphabet, info["coding"], int(info["lanes"]), info["words"])
    return flat.reshape(c, n).T.copy()


def _model_header(model, network: dict | None) -> dict:
    from ..priors import PretrainedPrior
    from .specs import likelihood_spec, prior_spec

    if isinstance(model.prior, PretrainedPrior):  # its centres are not in a compact file
        prior = {
            "kind": "PretrainedPrior",
            "scale": model.prior.scale,
            "delta": model.prior.delta,
            "centres": "not stored",
        }
    else:
        prior = prior_spec(model.prior, model)[0]
    return {
        "likelihood": likelihood_spec(model.likelihood),
        "prior": prior,
        "network": network,
        "dtype": str(model.dtype).removeprefix("torch."),
        "sites": [[s.name, list(s.shape)] for s in model.sites],
    }
