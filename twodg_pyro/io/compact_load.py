"""Reading compact model files (``.2dgz``) back into a model and a guide: the 2DG BNN
(:class:`~twodg_pyro.guides.SharedGMMGuide`) or the INT8 mean-field baseline
(:class:`~twodg_pyro.guides.MeanFieldGuide`); see :mod:`twodg_pyro.io.compact`."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch

from .bits import unpack_bits
from .compact_format import (
    _MU_DTYPES,
    _SECTIONS_2DG,
    COMPACT_FORMAT_VERSION,
    KIND_2DG,
    KIND_INT8,
    _decode_columns,
    _dequantise,
    _load_net,
    _read_floats,
    _site_counts,
    read_compact,
)
from .entropy import decode_index

__all__ = ["load_compact"]


def _rebuild_model(header: dict, net, prior, where: str, net_bytes):
    from ..model import BNNModel
    from .specs import PriorNotStoredWarning, UnavailablePrior, rebuild_likelihood, rebuild_prior

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
    lik = rebuild_likelihood(header["likelihood"])
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
