"""Algorithm 1 end to end: stage 1 (mean-field) -> outliers -> GMM -> size reduction ->
stage 2 (merging, ellipses) -> stage 3 (SVI on the shared-GMM guide, with hooks) ->
evaluation and compression accounting.

Every stage runs through an :class:`~twodg_pyro.pipeline.execution.Execution`: in one
process (the default), or on every rank of a process group with the same result on each
(:class:`~twodg_pyro.distributed.runner.DataParallel`)."""

from __future__ import annotations

import copy
import time

from ..accounting import compression_report
from ..distributed import env
from ..evaluation import seeded_predict
from ..guides import SharedGMMGuide
from ..metrics import classification_metrics
from ..sharing import MahalanobisHook, MergeHook, build_sharing
from .builders import train_loader
from .config import RunConfig
from .execution import LOCAL, Execution
from .runner import kl_weight_field, train_svi

__all__ = ["run_2dg", "stage3", "stage3_hooks"]


def stage3_hooks(cfg: RunConfig, loader) -> list:
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
            )
        )
    return hooks


def stage3(
    cfg: RunConfig,
    model,
    structure,
    loader,
    progress: bool = True,
    checkpoints=None,
    extra=None,
    execution: Execution = LOCAL,
):
    """Train the shared-GMM guide over ``structure``; returns ``(guide, state, hooks)``.

    ``loader`` is the seeded training loader: the merge hook's gradients use it as it is
    (the same minibatches on every rank), the SVI loop ``execution.shard(loader)``.
    With ``checkpoints`` (a :class:`~twodg_pyro.pipeline.resume.RunCheckpoints`) it writes
    ``stage3.pt`` checkpoints (holding ``extra``, on rank 0) and continues from one when
    resuming.
    """
    guide = SharedGMMGuide(model, structure, tying=cfg.stage3.tying).to(cfg.device)
    hooks = stage3_hooks(cfg, loader)
    s3 = cfg.stage3
    lr = {"centre": s3.lr_centre, "outlier": s3.lr_outlier, "default": s3.lr_centre}
    if s3.tying != "representative":
        lr["cov"] = s3.lr_cov
    state = train_svi(
        cfg,
        "stage3",
        model,
        guide,
        loader,
        s3.epochs,
        lr,
        hooks,
        progress,
        checkpoints,
        extra,
        execution,
        kl_weight=s3.kl_weight,
    )
    return guide, state, hooks


def run_2dg(
    cfg: RunConfig, split, art, eval_data, checkpoints=None, execution: Execution = LOCAL
) -> dict:
    """Stages 1-3 on top of the trained mean-field BNN in ``art``; returns the 2DG record.

    When resuming from a stage-3 checkpoint (``checkpoints``), stage 2 is not rerun: its
    structure and report come from the checkpoint.  Under a process group (``execution``)
    every rank builds the structure from the same, unsharded minibatches under a common
    seed, its mixture fitted by ``execution.mixture``, and the ranks agree on it before
    stage 3.
    """
    model, mf_guide, _ = art.mean_field
    progress = cfg.progress and env.is_main()
    loader = train_loader(split, cfg.data, cfg.seed)
    t0 = time.perf_counter()
    resumed = checkpoints.load("stage3") if checkpoints is not None else None
    if resumed is None:
        execution.seed_common(cfg.seed)
        structure, report = build_sharing(
            model,
            mf_guide,
            loader,
            cfg.sharing,
            seed=cfg.seed,
            device=cfg.device,
            progress=progress,
            mixture=execution.mixture,
        )
        structure = execution.agree(structure)
    else:
        structure, report = resumed.structure(), resumed.extra["report"]
    extra = {"records": list(art.records), "report": report}
    # stage 3 trains the network's deterministic parameters (BatchNorm) too: on a copy,
    # so that the mean-field model in ``art`` keeps predicting as it was evaluated
    model = copy.deepcopy(model)
    guide, state, hooks = stage3(
        cfg, model, structure, loader, progress, checkpoints, extra, execution
    )
    seconds = time.perf_counter() - t0
    pred = execution.predict(  # the run's seeded draws (twodg_pyro.evaluation)
        lambda d: seeded_predict(model, guide, d, cfg.num_samples, cfg.seed, progress=progress),
        eval_data,
        cfg.device,
    )
    art.extras.setdefault("predictions", {})["2dg"] = pred
    record = {
        "method": "2dg",
        **classification_metrics(pred.mean, pred.targets),
        **compression_report(guide, model),
        "tying": cfg.stage3.tying,
        "merge_rule": cfg.sharing.merge_rule,
        "coordinates": cfg.sharing.coordinates,
        "outlier_rule": report["outlier_rules"].get("rule"),
        "stage2": report,
        "hooks": {type(h).__name__: h.log for h in hooks},
        **kl_weight_field(cfg.stage3.kl_weight),
        "train_seconds": seconds,
        "final_elbo_terms": state.history[-1] if state.history else {},
        **execution.record_fields(),
    }
    art.extras["2dg"] = {"model": model, "guide": guide, "state": state, "structure": structure}
    return record
