"""Names and coordinates of the exported sites: the method of a guide, each site's named
dimensions, and the seeded sub-grid of a large site ("Thinning" in
:mod:`twodg_pyro.diagnostics.arviz_export`); and what the export holds besides the
draws: the guide's variational parameters at the exported coordinates
(``constant_data``), and a shared-GMM guide's sharing structure as a group of its own
(``sharing``: the component parameters, each weight's assignment and the outlier set)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from ..guide import BNNGuide
from ._draws import subset, to_numpy

#: Codes of ``<site>.kind`` in the ``sharing`` group.
KIND_CODES = {"outlier": 0, "plain": 1, "ellipse": 2}


def method_of(guide) -> str:
    """The method name of a guide (:attr:`~twodg_pyro.guide.BNNGuide.method`:
    ``"mean_field"``, ``"2dg"``, ``"rank1"``, ``"ssvi"``), else the guide's class name."""
    method = guide.method if isinstance(guide, BNNGuide) else None
    return method or type(guide).__name__


def site_dims(site) -> list[str]:
    """Named dimensions of a site's tensor, prefixed with the site's name (see the module
    docstring): ``["fc1.weight_out", "fc1.weight_in"]`` for a Linear weight."""
    n, nd, kind = site.name, len(site.shape), site.layer_type
    if site.param_name in ("r", "s") and nd == 2:  # a rank-1 factor: (M, out) or (M, in)
        names = ["component", "out" if site.param_name == "r" else "in"]
    elif site.param_name == "bias" and nd == 1:
        names = ["out"]
    elif site.param_name == "weight" and kind == "Linear" and nd == 2:
        names = ["out", "in"]
    elif site.param_name == "weight" and kind.startswith("ConvTranspose") and nd >= 3:
        names = ["in", "out", *[f"k{i}" for i in range(nd - 2)]]
    elif site.param_name == "weight" and kind.startswith("Conv") and nd >= 3:
        names = ["out", "in", *[f"k{i}" for i in range(nd - 2)]]
    else:
        names = [f"dim_{i}" for i in range(nd)]
    return [f"{n}_{d}" for d in names]


