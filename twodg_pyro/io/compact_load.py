"""Reading compact model files (``.2dgz``) back into a model and a guide: the 2DG BNN
(:class:`~twodg_pyro.guides.SharedGMMGuide`) or the INT8 mean-field baseline
(:class:`~twodg_pyro.guides.MeanFieldGuide`); see :mod:`twodg_pyro.io.compact`."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch

from ..files.integrity import check_field
from .compact_format import (
    _FLOAT_DTYPES,
    _MU_DTYPES,
    _SECTIONS,
    COMPACT_FORMAT_VERSION,
    KIND_2DG_LAPLACE,
    KIND_INT8,
    _check_bits,
    _decode_columns,
    _dequantise_sites,
    _load_net,
    _net_shapes,
    _read_floats,
    _read_tensors,
    _shapes,
    _site_counts,
    read_compact,
)
from .entropy import decode_index
from .network_size import MAX_NETWORK_VALUES, build_file_network


def _site_sizes(header: dict) -> list[int]:
    """The number of weights of every site the header lists, each ``[name, shape]``."""
    sites = header.get("sites")
    if not isinstance(sites, list) or not sites:
        raise ValueError(f"the header's sites {sites!r:.60} are not a list of [name, shape]")
    return [math.prod(shape) for shape in _shapes(sites, "site", 2)]


def _check_2dg(header: dict, sec: dict) -> tuple[int, int, list[int]]:
    """Every size a 2DG file's header declares, checked against its sections' bytes (and,
    where bytes cannot bound it, :data:`~twodg_pyro.io.network_size.MAX_NETWORK_VALUES`)
    before anything is allocated; returns ``(K, n_w, site sizes)``."""
    sizes = _site_sizes(header)
    n_w = header.get("n_weights")
    if isinstance(n_w, int) and n_w > MAX_NETWORK_VALUES:
        raise ValueError(
            f"the header declares {n_w} weights, more than the {MAX_NETWORK_VALUES} a model "
            "file may declare"
        )
    n_w = _check_bits("n_weights", n_w, 1, MAX_NETWORK_VALUES)
    if sum(sizes) != n_w:
        raise ValueError(f"the sites hold {sum(sizes)} weights, the header says {n_w}")
    dt = header.get("centre_dtype")
    if dt not in _FLOAT_DTYPES:
        raise ValueError(f"the header's centre_dtype {dt!r:.40} is not float16 or float32")
    K, cap = header.get("n_components"), len(sec["centres"]) // (2 * _FLOAT_DTYPES[dt].itemsize)
    if isinstance(K, int) and not isinstance(K, bool) and K > cap:
        raise ValueError(
            f"the header declares {K} components, but its centres section of "
            f"{len(sec['centres'])} bytes holds at most {cap} at {dt}"
        )
    K = _check_bits("n_components", K, 1, max(cap, 1))
    if not isinstance(header.get("covariances"), bool):
        raise ValueError(
            f"the header's covariances {header.get('covariances')!r:.40} is not a boolean"
        )
    n_out = _check_bits("n_outliers", header.get("n_outliers"), 0, n_w)
    mu_bits = _check_bits("outlier_mu_bits", header.get("outlier_mu_bits"), 8, 16)
    if mu_bits not in _MU_DTYPES:
        raise ValueError(f"outlier_mu_bits must be 8 or 16, got {mu_bits}")
    _check_bits("outlier_sigma_bits", header.get("outlier_sigma_bits"), 1, 16)
    cap = len(sec["outliers"]) // _MU_DTYPES[mu_bits].itemsize
    if n_out > cap:
        raise ValueError(
            f"the header declares {n_out} outliers, but its outlier section of "
            f"{len(sec['outliers'])} bytes holds at most {cap}"
        )
    n_e = _check_bits("n_ellipses", header.get("n_ellipses"), 0, n_w - n_out)
    _check_bits("alpha_bits", header.get("alpha_bits"), 2, 16)
    bits = max(1, math.ceil(math.log2(K))) if K > 1 else 1
    _check_bits("component_bits", header.get("component_bits"), bits, bits)
    if n_e:
        k = _check_bits("ellipse_k", header.get("ellipse_k"), 1, K)
        if n_e * k > MAX_NETWORK_VALUES:
            raise ValueError(
                f"the header declares {n_e} ellipse weights of {k} components, more than "
                f"the {MAX_NETWORK_VALUES} values a model file may declare"
            )
        for field in ("ellipse_components", "ellipse_alphas"):
            _check_coding(header.get(field), field, len(sec["ellipses"]), ("packed",))
    ix = header.get("index")
    _check_coding(ix, "index", len(sec["index"]))
    if ix.get("alphabet", K + 2) != K + 2:
        raise ValueError(
            f"the header's index alphabet {ix['alphabet']!r:.40} is not K + 2 = {K + 2}"
        )
    return K, n_w, sizes


def _check_coding(info, field: str, n_bytes: int, extra: tuple[str, ...] = ()) -> None:
    """A part's coding record: ``coding`` (rANS: ``global``/``per_site`` with ``lanes`` and
    ``words``), and ``bytes`` within the section's ``n_bytes`` when it has them."""
    if not isinstance(info, dict) or info.get("coding") not in ("global", "per_site", *extra):
        raise ValueError(f"the header's {field} {info!r:.80} has no known coding")
    if "bytes" in info or extra:
        _check_bits(f"{field} bytes", info.get("bytes"), 0, n_bytes)
    if info["coding"] != "packed":
        _check_bits(f"{field} lanes", info.get("lanes"), 1, n_bytes // 4)
        _check_bits(f"{field} words", info.get("words"), 0, n_bytes // 2)


def _rebuild_model(header: dict, net, prior, where: str, net_bytes):
    from ..bnn import BNNModel
    from .specs import (
        PriorNotStoredWarning,
        UnavailablePrior,
        rebuild_likelihood,
        rebuild_prior,
        saved_dtype,
    )

    net_shapes = _net_shapes(header.get("net"), len(net_bytes))
    if net is None:  # what the file describes: its sites (the index) and its net section
        tensors = {n: tuple(sh) for n, sh in header["sites"]} | net_shapes
        net = build_file_network(header.get("network"), where, tensors)
    net = net.to(saved_dtype(header, {}, where))
    lik = rebuild_likelihood(header["likelihood"])
    prior_spec = header.get("prior") or {}
    if not isinstance(prior_spec, dict):
        raise ValueError(f"the header's prior {prior_spec!r:.60} is not a table")
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

    K, n_w, sizes = _check_2dg(header, sec)
    # every value is checked once the structure and the guide hold them (check_values)
    centres = _read_floats(sec["centres"], header["centre_dtype"], (K, 2), "centres")
    chol = None
    if header["covariances"]:
        chol = _read_floats(sec["covariances"], header["cov_dtype"], (K, 3), "covariances")
    model = _rebuild_model(header, net, prior, where, sec["net"])
    ends = np.cumsum(sizes)
    # index -> who is what
    ix = header["index"]
    sym = decode_index(sec["index"], sizes, K + 2, ix["coding"], ix["lanes"], ix["words"])
    plain, outl, ell = (np.flatnonzero(who) for who in (sym < K, sym == K, sym == K + 1))
    if outl.size != header["n_outliers"] or ell.size != header["n_ellipses"]:
        raise ValueError(
            f"the index has {outl.size} outliers and {ell.size} ellipse weights, the header "
            f"says {header['n_outliers']} and {header['n_ellipses']}"
        )
    covs = torch.zeros(K, 2, 2)
    if chol is not None:
        L = torch.zeros(K, 2, 2)
        L[:, 0, 0], L[:, 1, 1], L[:, 1, 0] = chol[:, 0].exp(), chol[:, 1].exp(), chol[:, 2]
        covs = L @ L.transpose(-1, -2)
    elif len(sec["covariances"]):
        raise ValueError("covariances are stored but the header says they are not")
    # outliers
    counts = _site_counts(outl, ends)
    bits, mu_bits = int(header["outlier_sigma_bits"]), int(header["outlier_mu_bits"])
    loc, scale = _dequantise_sites(
        sec["outliers"], counts, bits, mu_bits, "outlier section", "outliers"
    )
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
        check_field("ellipse_components", comps, 0, K - 1)  # before the centres are indexed
        cum = np.ones((n_e, k))
        if k > 1:
            levels = (1 << ab) - 1
            codes = _decode_columns(buf[ci["bytes"] :], ai, n_e, k - 1, levels + 1, ab)
            cum[:, :-1] = codes / levels
        alphas = torch.from_numpy(np.diff(cum, axis=1, prepend=0.0)).float()
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
    structure.check_values()
    guide = SharedGMMGuide(model, structure, tying=header["tying"])
    with torch.no_grad():
        if chol is not None:  # the stored Cholesky parameters themselves, not via S
            guide.chol_log_diag.copy_(chol[:, :2])
            guide.chol_off.copy_(chol[:, 2])
    guide.check_values()
    return model, guide


def _load_int8(header: dict, sec: dict, net, prior, where: str):
    from ..guides.base import site_key
    from ..guides.mean_field import MeanFieldGuide
    from ..nn.functional import inverse_softplus

    bits = _check_bits("sigma_bits", header.get("sigma_bits"), 1, 8)
    sizes = _site_sizes(header)
    if sum(sizes) != len(sec["mu"]):
        raise ValueError(
            f"the header's sites hold {sum(sizes)} weights, its mu section "
            f"{len(sec['mu'])} (one byte each)"
        )
    model = _rebuild_model(header, net, prior, where, sec["net"])
    if model.num_weights != header["n_weights"]:
        raise ValueError(
            f"the network has {model.num_weights} weights, the header says {header['n_weights']}"
        )
    if len(sec["params"]) != 12 * np.count_nonzero(sizes):
        raise ValueError("the INT8 sections do not match the network's sites")
    buf = b"".join(bytes(sec[name]) for name in ("params", "mu", "sigma"))
    loc, scale = _dequantise_sites(buf, sizes, bits, 8, "INT8 sections", "weights")
    guide = MeanFieldGuide(model)
    with torch.no_grad():
        for site, mu, sg in zip(model.sites, loc.split(sizes), scale.split(sizes), strict=True):
            check_field(
                f"the means and log-scales of site {site.name!r}", torch.cat([mu, sg.log()])
            )
            guide.loc(site.name).copy_(mu.view(site.shape))
            guide.rhos[site_key(site.name)].copy_(inverse_softplus(sg).view(site.shape))
    return model, guide


def load_compact(path: str | Path, net=None, prior=None, device="cpu"):
    """Read a compact file: ``(model, guide)``.

    A 2DG file gives a :class:`~twodg_pyro.guides.SharedGMMGuide` (a 2DG + Laplace file
    its 2DG BNN: :func:`~twodg_pyro.methods.load_method` reads the Laplace approximation
    too), an INT8 mean-field file a :class:`~twodg_pyro.guides.MeanFieldGuide` holding the
    dequantised values.

    Args:
        net: the network architecture (default: built from the file's network spec).
        prior: the prior (default: the saved one, when it is a library prior).

    Raises:
        ValueError: naming the file: see :func:`read_compact`, or a file whose parts do
            not fit together, or a network that does not match the saved one.
    """
    return load_compact_parts(path, net, prior, device)[:2]


def load_compact_parts(path: str | Path, net=None, prior=None, device="cpu"):
    """:func:`load_compact`'s ``(model, guide)`` on ``device`` and, for a 2DG + Laplace
    file, its ``laplace`` header table and tensors (name -> tensor as stored, on the CPU:
    the method built from them goes to ``device``; ``None`` for other files)."""
    where = str(path)
    header, sec = read_compact(path)
    kind = header.get("kind")
    if not isinstance(kind, str) or kind not in _SECTIONS:
        raise ValueError(f"{where!r} is a compact file of unknown kind {kind!r}")
    if header.get("format_version") != COMPACT_FORMAT_VERSION or list(sec) != list(_SECTIONS[kind]):
        raise ValueError(
            f"{where!r}: header version {header.get('format_version')!r} / sections "
            f"{list(sec)} do not match this version of the format"
        )
    loader = _load_int8 if kind == KIND_INT8 else _load_2dg
    try:
        model, guide = loader(header, sec, net, prior, where)
        laplace = _laplace(header, sec) if kind == KIND_2DG_LAPLACE else None
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{where!r}: the file's parts do not fit together: {e!r}") from e
    except ValueError as e:
        if where in str(e):
            raise
        raise ValueError(f"{where!r}: {e}") from e
    return model.to(device), guide.to(device), laplace


def _laplace(header: dict, sec: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """The ``laplace`` table of a 2DG + Laplace file and its tensors, sizes checked
    against the section before they are read."""
    table = header["laplace"]
    if not isinstance(table, dict) or not isinstance(table.get("tensors"), list):
        raise ValueError(f"the header's laplace = {table!r:.80} is not a table of tensors")
    spec = table["tensors"]
    _net_shapes(spec, len(sec["laplace"]))
    tensors = _read_tensors(sec["laplace"], spec, "Laplace tensor")
    if any(not name.startswith("laplace/") for name in tensors):
        raise ValueError(f"the Laplace tensors {sorted(tensors)} are not all laplace/...")
    return table, tensors
