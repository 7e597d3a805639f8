"""The main job: train and evaluate the configured methods, write the results table.

:func:`run` reads top-down: check the device and the output folder, load and check the
data, then run every method of the registry :data:`METHOD_REGISTRY` that the settings ask for,
in the registry's order (each returns its row of the table), then print the table and
write the results, model files and diagnostics.  What the methods share (the data, the
seeded initial network, stage 1, checkpoints) is a :class:`RunContext`; the 2DG BNN's
stages are :mod:`twodg_pyro.pipeline.algorithm1`'s.

One orchestration for a plain run and a data-parallel one under ``torchrun``: the
pieces that differ come in as an :class:`~twodg_pyro.pipeline.execution.Execution`
(:data:`~twodg_pyro.pipeline.execution.LOCAL` by default), and every file is written
on rank 0 only (:func:`~twodg_pyro.distributed.env.on_main`,
:class:`~twodg_pyro.distributed.MainOnly`: plain calls in one process).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..distributed import env
from ..metrics import classification_metrics
from ..prediction import deterministic_predict
from . import artifacts
from .algorithm1 import run_2dg
from .alternatives import run_rank1, run_ssvi
from .baseline_methods import (
    run_deterministic_matched,
    run_ensemble,
    run_laplace,
    write_baseline_files,
)
from .builders import (
    build_net,
    check_device,
    eval_data,
    load_data,
    seed_everything,
    train_loader,
)
from .checks import check_sharing_sizes, check_split
from .config import RunConfig
from .context import RunContext, deterministic_recipe
from .execution import LOCAL, Execution
from .results import (
    evaluation_of,
    format_table,
    kl_weight_field,
    uncertainty_table,
    write_results,
)
from .resume import RunCheckpoints
from .run_folder import RunFolder
from .trained import RunArtifacts, Trained
from .uncertainty_step import add_uncertainty

__all__ = [
    "METHOD_REGISTRY",
    "Method",
    "RunArtifacts",
    "RunContext",
    "Trained",
    "deterministic_recipe",
    "run",
]


# ---------------------------------------------------------------------------- run
def run(
    cfg: RunConfig,
    out_dir: str | Path | None = None,
    resume: bool = False,
    *,
    overwrite: bool = False,
    execution: Execution = LOCAL,
) -> RunArtifacts:
    """Run every method of ``cfg.methods`` and write ``results.json``/``results.md``.

    Returns the records and trained objects.  The table is also printed.  Before
    anything is trained or written: the device is checked (it exists on this machine),
    the output folder is checked and locked (:class:`~twodg_pyro.pipeline.run_folder.RunFolder`:
    a writable folder, no other run in it, no earlier run's files unless ``resume`` or
    ``overwrite``; temporary files of an interrupted write removed), and the data are
    checked (finite inputs, labels of every split in range, not empty).  With
    ``overwrite`` an earlier run's files are removed only then.  With
    ``cfg.checkpoint_every > 0`` stages 1 and 3 write checkpoints under
    ``out_dir/checkpoints``; ``resume=True`` continues a killed run from them (see
    :mod:`twodg_pyro.pipeline.resume`).

    Every stage runs on ``cfg.device`` in the network's dtype (``cfg.network.dtype``): the
    priors, guides, stage 2's mixture, draws and predictions follow the network.  The
    results are written before the diagnostics start (``cfg.diagnostics``: budget, or
    ``enabled = false`` for none).

    ``execution`` says where the stages run: in this process (the default), or on every
    rank of a process group (:func:`~twodg_pyro.pipeline.run_distributed` passes a
    :class:`~twodg_pyro.pipeline.data_parallel.DataParallel`; every rank then calls this
    with the same settings, and rank 0 alone prints, writes files and holds the folder's
    lock).

    Raises:
        ConfigError: a device this machine lacks.
        RunFolderError: the output folder cannot take this run (named, with what to do).
        ValueError: bad data (named).
    """
    execution.check(cfg, resume)
    cfg = execution.configure(cfg)
    check_device(cfg.device)  # a CUDA run on a machine without it fails here, not mid-run
    folder = None if out_dir is None else RunFolder(out_dir, resume=resume, overwrite=overwrite)
    if folder is not None:
        env.on_main(folder.acquire, f"prepare the output folder {out_dir}")
    try:
        return _run(cfg, out_dir, resume, execution, folder)
    finally:
        if folder is not None:
            folder.release()


def _run(
    cfg: RunConfig,
    out_dir: str | Path | None,
    resume: bool,
    execution: Execution,
    folder: RunFolder | None,
) -> RunArtifacts:
    """:func:`run` once the device and the output folder are checked."""
    ctx = _context(cfg, out_dir, resume, execution, folder)
    art = ctx.art
    for name, method in METHOD_REGISTRY.items():
        if name in cfg.methods:
            try:
                record = method.run(ctx)
            except Exception as error:
                # rank 0 alone, no barrier: the other ranks may not have failed here
                if out_dir is not None and art.records and env.is_main():
                    _keep_finished(out_dir, art, cfg, name, error)
                raise
            if record is not None:
                art.records.append(record)
    if cfg.uncertainty.enabled and env.is_main():  # OOD, shift, selective prediction
        add_uncertainty(art, cfg)
    if env.is_main():
        print(format_table(art.records) + uncertainty_table(art.records))
    if out_dir is not None:

        def write():
            write_results(out_dir, art.records, cfg.to_dict(), evaluation_of(cfg, art.eval_data))
            write_baseline_files(art, cfg, out_dir)  # model_<baseline>.pt
            artifacts.write_artifacts(art, cfg, out_dir)  # model files, diagnostics, ...

        env.on_main(write, f"write the results to {out_dir}")
    return art


def _keep_finished(out_dir, art: RunArtifacts, cfg: RunConfig, failed: str, error) -> None:
    """When method ``failed`` raised ``error``: write the finished methods' rows (a
    ``results.json`` marked incomplete) and model files, without diagnostics, so that a
    late failure loses nothing already trained.  A failure here is a warning: the
    method's own error is the one raised."""
    status = {
        "failed_method": failed,
        "error": f"{type(error).__name__}: {error}",
        "finished": [r.get("method") for r in art.records],
    }
    try:
        evaluation = evaluation_of(cfg, art.eval_data)
        write_results(out_dir, art.records, cfg.to_dict(), evaluation, incomplete=status)
        write_baseline_files(art, cfg, out_dir)
        artifacts.write_artifacts(art, cfg, out_dir, skip_diagnostics=f"{failed} failed")
    except Exception as e:  # keep the original error
        warnings.warn(f"could not keep the finished methods' files in {out_dir}: {e}", stacklevel=2)


