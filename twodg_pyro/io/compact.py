r"""Compact model files (``.2dgz``): a trained 2DG BNN at the size its accounting promises.

:func:`export_compact` writes what prediction needs and nothing else, at a chosen
precision; :func:`load_compact` gives back an ordinary
:class:`~twodg_pyro.model.BNNModel` + :class:`~twodg_pyro.guides.SharedGMMGuide` pair
(``predict``, ``twodg-pyro evaluate`` and ``diagnose`` take it like a full model file).
:func:`export_int8_mean_field` writes the INT8-quantised mean-field baseline
(:mod:`twodg_pyro.baselines.quantized`) in the same container, so both are compared as
bytes on disk.

What a compact 2DG file stores
------------------------------
* **centres** :math:`m_k = (\mu_k, m_{k,1})` in the mixture's coordinates
  (:math:`\sigma` or :math:`\log\sigma`), ``float16`` (default) or ``float32``; an
  array ``float16`` cannot hold (overflow, or magnitudes below its normal range) is
  written at ``float32`` and the header says so;
* **covariances** as Cholesky parameters :math:`(\log L_{00}, \log L_{11}, L_{10})`
  per component, at the same precision, when the tying draws with them
  (``stochastic``, ``tied``; on request for ``representative``);
* **index**: one symbol per weight, in site order: its component :math:`c_i \in [0, K)`
  for a plain inlier, :math:`K` for an outlier, :math:`K + 1` for an ellipse weight; so
  the positions of outliers and ellipse weights cost no extra bytes.  The stream is
  entropy-coded with interleaved rANS (:mod:`twodg_pyro.io.entropy`), with one frequency
  table (``global``) or one per layer (``per_site``), whichever is smaller (``auto``);
* **outliers** (in weight order) with the quantised baseline's scheme, per layer that
  has outliers: means on a symmetric grid, :math:`s = \max|\mu| / 32767` (16 bits, the
  default) or :math:`s = \max|\mu| / 127` (INT8, exactly the baseline's), and
  :math:`b`-bit codes uniform in :math:`\log\sigma` between the layer's outliers'
  extremes (:func:`~twodg_pyro.baselines.quantized.dequantize`; 16 bits by default, down
  to the baseline's 1-8).  The outliers are the weights the method singles out (largest
  :math:`|\mu|` and gradients) and are about 1% of them: at INT8 and 8 or 4 bits they
  changed the predicted class of test points of a noisy ResNet-20, at 16 bits they did
  not, for 1.5-3 bytes per outlier;
* **ellipses** (in weight order): the :math:`k` components of each ellipse weight and
  its blending weights as :math:`k - 1` cumulative sums :math:`\sum_{j \le l} \alpha_j`
  quantised to ``alpha_bits`` bits (so the decoded :math:`\alpha` are non-negative and
  sum to one exactly); each of the two tables bit-packed (components at
  :math:`\lceil\log_2 K\rceil` bits) or rANS-coded column by column, whichever is smaller;
* **net**: the network's deterministic tensors (BatchNorm parameters and statistics),
  at their own dtype; the Bayesian tensors are not stored (the guide draws them).

Not stored: the stage-1 points of the inliers (needed only to rerun the Mahalanobis
check while training), for ``representative`` by default the covariances (unused when
drawing), and the centres of a ``PretrainedPrior`` (the pretrained weights: a loaded
model gets an :class:`~twodg_pyro.io.specs.UnavailablePrior`, with a warning, which
raises wherever the prior is used; prediction does not use it).  A loaded guide
gets each inlier's component centre (the :math:`\alpha`-weighted centre of an ellipse
weight's components) as its point and, without stored covariances, zero covariances:
compact files are for prediction; continue training from the full ``model_2dg.pt``.

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

An INT8 mean-field file (kind ``twodg_pyro.CompactINT8MeanField``) has the sections
``params`` (``n_sites x 3`` ``float32``: scale, log-sigma low, step), ``mu`` (``n_w``
``int8``), ``sigma`` (``n_w`` codes packed at ``sigma_bits``) and ``net``.

Bit packing is LSB first.  Loading checks the length of every part and the SHA-256
before it parses anything: a truncated, extended or modified file is a ``ValueError``
naming it, never a different model.
"""

from __future__ import annotations

import json
import math
import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

from .entropy import decode_index, empirical_entropy_bits, encode_index, pack_bits, unpack_bits
from .files import atomic_write
from .integrity import ChecksumError, bytes_digest

