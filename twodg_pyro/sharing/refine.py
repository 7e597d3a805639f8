r"""Structure-level refinement: cluster-size reduction, Mahalanobis reassignment, merging.

These take a :class:`SharingStructure` (plus the current mixture) and return a new,
consistent one; the guide-refinement hooks apply them during stage 3.

* **Size reduction**: components with fewer than :math:`N_\min` hard-assigned
  inliers are deleted; their weights become outliers (or, when outliers are
  switched off, move to their most responsible surviving component).
* **Reassignment** (Eq. 7): each inlier goes to its most responsible component (or, with
  ``sharing.assignment = "nearest"``, its nearest in :math:`W_2`: :func:`assign_components`);
  if :math:`D^2_i = (x_i - m_c)^\top S_c^{-1} (x_i - m_c) > T_M` it becomes an ellipse
  weight tied to its :math:`k` nearest components (Mahalanobis distance) with
  :math:`\alpha_{ij} \propto \mathcal N(x_i \mid m_j, S_j)`.
* **Merging** (Eqs. 4-6): components mapped by a merge result are renumbered in
  every plain and ellipse assignment.
"""

from __future__ import annotations

import dataclasses

import torch

from ..gmm import ellipse_assign, gaussian_log_prob
from .structure import SharingStructure, inlier_fields, plane_sigma, site_index


