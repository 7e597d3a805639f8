r"""Stages 1 (steps 3-5) and 2 of Algorithm 1: from a trained mean-field BNN to a
:class:`SharingStructure`.

1. points :math:`x_i = (\mu_i, \sigma_i)` (or :math:`(\mu_i, \log\sigma_i)`) of all weights;
2. outliers by the mean rule and the top-:math:`P_g` gradient rule;
3. a 2-D Gaussian mixture fitted to the inlier points (mini-batch EM);
4. cluster-size reduction (components with fewer than :math:`N_\min` points go);
5. Mahalanobis check and alpha-blending (ellipse weights);
6. W2 merging until no pair qualifies.

Ablation switches (``use_outliers``, ``use_ellipses``, ``use_merging``) turn steps off:
without outliers, every weight is an inlier and the points of deleted clusters move to
their most responsible surviving component.
"""

from __future__ import annotations

import time

import torch

from .outliers import mean_gradients, select_outliers
from .refine import drop_small_components, hard_assign
from .structure import COORDINATES, SharingStructure, SiteLayout

__all__ = ["build_sharing", "weight_points"]


def weight_points(mus: torch.Tensor, sigmas: torch.Tensor, coordinates: str) -> torch.Tensor:
    r"""Stack the 2-D points: :math:`(\mu, \sigma)` or :math:`(\mu, \log\sigma)`."""
    if coordinates == "sigma":
        return torch.stack([mus, sigmas], 1)
    if coordinates == "log_sigma":
        return torch.stack([mus, sigmas.clamp_min(1e-30).log()], 1)
    raise ValueError(f"coordinates must be one of {list(COORDINATES)}, got {coordinates!r}")


