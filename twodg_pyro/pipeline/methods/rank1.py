"""The ``rank1`` row: a rank-1 BNN (Dusenberry et al. 2020), ``M`` mixture components
over rank-1 factors of the shared weights (:class:`~twodg_pyro.guides.Rank1Guide`), with
``cfg.rank1`` settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...guides.rank1 import Rank1BNNModel, Rank1Guide, rank1_kl_annealing, rank1_prior
from ...likelihoods import Categorical
from ..settings.build import build_net, seed_everything, train_loader
from .guide_row import train_and_record

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    """Train and evaluate a rank-1 BNN with ``cfg.rank1`` settings; returns its record.

    The shared weights start from the same seeded network as the other methods; the KL
    is annealed linearly over the first two thirds of ``cfg.rank1.epochs``.
    """
    cfg, split = ctx.cfg, ctx.art.split
    rc = cfg.rank1
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(cfg.device)
    model = Rank1BNNModel(
        net,
        prior=rank1_prior(rc.prior, rc.prior_scale),
        likelihood=Categorical(len(split.train)),
        components=rc.components,
        routing=rc.routing,
    ).to(cfg.device)
    guide = Rank1Guide(model, init_scale=rc.init_scale, init_mean=rc.init_mean, seed=cfg.seed)
    guide = guide.to(cfg.device)
    return train_and_record(
        ctx,
        model,
        guide,
        train_loader(split, cfg.data, cfg.seed),
        "rank1",
        rc.epochs,
        rc.lr,
        [rank1_kl_annealing(rc.epochs)],
        lambda n_guide, n_det: {k: getattr(rc, k) for k in ("components", "prior", "prior_scale")},
    )