def thinned_coordinates(
    shape, max_values: int | None, seed: int, salt: int = 0
) -> list[torch.Tensor] | None:
    r"""The seeded sub-grid of a tensor of ``shape`` with at most ``max_values`` entries:
    one sorted index tensor per dimension, or ``None`` when every entry fits.

    Dimensions are served from the smallest: each keeps
    :math:`\min(n_d, \lfloor b^{1/r} \rfloor)` indices of the remaining budget
    :math:`b` over the :math:`r` dimensions left, so a 3x3 kernel stays whole and the
    product never exceeds ``max_values``.
    """
    shape = [int(d) for d in shape]
    if max_values is None or math.prod(shape) <= int(max_values):
        return None
    if int(max_values) < 1:
        raise ValueError(f"max_site_values must be at least 1 (or None), got {max_values!r}")
    keep = list(shape)
    budget, left = int(max_values), len(shape)
    for d in sorted(range(len(shape)), key=lambda i: shape[i]):
        k = min(shape[d], max(1, int(math.floor(budget ** (1.0 / left) + 1e-9))))
        keep[d], budget, left = k, max(1, budget // k), left - 1
    return [
        subset(n, k, seed, salt=salt * 64 + d) if k < n else torch.arange(n)
        for d, (n, k) in enumerate(zip(shape, keep, strict=True))
    ]


def take(t: torch.Tensor, grid: list[torch.Tensor] | None, lead: int) -> torch.Tensor:
    """``t[..., grid...]`` with ``lead`` leading dimensions left whole."""
    if grid is None:
        return t
    for d, idx in enumerate(grid):
        t = t.index_select(lead + d, idx.to(t.device))
    return t


def site_offsets(sites) -> list[int]:
    """The global flat index of each site's first weight (in the guide's site order)."""
    return list(itertools.accumulate((s.numel for s in sites), initial=0))[:-1]


def gather_flat(weights: dict[str, torch.Tensor], sites, flat_index: torch.Tensor) -> torch.Tensor:
    """``(S, len(flat_index))``: the draws ``{site: (S, *shape)}`` at global flat indices
    (in the guide's site order), without concatenating every site."""
    flat_index = flat_index.long().cpu()
    first = next(iter(weights.values()))
    out = first.new_empty(first.shape[0], flat_index.numel())
    for site, off in zip(sites, site_offsets(sites), strict=True):
        inside = (flat_index >= off) & (flat_index < off + site.numel)
        if inside.any():
            local = (flat_index[inside] - off).to(first.device)
            w = weights[site.name].reshape(first.shape[0], -1)
            out[:, inside.to(out.device)] = w.index_select(1, local)
    return out


def _put(out: dict, dims: dict, site, suffix: str, values: torch.Tensor, grids: dict) -> None:
    name = f"{site.name}.{suffix}"
    out[name] = to_numpy(take(values.detach().reshape(site.shape), grids[site.name], 0))
    dims[name] = site_dims(site)


def guide_constants(guide, grids: dict, dims: dict) -> dict:
    """Each site's variational parameters (:meth:`~twodg_pyro.guide.BNNGuide.site_parameters`:
    ``<site>.loc``, ``<site>.scale``, SSVI's ``<site>.active``) at the exported coordinates."""
    out: dict = {}
    for site in guide.sites:
        for suffix, values in guide.site_parameters(site.name).items():
            _put(out, dims, site, suffix, values, grids)
    return out


def component_representatives(st) -> tuple[np.ndarray, torch.Tensor]:
    """``(components, flat indices)``: for each component with a plain inlier, its plain
    inlier of smallest global flat index (whose draws are the component's marginal
    :math:`q_k(w)`; in the ``tied`` tying, :math:`z_{k,0}` itself)."""
    idx, comp = st.plain_index.long().cpu(), st.plain_component.long().cpu()
    none = int(st.num_weights)
    first = torch.full((st.n_gaussians,), none, dtype=torch.long)
    first = first.scatter_reduce(0, comp, idx, reduce="amin")
    keep = first < none
    return np.flatnonzero(keep.numpy()), first[keep]


def sharing_group(
    guide, st, grids: dict, dims: dict, coords: dict, max_site_values: int | None, seed: int
) -> dict:
    """The ``sharing`` group of a shared-GMM guide's structure ``st``: per site
    ``<site>.kind`` (:data:`KIND_CODES`) and ``<site>.component`` (a plain inlier's
    component, else -1) at the exported coordinates; ``centre`` (``component``,
    ``coord``), ``covariance`` (``component``, ``coord``, ``coord_``), ``component_count``
    :math:`N_k` and ``representative`` (the flat index of the weight whose draws are
    ``posterior.component_value``, -1 when none); ``outlier_loc`` / ``outlier_scale``
    (``outlier``: each outlier's global flat index, a seeded subset of at most
    ``max_site_values``); ``site_offset`` (``site``: the global flat index of each site's
    first weight)."""
    out: dict = {}
    n_w = st.num_weights
    kind = torch.full((n_w,), KIND_CODES["outlier"], dtype=torch.int8)
    kind[st.plain_index] = KIND_CODES["plain"]
    kind[st.ellipse_index] = KIND_CODES["ellipse"]
    comp = torch.full((n_w,), -1, dtype=torch.long)
    comp[st.plain_index] = st.plain_component
    offsets = site_offsets(guide.sites)
    for site, off in zip(guide.sites, offsets, strict=True):
        _put(out, dims, site, "kind", kind[off : off + site.numel], grids)
        _put(out, dims, site, "component", comp[off : off + site.numel], grids)
    names = ["mu", "sigma"] if st.coordinates == "sigma" else ["mu", "log_sigma"]
    coords.update(component=np.arange(st.n_gaussians), coord=names, coord_=list(names))
    coords["site"] = [s.name for s in guide.sites]
    ks, rep = component_representatives(st)
    representative = np.full(st.n_gaussians, -1, dtype=np.int64)
    representative[ks] = rep.numpy()
    for name, values, dim in (  # the component parameters, and where each site starts
        ("centre", to_numpy(st.means), ["component", "coord"]),
        ("covariance", to_numpy(st.covariances), ["component", "coord", "coord_"]),
        ("component_count", to_numpy(st.component_counts()), ["component"]),
        ("representative", representative, ["component"]),
        ("site_offset", np.asarray(offsets, dtype=np.int64), ["site"]),
    ):
        out[name], dims[name] = values, dim
    if st.n_outliers:  # (a structure without outliers has no outlier variables)
        limit = st.n_outliers if max_site_values is None else int(max_site_values)
        o_sel = subset(st.n_outliers, limit, seed, salt=1)
        out["outlier_loc"] = to_numpy(st.outlier_loc[o_sel])
        out["outlier_scale"] = to_numpy(st.outlier_scale[o_sel])
        dims.update(outlier_loc=["outlier"], outlier_scale=["outlier"])
        coords["outlier"] = to_numpy(st.outlier_index[o_sel])
    return out