def _context(cfg, out_dir, resume, execution, folder) -> RunContext:
    """Load and check the data, build the seeded network and check the settings' sizes
    against it, then (inputs valid) clear an overwritten run and prepare the checkpoints."""
    art = RunArtifacts()
    seed_everything(cfg.seed)
    split = load_data(cfg.data, image=cfg.network.arch != "mlp")
    check_split(split)
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(cfg.device)
    if "2dg" in cfg.methods:  # K, N_min against n_w: known now, not after stage 1
        check_sharing_sizes(cfg.sharing, net)
    if folder is not None:  # inputs valid: an earlier run's files may go (overwrite)
        env.on_main(folder.clear_previous, f"clear the output folder {out_dir}")
    checkpoints = RunCheckpoints(out_dir, cfg, resume)
    env.on_main(checkpoints.start, f"prepare the checkpoint folder of {out_dir}")
    resume_from = checkpoints.latest()
    if resume_from is not None:  # records of the methods finished before the checkpoint
        art.records = [dict(r) for r in checkpoints.load(resume_from).extra["records"]]
    art.split = split
    art.eval_data = eval_data(split.test, cfg.device)
    return RunContext(
        cfg=cfg,
        art=art,
        execution=execution,
        checkpoints=checkpoints,
        resume_from=resume_from,
        net=net,
        loader=train_loader(split, cfg.data, cfg.seed),
    )


# ---------------------------------------------------------------------------- methods
class Method(NamedTuple):
    """A row of the results table: ``run(ctx)`` returns the method's record (``None``:
    none, e.g. restored from a checkpoint); ``distributed``: it runs under
    ``torchrun`` (:func:`~twodg_pyro.pipeline.run_distributed`)."""

    run: Callable[[RunContext], dict | None]
    distributed: bool


def deterministic(ctx: RunContext) -> dict | None:
    """The deterministic network trained on the data (its record was restored when
    resuming)."""
    if ctx.resume_from is not None:
        return None
    cfg = ctx.cfg
    det, seconds = ctx.train_deterministic(cfg.stage1.deterministic_epochs)
    ctx.deterministic = (det, cfg.stage1.deterministic_epochs)
    ctx.art.trained["deterministic"] = Trained(det, None, None)
    pred = ctx.execution.predict(
        lambda d: deterministic_predict(det, d), ctx.art.eval_data, cfg.device
    )
    n_det = sum(p.numel() for p in ctx.net.parameters())
    return {
        "method": "deterministic",
        **classification_metrics(pred.mean, pred.targets),
        "trainable_params": n_det,
        "stored_params": n_det,
        "size_mb": 4 * n_det / 1e6,
        "train_seconds": seconds,
        **ctx.execution.record_fields(),
    }