def build_sharing(
    model, guide, data, cfg, seed: int = 0, device=None, progress: bool = False, mixture=None
):
    """Build the sharing structure from a trained mean-field ``guide``.

    Args:
        model: the :class:`~twodg_pyro.model.BNNModel`.
        guide: the trained :class:`~twodg_pyro.guides.MeanFieldGuide`.
        data: minibatches for the gradient rule.
        cfg: a :class:`~twodg_pyro.pipeline.config.SharingConfig`.
        seed: seed of the mixture fit.
        progress: tqdm bars for the mixture fit, the merging and the Mahalanobis step.
        mixture: the mixture class (default :class:`~twodg_pyro.gmm.GaussianMixture2D`;
            e.g. :class:`~twodg_pyro.distributed.DistributedGaussianMixture2D`).

    Returns:
        ``(structure, report)`` where ``report`` holds counts per step and timings.

    Raises:
        ValueError: NaN weights, K larger than the number of inlier points, no inliers
            left, or a bad setting — each naming the value.
    """
    from ..gmm import GaussianMixture2D, ellipse_assign, merge_components

    report: dict = {}
    t0 = time.perf_counter()
    mus, sigmas = guide.means_and_scales()
    # stage 2 runs on the CPU in the guide's dtype (float32, or float64 for a float64
    # network; the mixture's E-step too); the stage-3 guide built from the structure
    # moves it back to the network's device
    mus, sigmas = mus.cpu(), sigmas.cpu()
    dtype = mus.dtype if mus.dtype == torch.float64 else torch.float32
    mus, sigmas = mus.to(dtype), sigmas.to(dtype)
    n_w = mus.numel()
    for name, t in (("weight means", mus), ("weight scales", sigmas)):
        bad = ~torch.isfinite(t)
        if bad.any():
            raise ValueError(
                f"{name} have {int(bad.sum())} NaN/infinite value(s) (first at flat index "
                f"{int(bad.nonzero()[0, 0])}): the mean-field BNN diverged"
            )
    sites, off = [], 0
    for s in guide.sites:
        sites.append(SiteLayout(s.name, tuple(s.shape), off))
        off += s.numel
    points = weight_points(mus, sigmas, cfg.coordinates)

    # ---- outliers (Sec. 4.1)
    if cfg.use_outliers:
        grads = None
        if cfg.grad_percentile > 0:
            grads = mean_gradients(model, guide, data, cfg.grad_batches, device=device).cpu()
        rep = select_outliers(
            mus,
            grads,
            rule=cfg.outlier_rule,
            tau_w=cfg.tau_w,
            mu_quantile=cfg.mu_quantile,
            layer_std_multiple=cfg.layer_std_multiple,
            grad_percentile=cfg.grad_percentile,
            layer_sizes=[lay.numel for lay in sites],
        )
        outlier = rep.mask.clone()
        report["outlier_rules"] = rep.summary()
    else:
        outlier = torch.zeros(n_w, dtype=torch.bool)
        report["outlier_rules"] = {"n_outliers": 0, "rule": "off"}
    inlier_idx = (~outlier).nonzero().squeeze(1)
    if inlier_idx.numel() == 0:
        raise ValueError(
            f"no inliers left: all {n_w} weights are outliers under rule "
            f"{report['outlier_rules'].get('rule')!r}; raise tau_w or use a scale-aware rule"
        )
    if cfg.n_components > inlier_idx.numel():
        raise ValueError(
            f"n_components K = {cfg.n_components} is larger than the number of inlier "
            f"points ({inlier_idx.numel()})"
        )

    # ---- mixture (Eq. 3)
    t1 = time.perf_counter()
    gmm = (mixture or GaussianMixture2D)(
        cfg.n_components,
        batch_size=cfg.gmm_batch_size,
        max_iter=cfg.gmm_max_iter,
        random_state=seed,
        device=device,
        dtype=dtype,
        progress=progress,
    ).fit(points[inlier_idx])
    report["gmm_seconds"] = time.perf_counter() - t1
    report["gmm_components"] = cfg.n_components
    means = gmm.means_.detach().cpu().to(dtype)
    covs = gmm.covariances_.detach().cpu().to(dtype)
    in_points = points[inlier_idx]
    assign = gmm.predict(in_points).cpu()

    # ---- cluster-size reduction
    keep, assign_kept, means, covs = drop_small_components(
        in_points, assign, means, covs, cfg.n_min
    )
    report["components_after_size_reduction"] = int(means.shape[0])
    if cfg.use_outliers:
        report["outliers_from_small_clusters"] = int((~keep).sum())
        outlier[inlier_idx[~keep]] = True
        inlier_idx, in_points, assign = inlier_idx[keep], in_points[keep], assign_kept
    else:
        weights = torch.bincount(assign_kept, minlength=means.shape[0]).to(dtype)
        assign = hard_assign(in_points, means, covs, weights / weights.sum())

    # ---- merging (Eqs. 4-6), until no pair qualifies
    K0 = int(means.shape[0])
    if cfg.use_merging:
        counts = torch.bincount(assign, minlength=K0).to(dtype)
        grads_k = None
        result = merge_components(
            means,
            covs,
            counts,
            tau_d=cfg.tau_d,
            rule=cfg.merge_rule,
            grads=grads_k,
            tau_g=cfg.tau_g,
            tau_v=cfg.tau_v,
            test=cfg.merge_test,
            progress=progress,
        )
        means, covs = result.means.to(dtype), result.covs.to(dtype)
        assign = result.mapping[assign]
        report["merge_rounds"] = int(result.n_rounds)
    report["components_after_merging"] = int(means.shape[0])

    # ---- Mahalanobis check and alpha-blending (Eq. 7)
    if cfg.use_ellipses:
        ell = ellipse_assign(
            in_points,
            means,
            covs,
            assign,
            threshold=cfg.mahalanobis_threshold,
            k=cfg.k_nearest,
            progress=progress,
        )
        mask, comps, alphas = ell.mask.cpu(), ell.components.cpu(), ell.alphas.cpu().to(dtype)
    else:
        k = min(cfg.k_nearest, int(means.shape[0]))
        mask = torch.zeros(in_points.shape[0], dtype=torch.bool)
        comps, alphas = torch.zeros(0, k, dtype=torch.long), torch.zeros(0, k, dtype=dtype)

    out_idx = outlier.nonzero().squeeze(1)
    structure = SharingStructure(
        sites=sites,
        coordinates=cfg.coordinates,
        means=means,
        covariances=covs,
        outlier_index=out_idx,
        outlier_loc=mus[out_idx],
        outlier_scale=sigmas[out_idx],
        plain_index=inlier_idx[~mask],
        plain_component=assign[~mask],
        ellipse_index=inlier_idx[mask],
        ellipse_components=comps,
        ellipse_alphas=alphas,
        inlier_points=torch.cat([in_points[~mask], in_points[mask]]),
        info={"outlier_rule": report["outlier_rules"].get("rule")},
    )
    report.update(structure.counts())
    report["seconds"] = time.perf_counter() - t0
    return structure, report
