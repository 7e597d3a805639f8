r"""Stages 1 (steps 3-5) and 2 of Algorithm 1: from a trained mean-field BNN to a
:class:`SharingStructure`, as a sequence of named steps.

:func:`build_sharing` runs, in order:

1. :func:`gather_points` — the points :math:`x_i = (\mu_i, \sigma_i)` (or
   :math:`(\mu_i, \log\sigma_i)`) of all weights;
2. :func:`outlier_gradients` — :math:`\partial\mathcal L/\partial\mu` for the top-:math:`P_g`
   rule (the only step that needs the model and data);
3. :func:`find_outliers` — the mean rule and the gradient rule (Sec. 4.1);
4. :func:`fit_mixture` — a 2-D Gaussian mixture fitted to the inlier points (Eq. 3), to all
   of them or to a seeded random subsample of ``sharing.gmm_max_points`` (one per
   layer with ``sharing.codebook = "per_layer"``: :func:`fit_layer_mixtures`);
5. :func:`assign_points` — every inlier to its most responsible (or W2-nearest) component;
6. :func:`reduce_cluster_sizes` — components with fewer than :math:`N_\min` points go;
7. :func:`merge_to_fixed_point` — W2 merging (Eqs. 4-6) until no pair qualifies;
8. :func:`blend_ellipses` — Mahalanobis check and alpha-blending (Eq. 7);
9. :func:`assemble_structure` — the :class:`SharingStructure`.

Steps 3-9 need only the points (:func:`build_sharing_from_points`), so they can be run,
and timed one by one, without a model.  Ablation switches (``use_outliers``,
``use_ellipses``, ``use_merging``) turn steps off: without outliers, every weight is an
inlier and the points of deleted clusters move to their most responsible surviving
component.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..gmm import GaussianMixture2D, ellipse_assign, merge_components
from .outliers import check_finite, mean_gradients, select_outliers
from .refine import _float_dtype, assign_components, drop_small_components, layer_scope, no_ellipses
from .structure import SharingStructure, SiteLayout, inlier_fields, plane_coordinate, site_index

#: ``step(name)`` returns a context manager around one named step (e.g. a timer)
StepHook = Callable[[str], contextlib.AbstractContextManager]


def weight_points(mus: torch.Tensor, sigmas: torch.Tensor, coordinates: str) -> torch.Tensor:
    r"""Stack the 2-D points: :math:`(\mu, \sigma)` or :math:`(\mu, \log\sigma)`
    (:func:`~twodg_pyro.sharing.structure.plane_coordinate`)."""
    return torch.stack([mus, plane_coordinate(sigmas, coordinates)], 1)


@dataclass
class WeightPoints:
    r"""Every Bayesian weight as a point of the mixture's plane, in site order.

    Attributes:
        mus, sigmas: ``(n_w,)`` posterior means and scales of the mean-field BNN.
        points: ``(n_w, 2)`` :math:`(\mu, \sigma)` or :math:`(\mu, \log\sigma)`.
        sites: name, shape and flat offset of each site.
        coordinates: ``"sigma"`` or ``"log_sigma"``.
    """

    mus: Tensor
    sigmas: Tensor
    points: Tensor
    sites: list[SiteLayout]
    coordinates: str

    @property
    def n_w(self) -> int:
        return int(self.mus.numel())


@dataclass
class Inliers:
    """The inliers as stage 2 goes: flat indices, points, component of each, components.

    Attributes:
        index: ``(n,)`` flat weight indices, ascending.
        points: ``(n, 2)`` their points.
        assign: ``(n,)`` component of each (``None`` before :func:`assign_points`).
        means, covs: ``(K, 2)`` / ``(K, 2, 2)`` the components (``None`` before the fit).
    """

    index: Tensor
    points: Tensor
    assign: Tensor | None = None
    means: Tensor | None = None
    covs: Tensor | None = None


def site_layouts(sites) -> tuple[list[SiteLayout], int]:
    """``(layouts, n_w)``: the name, shape and flat offset of each of ``sites`` (a model's
    or a guide's, in order) and the number of weights they hold."""
    layouts, off = [], 0
    for s in sites:
        layouts.append(SiteLayout(s.name, tuple(s.shape), off))
        off += s.numel
    return layouts, off


def points_from_arrays(
    mus: Tensor, sigmas: Tensor, sites: list[SiteLayout], coordinates: str
) -> WeightPoints:
    """:class:`WeightPoints` from flat means and scales (on the CPU, float32 or float64).

    Raises:
        ValueError: a NaN or infinite mean or scale (naming how many and the first), or
            sizes that do not match ``sites``.
    """
    dtype = _float_dtype(mus)
    mus, sigmas = (t.detach().reshape(-1).cpu().to(dtype) for t in (mus, sigmas))
    n_sites = sum(s.numel for s in sites)
    if mus.numel() != n_sites or sigmas.numel() != n_sites:
        raise ValueError(
            f"{mus.numel()} means and {sigmas.numel()} scales for sites holding {n_sites} weights"
        )
    check_finite("weight means", mus, ": the mean-field BNN diverged")
    check_finite("weight scales", sigmas, ": the mean-field BNN diverged")
    return WeightPoints(mus, sigmas, weight_points(mus, sigmas, coordinates), sites, coordinates)


def gather_points(guide, coordinates: str) -> WeightPoints:
    """Step 1: the points of a trained mean-field ``guide``.

    Stage 2 runs on the CPU in the guide's dtype (float32, or float64 for a float64 network;
    the mixture's E-step too); the stage-3 guide built from the structure moves it back to
    the network's device.
    """
    mus, sigmas = guide.means_and_scales()
    return points_from_arrays(mus, sigmas, site_layouts(guide.sites)[0], coordinates)


def outlier_gradients(model, guide, data, cfg, device=None) -> Tensor | None:
    r"""Step 2: :math:`\partial(-\mathrm{ELBO})/\partial\mu` averaged over ``cfg.grad_batches``
    minibatches (:func:`~twodg_pyro.sharing.mean_gradients`), on the CPU; ``None`` when the
    gradient rule is off (no outliers, or :math:`P_g = 0`)."""
    if not cfg.use_outliers or cfg.grad_percentile <= 0:
        return None
    return mean_gradients(model, guide, data, cfg.grad_batches, device=device).cpu()


def find_outliers(wp: WeightPoints, cfg, grads: Tensor | None = None) -> tuple[Tensor, dict]:
    """Step 3: ``(outlier mask (n_w,), summary)`` under the mean rule and the gradient rule
    (:func:`~twodg_pyro.sharing.select_outliers`); no outliers when ``use_outliers`` is off."""
    if not cfg.use_outliers:
        return torch.zeros(wp.n_w, dtype=torch.bool), {"n_outliers": 0, "rule": "off"}
    rep = select_outliers(
        wp.mus,
        grads,
        rule=cfg.outlier_rule,
        tau_w=cfg.tau_w,
        mu_quantile=cfg.mu_quantile,
        layer_std_multiple=cfg.layer_std_multiple,
        grad_percentile=cfg.grad_percentile,
        layer_sizes=[lay.numel for lay in wp.sites],
    )
    return rep.mask.clone(), rep.summary()


def _inliers(wp: WeightPoints, outlier: Tensor, rule, n_components: int) -> Inliers:
    """The inliers of an outlier mask, checked against ``K``."""
    index = (~outlier).nonzero().squeeze(1)
    if index.numel() == 0:
        raise ValueError(
            f"no inliers left: all {wp.n_w} weights are outliers under rule "
            f"{rule!r}; raise tau_w or use a scale-aware rule"
        )
    if n_components > index.numel():
        raise ValueError(
            f"n_components K = {n_components} is larger than the number of inlier "
            f"points ({index.numel()})"
        )
    return Inliers(index=index, points=wp.points[index])


def mixture_sample(n: int, max_points: int | None, seed: int) -> Tensor | None:
    r"""Rows the mixture is fitted to when ``n`` points exceed ``max_points``: a uniform
    random subset of ``max_points`` rows, drawn by a generator seeded with ``seed`` (the
    global random state is untouched) and kept in ascending order; ``None`` (all rows)
    otherwise.

    The EM's cost grows with the number of points while what it estimates, :math:`6K - 1`
    numbers, does not: at ResNet-50 size (25.6 million weights, :math:`K = 6000`) a few
    hundred points per component fit the mixture about as well as all of them
    (``benchmarks/bench_stage2_scale.py``). Every point is still hard-assigned by the
    fitted mixture (:func:`assign_points`).
    """
    if max_points is None or n <= max_points:
        return None
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n, generator=gen)[: int(max_points)].sort().values