def hard_assign(
    points: torch.Tensor,
    means: torch.Tensor,
    covs: torch.Tensor,
    weights: torch.Tensor,
    chunk_size: int = 65536,
) -> torch.Tensor:
    r""":math:`\arg\max_k \log\pi_k + \log\mathcal N(x_i \mid m_k, S_k)` per point (chunked)."""
    log_pi = weights.clamp_min(1e-30).log()
    out = [(gaussian_log_prob(c, means, covs) + log_pi).argmax(1) for c in points.split(chunk_size)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def nearest_components(
    points: torch.Tensor, means: torch.Tensor, coordinates: str, chunk_size: int = 65536
) -> torch.Tensor:
    r""":math:`\arg\min_k W_2(\mathcal N(\mu_i, \sigma_i^2), \mathcal N(m_{k,0}, s_k^2))^2
    = (\mu_i - m_{k,0})^2 + (\sigma_i - s_k)^2` per point, with :math:`\sigma_i, s_k` the
    scales of the plane's second coordinates (:func:`~twodg_pyro.sharing.structure.plane_sigma`;
    with ``coordinates = "sigma"`` the plane's Euclidean distance)."""

    def normals(x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x[:, 0], plane_sigma(x[:, 1], coordinates)], 1)

    m = normals(means)
    out = [torch.cdist(normals(c.to(m.dtype)), m).argmin(1) for c in points.split(chunk_size)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def assign_components(points, means, covs, weights, rule: str, coordinates: str) -> torch.Tensor:
    """Each point's component under ``sharing.assignment``'s ``rule``: ``"responsibility"``
    (:func:`hard_assign`) or ``"nearest"`` (:func:`nearest_components`)."""
    if rule == "nearest":
        return nearest_components(points, means, coordinates)
    return hard_assign(points, means, covs, weights)


def reassign(
    s: SharingStructure,
    means: torch.Tensor,
    covs: torch.Tensor,
    threshold: float = 5.991,
    k: int = 5,
    keep_components: bool = False,
    pinned: int = 0,
    assignment: str = "responsibility",
    scope: str = "all",
) -> SharingStructure:
    """Re-run the Mahalanobis check of every inlier, after re-running its assignment
    (``keep_components=False``; ``assignment``: :func:`assign_components`' rule) or
    against the component it is tied to now
    (``keep_components=True``: a plain weight's own component, an ellipse weight's nearest
    one), so that only weights far from that component become (or stop being) ellipse
    weights.  The weights of the last ``pinned`` components (pruned ones,
    :func:`~twodg_pyro.sharing.prune.prune_structure`) stay as they are, and no other
    weight is assigned or blended to those components.  ``scope = "layer"`` blends an
    ellipse weight from its own layer's components only (:func:`layer_scope`)."""
    dtype = _float_dtype(means)
    means, covs = means.detach().cpu().to(dtype), covs.detach().cpu().to(dtype)
    idx = torch.cat([s.plain_index, s.ellipse_index])
    order = idx.argsort()
    idx, points = idx[order], s.inlier_points[order].to(dtype)
    K = means.shape[0]
    if keep_components and K != s.n_gaussians:
        raise ValueError(
            f"keep_components needs the structure's {s.n_gaussians} components, got {K}"
        )
    if not 0 <= pinned < K:
        raise ValueError(f"pinned must be in [0, {K}) for {K} components, got {pinned!r}")
    current = s.ellipse_components[:, 0] if s.n_ellipses else s.ellipse_index.new_zeros(0)
    assign = torch.cat([s.plain_component.long(), current.long()])[order]
    free = assign < K - pinned if pinned else torch.ones_like(assign, dtype=torch.bool)
    m, c = means[: K - pinned], covs[: K - pinned]
    if not keep_components:
        counts = s.component_counts() if s.n_gaussians == K else torch.ones(K, dtype=s.means.dtype)
        weights = (counts / counts.sum().clamp_min(1e-30))[: K - pinned]
        weights = weights / weights.sum().clamp_min(1e-30)
        assign[free] = assign_components(points[free], m, c, weights, assignment, s.coordinates)
    mask, comps, alphas = no_ellipses(int(points.shape[0]), min(k, K - pinned), dtype)
    if bool(free.any()):
        within = None
        if scope == "layer":
            within = layer_scope(s.sites, idx[free], assign[free], K - pinned)
        ell = ellipse_assign(
            points[free], m, c, assign[free], threshold=threshold, k=k, scope=within
        )
        mask[free] = ell.mask
        comps, alphas = ell.components, ell.alphas
    return dataclasses.replace(
        s,
        means=means,
        covariances=covs,
        info=dict(s.info),
        **inlier_fields(idx, points, assign, (mask, comps, alphas)),
    )


def layer_scope(
    sites, index: torch.Tensor, assign: torch.Tensor, n_components: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layer, allowed)`` for :func:`~twodg_pyro.gmm.ellipse_assign`'s ``scope``: the
    layer (site) of each flat weight ``index`` and, per layer, the components that its
    weights are ``assign``-ed to (``(L, K)`` bool).

    Raises:
        ValueError: no ``sites`` (``ellipse_scope = "layer"`` needs the layers)."""
    if sites is None:
        raise ValueError(
            'ellipse_scope = "layer" needs the sites of the weights (blend_ellipses(..., '
            "sites=...)) to know each weight's layer; got sites=None"
        )
    layer = site_index(sites, index)
    allowed = torch.zeros(len(sites), n_components, dtype=torch.bool)
    allowed[layer, assign.long()] = True
    return layer, allowed


def no_ellipses(n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``(mask, components, alphas)`` of ``n`` inliers none of which is an ellipse weight."""
    mask = torch.zeros(n, dtype=torch.bool)
    return mask, torch.zeros(0, k, dtype=torch.long), torch.zeros(0, k, dtype=dtype)


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for float64 input (a float64 network's stage 2), else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def apply_mapping(
    s: SharingStructure, mapping: torch.Tensor, means: torch.Tensor, covs: torch.Tensor
) -> SharingStructure:
    """Renumber assignments after a merge (old component ``j`` becomes ``mapping[j]``)."""
    mapping = mapping.long().cpu()
    if mapping.numel() != s.n_gaussians:
        raise ValueError(
            f"merge mapping has {mapping.numel()} entries for {s.n_gaussians} components"
        )
    dtype = _float_dtype(means)
    return dataclasses.replace(
        s,
        means=means.detach().cpu().to(dtype),
        covariances=covs.detach().cpu().to(dtype),
        plain_component=mapping[s.plain_component],
        ellipse_components=mapping[s.ellipse_components] if s.n_ellipses else s.ellipse_components,
        info=dict(s.info),
    )


def merge_point_covariances(
    covs: torch.Tensor,
    means: torch.Tensor,
    counts: torch.Tensor,
    mapping: torch.Tensor,
    new_means: torch.Tensor,
) -> torch.Tensor:
    r"""The spread of merged point clouds about their new centres.

    Component :math:`a` (``N_a`` points spread as :math:`\Sigma_a` about :math:`m_a`)
    becomes component ``mapping[a]`` with centre :math:`m'`; the merged cloud's second
    moment about :math:`m'` is exactly

    .. math:: \Sigma' = \frac{1}{\sum_a N_a} \sum_a N_a
        \big(\Sigma_a + (m_a - m')(m_a - m')^\top\big).

    Returns ``(K', 2, 2)`` for ``K' = new_means.shape[0]``.
    """
    mapping = mapping.long().to(covs.device)
    n = counts.to(covs.dtype).clamp_min(1e-12)
    d = means - new_means[mapping]
    moment = n[:, None, None] * (covs + d[:, :, None] * d[:, None, :])
    K = new_means.shape[0]
    total = covs.new_zeros(K, 2, 2).index_add(0, mapping, moment)
    return total / covs.new_zeros(K).index_add(0, mapping, n)[:, None, None]


def drop_small_components(
    points: torch.Tensor,
    assign: torch.Tensor,
    means: torch.Tensor,
    covs: torch.Tensor,
    n_min: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Remove components with fewer than ``n_min`` hard-assigned points.

    Returns ``(keep_points_mask, new_assign, means, covs)``: points of removed components
    are flagged ``False`` in the mask (they become outliers); components are renumbered.

    Raises:
        ValueError: if no component keeps ``n_min`` points.
    """
    K = means.shape[0]
    counts = torch.bincount(assign, minlength=K)
    keep = counts >= n_min
    if not bool(keep.any()):
        raise ValueError(
            f"no component has at least N_min = {n_min} points (largest has "
            f"{int(counts.max()) if K else 0}): no inliers would be left; lower n_min or "
            "n_components"
        )
    new_id = torch.full((K,), -1, dtype=torch.long)
    new_id[keep] = torch.arange(int(keep.sum()))
    point_keep = keep[assign]
    return point_keep, new_id[assign[point_keep]], means[keep], covs[keep]
