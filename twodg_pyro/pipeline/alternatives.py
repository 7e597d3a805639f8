"""The other systems of the source material as rows of the results table: Rank-1 BNNs
(Dusenberry et al. 2020) and Sparse Subspace VI (Li et al. 2024).

Both train on the same network, data, training loop and metrics as the mean-field and
2DG rows and return a record of the same ``results.json`` schema: ``method``,
``accuracy``, ``nll``, ``ece``, ``brier``, ``trainable_params`` (guide parameters plus
the network's deterministic ones), ``stored_params`` (the floating-point numbers a
model file keeps for prediction: the same; SSVI's active positions are integers, in
``size_mb_with_index``), ``size_mb`` (those at float32, in :math:`10^6` bytes) and
``train_seconds``, plus a few method-specific fields.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..guides.rank1 import Rank1BNNModel, Rank1Guide, rank1_kl_annealing, rank1_prior
from ..guides.ssvi import SSVIGuide
from ..guides.ssvi_subspace import SubspaceUpdate
from ..infer import DecomposedELBO, KLAnnealing, fit
from ..infer.temperature import resolve_kl_weight
from ..likelihoods import Categorical
from ..priors import LayerwiseNormalPrior, prior_class
from .algorithm1 import EMPIRICAL_BAYES_KINDS
from .builders import build_model, build_net, seed_everything, train_loader
from .results import kl_weight_field, size_mb
from .trained import Trained


def _train_and_evaluate(
    ctx,
    model,
    guide,
    loader,
    method: str,
    epochs: int,
    lr: float,
    callbacks: list,
    extra: Callable,
    kl_weight: float = 1.0,
) -> dict:
    r"""Fit ``guide`` (timed) on :math:`\text{nll} + \beta\,\mathrm{KL}` (:math:`\beta` =
    ``kl_weight``), predict the evaluation data (the run's seeded draws), keep both in
    the run's artifacts and return the method's record, with the method-specific fields
    ``extra(n_guide, n_det)`` (called after training; the guide's trainable parameters
    and the network's deterministic ones)."""
    cfg = ctx.cfg
    t0 = time.perf_counter()
    state = fit(
        model,
        guide,
        loader,
        epochs=epochs,
        lr=lr,
        elbo=DecomposedELBO(beta=kl_weight, fast_step=cfg.fast_step),
        callbacks=callbacks,
        device=cfg.device,
        progress=cfg.progress,
    )
    seconds = time.perf_counter() - t0
    pred = ctx.predict(model, guide, ctx.art.eval_data)
    ctx.keep(method, Trained(model, guide, state), pred)
    n_guide = guide.num_trainable()
    n_det = sum(p.numel() for p in model.deterministic_parameters())
    return ctx.record(
        method,
        pred,
        seconds,
        n_guide + n_det,
        state=state,
        guide_trainable_params=n_guide,
        **extra(n_guide, n_det),
    )


def run_rank1(ctx) -> dict:
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
    return _train_and_evaluate(
        ctx,
        model,
        guide,
        train_loader(split, cfg.data, cfg.seed),
        "rank1",
        rc.epochs,
        rc.lr,
        [rank1_kl_annealing(rc.epochs)],
        lambda n_guide, n_det: {
            "components": rc.components,
            "prior": rc.prior,
            "prior_scale": rc.prior_scale,
        },
    )


def run_ssvi(ctx) -> dict:
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
        prior = ctx.stage1()[0].model.prior
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
    update = SubspaceUpdate(
        loader,
        removal=sc.removal,
        addition=sc.addition,
        update_every=sc.update_every,
        move_fraction=sc.move_fraction,
        stop_fraction=sc.stop_fraction,
        seed=cfg.seed,
    )
    callbacks = [update]
    beta = resolve_kl_weight(cfg.stage1.kl_weight, model)
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

    return _train_and_evaluate(
        ctx, model, guide, loader, "ssvi", sc.epochs, sc.lr, callbacks, extra, kl_weight=beta
    )