def fit_mixture(
    inl: Inliers,
    cfg,
    seed: int = 0,
    device=None,
    progress: bool = False,
    mixture=None,
    n_components: int | None = None,
):
    """Step 4: the 2-D mixture (Eq. 3) of ``n_components`` (default
    ``cfg.n_components``) fitted to the inlier points (or to :func:`mixture_sample` of
    them); returns the fitted mixture and sets ``inl.means`` and ``inl.covs`` (CPU, the
    points' dtype)."""
    rows = mixture_sample(int(inl.points.shape[0]), cfg.gmm_max_points, seed)
    gmm = (mixture or GaussianMixture2D)(
        cfg.n_components if n_components is None else n_components,
        batch_size=cfg.gmm_batch_size,
        max_iter=cfg.gmm_max_iter,
        random_state=seed,
        device=device,
        dtype=inl.points.dtype,
        progress=progress,
    ).fit(inl.points if rows is None else inl.points[rows])
    inl.means = gmm.means_.detach().cpu().to(inl.points.dtype)
    inl.covs = gmm.covariances_.detach().cpu().to(inl.points.dtype)
    return gmm


def fit_layer_mixtures(
    inl: Inliers, wp: WeightPoints, cfg, seed: int = 0, device=None, progress=False, mixture=None
) -> None:
    r"""Steps 4-5 with a codebook per layer (``sharing.codebook = "per_layer"``): for
    each layer :math:`l` with inliers, a mixture of :math:`K_l = \min(K, n_l)` components
    fitted to its :math:`n_l` inlier points (seed ``seed + l``, :func:`fit_mixture`) and
    each of them assigned to one of them (:func:`assign_points`); the components of
    all layers pooled in layer order (``inl.means``, ``inl.covs``, ``inl.assign``): one
    mixture for all layers spends few components on a layer of small weights.
    """
    layer = site_index(wp.sites, inl.index)
    means, covs, assign, offset = [], [], torch.empty_like(inl.index), 0
    for lay in layer.unique().tolist():
        rows = (layer == lay).nonzero().squeeze(1)
        part = Inliers(index=inl.index[rows], points=inl.points[rows])
        k = min(cfg.n_components, int(rows.numel()))
        gmm = fit_mixture(part, cfg, seed + lay, device, progress, mixture, n_components=k)
        assign_points(part, gmm, cfg.assignment, wp.coordinates)
        assign[rows] = part.assign + offset
        means.append(part.means)
        covs.append(part.covs)
        offset += int(part.means.shape[0])
    inl.means, inl.covs, inl.assign = torch.cat(means), torch.cat(covs), assign


