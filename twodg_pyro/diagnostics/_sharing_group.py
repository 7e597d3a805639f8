"""What the export holds besides the draws: the guide's variational parameters at the
exported coordinates (``constant_data``), and a shared-GMM guide's sharing structure as
a group of its own (``sharing``: the component parameters, each weight's assignment and
the outlier set), as described in :mod:`twodg_pyro.diagnostics.arviz_export`."""

from __future__ import annotations

import numpy as np
import torch

from ._draws import subset, to_numpy
from ._sites import site_dims, take

__all__ = [
    "KIND_CODES",
    "component_representatives",
    "guide_constants",
    "sharing_group",
]

#: Codes of ``<site>.kind`` in the ``sharing`` group.
KIND_CODES = {"outlier": 0, "plain": 1, "ellipse": 2}


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
    off, offsets = 0, []
    for site in guide.sites:
        _put(out, dims, site, "kind", kind[off : off + site.numel], grids)
        _put(out, dims, site, "component", comp[off : off + site.numel], grids)
        offsets.append(off)
        off += site.numel
    names = ["mu", "sigma"] if st.coordinates == "sigma" else ["mu", "log_sigma"]
    coords.update(component=np.arange(st.n_gaussians), coord=names, coord_=list(names))
    coords["site"] = [s.name for s in guide.sites]
    ks, rep = component_representatives(st)
    representative = np.full(st.n_gaussians, -1, dtype=np.int64)
    representative[ks] = rep.numpy()
    out.update(
        centre=to_numpy(st.means),
        covariance=to_numpy(st.covariances),
        component_count=to_numpy(st.component_counts()),
        representative=representative,
        site_offset=np.asarray(offsets, dtype=np.int64),
    )
    dims.update(
        centre=["component", "coord"],
        covariance=["component", "coord", "coord_"],
        component_count=["component"],
        representative=["component"],
        site_offset=["site"],
    )
    if st.n_outliers:  # (a structure without outliers has no outlier variables)
        limit = st.n_outliers if max_site_values is None else int(max_site_values)
        o_sel = subset(st.n_outliers, limit, seed, salt=1)
        out["outlier_loc"] = to_numpy(st.outlier_loc[o_sel])
        out["outlier_scale"] = to_numpy(st.outlier_scale[o_sel])
        dims.update(outlier_loc=["outlier"], outlier_scale=["outlier"])
        coords["outlier"] = to_numpy(st.outlier_index[o_sel])
    return out
