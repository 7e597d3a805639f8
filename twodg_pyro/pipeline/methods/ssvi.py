"""The ``ssvi`` row: Sparse Subspace VI (Li et al. 2024), a mean-field posterior on a
fraction of each Bayesian tensor's coordinates, the subspace updated during training
(:class:`~twodg_pyro.guides.SSVIGuide`), with ``cfg.ssvi`` settings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ...guides.ssvi import SSVIGuide
from ...guides.ssvi_subspace import SubspaceUpdate
from ...infer import KLAnnealing
from ...priors import LayerwiseNormalPrior, prior_class
from ..outputs.results import kl_weight_field, size_mb
from ..settings.build import build_model, build_net, seed_everything, train_loader
from .algorithm1 import EMPIRICAL_BAYES_KINDS
from .guide_row import train_and_record
from .mean_field import stage1

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    r"""Train and evaluate an SSVI BNN with ``cfg.ssvi`` settings; returns its record.

    Prior, network, KL weight and initial scales are those of the mean-field row
    (``cfg.prior``, ``cfg.network``, ``cfg.stage1.kl_weight``, ``cfg.stage1.init_scale``
    and ``kl_warmup_epochs``): the same tempered ELBO as stage 1; SSVI starts
    from the seeded fresh network, so a prior learnt by empirical Bayes is stage 1's
    (learnt from the pretrained network) and ``init_scale = "curvature"`` (the curvature
    of the pretrained network) is the paper's initial scales.  Besides ``size_mb``,
    ``size_mb_with_index`` adds one int32 position per active coordinate.

    A fan-in prior (``layerwise``, :math:`\mathcal N(0, g^2/\text{fan\_in})`) counts the
    active inputs only: :math:`\mathcal N(0, g^2/(d\,\text{fan\_in}))` at density
    :math:`d`, so that a unit's pre-activation keeps the prior variance the fan-in rule
    gives a dense layer (with a fraction :math:`d` of its weights active, the dense
    rule shrinks it by :math:`d` per layer and SSVI's predictions collapse to chance).
    """
    cfg, split = ctx.cfg, ctx.art.split
    sc = cfg.ssvi
    prior = cfg.prior
    if cfg.prior.kind in EMPIRICAL_BAYES_KINDS:
        prior = stage1(ctx)[0].model.prior
    elif prior_class(cfg.prior.kind) is LayerwiseNormalPrior:
        prior = LayerwiseNormalPrior(gain=cfg.prior.scale / math.sqrt(sc.density))
    init_scale = "paper" if cfg.stage1.init_scale == "curvature" else cfg.stage1.init_scale
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(cfg.device)
    model = build_model(net, prior, len(split.train), cfg.network.norm_stats).to(cfg.device)
    guide = SSVIGuide(model, density=sc.density, init_scale=init_scale, seed=cfg.seed).to(
        cfg.device
    )
    loader = train_loader(split, cfg.data, cfg.seed)
    keys = ("removal", "addition", "update_every", "move_fraction", "stop_fraction")
    update = SubspaceUpdate(loader, seed=cfg.seed, **{k: getattr(sc, k) for k in keys})
    callbacks = [update]
    beta = ctx.kl_weight("stage1", model)
    if cfg.stage1.kl_warmup_epochs:
        callbacks.insert(0, KLAnnealing(cfg.stage1.kl_warmup_epochs, end=beta))

    def extra(n_guide: int, n_det: int) -> dict:
        return {
            "size_mb_with_index": size_mb(n_guide + n_det + guide.num_active),
            "compression_ratio": 2 * model.num_weights / max(n_guide, 1),
            "density": sc.density,
            "active": guide.num_active,
            "removal": sc.removal,
            "addition": sc.addition,
            "subspace_updates": len(update.updates),
            **kl_weight_field(beta),
        }

    return train_and_record(
        ctx, model, guide, loader, "ssvi", sc.epochs, sc.lr, callbacks, extra, kl_weight=beta
    )