def assign_points(inl: Inliers, gmm, rule: str = "responsibility", coords: str = "sigma") -> None:
    r"""Step 5: ``inl.assign``, each inlier's most responsible component
    :math:`\arg\max_k \pi_k \mathcal N(x_i \mid m_k, S_k)` (``rule = "nearest"``: its
    nearest in :math:`W_2`, :func:`~twodg_pyro.sharing.refine.nearest_components`)."""
    if rule == "nearest":
        inl.assign = assign_components(inl.points, inl.means, None, None, rule, coords)
    else:
        inl.assign = gmm.predict(inl.points).cpu()


def reduce_cluster_sizes(inl: Inliers, outlier: Tensor, cfg, coords: str = "sigma") -> dict:
    r"""Step 6: components with fewer than :math:`N_\min` points are deleted.

    With outliers on, their points become outliers (``outlier`` is updated in place and
    ``inl`` loses them); otherwise they move to their most responsible (or nearest,
    ``cfg.assignment``) surviving component.  Returns the report entries of the step.
    """
    keep, assign_kept, inl.means, inl.covs = drop_small_components(
        inl.points, inl.assign, inl.means, inl.covs, cfg.n_min
    )
    report = {"components_after_size_reduction": int(inl.means.shape[0])}
    if cfg.use_outliers:
        report["outliers_from_small_clusters"] = int((~keep).sum())
        outlier[inl.index[~keep]] = True
        inl.index, inl.points, inl.assign = inl.index[keep], inl.points[keep], assign_kept
    else:
        weights = torch.bincount(assign_kept, minlength=inl.means.shape[0]).to(inl.points.dtype)
        w = weights / weights.sum()
        moved = assign_components(inl.points, inl.means, inl.covs, w, cfg.assignment, coords)
        if cfg.codebook == "per_layer":  # only the deleted clusters' points move
            moved[keep] = assign_kept
        inl.assign = moved
    return report


