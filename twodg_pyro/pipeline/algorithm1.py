"""Algorithm 1 end to end: stage 1 (mean-field) -> outliers -> GMM -> size reduction ->
stage 2 (merging, ellipses) -> stage 3 (SVI on the shared-GMM guide, with hooks) ->
evaluation and compression accounting."""

from __future__ import annotations

import time

from ..accounting import compression_report
from ..guides import SharedGMMGuide
from ..infer import DecomposedELBO, fit
from ..infer.hooks import MahalanobisHook, MergeHook
from ..io.checkpoint import restore_state
from ..metrics import classification_metrics
from ..predict import predict
from ..sharing import build_sharing
from .builders import train_loader
from .config import RunConfig

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
            )
        )
    if cfg.sharing.use_ellipses and cfg.stage3.reassign_every:
        hooks.append(
            MahalanobisHook(
                threshold=cfg.sharing.mahalanobis_threshold,
                k=cfg.sharing.k_nearest,
                every=cfg.stage3.reassign_every,
            )
        )
    return hooks


def stage3(
    cfg: RunConfig, model, structure, loader, progress: bool = True, checkpoints=None, extra=None
):
    """Train the shared-GMM guide over ``structure``; returns ``(guide, state, hooks)``.

    With ``checkpoints`` (a :class:`~twodg_pyro.pipeline.resume.RunCheckpoints`) it writes
    ``stage3.pt`` checkpoints (holding ``extra``) and continues from one when resuming.
    """
    guide = SharedGMMGuide(model, structure, tying=cfg.stage3.tying).to(cfg.device)
    hooks = stage3_hooks(cfg, loader)
    s3 = cfg.stage3
    lr = {"centre": s3.lr_centre, "outlier": s3.lr_outlier, "default": s3.lr_centre}
    if s3.tying != "representative":
        lr["cov"] = s3.lr_cov
    state, ckpt = None, None
    if checkpoints is not None:
        resumed = checkpoints.load("stage3")
        if resumed is not None:
            state = restore_state(resumed, model, guide, lr, callbacks=hooks, generators=[loader])
        ckpt = checkpoints.callback("stage3", hooks, [loader], extra)
    state = fit(
        model,
        guide,
        loader,
        epochs=s3.epochs,
        lr=lr,
        elbo=DecomposedELBO(),
        callbacks=hooks + ([ckpt] if ckpt is not None else []),
        device=cfg.device,
        progress=progress,
        state=state,
    )
    return guide, state, hooks


def run_2dg(cfg: RunConfig, split, art, eval_data, checkpoints=None) -> dict:
    """Stages 1-3 on top of the trained mean-field BNN in ``art``; returns the 2DG record.

    When resuming from a stage-3 checkpoint (``checkpoints``), stage 2 is not rerun: its
    structure and report come from the checkpoint.
    """
    model, mf_guide, _ = art.mean_field
    loader = train_loader(split, cfg.data, cfg.seed)
    t0 = time.perf_counter()
    resumed = checkpoints.load("stage3") if checkpoints is not None else None
    if resumed is None:
        structure, report = build_sharing(
            model,
            mf_guide,
            loader,
            cfg.sharing,
            seed=cfg.seed,
            device=cfg.device,
            progress=cfg.progress,
        )
    else:
        structure, report = resumed.structure(), resumed.extra["report"]
    extra = {"records": list(art.records), "report": report}
    guide, state, hooks = stage3(cfg, model, structure, loader, cfg.progress, checkpoints, extra)
    seconds = time.perf_counter() - t0
    pred = predict(model, guide, eval_data, cfg.num_samples)
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
        "train_seconds": seconds,
        "final_elbo_terms": state.history[-1] if state.history else {},
    }
    art.extras["2dg"] = {"model": model, "guide": guide, "state": state, "structure": structure}
    return record
