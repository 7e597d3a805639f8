"""The main job under ``torchrun``: :func:`~twodg_pyro.pipeline.run` with every stage on
all processes.

``torchrun --nproc_per_node=N twodg-pyro train --config FILE`` lands here (the CLI sees
``WORLD_SIZE > 1``).  Per method:

* ``deterministic``: the network under DDP on sharded data (the configured batch is the
  global batch);
* ``mean_field`` (stage 1): :func:`~twodg_pyro.distributed.fit_distributed`;
* ``2dg``: stage 2 on every rank from identical inputs (outlier gradients on the same,
  unsharded minibatches under the same seed; the mixture fitted with
  :class:`~twodg_pyro.distributed.DistributedGaussianMixture2D`, each rank's E-step on a
  shard of the points), a check that every rank holds the same structure (rank 0's is
  broadcast if not), then stage 3 with the merge and Mahalanobis hooks under
  :func:`~twodg_pyro.distributed.fit_distributed`.

Test-set predictions are sharded and gathered.  Only rank 0 prints the table and writes
files: ``results.json``/``results.md``, the model file, diagnostics and figures
(:func:`~twodg_pyro.pipeline.artifacts.write_artifacts`), and with
``checkpoint_every > 0`` the stage checkpoints under ``checkpoints/`` (the pipeline's
format; resuming them is single-process only for now).

Environment: ``TWODG_DIST_BACKEND`` (default ``nccl`` with CUDA, else ``gloo``) and
``TWODG_DIST_TIMEOUT_S`` (default 1800 s, the longest any rank waits for the others).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
import warnings
from pathlib import Path

import pyro
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

from ..accounting import compression_report
from ..baselines import train_deterministic
from ..data import make_loader
from ..guides import MeanFieldGuide, SharedGMMGuide
from ..infer import DecomposedELBO, KLAnnealing
from ..metrics import classification_metrics
from ..pipeline.algorithm1 import stage3_hooks
from ..pipeline.builders import build_model, build_net, load_data, seed_everything
from ..pipeline.checks import check_split
from ..pipeline.config import RunConfig
from ..pipeline.results import format_table, write_results
from ..pipeline.resume import RunCheckpoints
from ..pipeline.runner import RunArtifacts, _eval_split
from ..predict import Prediction, deterministic_predict, predict
from ..sharing import build_sharing
from . import env
from .gmm import DistributedGaussianMixture2D
from .train import MainOnly, ShardedLoader, _average_buffers, fit_distributed, local_batch_size

__all__ = ["SUPPORTED_METHODS", "run_distributed", "structure_checksum"]

#: Methods that run under torch.distributed.
SUPPORTED_METHODS = ("deterministic", "mean_field", "2dg")


def run_distributed(
    cfg: RunConfig,
    out_dir: str | Path | None = None,
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
) -> RunArtifacts:
    """Run ``cfg``'s methods on every process of the group; rank 0 writes the results.

    Joins the process group from ``torchrun``'s environment (and leaves it at the end
    if it joined it here).  Every rank must call it with the same configuration.

    Raises:
        ValueError: a method without distributed support, or a configured batch size
            that the world size does not divide (every rank, before any communication);
            :class:`~twodg_pyro.distributed.env.DistributedSetupError` when the group
            cannot be formed.
    """
    unsupported = [m for m in cfg.methods if m not in SUPPORTED_METHODS]
    if unsupported:
        raise ValueError(
            f"methods {unsupported} have no multi-process support yet; run them in one "
            f"process (plain `twodg-pyro`), or keep to {list(SUPPORTED_METHODS)} under torchrun"
        )
    local_batch_size(cfg.data.batch_size, env.env_world_size())
    backend = backend or os.environ.get("TWODG_DIST_BACKEND") or None
    if timeout_s is None:
        timeout_s = float(os.environ.get("TWODG_DIST_TIMEOUT_S", env.DEFAULT_TIMEOUT_S))
    joined_here = not (torch.distributed.is_available() and torch.distributed.is_initialized())
    info = env.setup(backend, timeout_s)
    try:
        return _run(cfg, out_dir, info)
    finally:
        if joined_here:
            env.cleanup()


def _run(cfg: RunConfig, out_dir, info: env.DistInfo) -> RunArtifacts:
    if cfg.device.startswith("cuda") and info.backend == "nccl":
        cfg = dataclasses.replace(cfg, device=str(info.device))
    device = torch.device(cfg.device)
    progress = cfg.progress and info.is_main
    out = Path(out_dir) if out_dir is not None else None
    art = RunArtifacts()
    seed_everything(cfg.seed)
    split = load_data(cfg.data, image=cfg.network.arch != "mlp")
    check_split(split)
    checkpoints = RunCheckpoints(out, cfg)
    env.on_main(checkpoints.start, f"prepare the checkpoint folder of {out}")
    art.split = split
    eval_data = _eval_split(split)
    art.extras["eval_data"] = _to(eval_data, device)
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(device)
    n_det = sum(p.numel() for p in net.parameters())

    def train_det(epochs: int):
        det = copy.deepcopy(net)
        t0 = time.perf_counter()
        wrapped = _ddp(det, device)
        loader = ShardedLoader(split.train, cfg.data.batch_size, seed=cfg.seed)
        train_deterministic(
            wrapped, loader, epochs, cfg.stage1.deterministic_lr, device=device, progress=progress
        )
        _average_buffers(det)
        return det, time.perf_counter() - t0

    pretrained = None
    if "deterministic" in cfg.methods:
        det, seconds = train_det(cfg.stage1.deterministic_epochs)
        pred = sharded_predict(lambda d: deterministic_predict(det, d), eval_data, device)
        art.records.append(
            {
                "method": "deterministic",
                **classification_metrics(pred.mean, pred.targets),
                "trainable_params": n_det,
                "train_seconds": seconds,
                "world_size": info.world_size,
            }
        )
        if cfg.network.pretrain_epochs == cfg.stage1.deterministic_epochs:
            pretrained = det
    if cfg.network.pretrain_epochs:  # stage-1 means start from a pretrained network
        net = pretrained if pretrained is not None else train_det(cfg.network.pretrain_epochs)[0]

    if {"mean_field", "2dg"} & set(cfg.methods):
        seed_everything(cfg.seed)
        t0 = time.perf_counter()
        model, guide, state = train_mean_field_distributed(
            cfg, split, copy.deepcopy(net), progress, checkpoints, {"records": art.records}
        )
        seconds = time.perf_counter() - t0
        art.mean_field = (model, guide, state)
        if "mean_field" in cfg.methods:
            pred = sharded_predict(
                lambda d: predict(model, guide, d, cfg.num_samples), eval_data, device
            )
            n_train = guide.num_trainable() + sum(
                p.numel() for p in model.deterministic_parameters()
            )
            art.records.append(
                {
                    "method": "mean_field",
                    **classification_metrics(pred.mean, pred.targets),
                    "trainable_params": n_train,
                    "train_seconds": seconds,
                    "final_elbo_terms": state.history[-1] if state.history else {},
                    "world_size": info.world_size,
                }
            )

    if "2dg" in cfg.methods:
        art.records.append(run_2dg_distributed(cfg, split, art, eval_data, progress, checkpoints))

    if info.is_main:
        print(format_table(art.records))
    if out is not None:

        def write():
            from ..pipeline.artifacts import write_artifacts

            write_results(out, art.records, cfg.to_dict())
            write_artifacts(art, cfg, out)

        env.on_main(write, f"write the results to {out}")
    return art


def _ddp(net: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    if not env.is_distributed():
        return net
    if device.type != "cuda":
        return DDP(net)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DDP(net, device_ids=[index])


def train_mean_field_distributed(
    cfg: RunConfig, split, net, progress: bool, checkpoints=None, extra=None
):
    """Stage 1 on every rank: a mean-field BNN over ``net`` trained by SVI under DDP.

    With ``checkpoints`` (a :class:`~twodg_pyro.pipeline.resume.RunCheckpoints` with
    ``checkpoint_every > 0``) rank 0 writes ``stage1.pt`` checkpoints holding ``extra``.
    """
    n_train = len(split.train)
    model = build_model(net, cfg.prior, n_train).to(cfg.device)
    guide = MeanFieldGuide(model, init_scale=cfg.stage1.init_scale, seed=cfg.seed).to(cfg.device)
    callbacks = []
    if cfg.stage1.kl_warmup_epochs:
        callbacks.append(KLAnnealing(cfg.stage1.kl_warmup_epochs))
    s1 = cfg.stage1
    state = fit_distributed(
        model,
        guide,
        split.train,
        s1.epochs,
        batch_size=cfg.data.batch_size,
        lr={"loc": s1.lr_loc, "scale": s1.lr_scale, "default": s1.lr_loc},
        elbo=DecomposedELBO(),
        callbacks=callbacks + _checkpoint(checkpoints, "stage1", callbacks, extra),
        device=cfg.device,
        progress=progress,
        seed=cfg.seed,
    )
    return model, guide, state


def _checkpoint(checkpoints, stage: str, callbacks, extra) -> list:
    """The pipeline's checkpoint callback for ``stage``, on rank 0 only (or nothing)."""
    cb = checkpoints.callback(stage, callbacks, [], extra) if checkpoints is not None else None
    return [] if cb is None else [MainOnly(cb)]