def merge_to_fixed_point(inl: Inliers, cfg, progress: bool = False) -> dict:
    """Step 7: W2 merging (Eqs. 4-6) until no pair qualifies
    (:func:`~twodg_pyro.gmm.merge_components`); renumbers ``inl.assign``. Returns the report
    entries of the step (none when ``use_merging`` is off)."""
    if not cfg.use_merging:
        return {}
    dtype = inl.points.dtype
    counts = torch.bincount(inl.assign, minlength=int(inl.means.shape[0])).to(dtype)
    result = merge_components(
        inl.means,
        inl.covs,
        counts,
        tau_d=cfg.tau_d,
        rule=cfg.merge_rule,
        grads=None,
        tau_g=cfg.tau_g,
        tau_v=cfg.tau_v,
        test=cfg.merge_test,
        progress=progress,
    )
    inl.means, inl.covs = result.means.to(dtype), result.covs.to(dtype)
    inl.assign = result.mapping[inl.assign]
    return {"merge_rounds": int(result.n_rounds)}


def blend_ellipses(inl: Inliers, cfg, progress: bool = False, sites=None) -> tuple[Tensor, ...]:
    r"""Step 8: ``(mask, components, alphas)`` of the ellipse weights (Eq. 7): inliers whose
    squared Mahalanobis distance to their component exceeds :math:`T_M`, tied to their
    ``k`` nearest components (:func:`~twodg_pyro.gmm.ellipse_assign`; with
    ``ellipse_scope = "layer"``, of their layer's ``sites``); none when ``use_ellipses``
    is off."""
    dtype = inl.points.dtype
    if not cfg.use_ellipses:
        return no_ellipses(int(inl.points.shape[0]), min(cfg.k_nearest, len(inl.means)), dtype)
    scope = None
    if cfg.ellipse_scope == "layer":
        scope = layer_scope(sites, inl.index, inl.assign, int(inl.means.shape[0]))
    kw = dict(threshold=cfg.mahalanobis_threshold, k=cfg.k_nearest, progress=progress, scope=scope)
    ell = ellipse_assign(inl.points, inl.means, inl.covs, inl.assign, **kw)
    return ell.mask.cpu(), ell.components.cpu(), ell.alphas.cpu().to(dtype)


def assemble_structure(
    wp: WeightPoints, outlier: Tensor, inl: Inliers, ellipses: tuple[Tensor, Tensor, Tensor], info
) -> SharingStructure:
    """Step 9: the :class:`SharingStructure` (outliers keep their stage-1 ``(mu, sigma)``;
    the inliers' points are stored plain weights first, then ellipse weights)."""
    out_idx = outlier.nonzero().squeeze(1)
    return SharingStructure(
        sites=wp.sites,
        coordinates=wp.coordinates,
        means=inl.means,
        covariances=inl.covs,
        outlier_index=out_idx,
        outlier_loc=wp.mus[out_idx],
        outlier_scale=wp.sigmas[out_idx],
        info=info,
        **inlier_fields(inl.index, inl.points, inl.assign, ellipses),
    )


