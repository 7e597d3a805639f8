r"""Algorithm 1, top-down: three stages, then the 2DG BNN's row of the results table.

1. :func:`stage1_mean_field` -- a mean-field BNN over the (optionally pretrained)
   network, trained by SVI on the (annealed) ELBO;
2. :func:`stage2_sharing` -- from its :math:`(\mu, \sigma)` points: outliers, the 2-D
   mixture, cluster-size reduction, W2 merging and the Mahalanobis check
   (:func:`~twodg_pyro.sharing.build_sharing`), giving the
   :class:`~twodg_pyro.sharing.SharingStructure`;
3. :func:`stage3_shared_gmm` -- the shared-GMM guide over that structure, trained by
   SVI on Eq. 10 with the merge and Mahalanobis hooks (:func:`stage3_hooks`) between
   epochs.

:func:`run_2dg` runs stages 2-3 on a trained stage 1 and evaluates the result; the
main job (:func:`~twodg_pyro.pipeline.run`) calls it as the ``2dg`` method, the
experiments' variants (:func:`~twodg_pyro.pipeline.runtime.variants.run_variants`) once per
variant.  Every stage runs through an
:class:`~twodg_pyro.pipeline.runtime.execution.Execution`: in one process (the default), or on
every rank of a process group with the same result on each
(:class:`~twodg_pyro.pipeline.runtime.data_parallel.DataParallel`).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...accounting import compression_report
from ...distributed import MainOnly
from ...guides import MeanFieldGuide, SharedGMMGuide
from ...infer import DecomposedELBO, KLAnnealing, ScaleTrajectory
from ...infer.checkpoint import restore_state
from ...infer.curvature import curvature_scales, diagonal_fisher, empirical_bayes_scales
from ...infer.temperature import resolve_kl_weight
from ...infer.von import VariationalOnlineNewton
from ...methods import GuidePosterior
from ...nn.sites import DEFAULT_LAYER_TYPES
from ...priors import LayerwiseNormalPrior, PerSiteNormalPrior
from ...sharing import (
    MahalanobisHook,
    MergeHook,
    PinPruned,
    PruneRamp,
    SharingStructure,
    build_sharing,
    prune_structure,
)
from ..outputs.results import kl_weight_field
from ..settings.build import build_model, build_prior, train_loader

if TYPE_CHECKING:
    from ..runtime.context import RunContext


# ---------------------------------------------------------------------------- stage 1
#: ``prior.kind`` values learnt by stage 1 from the curvature of the network
EMPIRICAL_BAYES_KINDS = ("empirical_bayes", PerSiteNormalPrior.kind)


def stage1_model(
    cfg,
    split,
    net,
    prior_scales: dict | None = None,
    resumed: bool = False,
    layer_types: tuple[type[nn.Module], ...] = DEFAULT_LAYER_TYPES,
):
    r"""The Bayesian model over ``net`` that stage 1 trains and its guide's initial scales
    (``stage1.init_scale``, or the per-weight tensors it derives).

    With ``prior.kind = "empirical_bayes"`` or ``stage1.init_scale = "curvature"`` the
    diagonal Fisher of ``net`` (pretrained) on the training set is computed once
    (:func:`~twodg_pyro.infer.curvature.diagonal_fisher`, labels sampled from the network
    with the run's seed); from it, with :math:`\beta` = ``stage1.kl_weight``, the
    per-site prior scales by type-II maximum likelihood
    (:func:`~twodg_pyro.infer.curvature.empirical_bayes_scales`) and the initial scales
    :math:`\sigma_i = (G_{ii}/\beta + 1/s_l^2)^{-1/2}`
    (:func:`~twodg_pyro.infer.curvature.curvature_scales`).

    ``stage1.init_scale = "hess_init"`` is the same optimum under a curvature of
    ``stage1.hess_init`` per example and weight (:math:`G_{ii} = N h_0`: IVON's initial
    scales :math:`(\lambda (h_0 + \delta_i))^{-1/2}`, :mod:`~twodg_pyro.infer.von`).

    A resumed stage 1 (``resumed``: its checkpoint restores the guide) passes the learnt
    ``prior_scales`` its checkpoint holds: the Fisher is not computed again (the
    network a resumed run starts from is not the pretrained one).  ``layer_types``: the
    module classes whose parameters are Bayesian (:func:`~twodg_pyro.nn.find_sites`; a
    study of BatchNorm's affine parameters adds ``nn.BatchNorm2d``).
    """
    n_train, norm = len(split.train), cfg.network.norm_stats
    eb = cfg.prior.kind in EMPIRICAL_BAYES_KINDS
    curvature = cfg.stage1.init_scale in ("curvature", "hess_init")
    init = "paper" if curvature else cfg.stage1.init_scale  # resumed: the checkpoint's
    if cfg.stage1.init_scale == "hess_init" and not (eb or resumed):
        model = build_model(net, build_prior(cfg.prior, net), n_train, norm, layer_types)
        model = model.to(cfg.device)
        h0 = {s.name: torch.full(s.shape, n_train * cfg.stage1.hess_init) for s in model.sites}
        beta = resolve_kl_weight(cfg.stage1.kl_weight, model)
        return model, curvature_scales(model, h0, beta)
    if eb and prior_scales is not None:
        model = build_model(net, PerSiteNormalPrior(prior_scales), n_train, norm, layer_types)
        if resumed:
            return model.to(cfg.device), init
    elif not (eb or curvature) or resumed:
        return build_model(net, cfg.prior, n_train, norm, layer_types).to(cfg.device), init
    else:  # the Fisher does not depend on the prior: a placeholder until the learnt one
        prior = LayerwiseNormalPrior() if eb else build_prior(cfg.prior, net)
        model = build_model(net, prior, n_train, norm, layer_types)
    model = model.to(cfg.device)
    fisher = diagonal_fisher(model, split.train, seed=cfg.seed)
    beta = resolve_kl_weight(cfg.stage1.kl_weight, model)
    if eb and prior_scales is None:
        model.prior = PerSiteNormalPrior(empirical_bayes_scales(model, fisher, beta))
    return model, curvature_scales(model, fisher, beta) if curvature else init


def stage1_mean_field(
    rt: RunContext,
    split,
    net,
    extra: dict | None = None,
    layer_types: tuple[type[nn.Module], ...] = DEFAULT_LAYER_TYPES,
) -> GuidePosterior:
    """Stage 1: a mean-field BNN over ``net`` (:func:`stage1_model`, whose ``layer_types`` are
    Bayesian) trained by SVI on the (annealed) ELBO; returns it (the input of
    :func:`run_2dg`).  Its checkpoints (``stage1.pt``) also hold ``extra``.
    """
    cfg = rt.cfg
    resumed = rt.checkpoints.load("stage1") if rt.checkpoints is not None else None
    saved = None if resumed is None else resumed.extra.get("prior_scales")
    model, init_scale = stage1_model(cfg, split, net, saved, resumed is not None, layer_types)
    if isinstance(model.prior, PerSiteNormalPrior):  # a resumed stage 1 reads them back
        extra = {**(extra or {}), "prior_scales": model.prior.scales}
    guide = MeanFieldGuide(model, init_scale=init_scale, seed=cfg.seed).to(cfg.device)
    beta = rt.kl_weight("stage1", model)
    callbacks = [ScaleTrajectory(guide)]  # the scales' trajectory in every epoch's record
    if cfg.stage1.kl_warmup_epochs:
        callbacks.append(KLAnnealing(cfg.stage1.kl_warmup_epochs, end=beta))
    loader = train_loader(split, cfg.data, cfg.seed)
    s1 = cfg.stage1
    lr = {"loc": s1.lr_loc, "scale": s1.lr_scale, "default": s1.lr_loc}
    optimizer = None
    if s1.trainer == "von":  # every rank takes as many steps as the unsharded loader
        lr.update(loc=s1.von_lr, scale=s1.von_lr)
        optimizer = functools.partial(
            VariationalOnlineNewton,
            kl_weight=beta,
            beta1=s1.von_beta1,
            beta2=s1.von_beta2,
            clip_radius=None if math.isinf(s1.von_clip_radius) else s1.von_clip_radius,
            warmup_steps=s1.von_warmup_epochs * len(loader),
            total_steps=(s1.epochs - s1.von_settle_epochs) * len(loader),
            settle_rate=s1.von_settle_rate or None,
        )
    state = train_svi(rt, "stage1", model, guide, loader, lr, callbacks, extra, optimizer)
    return GuidePosterior(model, guide, "mean_field", state)


# ---------------------------------------------------------------------------- stage 2
def stage2_sharing(rt: RunContext, model, guide, loader) -> tuple[SharingStructure, dict]:
    """Stage 2: the sharing structure of the trained mean-field ``guide`` and its report.

    Every rank builds it from the same, unsharded minibatches of ``loader`` under a common
    seed, its mixture fitted by ``rt.execution.mixture``, and the ranks agree on it.
    """
    cfg, execution = rt.cfg, rt.execution
    execution.seed_common(cfg.seed)
    structure, report = build_sharing(
        model,
        guide,
        loader,
        cfg.sharing,
        seed=cfg.seed,
        device=cfg.device,
        progress=rt.progress,
        mixture=execution.mixture,
    )
    return execution.agree(structure), report


# ---------------------------------------------------------------------------- stage 3
def stage3_hooks(cfg, loader) -> list:
    """The stage-3 refinement hooks that ``cfg`` asks for (merging, Mahalanobis
    reassignment), each on its own schedule; ``loader`` feeds the merge's gradient test."""
    hooks = []
    if cfg.sharing.use_merging and cfg.stage3.merge_every:
        hooks.append(
            MergeHook(
                tau_d=cfg.sharing.tau_d,
                rule=cfg.sharing.merge_rule,
                test=cfg.sharing.merge_test,
                tau_g=cfg.sharing.tau_g,
                tau_v=cfg.sharing.tau_v,
                data=loader,
                every=cfg.stage3.merge_every,
                until_fixed_point=False,  # the centres move: a later epoch may merge again
            )
        )
    if cfg.sharing.use_ellipses and cfg.stage3.reassign_every:
        hooks.append(
            MahalanobisHook(
                threshold=cfg.sharing.mahalanobis_threshold,
                k=cfg.sharing.k_nearest,
                every=cfg.stage3.reassign_every,
                until_fixed_point=False,  # a later merge changes the mixture's shape again
                assignment=cfg.sharing.assignment,
                scope=cfg.sharing.ellipse_scope,
            )
        )
    if cfg.stage3.prune_snr:
        hooks.append(PinPruned())
    return hooks


def stage3_shared_gmm(
    rt: RunContext, model, structure: SharingStructure, loader, extra: dict | None = None
) -> tuple[GuidePosterior, list]:
    """Stage 3: the shared-GMM guide over ``structure`` trained with the refinement hooks;
    returns ``(GuidePosterior(model, guide, "2dg", state, structure), hooks)``.

    ``loader`` is the seeded training loader: the merge hook's gradients use it as it is
    (the same minibatches on every rank), the SVI loop ``rt.execution.shard(loader)``.
    Its checkpoints (``stage3.pt``) also hold ``extra``.
    """
    cfg, s3 = rt.cfg, rt.cfg.stage3
    ramp = (
        PruneRamp(structure, s3.prune_snr, s3.prune_ramp_epochs) if s3.prune_ramp_epochs else None
    )
    # pruning inside stage 3: the pruned weights' neighbours adapt (a resumed run's
    # structure, the checkpoint's, is pruned already)
    if s3.prune_snr and "pruned" not in structure.info:
        limit = None if ramp is None else ramp.count(0)
        structure, _ = prune_structure(structure, s3.prune_snr, s3.prune_spread, limit=limit)
    guide = SharedGMMGuide(model, structure, tying=s3.tying).to(cfg.device)
    hooks = stage3_hooks(cfg, loader) + ([] if ramp is None else [ramp])
    lr = {"centre": s3.lr_centre, "outlier": s3.lr_outlier, "default": s3.lr_centre}
    if guide.tying_rule.trains_covariances:
        lr["cov"] = s3.lr_cov
    state = train_svi(rt, "stage3", model, guide, loader, lr, hooks, extra)
    return GuidePosterior(model, guide, "2dg", state, structure), hooks


# ---------------------------------------------------------------------------- SVI of a stage
def train_svi(
    rt: RunContext,
    stage: str,
    model,
    guide,
    loader,
    lr,
    callbacks: list,
    extra: dict | None = None,
    optimizer=None,
):
    r"""SVI of ``guide`` for ``stage`` (``"stage1"``, ``"stage3"``: its ``epochs``) on the
    seeded ``loader`` (``rt.execution`` shards it) on :math:`\text{nll} +
    \beta\,\mathrm{KL}` with the stage's :math:`\beta` (:meth:`RunContext.kl_weight`);
    returns the final ``TrainState``.

    With ``rt.checkpoints`` rank 0 writes the stage's checkpoints (holding ``callbacks``'
    states, ``loader``'s generator and ``extra``), and a resumed run continues from the
    stage's checkpoint.  ``optimizer``: a ``torch.optim`` class or factory (default Adam).
    """
    cfg, checkpoints, execution = rt.cfg, rt.checkpoints, rt.execution
    state, ckpt = None, None
    opt = {} if optimizer is None else {"optimizer": optimizer}
    if checkpoints is not None:
        resumed = checkpoints.load(stage)  # the caller's, loaded once
        if resumed is not None:
            state = restore_state(
                resumed, model, guide, lr, callbacks=callbacks, generators=[loader], **opt
            )
        ckpt = checkpoints.callback(stage, callbacks, [loader], extra)
    return execution.fit(
        model,
        guide,
        execution.shard(loader, cfg.seed),
        getattr(cfg, stage).epochs,
        seed=cfg.seed,
        lr=lr,
        elbo=DecomposedELBO(
            beta=rt.kl_weight(stage, model), fast_step=cfg.fast_step, fused_kl=cfg.fused_kl
        ),
        callbacks=list(callbacks) + ([] if ckpt is None else [MainOnly(ckpt)]),
        device=cfg.device,
        progress=rt.progress,
        state=state,
        **opt,
    )


# ---------------------------------------------------------------------------- the 2DG row
def run_2dg(rt: RunContext, split, stage1: GuidePosterior, eval_data) -> dict:
    """Stages 2-3 on top of ``stage1``, the trained mean-field BNN that
    :func:`stage1_mean_field` returned; returns the 2DG record and keeps the trained 2DG
    BNN in ``rt.art.trained["2dg"]``, its prediction in ``rt.art.predictions["2dg"]``.

    When resuming from a stage-3 checkpoint (``rt.checkpoints``), stage 2 is not rerun:
    its structure and report come from the checkpoint.
    """
    cfg = rt.cfg
    model, mf_guide = stage1.model, stage1.guide
    loader = train_loader(split, cfg.data, cfg.seed)
    t0 = time.perf_counter()
    resumed = rt.checkpoints.load("stage3") if rt.checkpoints is not None else None
    if resumed is None:
        structure, report = stage2_sharing(rt, model, mf_guide, loader)
    else:
        structure = resumed.structure(SharingStructure.from_payload)
        report = resumed.extra["report"]
    extra = {"records": list(rt.art.records), "report": report}
    # stage 3 trains the network's deterministic parameters (BatchNorm) too: on a copy,
    # so that the mean-field model in ``rt.art`` keeps predicting as it was evaluated
    model = copy.deepcopy(model)
    trained, hooks = stage3_shared_gmm(rt, model, structure, loader, extra)
    seconds = time.perf_counter() - t0
    pred = rt.predict(trained, eval_data)
    rt.keep("2dg", trained, pred)
    compression = compression_report(trained.guide, model)
    return rt.record(
        "2dg",
        pred,
        seconds,
        compression["trainable_params"],
        state=trained.state,
        **compression,
        tying=cfg.stage3.tying,
        merge_rule=cfg.sharing.merge_rule,
        coordinates=cfg.sharing.coordinates,
        outlier_rule=report["outlier_rules"].get("rule"),
        stage2=report,
        hooks={type(h).__name__: h.log for h in hooks},
        **kl_weight_field(rt.kl_weight("stage3", model)),
    )
