"""The main job: train and evaluate the configured methods, write the results table.

:func:`run` reads top-down: check the device and the output folder, load and check the
data, then run every method of the registry
:data:`~twodg_pyro.pipeline.settings.registry.METHOD_REGISTRY` that the settings ask for, in the
registry's order (each returns its row of the table), then print the table and write
the results, model files and diagnostics.  What the methods share (the data, the seeded
initial network, stage 1, checkpoints) is a
:class:`~twodg_pyro.pipeline.runtime.context.RunContext`; the 2DG BNN's stages are
:mod:`twodg_pyro.pipeline.methods.algorithm1`'s.

One orchestration for a plain run and a data-parallel one under ``torchrun``: the
pieces that differ come in as an :class:`~twodg_pyro.pipeline.runtime.execution.Execution`, and
every file is written on rank 0 only.
"""

from __future__ import annotations

import copy
import tempfile
import warnings
from pathlib import Path

from ...distributed import env
from ..outputs import artifacts
from ..outputs.costs import add_costs
from ..outputs.results import (
    IncompleteRunError,
    evaluation_of,
    format_table,
    uncertainty_table,
    write_results,
)
from ..outputs.uncertainty_step import add_uncertainty
from ..settings.build import (
    build_net,
    check_device,
    eval_data,
    load_data,
    seed_everything,
    train_loader,
)
from ..settings.checks import check_sharing_sizes, check_split
from ..settings.config import RunConfig
from ..settings.registry import METHOD_REGISTRY, method_runner
from .context import RunContext
from .execution import LOCAL, Execution
from .resume import RunCheckpoints
from .run_folder import RunFolder
from .trained import RunArtifacts


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
    the output folder is checked and locked
    (:class:`~twodg_pyro.pipeline.runtime.run_folder.RunFolder`: a writable folder, no
    other run in it, no earlier run's files unless ``resume`` or ``overwrite``; temporary
    files of an interrupted write removed), and the data are checked (finite inputs,
    labels of every split in range, not empty).  With ``overwrite`` an earlier run's files
    are removed only then.  With
    ``cfg.checkpoint_every > 0`` stages 1 and 3 write checkpoints under
    ``out_dir/checkpoints``; ``resume=True`` continues a killed run from them (see
    :mod:`twodg_pyro.pipeline.runtime.resume`).

    Every stage runs on ``cfg.device`` in the network's dtype (``cfg.network.dtype``): the
    priors, guides, stage 2's mixture, draws and predictions follow the network.  The
    results are written before the diagnostics start (``cfg.diagnostics``: budget, or
    ``enabled = false`` for none); the model files before the results, whose
    ``file_bytes`` are their sizes (:mod:`twodg_pyro.pipeline.outputs.costs`).

    ``execution`` says where the stages run: in this process (the default), or on every
    rank of a process group (:func:`~twodg_pyro.pipeline.run_distributed` passes a
    :class:`~twodg_pyro.pipeline.runtime.data_parallel.DataParallel`; every rank then calls this
    with the same settings, and rank 0 alone prints, writes files and holds the folder's
    lock).

    Raises:
        ConfigError: a device this machine lacks.
        IncompleteRunError: (an ``OSError``) a model file could not be written (e.g. a
            full disk): named, after ``results.json`` recorded the run as incomplete.
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
        return _run(_context(cfg, out_dir, resume, execution, folder), out_dir)
    finally:
        if folder is not None:
            folder.release()


def _run(ctx: RunContext, out_dir: str | Path | None) -> RunArtifacts:
    """:func:`run` once the device, the output folder and the data are checked."""
    cfg, art = ctx.cfg, ctx.art
    for name in METHOD_REGISTRY:
        if name in cfg.methods:
            try:
                record = method_runner(name)(ctx)
            except Exception as error:
                # rank 0 alone, no barrier: the other ranks may not have failed here
                if out_dir is not None and art.records and env.is_main():
                    _keep_finished(out_dir, art, cfg, name, error)
                raise
            if record is not None:
                art.records.append(record)
    if cfg.uncertainty.enabled and env.is_main():  # OOD, shift, selective prediction
        add_uncertainty(art, cfg)
    # the model files, written once (rank 0), and what they cost: bytes on disk,
    # forward passes, seconds
    env.on_main(lambda: _measure(ctx, out_dir), "write and measure the model files")
    if env.is_main():
        print(format_table(art.records) + uncertainty_table(art.records))
    if out_dir is not None:
        env.on_main(lambda: _write_run(out_dir, art, cfg), f"write the results to {out_dir}")
    return art


def _write_run(out_dir, art: RunArtifacts, cfg: RunConfig) -> None:
    """``results.json`` and the artifacts of a finished run; a model file that could not
    be written (``art.failed_files``) makes it incomplete: ``results.json`` says so, no
    diagnostics are written, and :class:`IncompleteRunError` names the file."""
    failed = {name: error.splitlines()[0] for name, error in art.failed_files.items()}
    status = None
    if failed:
        first = next(iter(failed.values()))
        more = f" (and {len(failed) - 1} more file(s))" if len(failed) > 1 else ""
        finished = [r.get("method") for r in art.records]
        status = {"failed_files": failed, "error": first + more, "finished": finished}
    write_results(out_dir, art.records, cfg.to_dict(), evaluation_of(cfg, art.eval_data), status)
    if status is None:
        artifacts.write_artifacts(art, cfg, out_dir)  # diagnostics, figures, ...
    else:
        skip = "a model file could not be written"
        artifacts.write_artifacts(art, cfg, out_dir, skip_diagnostics=skip)
        raise IncompleteRunError(
            f"{status['error']}; the run is incomplete ({Path(out_dir) / 'results.json'} "
            "says so; its other files are written)"
        )


def _write_model_files(art: RunArtifacts, cfg: RunConfig, folder, warn: bool = True) -> None:
    """Write the run's model files into ``folder`` (:func:`.artifacts.write_model_files`),
    recorded in ``art`` (those that could not be written in ``art.failed_files``; a
    warning each with ``warn``)."""
    written = artifacts.write_model_files(art, cfg, folder, warn=warn)
    art.model_files, art.failed_files = dict(written["files"]), dict(written["errors"])


def _measure(ctx: RunContext, out_dir) -> None:
    """Write the model files (into the run folder, or a temporary one removed afterwards)
    and add what each method costs to its record (:func:`~.costs.add_costs`; the
    deterministic network of the architecture is the reference of the timings).  A
    model file that cannot be written into the run folder is kept in
    ``art.failed_files`` without a warning: the run reports it (:func:`_write_run`)."""
    art = ctx.art
    reference = ctx.deterministic[0] if ctx.deterministic is not None else copy.deepcopy(ctx.net)
    if out_dir is not None:  # a file that fails makes the run incomplete (_write_run)
        _write_model_files(art, ctx.cfg, out_dir, warn=False)
        add_costs(art, ctx.cfg, reference, art.model_files)
        return
    with tempfile.TemporaryDirectory(prefix="twodg-costs-") as tmp:
        add_costs(art, ctx.cfg, reference, artifacts.write_model_files(art, ctx.cfg, tmp)["files"])


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
        write_results(
            out_dir, art.records, cfg.to_dict(), evaluation_of(cfg, art.eval_data), status
        )
        _write_model_files(art, cfg, out_dir)
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
        checkpoints=checkpoints,
        execution=execution,
        art=art,
        resume_from=resume_from,
        net=net,
        loader=train_loader(split, cfg.data, cfg.seed),
    )