__all__ = [
    "COMPACT_FORMAT_VERSION",
    "COMPACT_MAGIC",
    "FAITHFUL_OPTIONS",
    "compact_summary",
    "export_compact",
    "export_compact_file",
    "export_int8_mean_field",
    "is_compact_file",
    "load_compact",
    "load_model_file",
    "read_compact",
    "resolve_model_file",
]

COMPACT_MAGIC = b"2DGZ\r\n\x1a\n"
COMPACT_FORMAT_VERSION = 1
KIND_2DG = "twodg_pyro.Compact2DG"
KIND_INT8 = "twodg_pyro.CompactINT8MeanField"
_PREFIX = struct.Struct("<8sHI")  # magic, version, header length
_PAYLOAD_LEN = struct.Struct("<Q")
_DIGEST = 32
#: :func:`export_compact` options that keep predictions as the full file's under the same
#: seed (float32 centres and 16-bit alphas on top of the default 16-bit outliers), for
#: 1-21% more bytes; every predicted probability stayed within 1e-4 of the full file's in
#: ``benchmarks/results/compact_export.md`` (the defaults: within 2e-3).
FAITHFUL_OPTIONS: dict = {
    "centre_dtype": "float32",
    "outlier_mu_bits": 16,
    "outlier_sigma_bits": 16,
    "alpha_bits": 16,
}
_MAX_HEADER = 64 << 20  # decompressed header bound (a crafted file cannot exhaust memory)
_SECTIONS_2DG = ("centres", "covariances", "index", "outliers", "ellipses", "net")
_FLOAT_DTYPES = {"float16": np.dtype("<f2"), "float32": np.dtype("<f4")}
_TENSOR_DTYPES = {
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.float16: "<f2",
    torch.int64: "<i8",
    torch.int32: "<i4",
    torch.uint8: "|u1",
    torch.int8: "|i1",
    torch.bool: "|b1",
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

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: not a compact file, another format version, a
            truncated or extended file, a checksum mismatch (corrupted or modified), or
            a header that does not describe the payload.
    """
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {where!r}")
    blob = path.read_bytes()
    if len(blob) < _PREFIX.size or blob[: len(COMPACT_MAGIC)] != COMPACT_MAGIC:
        raise ValueError(f"{where!r} is not a compact twodg_pyro model file (no 2DGZ magic)")
    _, version, h_len = _PREFIX.unpack_from(blob, 0)
    if version != COMPACT_FORMAT_VERSION:
        raise ValueError(
            f"{where!r} has compact format version {version}; this version of twodg_pyro "
            f"reads version {COMPACT_FORMAT_VERSION}"
        )
    p_at = _PREFIX.size + h_len
    if len(blob) < p_at + _PAYLOAD_LEN.size + _DIGEST:
        raise ValueError(
            f"{where!r} is truncated: {len(blob)} bytes, its header alone announces "
            f"{p_at + _PAYLOAD_LEN.size + _DIGEST}"
        )
    (p_len,) = _PAYLOAD_LEN.unpack_from(blob, p_at)
    end = p_at + _PAYLOAD_LEN.size + p_len
    if len(blob) != end + _DIGEST:
        state = "truncated" if len(blob) < end + _DIGEST else "longer than its content"
        raise ValueError(
            f"{where!r} is {state}: {len(blob)} bytes, its layout says {end + _DIGEST}"
        )
    view = memoryview(blob)
    if bytes_digest(view[:end]) != blob[end:]:
        raise ChecksumError(
            f"{where!r} fails its SHA-256 checksum: the file is corrupted or was modified"
        )
    try:
        d = zlib.decompressobj()
        text = d.decompress(blob[_PREFIX.size : p_at], _MAX_HEADER)
        if d.unconsumed_tail:
            raise ValueError("header too large")
        header = json.loads(text.decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{where!r}: the header cannot be read: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("sections"), list):
        raise ValueError(f"{where!r}: the header lists no sections")
    sections: dict[str, memoryview] = {}
    pos = p_at + _PAYLOAD_LEN.size
    for item in header["sections"]:
        name, length = item if isinstance(item, list) and len(item) == 2 else (item, None)
        if not isinstance(length, int) or length < 0:
            raise ValueError(f"{where!r}: section {name!r} has length {length!r}")
        sections[name] = view[pos : pos + length]
        pos += length
    if pos != end:
        raise ValueError(f"{where!r}: the sections cover {pos - p_at - 8} of {p_len} bytes")
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
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"precision must be 'float16' or 'float32', got {dtype!r}")
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
    n = math.prod(shape)
    need = n * _FLOAT_DTYPES[dtype].itemsize
    if len(buf) != need:
        raise ValueError(f"{what} holds {len(buf)} bytes, {shape} at {dtype} needs {need}")
    a = np.frombuffer(bytes(buf), dtype=_FLOAT_DTYPES[dtype]).astype(np.float32)
    return torch.from_numpy(a.reshape(shape).copy())


def _net_section(model) -> tuple[bytes, list]:
    """The network's deterministic tensors (everything but the Bayesian sites)."""
    sites = set(model.site_names)
    chunks, spec = [], []
    for name, t in model.net.state_dict().items():
        if name in sites:
            continue
        if t.dtype not in _TENSOR_DTYPES:
            raise ValueError(f"network tensor {name!r} has dtype {t.dtype}, not storable")
        code = _TENSOR_DTYPES[t.dtype]
        a = t.detach().cpu().contiguous().numpy().astype(np.dtype(code), copy=False)
        chunks.append(a.tobytes())
        spec.append([name, code, list(t.shape)])
    return b"".join(chunks), spec


def _load_net(net, buf, spec: list, site_names: list[str]) -> None:
    state, pos = {}, 0
    for name, code, shape in spec:
        dt = np.dtype(code)
        n = math.prod(shape) * dt.itemsize
        if pos + n > len(buf):
            raise ValueError(f"the net section ends inside tensor {name!r}")
        a = np.frombuffer(bytes(buf[pos : pos + n]), dtype=dt).reshape(shape)
        state[name] = torch.from_numpy(a.copy())
        pos += n
    if pos != len(buf):
        raise ValueError(f"the net section holds {len(buf) - pos} bytes more than its tensors")
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise ValueError(f"the network does not match the saved one: {e}") from e
    missing = sorted(set(missing) - set(site_names))
    if missing or unexpected:
        raise ValueError(
            f"the network does not match the saved one: missing {missing}, "
            f"unexpected {sorted(unexpected)}"
        )


_MU_DTYPES = {8: np.dtype(np.int8), 16: np.dtype("<i2")}


def _quantise_site(mu: torch.Tensor, sigma: torch.Tensor, bits: int, mu_bits: int = 8):
    r"""The quantised baseline's scheme for one tensor: symmetric ``mu_bits``-bit means
    (``int8``: exactly :func:`~twodg_pyro.baselines.quantized.quantize_mean_field`'s), and
    ``bits``-bit codes of :math:`\log\sigma`; returns ``(q, codes, [scale, lo, step])``."""
    from ..baselines.quantized import _quantize_mu, _quantize_sigma

    mu = mu.detach().float().cpu()
    if mu_bits == 8:
        q, scale = _quantize_mu(mu)
    else:
        top = 2 ** (mu_bits - 1) - 1
        scale = mu.abs().max().clamp_min(1e-12) / top
        q = torch.round(mu / scale).clamp(-top, top).to(torch.int16)
    code, lo_step = _quantize_sigma(sigma.detach().float().cpu(), bits)
    return q, code, torch.stack([scale, lo_step[0], lo_step[1]]).float()


def _dequantise(q: torch.Tensor, code: torch.Tensor, params: torch.Tensor):
    from ..baselines.quantized import dequantize

    return dequantize(q, params[0], code, params[1:3])


def _check_bits(name: str, bits: int, lo: int, hi: int) -> int:
    if not isinstance(bits, int) or isinstance(bits, bool) or not lo <= bits <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {bits!r}")
    return bits


def _symbols(s) -> np.ndarray:
    """The per-weight symbol: component, ``K`` (outlier) or ``K + 1`` (ellipse)."""
    K = s.n_gaussians
    sym = np.empty(s.num_weights, dtype=np.int64)
    sym[s.plain_index.numpy()] = s.plain_component.numpy()
    sym[s.outlier_index.numpy()] = K
    sym[s.ellipse_index.numpy()] = K + 1
    return sym


def _site_counts(index: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the sorted flat ``index`` fall into each site (``ends``: site ends)."""
    cuts = np.searchsorted(index, ends)
    return np.diff(np.concatenate([[0], cuts]))


def _encode_columns(values: np.ndarray, alphabet: int, bits: int) -> tuple[bytes, dict]:
    """A small ``(n, c)`` table of codes: bit-packed row-major at ``bits`` bits, or rANS by
    column (column-major, one table per column or one for all), whichever is smaller."""
    n, c = values.shape
    packed = pack_bits(values.reshape(-1), bits) if c else b""
    if c == 0:
        return b"", {"coding": "packed", "bytes": 0}
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


# ---------------------------------------------------------------------------- 2DG export
def export_compact(
    path: str | Path,
    model,
    guide,
    network: dict | None = None,
    *,
    centre_dtype: str = "float16",
    outlier_sigma_bits: int = 16,
    outlier_mu_bits: int = 16,
    alpha_bits: int = 8,
    index_coding: str = "auto",
    covariances: bool | None = None,
) -> dict:
    r"""Write ``model`` + shared-GMM ``guide`` as a compact file (layout: module docstring).

    Args:
        network: ``{"name", "kwargs"}`` to rebuild the network on loading (as in
            :func:`~twodg_pyro.io.save_2dg`); without it :func:`load_compact` needs ``net=``.
        centre_dtype: ``"float16"`` or ``"float32"`` for centres and covariances.
        outlier_sigma_bits: bits of each outlier's :math:`\log\sigma` code (1 to 16).
        outlier_mu_bits: 16 or 8 (INT8, as the quantised baseline) bits per outlier mean.
            The default 16 + 16 costs 1.5 bytes per outlier more than INT8 + 8-bit
            (2-7% of the file in ``benchmarks/results/compact_export.md``) and keeps the
            predictions of a noisy ResNet-20 that INT8 outliers change.
        alpha_bits: bits of each ellipse weight's cumulative blending weights (2 to 16).
        index_coding: ``"auto"`` (the smaller of the two), ``"global"`` or ``"per_site"``.
        covariances: store the covariances; default only when the tying draws with them
            (``stochastic``, ``tied``).

    Returns:
        The bytes of every part (``centres``, ``covariances``, ``index``, ``outliers``,
        ``ellipses``, ``net``, ``header`` = framing + JSON header + checksum, ``total``)
        and the index statistics: ``index_bits_per_weight`` (all index bytes, tables
        included, over :math:`n_w`), ``index_entropy_bits`` (zeroth-order empirical
        entropy of the per-weight symbol, bits per weight), ``index_entropy_bits_per_site``
        (the same conditioned on the layer), the coding chosen and the size of every
        coding tried.
    """
    _check_bits("outlier_sigma_bits", outlier_sigma_bits, 1, 16)
    if outlier_mu_bits not in _MU_DTYPES:
        raise ValueError(f"outlier_mu_bits must be 8 or 16, got {outlier_mu_bits!r}")
    _check_bits("alpha_bits", alpha_bits, 2, 16)
    if centre_dtype not in _FLOAT_DTYPES:
        raise ValueError(f"centre_dtype must be 'float16' or 'float32', got {centre_dtype!r}")
    s = guide.structure()
    K, n_w = s.n_gaussians, s.num_weights
    sizes = [lay.numel for lay in s.sites]
    offsets = [lay.offset for lay in s.sites]
    if offsets != [sum(sizes[:i]) for i in range(len(sizes))]:
        raise ValueError("the sharing structure's sites are not laid out back to back")
    ends = np.cumsum(sizes)
    if covariances is None:
        covariances = guide.tying != "representative"

    # centres (and covariances as Cholesky parameters)
    centre_bytes, centre_dt = _float_bytes(s.means, centre_dtype)
    cov_bytes, cov_dt = b"", None
    if covariances:
        with torch.no_grad():
            chol = torch.cat([guide.chol_log_diag, guide.chol_off[:, None]], 1)
        cov_bytes, cov_dt = _float_bytes(chol, centre_dtype)

    # the per-weight index
    sym = _symbols(s)
    t0 = time.perf_counter()
    code = encode_index(sym, sizes, K + 2, index_coding)
    encode_seconds = time.perf_counter() - t0

    # outliers: per layer with outliers, INT8 means and b-bit sigmas
    out_idx = s.outlier_index.numpy()
    per_site = _site_counts(out_idx, ends)
    params, qs, codes = [], [], []
    start = 0
    for n in per_site:
        if n:
            q, c, p = _quantise_site(
                s.outlier_loc[start : start + n],
                s.outlier_scale[start : start + n],
                outlier_sigma_bits,
                outlier_mu_bits,
            )
            params.append(p)
            qs.append(q)
            codes.append(c)
        start += n
    outlier_bytes = b""
    if qs:
        outlier_bytes = (
            torch.stack(params).numpy().astype("<f4").tobytes()
            + torch.cat(qs).numpy().astype(_MU_DTYPES[outlier_mu_bits]).tobytes()
            + pack_bits(torch.cat(codes).numpy(), outlier_sigma_bits)
        )

    # ellipses: component lists and cumulative alphas, packed or rANS-coded by column
    k = int(s.ellipse_components.shape[1]) if s.n_ellipses else 0
    component_bits = max(1, math.ceil(math.log2(K))) if K > 1 else 1
    ellipse_bytes, comp_info, alpha_info = b"", None, None
    if s.n_ellipses:
        levels = (1 << alpha_bits) - 1
        cum = s.ellipse_alphas.double().cumsum(1)[:, :-1].numpy()
        cum_codes = np.clip(np.rint(cum * levels), 0, levels).astype(np.int64)
        cum_codes = np.maximum.accumulate(cum_codes, axis=1)
        comp_bytes, comp_info = _encode_columns(s.ellipse_components.numpy(), K, component_bits)
        alpha_bytes, alpha_info = _encode_columns(cum_codes, levels + 1, alpha_bits)
        ellipse_bytes = comp_bytes + alpha_bytes

    net_bytes, net_spec = _net_section(model)
    header = {
        "kind": KIND_2DG,
        "format_version": COMPACT_FORMAT_VERSION,
        "tying": guide.tying,
        "coordinates": guide.coordinates,
        **_model_header(model, network),
        "n_weights": n_w,
        "n_components": K,
        "n_outliers": s.n_outliers,
        "n_ellipses": s.n_ellipses,
        "ellipse_k": k,
        "centre_dtype": centre_dt,
        "covariances": bool(covariances),
        "cov_dtype": cov_dt,
        "outlier_sigma_bits": outlier_sigma_bits,
        "outlier_mu_bits": outlier_mu_bits,
        "component_bits": component_bits,
        "alpha_bits": alpha_bits,
        "ellipse_components": comp_info,
        "ellipse_alphas": alpha_info,
        "index": {
            "coding": code.mode,
            "lanes": code.lanes,
            "words": code.n_words,
            "alphabet": K + 2,
        },
        "net": net_spec,
        "info": s.info,
    }
    sections = [
        ("centres", centre_bytes),
        ("covariances", cov_bytes),
        ("index", code.data),
        ("outliers", outlier_bytes),
        ("ellipses", ellipse_bytes),
        ("net", net_bytes),
    ]
    report = _write_container(path, header, sections)
    ctx = np.repeat(np.arange(len(sizes)), sizes)
    report.update(
        n_weights=n_w,
        n_components=K,
        n_outliers=s.n_outliers,
        n_ellipses=s.n_ellipses,
        index_coding=code.mode,
        index_bytes_by_coding=dict(code.sizes),
        index_table_bytes=code.table_bytes,
        index_lanes=code.lanes,
        index_bits_per_weight=8 * len(code.data) / max(n_w, 1),
        index_entropy_bits=empirical_entropy_bits(sym),
        index_entropy_bits_per_site=empirical_entropy_bits(sym, ctx),
        index_encode_seconds=encode_seconds,
        centre_dtype=centre_dt,
        cov_dtype=cov_dt,
    )
    return report


# ---------------------------------------------------------------------------- loading
def _rebuild_model(header: dict, net, prior, where: str, net_bytes):
    from ..likelihoods import Categorical, Gaussian
    from ..model import BNNModel
    from .specs import PriorNotStoredWarning, UnavailablePrior, rebuild_prior

    if net is None:
        spec = header.get("network")
        if not spec:
            raise ValueError(f"{where!r} does not say how to build its network: pass net=")
        from ..models import build_network

        net = build_network(spec["name"], **spec.get("kwargs", {}))
    dtype = header.get("dtype", "float32")
    if dtype not in ("float32", "float64", "float16", "bfloat16"):
        raise ValueError(f"unknown network dtype {dtype!r} in the header")
    net = net.to(getattr(torch, dtype))
    lik_spec = header["likelihood"]
    if lik_spec["kind"] == "Gaussian":
        lik = Gaussian(lik_spec["dataset_size"], lik_spec["scale"])
    else:
        lik = Categorical(lik_spec["dataset_size"])
    prior_spec = header.get("prior") or {}
    if prior is None and prior_spec.get("kind") == "PretrainedPrior":
        # its centres are the pretrained network's weights, which a compact file does not
        # hold: prediction does not use the prior, the KL, k-hat and training do
        warnings.warn(
            f"{where!r} was trained with a PretrainedPrior whose centres (the pretrained "
            "weights) a compact file does not hold: the loaded model predicts, but its "
            "prior raises until you pass one (prior=), or use the full model file for "
            "anything that uses the prior",
            PriorNotStoredWarning,
            stacklevel=4,
        )
        prior = UnavailablePrior(
            f"PretrainedPrior(scale={prior_spec.get('scale')}, delta="
            f"{prior_spec.get('delta')}), whose centres a compact file does not hold",
            where,
        )
    elif prior is None:
        prior = rebuild_prior(prior_spec, net, where)
    model = BNNModel(net, prior=prior, likelihood=lik)
    saved = [[n, list(sh)] for n, sh in header["sites"]]
    here = [[s.name, list(s.shape)] for s in model.sites]
    if saved != here:
        diff = next(
            ((a, b) for a, b in zip(saved, here, strict=False) if a != b),
            (f"{len(saved)} sites", f"{len(here)} sites"),
        )
        raise ValueError(
            f"the network does not match the one saved in {where!r}: saved {diff[0]}, "
            f"this network has {diff[1]}"
        )
    _load_net(net, net_bytes, header["net"], model.site_names)
    return model


def _load_2dg(header: dict, sec: dict, net, prior, where: str):
    from ..guides.shared_gmm import SharedGMMGuide
    from ..sharing.structure import SharingStructure, SiteLayout

    model = _rebuild_model(header, net, prior, where, sec["net"])
    K, n_w = int(header["n_components"]), int(header["n_weights"])
    sizes = [math.prod(sh) for _, sh in header["sites"]]
    if sum(sizes) != n_w:
        raise ValueError(f"the sites hold {sum(sizes)} weights, the header says {n_w}")
    ends = np.cumsum(sizes)
    # index -> who is what
    ix = header["index"]
    sym = decode_index(sec["index"], sizes, K + 2, ix["coding"], int(ix["lanes"]), ix["words"])
    plain = np.flatnonzero(sym < K)
    outl = np.flatnonzero(sym == K)
    ell = np.flatnonzero(sym == K + 1)
    if outl.size != header["n_outliers"] or ell.size != header["n_ellipses"]:
        raise ValueError(
            f"the index has {outl.size} outliers and {ell.size} ellipse weights, the header "
            f"says {header['n_outliers']} and {header['n_ellipses']}"
        )
    centres = _read_floats(sec["centres"], header["centre_dtype"], (K, 2), "centres")
    chol = None
    if header["covariances"]:
        chol = _read_floats(sec["covariances"], header["cov_dtype"], (K, 3), "covariances")
        L = torch.zeros(K, 2, 2)
        L[:, 0, 0], L[:, 1, 1], L[:, 1, 0] = chol[:, 0].exp(), chol[:, 1].exp(), chol[:, 2]
        covs = L @ L.transpose(-1, -2)
    else:
        if len(sec["covariances"]):
            raise ValueError("covariances are stored but the header says they are not")
        covs = torch.zeros(K, 2, 2)
    # outliers
    bits = int(header["outlier_sigma_bits"])
    mu_dt = _MU_DTYPES[int(header["outlier_mu_bits"])]
    per_site = _site_counts(outl, ends)
    n_sites_out, n_out = int((per_site > 0).sum()), int(outl.size)
    buf = sec["outliers"]
    p_end, q_end = 12 * n_sites_out, 12 * n_sites_out + n_out * mu_dt.itemsize
    need = q_end + math.ceil(n_out * bits / 8)
    if len(buf) != need:
        raise ValueError(
            f"the outlier section holds {len(buf)} bytes, {n_out} outliers need {need}"
        )
    loc = torch.zeros(n_out)
    scale = torch.ones(n_out)
    if n_out:
        params = np.frombuffer(bytes(buf[:p_end]), dtype="<f4").reshape(-1, 3)
        q = np.frombuffer(bytes(buf[p_end:q_end]), dtype=mu_dt).astype(np.int16)
        codes = unpack_bits(buf[q_end:], n_out, bits)
        start, row = 0, 0
        for n in per_site:
            if n:
                mu, sg = _dequantise(
                    torch.from_numpy(q[start : start + n].copy()),
                    torch.from_numpy(codes[start : start + n]),
                    torch.from_numpy(params[row].copy()),
                )
                loc[start : start + n], scale[start : start + n] = mu, sg
                row += 1
            start += n
    # ellipses
    k, n_e = int(header["ellipse_k"]), int(ell.size)
    cb, ab = int(header["component_bits"]), int(header["alpha_bits"])
    comps = torch.zeros(0, max(k, 1), dtype=torch.long)
    alphas = torch.zeros(0, max(k, 1))
    if n_e:
        buf = sec["ellipses"]
        ci, ai = header["ellipse_components"], header["ellipse_alphas"]
        if len(buf) != ci["bytes"] + ai["bytes"]:
            raise ValueError(
                f"the ellipse section holds {len(buf)} bytes, its parts {ci['bytes']} + "
                f"{ai['bytes']}"
            )
        comps = torch.from_numpy(_decode_columns(buf[: ci["bytes"]], ci, n_e, k, K, cb))
        if int(comps.max()) >= K:
            raise ValueError("an ellipse weight refers to a component outside [0, K)")
        cum = np.ones((n_e, k))
        if k > 1:
            levels = (1 << ab) - 1
            codes = _decode_columns(buf[ci["bytes"] :], ai, n_e, k - 1, levels + 1, ab)
            cum[:, :-1] = codes / levels
        alphas = torch.from_numpy(np.diff(cum, axis=1, prepend=0.0)).float()
        if bool((alphas < 0).any()):
            raise ValueError("decoded ellipse blending weights are negative")
    elif len(sec["ellipses"]):
        raise ValueError("the ellipse section is not empty but there are no ellipse weights")
    # stand-in stage-1 points: the (blended) component centres
    points = torch.cat(
        [centres[torch.from_numpy(sym[plain])], (alphas[..., None] * centres[comps]).sum(1)]
    )
    offsets = np.concatenate([[0], ends[:-1]])
    structure = SharingStructure(
        sites=[
            SiteLayout(n, tuple(sh), int(o))
            for (n, sh), o in zip(header["sites"], offsets, strict=True)
        ],
        coordinates=header["coordinates"],
        means=centres,
        covariances=covs,
        outlier_index=torch.from_numpy(outl),
        outlier_loc=loc,
        outlier_scale=scale,
        plain_index=torch.from_numpy(plain),
        plain_component=torch.from_numpy(sym[plain]),
        ellipse_index=torch.from_numpy(ell),
        ellipse_components=comps.long(),
        ellipse_alphas=alphas,
        inlier_points=points.float(),
        info=dict(header.get("info") or {}),
    )
    guide = SharedGMMGuide(model, structure, tying=header["tying"])
    with torch.no_grad():
        if chol is not None:  # the stored Cholesky parameters themselves, not via S
            guide.chol_log_diag.copy_(chol[:, :2])
            guide.chol_off.copy_(chol[:, 2])
    return model, guide


def _load_int8(header: dict, sec: dict, net, prior, where: str):
    from ..guides.base import site_key
    from ..guides.mean_field import MeanFieldGuide, inverse_softplus

    model = _rebuild_model(header, net, prior, where, sec["net"])
    bits = int(header["sigma_bits"])
    n_w, n_sites = model.num_weights, len(model.sites)
    if n_w != header["n_weights"]:
        raise ValueError(f"the network has {n_w} weights, the header says {header['n_weights']}")
    if len(sec["params"]) != 12 * n_sites or len(sec["mu"]) != n_w:
        raise ValueError("the INT8 sections do not match the network's sites")
    params = np.frombuffer(bytes(sec["params"]), dtype="<f4").reshape(n_sites, 3)
    q = np.frombuffer(bytes(sec["mu"]), dtype=np.int8)
    codes = unpack_bits(sec["sigma"], n_w, bits)
    guide = MeanFieldGuide(model)
    start = 0
    with torch.no_grad():
        for i, site in enumerate(model.sites):
            n = site.numel
            mu, sg = _dequantise(
                torch.from_numpy(q[start : start + n].copy()),
                torch.from_numpy(codes[start : start + n]),
                torch.from_numpy(params[i].copy()),
            )
            guide.loc(site.name).copy_(mu.view(site.shape))
            guide.rhos[site_key(site.name)].copy_(inverse_softplus(sg).view(site.shape))
            start += n
    return model, guide


def load_compact(path: str | Path, net=None, prior=None, device="cpu"):
    """Read a compact file: ``(model, guide)``.

    A 2DG file gives a :class:`~twodg_pyro.guides.SharedGMMGuide`, an INT8 mean-field
    file a :class:`~twodg_pyro.guides.MeanFieldGuide` holding the dequantised values.

    Args:
        net: the network architecture (default: built from the file's network spec).
        prior: the prior (default: the saved one, when it is a library prior).

    Raises:
        ValueError: naming the file: see :func:`read_compact`, or a file whose parts do
            not fit together, or a network that does not match the saved one.
    """
    where = str(path)
    header, sec = read_compact(path)
    kind = header.get("kind")
    expected = {
        KIND_2DG: _SECTIONS_2DG,
        KIND_INT8: ("params", "mu", "sigma", "net"),
    }
    if kind not in expected:
        raise ValueError(f"{where!r} is a compact file of unknown kind {kind!r}")
    if header.get("format_version") != COMPACT_FORMAT_VERSION or list(sec) != list(expected[kind]):
        raise ValueError(
            f"{where!r}: header version {header.get('format_version')!r} / sections "
            f"{list(sec)} do not match this version of the format"
        )
    loader = _load_2dg if kind == KIND_2DG else _load_int8
    try:
        model, guide = loader(header, sec, net, prior, where)
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{where!r}: the file's parts do not fit together: {e!r}") from e
    except ValueError as e:
        if where in str(e):
            raise
        raise ValueError(f"{where!r}: {e}") from e
    return model.to(device), guide.to(device)


# ---------------------------------------------------------------------------- INT8 export
def export_int8_mean_field(
    path: str | Path, model, guide, sigma_bits: int = 1, network: dict | None = None
) -> dict:
    """Write the INT8-quantised mean-field BNN (:mod:`twodg_pyro.baselines.quantized`'s
    scheme: per tensor INT8 means and ``sigma_bits``-bit scales) in the compact container.

    Returns the bytes of every part (``params``, ``mu``, ``sigma``, ``net``, ``header``,
    ``total``).  :func:`load_compact` reads it back into a mean-field guide that predicts
    like ``quantize_mean_field(guide, sigma_bits)``.
    """
    if sigma_bits not in (1, 2, 4, 8):
        raise ValueError(f"sigma_bits must be 1, 2, 4 or 8, got {sigma_bits!r}")
    params, qs, codes = [], [], []
    for site in guide.sites:
        q, c, p = _quantise_site(
            guide.loc(site.name).reshape(-1), guide.scale(site.name).reshape(-1), sigma_bits
        )
        params.append(p)
        qs.append(q)
        codes.append(c)
    net_bytes, net_spec = _net_section(model)
    header = {
        "kind": KIND_INT8,
        "format_version": COMPACT_FORMAT_VERSION,
        **_model_header(model, network),
        "n_weights": model.num_weights,
        "sigma_bits": sigma_bits,
        "net": net_spec,
    }
    sections = [
        ("params", torch.stack(params).numpy().astype("<f4").tobytes()),
        ("mu", torch.cat(qs).numpy().astype(np.int8).tobytes()),
        ("sigma", pack_bits(torch.cat(codes).numpy(), sigma_bits)),
        ("net", net_bytes),
    ]
    return _write_container(path, header, sections)


# ---------------------------------------------------------------------------- files
def resolve_model_file(run_or_file: str | Path) -> Path:
    """A model file, or the ``model_2dg.pt`` of a run folder.

    Raises:
        FileNotFoundError: neither a file nor a run folder with a model file.
    """
    p = Path(run_or_file)
    if p.is_dir():
        f = p / "model_2dg.pt"
        if not f.is_file():
            raise FileNotFoundError(
                f"run folder {str(p)!r} has no model_2dg.pt (only runs of the 2dg method write one)"
            )
        return f
    if not p.is_file():
        raise FileNotFoundError(f"no such run folder or model file: {str(p)!r}")
    return p


def load_model_file(path: str | Path, net=None, prior=None, device="cpu"):
    """``(model, guide)`` from any model file: :func:`~twodg_pyro.io.load_model` (full
    files of every method and compact ones, told apart by magic bytes and header)."""
    from .model_file import load_model

    return load_model(path, net=net, prior=prior, device=device)


def export_compact_file(run_or_file: str | Path, out: str | Path, **options) -> dict:
    """Load the full model file of a run folder (or a model file) and write it compact.

    ``options`` are those of :func:`export_compact`.  Returns its report plus
    ``source``, ``source_bytes`` and ``out``.
    """
    from .bnn_file import _FORMAT, load_2dg
    from .payload import read_payload

    src = resolve_model_file(run_or_file)
    if is_compact_file(src):
        raise ValueError(f"{str(src)!r} is already a compact file")
    if Path(out).resolve() == src.resolve():
        raise ValueError(f"--out {str(out)!r} would overwrite the source model file")
    _, header = read_payload(src, _FORMAT)
    model, guide = load_2dg(src)
    report = export_compact(out, model, guide, network=header.get("network"), **options)
    report.update(source=str(src), source_bytes=src.stat().st_size, out=str(out))
    return report
