"""The main job: train and evaluate the configured methods, write the results table.

One orchestration for a plain run and a data-parallel one under ``torchrun``: the
pieces that differ come in as an :class:`~twodg_pyro.pipeline.execution.Execution`
(:data:`~twodg_pyro.pipeline.execution.LOCAL` by default), and every file is written
on rank 0 only (:func:`~twodg_pyro.distributed.env.on_main`,
:class:`~twodg_pyro.distributed.MainOnly`: plain calls in one process).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from ..distributed import env
from ..evaluation import draws_record, seeded_predict
from ..guides import MeanFieldGuide
from ..infer import DecomposedELBO, KLAnnealing
from ..infer.checkpoint import restore_state
from ..metrics import classification_metrics
from ..predict import deterministic_predict
from .builders import (
    build_model,
    build_net,
    check_device,
    load_data,
    seed_everything,
    train_loader,
)
from .checks import check_split
from .config import RunConfig
from .execution import LOCAL, Execution, main_only
from .results import format_table, write_results
from .resume import RunCheckpoints
from .run_folder import RunFolder

__all__ = ["run", "RunArtifacts", "evaluation_of", "train_mean_field", "train_svi"]


class RunArtifacts:
    """What a run produced, for callers that want more than the table."""

    def __init__(self):
        self.records: list[dict] = []
        self.split = None
        self.net = None
        self.mean_field = None  # (model, guide, state)
        self.extras: dict = {}


def _eval_split(split):
    tensors = split.test.tensors if hasattr(split.test, "tensors") else None
    if tensors is not None:
        return tensors[0], tensors[1]
    return torch.utils.data.DataLoader(split.test, batch_size=512)


def train_mean_field(
    cfg: RunConfig,
    split,
    net,
    progress: bool,
    checkpoints=None,
    extra=None,
    execution: Execution = LOCAL,
):
    """Stage 1: a mean-field BNN over ``net`` trained by SVI on the (annealed) ELBO.

    With ``checkpoints`` (a :class:`~twodg_pyro.pipeline.resume.RunCheckpoints`) it writes
    ``stage1.pt`` checkpoints (holding ``extra``, on rank 0) and continues from one when
    resuming.  ``execution`` runs the SVI loop (one process, or every rank).
    """
    n_train = len(split.train)
    model = build_model(net, cfg.prior, n_train).to(cfg.device)
    guide = MeanFieldGuide(model, init_scale=cfg.stage1.init_scale, seed=cfg.seed).to(cfg.device)
    callbacks = []
    if cfg.stage1.kl_warmup_epochs:
        callbacks.append(KLAnnealing(cfg.stage1.kl_warmup_epochs, end=cfg.stage1.kl_weight))
    loader = train_loader(split, cfg.data, cfg.seed)
    lr = {"loc": cfg.stage1.lr_loc, "scale": cfg.stage1.lr_scale, "default": cfg.stage1.lr_loc}
    state = train_svi(
        cfg,
        "stage1",
        model,
        guide,
        loader,
        cfg.stage1.epochs,
        lr,
        callbacks,
        progress,
        checkpoints,
        extra,
        execution,
        kl_weight=cfg.stage1.kl_weight,
    )
    return model, guide, state


def train_svi(
    cfg: RunConfig,
    stage: str,
    model,
    guide,
    loader,
    epochs: int,
    lr,
    callbacks: list,
    progress: bool,
    checkpoints=None,
    extra=None,
    execution: Execution = LOCAL,
    kl_weight: float = 1.0,
):
    r"""SVI of ``guide`` for ``stage`` (``"stage1"``, ``"stage3"``) on the seeded ``loader``
    (``execution`` shards it) on :math:`\text{nll} + \beta\,\mathrm{KL}` with
    :math:`\beta` = ``kl_weight``; returns the final ``TrainState``.

    With ``checkpoints`` (a :class:`~twodg_pyro.pipeline.resume.RunCheckpoints`) rank 0
    writes the stage's checkpoints (holding ``callbacks``' states, ``loader``'s generator
    and ``extra``), and a resumed run continues from the stage's checkpoint.
    """
    state, ckpt = None, None
    if checkpoints is not None:
        resumed = checkpoints.load(stage)
        if resumed is not None:
            state = restore_state(
                resumed, model, guide, lr, callbacks=callbacks, generators=[loader]
            )
        ckpt = checkpoints.callback(stage, callbacks, [loader], extra)
    return execution.fit(
        model,
        guide,
        execution.shard(loader, cfg.seed),
        epochs,
        seed=cfg.seed,
        lr=lr,
        elbo=DecomposedELBO(beta=kl_weight),
        callbacks=list(callbacks) + main_only(ckpt),
        device=cfg.device,
        progress=progress,
        state=state,
    )


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
    rank of a process group (:func:`~twodg_pyro.distributed.run_distributed` passes a
    :class:`~twodg_pyro.distributed.runner.DataParallel`; every rank then calls this with
    the same settings, and rank 0 alone prints, writes files and holds the folder's lock).

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
    progress = cfg.progress and env.is_main()
    art = RunArtifacts()
    seed_everything(cfg.seed)
    split = load_data(cfg.data, image=cfg.network.arch != "mlp")
    check_split(split)
    if folder is not None:  # inputs valid: an earlier run's files may go (overwrite)
        env.on_main(folder.clear_previous, f"clear the output folder {out_dir}")
    checkpoints = RunCheckpoints(out_dir, cfg, resume)
    env.on_main(checkpoints.start, f"prepare the checkpoint folder of {out_dir}")
    resume_from = checkpoints.latest()
    art.split = split
    eval_data = _to(_eval_split(split), cfg.device)
    art.extras["eval_data"] = eval_data
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(cfg.device)
    loader = train_loader(split, cfg.data, cfg.seed)
    n_det = sum(p.numel() for p in net.parameters())
    pretrained = None

    def train_det(epochs: int):
        det = copy.deepcopy(net)
        t0 = time.perf_counter()
        execution.train_deterministic(
            det,
            execution.shard(loader, cfg.seed),
            epochs,
            cfg.stage1.deterministic_lr,
            device=cfg.device,
            progress=progress,
            **deterministic_recipe(cfg),
        )
        return det, time.perf_counter() - t0

    if resume_from is not None:  # records of the methods finished before the checkpoint
        art.records = [dict(r) for r in checkpoints.load(resume_from).extra["records"]]
    if "deterministic" in cfg.methods and resume_from is None:
        det, seconds = train_det(cfg.stage1.deterministic_epochs)
        pred = execution.predict(lambda d: deterministic_predict(det, d), eval_data, cfg.device)
        art.records.append(
            {
                "method": "deterministic",
                **classification_metrics(pred.mean, pred.targets),
                "trainable_params": n_det,
                "size_mb": 4 * n_det / 1e6,
                "train_seconds": seconds,
                **execution.record_fields(),
            }
        )
        if cfg.network.pretrain_epochs == cfg.stage1.deterministic_epochs:
            pretrained = det
    if cfg.network.pretrain_epochs and resume_from is None:
        # stage-1 means start from a pretrained deterministic network
        if pretrained is None:
            pretrained, _ = train_det(cfg.network.pretrain_epochs)
        net = pretrained

    if {"mean_field", "2dg"} & set(cfg.methods):
        seed_everything(cfg.seed)
        t0 = time.perf_counter()
        model, guide, state = train_mean_field(
            cfg,
            split,
            copy.deepcopy(net),
            progress,
            checkpoints,
            {"records": art.records},
            execution,
        )
        seconds = time.perf_counter() - t0
        art.mean_field = (model, guide, state)
        if "mean_field" in cfg.methods and resume_from != "stage3":
            pred = execution.predict(
                lambda d: seeded_predict(
                    model, guide, d, cfg.num_samples, cfg.seed, progress=progress
                ),
                eval_data,
                cfg.device,
            )
            art.extras.setdefault("predictions", {})["mean_field"] = pred
            n_train = guide.num_trainable() + sum(
                p.numel() for p in model.deterministic_parameters()
            )
            art.records.append(
                {
                    "method": "mean_field",
                    **classification_metrics(pred.mean, pred.targets),
                    "trainable_params": n_train,
                    "size_mb": 4 * n_train / 1e6,
                    "train_seconds": seconds,
                    "final_elbo_terms": state.history[-1] if state.history else {},
                    **kl_weight_field(cfg.stage1.kl_weight),
                    **execution.record_fields(),
                }
            )

    if "2dg" in cfg.methods:
        from .algorithm1 import run_2dg

        art.records.append(run_2dg(cfg, split, art, eval_data, checkpoints, execution))

    if "rank1" in cfg.methods:
        from .alternatives import run_rank1

        art.records.append(run_rank1(cfg, split, eval_data, art))

    if "ssvi" in cfg.methods:
        from .alternatives import run_ssvi

        art.records.append(run_ssvi(cfg, split, eval_data, art))

    if env.is_main():
        print(format_table(art.records))
    if out_dir is not None:

        def write():
            write_results(out_dir, art.records, cfg.to_dict(), evaluation_of(cfg, eval_data))
            from .artifacts import write_artifacts  # model file, InferenceData, diagnostics, ...

            write_artifacts(art, cfg, out_dir)

        env.on_main(write, f"write the results to {out_dir}")
    return art


def evaluation_of(cfg: RunConfig, eval_data) -> dict:
    """How the Bayesian rows of the results table were evaluated (``results.json``'s
    ``evaluation``): ``num_samples`` draws seeded with the run's seed on the test split
    (:mod:`twodg_pyro.evaluation`)."""
    if isinstance(eval_data, tuple):
        n = int(eval_data[0].shape[0])
    else:
        n = len(eval_data.dataset)
    return draws_record(cfg.num_samples, cfg.seed, n, "test")


def deterministic_recipe(cfg: RunConfig) -> dict:
    """The keyword arguments of :func:`~twodg_pyro.baselines.train_deterministic` beyond
    the learning rate: the optimiser and, for SGD, its schedule (``stage1.deterministic_*``)."""
    s1 = cfg.stage1
    return {
        "optimizer": s1.deterministic_optimizer,
        "momentum": s1.deterministic_momentum,
        "weight_decay": s1.deterministic_weight_decay,
        "milestones": tuple(s1.deterministic_milestones),
        "gamma": s1.deterministic_gamma,
        "warmup_epochs": s1.deterministic_warmup_epochs,
    }


def kl_weight_field(kl_weight: float) -> dict:
    """``{"kl_weight": beta}`` for a record trained on a tempered ELBO, ``{}`` at 1."""
    return {} if kl_weight == 1.0 else {"kl_weight": kl_weight}


def _to(data, device):
    if isinstance(data, tuple):
        return tuple(t.to(device) for t in data)
    return data
