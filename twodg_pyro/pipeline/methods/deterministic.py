"""The ``deterministic`` row: the seeded network trained by maximum likelihood
(:func:`~twodg_pyro.baselines.train_deterministic`), and the pieces of it the other
methods share: the recipe, the pretraining stage 1 starts from, the MAP network of
Laplace."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from torch import nn

from ...methods import Network
from ..settings.build import seed_everything, train_loader

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def recipe(ctx: RunContext) -> dict:
    """How the deterministic networks train: the keyword arguments of
    :func:`~twodg_pyro.baselines.train_deterministic` beyond the learning rate (the
    optimiser and, for SGD, its schedule: ``stage1.deterministic_*``), the device,
    progress and ``train``, this execution's trainer."""
    s1 = ctx.cfg.stage1
    return {
        "train": ctx.execution.train_deterministic,
        "device": ctx.cfg.device,
        "progress": ctx.progress,
        "optimizer": s1.deterministic_optimizer,
        "momentum": s1.deterministic_momentum,
        "weight_decay": s1.deterministic_weight_decay,
        "milestones": tuple(s1.deterministic_milestones),
        "gamma": s1.deterministic_gamma,
        "warmup_epochs": s1.deterministic_warmup_epochs,
    }


def train(ctx: RunContext, epochs: int, loader=None, net=None) -> tuple[nn.Module, float]:
    """``net`` (default: a copy of the run's initial network) trained deterministically for
    ``epochs`` on ``loader`` (default: the run's loader); and seconds."""
    det = copy.deepcopy(ctx.net) if net is None else net
    kw = recipe(ctx)
    data = ctx.execution.shard(ctx.loader if loader is None else loader, ctx.cfg.seed)
    lr = ctx.cfg.stage1.deterministic_lr
    _, seconds = ctx.timed(kw.pop("train"), det, data, epochs, lr, **kw)
    return det, seconds


def initial_network(ctx: RunContext) -> nn.Module:
    """The network stage 1 starts from: pretrained for ``network.pretrain_epochs`` (the
    deterministic row's network when it trained as long), else the initial network.  A
    resumed run does not pretrain (its checkpoint holds the trained guide)."""
    epochs = ctx.cfg.network.pretrain_epochs
    if not epochs or ctx.resume_from is not None:
        return ctx.net
    if ctx.deterministic is not None and ctx.deterministic[1] == epochs:
        return ctx.deterministic[0]
    return train(ctx, epochs)[0]


def map_network(ctx: RunContext) -> tuple[nn.Module, str, float]:
    """``(network, source, seconds)``: the deterministic row's network, else one trained
    as it would be (its initialisation, a fresh loader of the run's seed, its epochs)."""
    cfg = ctx.cfg
    epochs = cfg.stage1.deterministic_epochs
    if ctx.deterministic is not None and ctx.deterministic[1] == epochs:
        return copy.deepcopy(ctx.deterministic[0]), "the deterministic row", 0.0
    seed_everything(cfg.seed)
    net, seconds = train(ctx, epochs, train_loader(ctx.art.split, cfg.data, cfg.seed))
    return net, "trained for laplace as the deterministic row", seconds


def run(ctx: RunContext) -> dict | None:
    """The deterministic network trained on the data (its record was restored when
    resuming)."""
    if ctx.resume_from is not None:
        return None
    epochs = ctx.cfg.stage1.deterministic_epochs
    net, seconds = train(ctx, epochs)
    ctx.deterministic = (net, epochs)
    n_net = sum(p.numel() for p in net.parameters())
    return ctx.finish("deterministic", Network(net), seconds, n_net)
