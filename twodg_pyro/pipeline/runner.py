"""The main job: train and evaluate the configured methods, write the results table."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from ..baselines import train_deterministic
from ..guides import MeanFieldGuide
from ..infer import DecomposedELBO, KLAnnealing, fit
from ..metrics import classification_metrics
from ..predict import deterministic_predict, predict
from .builders import build_model, build_net, load_data, seed_everything, train_loader
from .config import RunConfig
from .results import format_table, write_results

__all__ = ["run", "RunArtifacts", "train_mean_field"]


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


def train_mean_field(cfg: RunConfig, split, net, progress: bool):
    """Stage 1: a mean-field BNN over ``net`` trained by SVI on the (annealed) ELBO."""
    n_train = len(split.train)
    model = build_model(net, cfg.prior, n_train).to(cfg.device)
    guide = MeanFieldGuide(model, init_scale=cfg.stage1.init_scale, seed=cfg.seed).to(cfg.device)
    callbacks = []
    if cfg.stage1.kl_warmup_epochs:
        callbacks.append(KLAnnealing(cfg.stage1.kl_warmup_epochs))
    state = fit(
        model,
        guide,
        train_loader(split, cfg.data, cfg.seed),
        epochs=cfg.stage1.epochs,
        lr={"loc": cfg.stage1.lr_loc, "scale": cfg.stage1.lr_scale, "default": cfg.stage1.lr_loc},
        elbo=DecomposedELBO(),
        callbacks=callbacks,
        device=cfg.device,
        progress=progress,
    )
    return model, guide, state


def run(cfg: RunConfig, out_dir: str | Path | None = None) -> RunArtifacts:
    """Run every method of ``cfg.methods`` and write ``results.json``/``results.md``.

    Returns the records and trained objects.  The table is also printed.
    """
    art = RunArtifacts()
    seed_everything(cfg.seed)
    split = load_data(cfg.data, image=cfg.network.arch != "mlp")
    art.split = split
    eval_data = _eval_split(split)
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(cfg.device)
    loader = train_loader(split, cfg.data, cfg.seed)
    n_det = sum(p.numel() for p in net.parameters())

    if "deterministic" in cfg.methods or cfg.network.pretrain_epochs:
        det = copy.deepcopy(net)
        t0 = time.perf_counter()
        epochs = cfg.stage1.deterministic_epochs
        train_deterministic(
            det,
            loader,
            epochs,
            cfg.stage1.deterministic_lr,
            device=cfg.device,
            progress=cfg.progress,
        )
        seconds = time.perf_counter() - t0
        if "deterministic" in cfg.methods:
            pred = deterministic_predict(det, _to(eval_data, cfg.device))
            art.records.append(
                {
                    "method": "deterministic",
                    **classification_metrics(pred.mean, pred.targets),
                    "trainable_params": n_det,
                    "train_seconds": seconds,
                }
            )
        if cfg.network.pretrain_epochs:
            net = det  # stage-1 means start from the pretrained network

    if {"mean_field", "2dg"} & set(cfg.methods):
        seed_everything(cfg.seed)
        t0 = time.perf_counter()
        model, guide, state = train_mean_field(cfg, split, copy.deepcopy(net), cfg.progress)
        seconds = time.perf_counter() - t0
        art.mean_field = (model, guide, state)
        if "mean_field" in cfg.methods:
            pred = predict(model, guide, _to(eval_data, cfg.device), cfg.num_samples)
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
                }
            )

    if "2dg" in cfg.methods:
        from .algorithm1 import run_2dg

        art.records.append(run_2dg(cfg, split, art, _to(eval_data, cfg.device)))

    if "rank1" in cfg.methods:
        from .alternatives import run_rank1

        art.records.append(run_rank1(cfg, split, _to(eval_data, cfg.device)))

    if "ssvi" in cfg.methods:
        from .alternatives import run_ssvi

        art.records.append(run_ssvi(cfg, split, _to(eval_data, cfg.device)))

    print(format_table(art.records))
    if out_dir is not None:
        write_results(out_dir, art.records, cfg.to_dict())
    return art


def _to(data, device):
    if isinstance(data, tuple):
        return tuple(t.to(device) for t in data)
    return data
