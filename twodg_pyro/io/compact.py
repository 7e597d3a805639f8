r"""Compact model files (``.2dgz``): a trained 2DG BNN at the size its accounting promises.

:func:`export_compact` writes what prediction needs and nothing else, at a chosen
precision; :func:`load_compact` gives back an ordinary
:class:`~twodg_pyro.bnn.BNNModel` + :class:`~twodg_pyro.guides.SharedGMMGuide` pair
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
  to the baseline's 1-8; why 16: :func:`export_compact`);
* **ellipses** (in weight order): the :math:`k` components of each ellipse weight and
  its blending weights as :math:`k - 1` cumulative sums :math:`\sum_{j \le l} \alpha_j`
  quantised to ``alpha_bits`` bits (so the decoded :math:`\alpha` are non-negative and
  sum to one exactly), bit-packed or rANS-coded, whichever is smaller;
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

The byte layout of the files and the coding of their parts are in
:mod:`twodg_pyro.io.compact_format`; loading is :mod:`twodg_pyro.io.compact_load`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..guide import require_sharing
from .compact_format import (
    _FLOAT_DTYPES,
    _MU_DTYPES,
    _SECTIONS,
    COMPACT_FORMAT_VERSION,
    COMPACT_MAGIC,
    KIND_2DG,
    KIND_2DG_LAPLACE,
    KIND_INT8,
    _check_bits,
    _encode_columns,
    _float_bytes,
    _model_header,
    _net_section,
    _quantise_sites,
    _site_counts,
    _tensor_section,
    _write_container,
    compact_summary,
    index_symbols,
    is_compact_file,
    read_compact,
)
from .compact_load import load_compact
from .entropy import empirical_entropy_bits, encode_index

__all__ = [
    "COMPACT_FORMAT_VERSION",
    "COMPACT_MAGIC",
    "FAITHFUL_OPTIONS",
    "KIND_2DG",
    "KIND_INT8",
    "compact_evaluation",
    "compact_summary",
    "export_compact",
    "export_compact_file",
    "export_int8_mean_field",
    "is_compact_file",
    "load_compact",
    "read_compact",
    "resolve_model_file",
]

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
    evaluation: dict | None = None,
    laplace=None,
    feature_dtype: str = "float16",
) -> dict:
    r"""Write ``model`` + shared-GMM ``guide`` as a compact file (layout: module docstring).

    Args:
        network: ``{"name", "kwargs"}`` to rebuild the network on loading (as in
            :func:`~twodg_pyro.io.save_2dg`); without it :func:`load_compact` needs ``net=``.
        evaluation: the record of how the model is evaluated (as in
            :func:`~twodg_pyro.io.save_model`: the run's data set and split settings,
            seed and draws; JSON-able), stored in the header so that ``twodg-pyro
            evaluate FILE.2dgz`` needs no ``--data`` (:func:`compact_evaluation` makes
            it from a full model file's record).
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
        laplace: a :class:`~twodg_pyro.methods.LaplacePosterior` fitted around this 2DG
            BNN's posterior means (``laplace.network = "2dg"``: its network is
            ``GuidePosterior(model, guide).mean_network()``), stored beside it: the file
            then loads (:func:`~twodg_pyro.methods.load_method`) as that Laplace
            approximation around the file's 2DG BNN's means, at the cost of its factors
            (a ResNet-20's last layer: 4,326 numbers) instead of a float32 network.
        feature_dtype: ``"float16"`` or ``"float32"`` for a Laplace residual's training
            features (:class:`~twodg_pyro.methods.FeatureResidual`, its largest part:
            3,600 x 64 numbers on the MNIST subset's ResNet-20); float16 halves them.

    Returns:
        The bytes of every part (``centres``, ``covariances``, ``index``, ``outliers``,
        ``ellipses``, ``net``, ``laplace``, ``header`` = framing + JSON header + checksum,
        ``total``)
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
    _check_evaluation(evaluation)
    for name, value in (("centre_dtype", centre_dtype), ("feature_dtype", feature_dtype)):
        if value not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be 'float16' or 'float32', got {value!r}")
    require_sharing(guide, "export_compact")
    laplace_part = None
    if laplace is not None:
        laplace_part = _laplace_part(laplace, model, guide, getattr(torch, feature_dtype))
    s = guide.structure()
    K, n_w = s.n_gaussians, s.num_weights
    sizes = [lay.numel for lay in s.sites]
    if [lay.offset for lay in s.sites] != [sum(sizes[:i]) for i in range(len(sizes))]:
        raise ValueError("the sharing structure's sites are not laid out back to back")
    ends = np.cumsum(sizes)
    if covariances is None:
        covariances = guide.tying_rule.trains_covariances

    # centres (and covariances as Cholesky parameters)
    centre_bytes, centre_dt = _float_bytes(s.means, centre_dtype)
    cov_bytes, cov_dt = b"", None
    if covariances:  # (_float_bytes detaches)
        chol = torch.cat([guide.chol_log_diag, guide.chol_off[:, None]], 1)
        cov_bytes, cov_dt = _float_bytes(chol, centre_dtype)

    # the per-weight index
    sym = index_symbols(s)
    t0 = time.perf_counter()
    code = encode_index(sym, sizes, K + 2, index_coding)
    encode_seconds = time.perf_counter() - t0

    # outliers: per layer with outliers, INT8 or 16-bit means and b-bit sigmas
    counts = _site_counts(s.outlier_index.numpy(), ends).tolist()
    pairs = zip(s.outlier_loc.split(counts), s.outlier_scale.split(counts), strict=True)
    outlier_bytes = b"".join(_quantise_sites(pairs, outlier_sigma_bits, outlier_mu_bits))

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
    tally = dict(n_weights=n_w, n_components=K, n_outliers=s.n_outliers, n_ellipses=s.n_ellipses)
    header = {
        "kind": KIND_2DG,
        "format_version": COMPACT_FORMAT_VERSION,
        "tying": guide.tying,
        "coordinates": guide.coordinates,
        **_model_header(model, network),
        **tally,
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
        "index": dict(coding=code.mode, lanes=code.lanes, words=code.n_words, alphabet=K + 2),
        "net": net_spec,
        "info": s.info,
        **({} if evaluation is None else {"evaluation": evaluation}),
    }
    parts = (centre_bytes, cov_bytes, code.data, outlier_bytes, ellipse_bytes, net_bytes)
    if laplace_part is not None:
        header.update(kind=KIND_2DG_LAPLACE, laplace=laplace_part[0])
        parts += (laplace_part[1],)
    sections = list(zip(_SECTIONS[header["kind"]], parts, strict=True))
    report = _write_container(path, header, sections)
    ctx = np.repeat(np.arange(len(sizes)), sizes)
    report.update(
        tally,
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


#: a Laplace residual's training features in a file's tensors
_FEATURES = "laplace/residual/inducing"


def _laplace_part(laplace, model, guide, feature_dtype: torch.dtype) -> tuple[dict, bytes]:
    """The header table and section of a Laplace approximation stored beside a 2DG BNN
    (a residual's features at ``feature_dtype``), after checking that its network is the
    BNN's mean network, tensor for tensor."""
    has_file = getattr(laplace, "file_tag", None) and callable(getattr(laplace, "file_content", 0))
    fields, tensors = laplace.file_content() if has_file else ({}, {})
    if "laplace" not in fields:
        raise TypeError(
            f"laplace must be a LaplacePosterior (twodg_pyro.methods.fit_laplace), got "
            f"{type(laplace).__name__}"
        )
    means = {k: v.detach() for k, v in guide.mean_weights().items()}
    reference = {**model.net.state_dict(), **means}
    for name, t in laplace.net.state_dict().items():
        ref = reference.get(name)
        if ref is None or ref.shape != t.shape or not torch.equal(ref.to(t), t):
            raise ValueError(
                f"the Laplace approximation is not around this 2DG BNN's posterior means "
                f"(its network's {name!r} differs): fit it on GuidePosterior(model, "
                "guide).mean_network(), as laplace.network = '2dg' does"
            )
    if _FEATURES in tensors:
        tensors[_FEATURES] = tensors[_FEATURES].to(feature_dtype)
    data, spec = _tensor_section((k, v) for k, v in tensors.items() if k.startswith("laplace/"))
    table = {**fields["laplace"], "tensors": spec, "method": laplace.name, "tag": laplace.file_tag}
    return table, data


# ---------------------------------------------------------------------------- INT8 export
def export_int8_mean_field(
    path: str | Path,
    model,
    guide,
    sigma_bits: int = 1,
    network: dict | None = None,
    evaluation: dict | None = None,
) -> dict:
    """Write the INT8-quantised mean-field BNN (:mod:`twodg_pyro.baselines.quantized`'s
    scheme: per tensor INT8 means and ``sigma_bits``-bit scales) in the compact container
    (``evaluation``: as in :func:`export_compact`).

    Returns the bytes of every part (``params``, ``mu``, ``sigma``, ``net``, ``header``,
    ``total``).  :func:`load_compact` reads it back into a mean-field guide that predicts
    like ``quantize_mean_field(guide, sigma_bits)``.
    """
    if sigma_bits not in (1, 2, 4, 8):
        raise ValueError(f"sigma_bits must be 1, 2, 4 or 8, got {sigma_bits!r}")
    _check_evaluation(evaluation)
    pairs = [(guide.loc(x.name).reshape(-1), guide.scale(x.name).reshape(-1)) for x in guide.sites]
    net_bytes, net_spec = _net_section(model)
    parts = (*_quantise_sites(pairs, sigma_bits), net_bytes)
    header = {
        "kind": KIND_INT8,
        "format_version": COMPACT_FORMAT_VERSION,
        **_model_header(model, network),
        "n_weights": model.num_weights,
        "sigma_bits": sigma_bits,
        "net": net_spec,
        **({} if evaluation is None else {"evaluation": evaluation}),
    }
    return _write_container(path, header, list(zip(_SECTIONS[KIND_INT8], parts, strict=True)))


# ---------------------------------------------------------------------------- evaluation
def _check_evaluation(evaluation) -> None:
    """``evaluation`` is ``None`` or a table (a header field of the file)."""
    if evaluation is not None and not isinstance(evaluation, dict):
        raise TypeError(
            f"evaluation must be a dict (the run's evaluation record) or None, got "
            f"{type(evaluation).__name__}"
        )


def compact_evaluation(evaluation: dict | None, source: str | Path | None = None) -> dict | None:
    """The ``evaluation`` record a compact file keeps from a full model file's:
    the data set, split settings, seed and draws as they are; the full model's metrics
    under ``source_metrics`` (a compact file holds a rounded model, so its own metrics
    are close to them, not equal; ``twodg-pyro evaluate`` does not report them as the
    file's); ``source``: the full file's name.  ``None`` without a record."""
    if not isinstance(evaluation, dict):
        return None
    out = {k: v for k, v in evaluation.items() if k != "metrics"}
    if evaluation.get("metrics"):
        out["source_metrics"] = evaluation["metrics"]
    if source is not None:
        out["source"] = Path(source).name
    return out


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


def export_compact_file(
    run_or_file: str | Path,
    out: str | Path,
    prune_snr: float | None = None,
    prune_spread: str = "zero",
    **options,
) -> dict:
    r"""Load the full model file of a run folder (or a model file) and write it compact.

    ``options`` are those of :func:`export_compact`.  ``prune_snr``: first tie every
    inlier of stage-1 :math:`|\mu| / \sigma <` ``prune_snr`` to a zero-mean component
    of ``prune_spread`` (:func:`~twodg_pyro.guides.prune_guide`; the report's ``pruned``
    says how many).  The compact file keeps the full
    file's evaluation record (:func:`compact_evaluation`: the data set the run used, so
    that ``twodg-pyro evaluate`` reads it without ``--data``).  Returns the report of
    :func:`export_compact` plus ``source``, ``source_bytes``, ``out`` and what to
    compare the file with: the deterministic network of the same architecture
    (``network_params``; ``float32_network_bytes`` and ``int8_network_bytes``, computed
    by :func:`~twodg_pyro.accounting.network_bytes`), ``float32_ratio`` (the float32
    network's bytes over the file's) and ``bytes_per_weight`` (the file's bytes over
    ``network_params``).
    """
    from ..files.payload import read_payload
    from .model_format import SHARED_GMM_FILE, model_from_payload

    src = resolve_model_file(run_or_file)
    if is_compact_file(src):
        raise ValueError(f"{str(src)!r} is already a compact file")
    if Path(out).resolve() == src.resolve():
        raise ValueError(f"--out {str(out)!r} would overwrite the source model file")
    payload, header = read_payload(src, SHARED_GMM_FILE.fmt)  # read and verified once
    model, guide = model_from_payload(payload, header, str(src))
    pruned = None
    if prune_snr is not None:
        from ..guides.pruning import prune_guide

        guide, pruned = prune_guide(model, guide, prune_snr, prune_spread)
    evaluation = compact_evaluation(header.get("evaluation"), src)
    report = export_compact(
        out, model, guide, network=header.get("network"), evaluation=evaluation, **options
    )
    from ..accounting import network_bytes

    sizes = network_bytes(model.net)
    report.update(
        source=str(src),
        source_bytes=src.stat().st_size,
        out=str(out),
        network_params=sizes["params"],
        float32_network_bytes=sizes["float32"],
        int8_network_bytes=sizes["int8"],
        float32_ratio=sizes["float32"] / report["total"],
        bytes_per_weight=report["total"] / max(sizes["params"], 1),
        pruned=None if pruned is None else dataclasses.asdict(pruned),
    )
    return report
