r"""Pruning for deployment: inliers whose stage-1 posterior includes zero share one cheap symbol.

A weight the data do not pin down has a mean-field posterior that covers zero: its
signal-to-noise ratio

.. math:: \mathrm{SNR}_i = |\mu_i| / \sigma_i

is small (Graves 2011; Blundell et al. 2015, who drop up to 95 % of a network's weights
by it; Louizos et al. 2017 prune on the same idea).  In a 2DG file every weight pays for
its component index (:mod:`twodg_pyro.io.compact`), about :math:`H = -\sum_k p_k \log_2
p_k` bits, so the index costs least when most weights share one symbol.
:func:`prune_structure` moves every inlier (plain or ellipse) with
:math:`\mathrm{SNR}_i < t`, measured on its stage-1 point :math:`x_i = (\mu_i,
\sigma_i)` (the structure's ``inlier_points``), to new components of zero mean, so that
the index of a fraction :math:`p` of the weights costs about :math:`-\log_2 p` bits each.
Outliers are never pruned.  Two spreads:

* ``"zero"``: one component :math:`\mathcal N(0, \sigma_{\min}^2)` with
  :math:`\sigma_{\min}` = :data:`~twodg_pyro.nn.functional.MIN_SIGMA`: the weight
  is removed (Bayesian Compression's pruning; a point mass, whose KL to the prior is
  unbounded: a pruned guide is for prediction, not for more training);
* ``"matched"``: one component per site, :math:`\mathcal N(0, \bar\sigma_s^2)` with
  :math:`\bar\sigma_s^2 = \frac{1}{|P_s|}\sum_{i \in P_s} (\mu_i^2 + \sigma_i^2)`, the
  zero-mean Normal closest in :math:`\mathrm{KL}(q_{P_s} \| \cdot)` to the mixture of the
  pruned weights' posteriors :math:`q_{P_s}` in site :math:`s` (it matches their second
  moment): the weights keep their noise, and with it part of the predictive uncertainty.

The new components' covariances (the spread of their member points, which the
Mahalanobis check would measure against) are those of the pruned points.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

import torch

from ..nn.functional import MIN_SIGMA
from .structure import SharingStructure, inlier_fields, plane_sigma, site_index

Spread = Literal["zero", "matched"]
SPREADS: tuple[str, ...] = get_args(Spread)


@dataclasses.dataclass(frozen=True)
class PruneReport:
    r"""What :func:`prune_structure` did.

    Attributes:
        snr: the threshold :math:`t`.
        spread: ``"zero"`` or ``"matched"``.
        n_pruned: inliers moved to the new components (plain and ellipse).
        fraction: ``n_pruned`` over all weights :math:`n_w`.
        new_components: the number of components added.
        site_scales: per site with pruned weights, its name and the new component's
            :math:`\sigma` (``"matched"``; ``"zero"``: :math:`\sigma_{\min}` once).
    """

    snr: float
    spread: str
    n_pruned: int
    fraction: float
    new_components: int
    site_scales: dict


def inlier_snr(s: SharingStructure) -> torch.Tensor:
    r""":math:`|\mu_i| / \sigma_i` of every inlier's stage-1 point, in the order of
    ``inlier_points`` (plain weights, then ellipse weights)."""
    mu, m1 = s.inlier_points[:, 0], s.inlier_points[:, 1]
    return mu.abs() / plane_sigma(m1, s.coordinates).clamp_min(MIN_SIGMA)


def lowest_snr_first(s: SharingStructure, snr: float) -> torch.Tensor:
    r"""The positions (in ``plain_index`` then ``ellipse_index`` order) of the inliers of
    :math:`\mathrm{SNR}_i <` ``snr``, lowest SNR first (ties in position order): the
    order in which a limited or ramped pruning ties them."""
    ratio = inlier_snr(s)
    below = torch.nonzero(ratio < snr).squeeze(1)
    return below[torch.argsort(ratio[below], stable=True)]


def _centre(sigma: float, coordinates: str) -> list[float]:
    return [0.0, math.log(sigma) if coordinates == "log_sigma" else sigma]


def _spread_of(points: torch.Tensor) -> torch.Tensor:
    """The covariance of ``points`` (n, 2), kept positive definite."""
    cov = torch.cov(points.T) if points.shape[0] >= 2 else torch.zeros(2, 2, dtype=points.dtype)
    scale = float(cov.diagonal().abs().max())
    return cov + (1e-6 * scale + 1e-12) * torch.eye(2, dtype=points.dtype)


def prune_structure(
    s: SharingStructure, snr: float, spread: Spread = "zero", limit: int | None = None
) -> tuple[SharingStructure, PruneReport]:
    r"""``s`` with every inlier of :math:`\mathrm{SNR}_i < ` ``snr`` tied to a new
    zero-mean component (module docstring); the old components keep their index.

    Args:
        s: a sharing structure (its ``inlier_points`` the stage-1 points).
        snr: the threshold :math:`t \ge 0` (0 prunes nothing; 1.96: the weights whose
            95 % interval covers zero).
        spread: ``"zero"`` (removed weights) or ``"matched"`` (per-site moment match).
        limit: tie only the ``limit`` inliers of lowest SNR below ``snr`` (the first share
            of a ramp, :class:`~twodg_pyro.sharing.PruneRamp`; ``None``: all of them).

    Raises:
        ValueError: a negative or non-finite ``snr``, an unknown ``spread``,
            non-finite inlier points, or a structure pruned already (pruning it again
            would move its pruned weights to yet another component and leave the first
            one empty: prune the unpruned structure at the new threshold).
    """
    if isinstance(snr, bool) or not isinstance(snr, int | float) or not 0 <= snr < math.inf:
        raise ValueError(f"snr must be a finite number >= 0, got {snr!r}")
    if spread not in SPREADS:
        raise ValueError(f"spread must be one of {list(SPREADS)}, got {spread!r}")
    if "pruned" in s.info:
        done = s.info["pruned"]
        raise ValueError(
            f"this structure is pruned already (snr {done['snr']}, spread "
            f"{done['spread']!r}, {done['n']} weights): prune the unpruned structure at "
            f"the new threshold instead"
        )
    if not bool(torch.isfinite(s.inlier_points).all()):
        raise ValueError("the structure's inlier points are not finite: nothing to prune by")
    idx = torch.cat([s.plain_index, s.ellipse_index])
    order = lowest_snr_first(s, snr)
    pruned = torch.zeros(idx.numel(), dtype=torch.bool)
    pruned[order if limit is None else order[: max(int(limit), 0)]] = True
    K, dtype = s.n_gaussians, s.means.dtype
    n_w = s.num_weights
    if not bool(pruned.any()):
        return s, PruneReport(float(snr), spread, 0, 0.0, 0, {})
    # the new component of every pruned inlier: K (zero), or K + j for its site's j-th
    site_of = site_index(s.sites, idx)
    points = s.inlier_points
    new_means, new_covs, scales = [], [], {}
    new_comp = torch.full((idx.numel(),), -1, dtype=torch.long)
    if spread == "zero":
        new_means.append(_centre(MIN_SIGMA, s.coordinates))
        new_covs.append(_spread_of(points[pruned]))
        new_comp[pruned] = K
        scales["all"] = MIN_SIGMA
    else:
        mu, sigma = points[:, 0], plane_sigma(points[:, 1], s.coordinates)
        for j, site in enumerate(s.sites):
            here = pruned & (site_of == j)
            if not bool(here.any()):
                continue
            scale = float((mu[here] ** 2 + sigma[here] ** 2).mean().sqrt())
            new_comp[here] = K + len(new_means)
            new_means.append(_centre(max(scale, MIN_SIGMA), s.coordinates))
            new_covs.append(_spread_of(points[here]))
            scales[site.name] = scale
    fields = _tied(s, pruned, new_comp)
    means = torch.cat([s.means, torch.tensor(new_means, dtype=dtype)])
    covs = torch.cat([s.covariances, torch.stack(new_covs).to(dtype)])
    n = int(pruned.sum())
    pruned_info = {"snr": float(snr), "spread": spread, "n": n, "components": len(new_means)}
    info = dict(s.info, pruned=pruned_info)
    out = dataclasses.replace(s, means=means, covariances=covs, info=info, **fields)
    return out, PruneReport(float(snr), spread, n, n / max(n_w, 1), len(new_means), scales)


def _tied(s: SharingStructure, pruned: torch.Tensor, new_comp: torch.Tensor) -> dict:
    """The inlier fields of ``s`` with the ``pruned`` inliers (a mask over ``plain_index``
    then ``ellipse_index``) tied to ``new_comp``: pruned ellipse weights become plain
    weights of their component; the fields keep index order within each kind."""
    n_plain = int(s.plain_index.numel())
    idx = torch.cat([s.plain_index, s.ellipse_index])
    component = torch.cat([s.plain_component, torch.zeros(idx.numel() - n_plain, dtype=torch.long)])
    component = torch.where(pruned, new_comp, component)
    kept = ~pruned[n_plain:]  # the ellipse weights left, in (ascending) index order
    ellipse = torch.cat([torch.zeros(n_plain, dtype=torch.bool), kept])
    order = torch.argsort(idx)
    ellipses = (ellipse[order], s.ellipse_components[kept], s.ellipse_alphas[kept])
    return inlier_fields(idx[order], s.inlier_points[order], component[order], ellipses)


def prune_further(s: SharingStructure, weights: torch.Tensor) -> SharingStructure:
    """``s``, pruned with the ``"zero"`` spread, with the inliers whose flat index is in
    ``weights`` also tied to its zero component (the last one): a ramp's later shares
    (:class:`~twodg_pyro.sharing.PruneRamp`).  Indices of outliers or of weights tied
    already change nothing.

    Raises:
        ValueError: ``s`` is not pruned with the ``"zero"`` spread.
    """
    done = s.info.get("pruned")
    if not done or done.get("spread") != "zero":
        raise ValueError(
            f"prune_further extends a structure pruned with spread 'zero'; this one is "
            f"{'not pruned' if not done else 'pruned with spread ' + repr(done.get('spread'))}"
        )
    zero = s.n_gaussians - 1
    pruned = torch.isin(torch.cat([s.plain_index, s.ellipse_index]), weights.long().cpu())
    fields = _tied(s, pruned, torch.full_like(pruned, zero, dtype=torch.long))
    n = int((fields["plain_component"] == zero).sum())
    return dataclasses.replace(s, info=dict(s.info, pruned=dict(done, n=n)), **fields)