def mean_field(ctx: RunContext) -> dict | None:
    """Stage 1's mean-field BNN (its record was restored when resuming from stage 3)."""
    (model, guide, state, _), seconds = ctx.stage1()
    if ctx.resume_from == "stage3":
        return None
    pred = ctx.predict(model, guide)
    ctx.art.predictions["mean_field"] = pred
    n_train = guide.num_trainable() + sum(p.numel() for p in model.deterministic_parameters())
    return {
        "method": "mean_field",
        **classification_metrics(pred.mean, pred.targets),
        "trainable_params": n_train,
        "stored_params": n_train,  # 2 per Bayesian weight + the deterministic ones
        "size_mb": 4 * n_train / 1e6,
        "train_seconds": seconds,
        "final_elbo_terms": state.history[-1] if state.history else {},
        "scale_trajectory": scale_trajectory(state.history),
        **kl_weight_field(ctx.cfg.stage1.kl_weight),
        **ctx.execution.record_fields(),
    }


def two_dg(ctx: RunContext) -> dict:
    """The 2DG BNN: stages 2-3 on the mean-field BNN that stage 1 returns
    (:func:`~twodg_pyro.pipeline.algorithm1.run_2dg`)."""
    stage1, _ = ctx.stage1()
    art = ctx.art
    return run_2dg(ctx.runtime, art.split, stage1, art, art.eval_data)


def rank1(ctx: RunContext) -> dict:
    """A rank-1 BNN (:func:`~twodg_pyro.pipeline.alternatives.run_rank1`)."""
    return run_rank1(ctx.cfg, ctx.art.split, ctx.art.eval_data, ctx.art)


def ssvi(ctx: RunContext) -> dict:
    """An SSVI BNN (:func:`~twodg_pyro.pipeline.alternatives.run_ssvi`)."""
    return run_ssvi(ctx.cfg, ctx.art.split, ctx.art.eval_data, ctx.art)


def deterministic_matched(ctx: RunContext) -> dict:
    """The deterministic network trained for the Bayesian pipeline's epochs, early-stopped
    on the validation NLL
    (:func:`~twodg_pyro.pipeline.baseline_methods.run_deterministic_matched`)."""
    return run_deterministic_matched(ctx, deterministic_recipe(ctx.cfg))


def ensemble(ctx: RunContext) -> dict:
    """A deep ensemble (:func:`~twodg_pyro.pipeline.baseline_methods.run_ensemble`)."""
    return run_ensemble(ctx, deterministic_recipe(ctx.cfg))


def laplace(ctx: RunContext) -> dict:
    """Post-hoc Laplace on the deterministic network
    (:func:`~twodg_pyro.pipeline.baseline_methods.run_laplace`)."""
    return run_laplace(ctx, deterministic_recipe(ctx.cfg))


#: The methods a run can train, in the order they run: the choices of ``methods`` in the
#: settings (:data:`~twodg_pyro.pipeline.config.METHODS`).
METHOD_REGISTRY: dict[str, Method] = {
    "deterministic": Method(deterministic, distributed=True),
    "mean_field": Method(mean_field, distributed=True),
    "2dg": Method(two_dg, distributed=True),
    "rank1": Method(rank1, distributed=False),
    "ssvi": Method(ssvi, distributed=False),
    "deterministic_matched": Method(deterministic_matched, distributed=False),
    "ensemble": Method(ensemble, distributed=False),
    "laplace": Method(laplace, distributed=False),
}


# ---------------------------------------------------------------------------- helpers
_TRAJECTORY_KEYS = ("loss", "kl", "nll", "sigma_median", "sigma_ratio_median", "sigma_over_spread")


def scale_trajectory(history: list[dict], points: int = 11) -> list[dict]:
    """About ``points`` evenly spaced epochs of a fit's history (always the last), each
    with its ELBO terms and the scales' summary of
    :class:`~twodg_pyro.infer.ScaleTrajectory`: whether the fit converged, in a few
    numbers."""
    if not history:
        return []
    step = max(1, len(history) // max(1, points - 1))
    picked = list(range(0, len(history), step))
    if picked[-1] != len(history) - 1:
        picked.append(len(history) - 1)
    return [
        {
            "epoch": history[i].get("epoch", i),
            **{k: history[i][k] for k in _TRAJECTORY_KEYS if k in history[i]},
        }
        for i in picked
    ]
