"""The ``deterministic_matched`` row: the deterministic network trained for as many epochs
as the Bayesian pipeline (``network.pretrain_epochs + stage1.epochs + stage3.epochs``, or
``deterministic_matched.epochs``), keeping the weights of its best validation NLL
(:func:`~twodg_pyro.baselines.train_early_stopped`); the plain ``deterministic`` row
trains ``stage1.deterministic_epochs`` and keeps its last epoch."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from ...baselines import train_early_stopped
from ...methods import Network
from ..settings.build import eval_data, seed_everything, train_loader
from .deterministic import recipe

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def matched_epochs(cfg) -> int:
    """The epochs of ``deterministic_matched``: ``deterministic_matched.epochs``, else
    pretraining + stage 1 + stage 3."""
    epochs = cfg.deterministic_matched.epochs
    if epochs is not None:
        return int(epochs)
    return int(cfg.network.pretrain_epochs + cfg.stage1.epochs + cfg.stage3.epochs)


def fresh_loader(ctx: RunContext, seed: int):
    """The seeded training loader of ``seed`` (a new shuffling stream), as the run's
    execution iterates it."""
    return ctx.execution.shard(train_loader(ctx.art.split, ctx.cfg.data, seed), seed)


def run(ctx: RunContext) -> dict:
    """The deterministic network trained for :func:`matched_epochs`, early-stopped on the
    validation NLL (``cfg.deterministic_matched``); its record (``epochs``,
    ``epochs_trained``, ``best_epoch``, ``best_val_nll``, ``validation``, ``patience``)."""
    cfg, art = ctx.cfg, ctx.art
    val = art.split.val
    seed_everything(cfg.seed)
    net = copy.deepcopy(ctx.net)
    (net, report), seconds = ctx.timed(
        train_early_stopped,
        net,
        fresh_loader(ctx, cfg.seed),
        None if val is None or len(val) == 0 else eval_data(val, cfg.device),
        matched_epochs(cfg),
        cfg.stage1.deterministic_lr,
        patience=cfg.deterministic_matched.patience,
        **recipe(ctx),
    )
    keys = ("epochs", "epochs_trained", "best_epoch", "best_val_nll", "validation")
    return ctx.finish(
        "deterministic_matched",
        Network(net, "deterministic_matched"),
        seconds,
        sum(p.numel() for p in net.parameters()),
        **{k: report[k] for k in keys},
        patience=cfg.deterministic_matched.patience,
    )
