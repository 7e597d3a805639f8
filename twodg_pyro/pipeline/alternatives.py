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

import time
from collections.abc import Callable

from ..evaluation import seeded_predict
from ..guides.rank1 import Rank1BNNModel, Rank1Guide, rank1_kl_annealing, rank1_prior
from ..guides.ssvi import SSVIGuide
from ..guides.ssvi_subspace import SubspaceUpdate
from ..infer import DecomposedELBO, KLAnnealing, fit
from ..likelihoods import Categorical
from ..metrics import classification_metrics
from .builders import build_model, build_net, seed_everything, train_loader
from .config import RunConfig
from .trained import Trained

__all__ = ["run_rank1", "run_ssvi", "size_mb"]


def size_mb(n_params: int, bytes_per_param: int = 4) -> float:
    """Storage of ``n_params`` float32 numbers in MB (:math:`10^6` bytes)."""
    return n_params * bytes_per_param / 1e6


def _train_and_evaluate(
    cfg: RunConfig,
    model,
    guide,
    loader,
    eval_data,
    *,
    method: str,
    epochs: int,
    lr: float,
    callbacks: list,
    extra: Callable[[int, int], dict],
    art=None,
) -> dict:
    """Fit ``guide`` (timed), predict ``eval_data`` (the run's seeded draws) and return
    the method's record; with ``art`` (the run's
    :class:`~twodg_pyro.pipeline.trained.RunArtifacts`) keep the trained model, guide and
    state in ``art.trained[method]`` and the prediction in ``art.predictions[method]``.

    ``extra(n_guide, n_det)`` gives the method-specific fields, placed after ``size_mb``
    (``n_guide`` counts the guide's trainable parameters, ``n_det`` the network's
    deterministic ones); it is called after training.
    """
    t0 = time.perf_counter()
    state = fit(
        model,
        guide,
        loader,
        epochs=epochs,
        lr=lr,
        elbo=DecomposedELBO(fast_step=cfg.fast_step),
        callbacks=callbacks,
        device=cfg.device,
        progress=cfg.progress,
    )
    seconds = time.perf_counter() - t0
    pred = seeded_predict(model, guide, eval_data, cfg.num_samples, cfg.seed, progress=cfg.progress)
    if art is not None:
        art.trained[method] = Trained(model, guide, state)
        art.predictions[method] = pred
    n_guide = guide.num_trainable()
    n_det = sum(p.numel() for p in model.deterministic_parameters())
    return {
        "method": method,
        **classification_metrics(pred.mean, pred.targets),
        "trainable_params": n_guide + n_det,
        "guide_trainable_params": n_guide,
        "stored_params": n_guide + n_det,
        "size_mb": size_mb(n_guide + n_det),
        **extra(n_guide, n_det),
        "train_seconds": seconds,
        "final_elbo_terms": state.history[-1] if state.history else {},
    }


def run_rank1(cfg: RunConfig, split, eval_data, art=None) -> dict:
    """Train and evaluate a rank-1 BNN with ``cfg.rank1`` settings; returns its record.

    The shared weights start from the same seeded network as the other methods; the KL
    is annealed linearly over the first two thirds of ``cfg.rank1.epochs``.
    """
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
        cfg,
        model,
        guide,
        train_loader(split, cfg.data, cfg.seed),
        eval_data,
        method="rank1",
        epochs=rc.epochs,
        lr=rc.lr,
        callbacks=[rank1_kl_annealing(rc.epochs)],
        extra=lambda n_guide, n_det: {"components": rc.components, "prior": rc.prior},
        art=art,
    )


def run_ssvi(cfg: RunConfig, split, eval_data, art=None) -> dict:
    """Train and evaluate an SSVI BNN with ``cfg.ssvi`` settings; returns its record.

    Prior, network and initial scales are those of the mean-field row (``cfg.prior``,
    ``cfg.network``, ``cfg.stage1.init_scale`` and ``kl_warmup_epochs``).  Besides
    ``size_mb``, ``size_mb_with_index`` adds one int32 position per active coordinate.
    """
    sc = cfg.ssvi
    seed_everything(cfg.seed)
    net = build_net(cfg.network, split).to(cfg.device)
    model = build_model(net, cfg.prior, len(split.train)).to(cfg.device)
    guide = SSVIGuide(
        model, density=sc.density, init_scale=cfg.stage1.init_scale, seed=cfg.seed
    ).to(cfg.device)
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
    if cfg.stage1.kl_warmup_epochs:
        callbacks.insert(0, KLAnnealing(cfg.stage1.kl_warmup_epochs))

    def extra(n_guide: int, n_det: int) -> dict:
        return {
            "size_mb_with_index": size_mb(n_guide + n_det + guide.num_active),
            "compression_ratio": 2 * model.num_weights / max(n_guide, 1),
            "density": sc.density,
            "active": guide.num_active,
            "removal": sc.removal,
            "addition": sc.addition,
            "subspace_updates": len(update.updates),
        }

    return _train_and_evaluate(
        cfg,
        model,
        guide,
        loader,
        eval_data,
        method="ssvi",
        epochs=sc.epochs,
        lr=sc.lr,
        callbacks=callbacks,
        extra=extra,
        art=art,
    )