def structure_checksum(s) -> torch.Tensor:
    """Counts and sums of a :class:`~twodg_pyro.sharing.SharingStructure` (float64)."""
    parts = [
        s.means,
        s.covariances,
        s.outlier_index,
        s.outlier_loc,
        s.outlier_scale,
        s.plain_index,
        s.plain_component,
        s.ellipse_index,
        s.ellipse_components,
        s.ellipse_alphas,
    ]
    sums = [float(t.to(torch.float64).sum()) if t.numel() else 0.0 for t in parts]
    return torch.tensor([s.n_gaussians, s.n_outliers, s.n_ellipses, *sums], dtype=torch.float64)


def agree_on_structure(structure):
    """Every rank's structure when all are equal; otherwise rank 0's, broadcast (with a
    warning: stage 2 was not deterministic across ranks)."""
    if env.same_across_ranks(structure_checksum(structure)):
        return structure
    if env.is_main():
        warnings.warn(
            "the sharing structures built on the ranks differ; using rank 0's on every rank",
            RuntimeWarning,
            stacklevel=2,
        )
    return env.broadcast_object(structure)


def run_2dg_distributed(
    cfg: RunConfig, split, art, eval_data, progress: bool, checkpoints=None
) -> dict:
    """Stages 2-3 on every rank on top of the stage-1 model in ``art``; returns the record."""
    model, mf_guide, _ = art.mean_field
    device = torch.device(cfg.device)
    # the same minibatches on every rank (the gradient rule and the merge hook's gradients)
    full = make_loader(split.train, cfg.data.batch_size, shuffle=True, seed=cfg.seed)
    t0 = time.perf_counter()
    pyro.set_rng_seed(cfg.seed)
    structure, report = build_sharing(
        model,
        mf_guide,
        full,
        cfg.sharing,
        seed=cfg.seed,
        device=device,
        progress=False,
        mixture=DistributedGaussianMixture2D,
    )
    structure = agree_on_structure(structure)
    guide = SharedGMMGuide(model, structure, tying=cfg.stage3.tying).to(device)
    hooks = stage3_hooks(cfg, full)
    extra = {"records": list(art.records), "report": report}
    s3 = cfg.stage3
    lr = {"centre": s3.lr_centre, "outlier": s3.lr_outlier, "default": s3.lr_centre}
    if s3.tying != "representative":
        lr["cov"] = s3.lr_cov
    state = fit_distributed(
        model,
        guide,
        split.train,
        s3.epochs,
        batch_size=cfg.data.batch_size,
        lr=lr,
        elbo=DecomposedELBO(),
        callbacks=hooks + _checkpoint(checkpoints, "stage3", hooks, extra),
        device=device,
        progress=progress,
        seed=cfg.seed,
    )
    seconds = time.perf_counter() - t0
    pred = sharded_predict(lambda d: predict(model, guide, d, cfg.num_samples), eval_data, device)
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
        "world_size": env.get_world_size(),
    }
    art.extras["2dg"] = {"model": model, "guide": guide, "state": state, "structure": structure}
    return record


def sharded_predict(fn, eval_data, device: torch.device) -> Prediction:
    """``fn(data)`` on this rank's contiguous share of the evaluation data, gathered: the
    predictions of the whole set, in order, on every rank."""
    world, rank = env.get_world_size(), env.get_rank()
    if isinstance(eval_data, tuple):
        n = int(eval_data[0].shape[0])
    else:
        n = len(eval_data.dataset)
    if world == 1 or n < world:
        return fn(_to(eval_data, device))
    lo, hi = rank * n // world, (rank + 1) * n // world
    if isinstance(eval_data, tuple):
        part = tuple(t[lo:hi].to(device) for t in eval_data)
    else:
        part = DataLoader(Subset(eval_data.dataset, range(lo, hi)), batch_size=eval_data.batch_size)
    pred = fn(part)
    targets = None if pred.targets is None else env.all_gather_rows(pred.targets)
    return Prediction(mean=env.all_gather_rows(pred.mean), targets=targets)


def _to(data, device):
    if isinstance(data, tuple):
        return tuple(t.to(device) for t in data)
    return data