def build_sharing_from_points(
    wp: WeightPoints,
    cfg,
    grads: Tensor | None = None,
    *,
    seed: int = 0,
    device=None,
    progress: bool = False,
    mixture=None,
    step: StepHook | None = None,
    started: float | None = None,
) -> tuple[SharingStructure, dict]:
    """Steps 3-9 of :func:`build_sharing` on given points (and gradients for the gradient
    rule, or ``None`` to skip it).

    ``step(name)``, when given, wraps each step in a context manager (the benchmark times
    them); the names are ``outliers``, ``mixture_fit``, ``hard_assignment``,
    ``size_reduction``, ``merging``, ``ellipses`` and ``structure``. ``started`` is the
    ``time.perf_counter()`` the report's ``seconds`` counts from (default: now).
    """
    step = step or (lambda name: contextlib.nullcontext())
    t0 = time.perf_counter() if started is None else started
    report: dict = {}
    with step("outliers"):
        outlier, report["outlier_rules"] = find_outliers(wp, cfg, grads)
    inl = _inliers(wp, outlier, report["outlier_rules"].get("rule"), cfg.n_components)
    t1 = time.perf_counter()
    gmm = None
    with step("mixture_fit"):
        if cfg.codebook == "per_layer":  # steps 4-5 layer by layer
            fit_layer_mixtures(inl, wp, cfg, seed, device, progress, mixture)
        else:
            gmm = fit_mixture(inl, cfg, seed, device, progress, mixture)
    report["gmm_seconds"] = time.perf_counter() - t1
    report["gmm_components"] = int(inl.means.shape[0])
    with step("hard_assignment"):
        if gmm is not None:
            assign_points(inl, gmm, cfg.assignment, wp.coordinates)
    del gmm
    with step("size_reduction"):
        report.update(reduce_cluster_sizes(inl, outlier, cfg, wp.coordinates))
    with step("merging"):
        report.update(merge_to_fixed_point(inl, cfg, progress=progress))
    report["components_after_merging"] = int(inl.means.shape[0])
    with step("ellipses"):
        ellipses = blend_ellipses(inl, cfg, progress=progress, sites=wp.sites)
    with step("structure"):
        info = {"outlier_rule": report["outlier_rules"].get("rule")}
        structure = assemble_structure(wp, outlier, inl, ellipses, info)
    report.update(structure.counts())
    report["seconds"] = time.perf_counter() - t0
    return structure, report


def build_sharing(
    model,
    guide,
    data,
    cfg,
    seed: int = 0,
    device=None,
    progress: bool = False,
    mixture=None,
    step: StepHook | None = None,
):
    """Build the sharing structure from a trained mean-field ``guide`` (module docstring).

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel`.
        guide: the trained :class:`~twodg_pyro.guides.MeanFieldGuide`.
        data: minibatches for the gradient rule.
        cfg: the method's settings, a :class:`~twodg_pyro.sharing.SharingConfig`.
        seed: seed of the mixture fit (and of its subsample, ``cfg.gmm_max_points``).
        progress: tqdm bars for the mixture fit, the merging and the Mahalanobis step.
        mixture: the mixture class (default :class:`~twodg_pyro.gmm.GaussianMixture2D`;
            e.g. :class:`~twodg_pyro.distributed.DistributedGaussianMixture2D`).
        step: optional ``step(name)`` context manager around each step (names ``points``,
            ``gradients``, then those of :func:`build_sharing_from_points`).

    Returns:
        ``(structure, report)`` where ``report`` holds counts per step and timings.

    Raises:
        ValueError: NaN weights, K larger than the number of inlier points, no inliers
            left, or a bad setting — each naming the value.
    """
    step = step or (lambda name: contextlib.nullcontext())
    t0 = time.perf_counter()
    with step("points"):
        wp = gather_points(guide, cfg.coordinates)
    with step("gradients"):
        grads = outlier_gradients(model, guide, data, cfg, device=device)
    return build_sharing_from_points(
        wp,
        cfg,
        grads,
        seed=seed,
        device=device,
        progress=progress,
        mixture=mixture,
        step=step,
        started=t0,
    )
