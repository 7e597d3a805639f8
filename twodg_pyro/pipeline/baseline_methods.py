"""The non-Bayesian baselines as rows of the results table, on the same data, network,
training recipe and metrics as the Bayesian rows:

* ``deterministic_matched``: the deterministic network trained for as many epochs as
  the Bayesian pipeline (``network.pretrain_epochs + stage1.epochs + stage3.epochs``,
  or ``deterministic_matched.epochs``), keeping the weights of its best validation NLL
  (:func:`~twodg_pyro.baselines.train_early_stopped`); the plain ``deterministic`` row
  trains ``stage1.deterministic_epochs`` and keeps its last epoch;
* ``ensemble``: ``ensemble.members`` deterministic networks, member ``m`` initialised and
  shuffled with seed ``seed + m`` (:class:`~twodg_pyro.baselines.Ensemble`);
* ``laplace``: post-hoc Laplace on the run's deterministic network (the deterministic
  row's, else one trained as it would be; :func:`~twodg_pyro.baselines.fit_laplace`),
  predicted by ``num_samples`` draws seeded with ``seed``;
* ``mcmc``: the reference posterior, Pyro's NUTS (or HMC) on the run's network, prior
  and likelihood over the whole training set (:func:`~twodg_pyro.infer.mcmc.run_mcmc`,
  ``cfg.mcmc``), predicted by all its kept draws.

Every record has ``method``, ``accuracy``, ``nll``, ``ece``, ``brier``,
``trainable_params``, ``stored_params`` (floating-point numbers kept for prediction),
``size_mb`` (``stored_params`` at float32) and ``train_seconds``, plus the method's own
fields.  The trained objects are in ``art.trained[method]`` (a
:class:`~twodg_pyro.pipeline.trained.Trained` whose ``model`` is the object and ``guide``
``None``), their predictions in ``art.predictions[method]``;
:func:`method_probs` gives any method's per-draw probabilities on other inputs.  The
run writes their model files (:func:`~twodg_pyro.io.save_baseline`,
:mod:`~twodg_pyro.pipeline.artifacts`), which ``twodg-pyro evaluate`` reads.
"""

from __future__ import annotations

import copy
import time

import torch

from ..baselines import draw_probs, fit_laplace, train_early_stopped, train_ensemble
from ..data import make_loader
from ..evaluation import seeded_predict
from ..metrics import classification_metrics
from .builders import build_model, build_net, eval_data, seed_everything, train_loader
from .trained import Trained


def method_probs(trained, x, num_samples: int = 30, seed: int = 0) -> torch.Tensor:
    """Per-draw class probabilities ``(S, N, C)`` of a trained method on inputs ``x`` (a
    tensor, ``(X, y)`` or batches), on the CPU.

    ``trained``: an entry of ``art.trained`` (or ``art.mean_field``), i.e. a
    :class:`~twodg_pyro.pipeline.trained.Trained` / ``(model, guide, ...)``, or the
    object itself.  A Bayesian model and guide: ``num_samples`` posterior draws seeded
    with ``seed`` (the run's evaluation draws,
    :func:`~twodg_pyro.evaluation.seeded_predict`; a rank-1 BNN gives ``S K``); an
    ensemble: its ``M`` members; Laplace: ``num_samples`` seeded draws; a network (the
    ``deterministic`` rows): ``S = 1`` (:func:`~twodg_pyro.baselines.draw_probs`).
    """
    if isinstance(trained, tuple) and len(trained) >= 2:
        model, guide = trained[0], trained[1]
        if guide is None:
            return draw_probs(model, x, num_samples, seed)
        return seeded_predict(model, guide, x, num_samples, seed, keep_samples=True).samples
    return draw_probs(trained, x, num_samples, seed)


def matched_epochs(cfg) -> int:
    """The epochs of ``deterministic_matched``: ``deterministic_matched.epochs``, else
    pretraining + stage 1 + stage 3."""
    epochs = cfg.deterministic_matched.epochs
    if epochs is not None:
        return int(epochs)
    return int(cfg.network.pretrain_epochs + cfg.stage1.epochs + cfg.stage3.epochs)


def _fresh_loader(ctx, seed: int):
    """The seeded training loader of ``seed`` (a new shuffling stream), as the run's
    execution iterates it."""
    return ctx.execution.shard(train_loader(ctx.art.split, ctx.cfg.data, seed), seed)


def run_deterministic_matched(ctx) -> dict:
    """The deterministic network trained for :func:`matched_epochs`, early-stopped on the
    validation NLL (``cfg.deterministic_matched``); its record (``epochs``,
    ``epochs_trained``, ``best_epoch``, ``best_val_nll``, ``validation``, ``patience``)."""
    cfg, art = ctx.cfg, ctx.art
    val = art.split.val
    seed_everything(cfg.seed)
    net = copy.deepcopy(ctx.net)
    t0 = time.perf_counter()
    net, report = train_early_stopped(
        net,
        _fresh_loader(ctx, cfg.seed),
        None if val is None or len(val) == 0 else eval_data(val, cfg.device),
        matched_epochs(cfg),
        cfg.stage1.deterministic_lr,
        patience=cfg.deterministic_matched.patience,
        **ctx.trainer,
    )
    seconds = time.perf_counter() - t0
    pred = ctx.predict(net, None, art.eval_data)
    ctx.keep("deterministic_matched", Trained(net, None, None), pred)
    keys = ("epochs", "epochs_trained", "best_epoch", "best_val_nll", "validation")
    return ctx.record(
        "deterministic_matched",
        pred,
        seconds,
        sum(p.numel() for p in net.parameters()),
        **{k: report[k] for k in keys},
        patience=cfg.deterministic_matched.patience,
    )


def run_ensemble(ctx) -> dict:
    """A deep ensemble of ``cfg.ensemble.members`` networks; its record (``members``,
    ``epochs``, each member's ``member_accuracy`` and ``member_nll``)."""
    cfg, art = ctx.cfg, ctx.art
    ec = cfg.ensemble
    epochs = ec.epochs if ec.epochs is not None else cfg.stage1.deterministic_epochs

    def make_member(m: int):
        seed_everything(cfg.seed + m)
        net = build_net(cfg.network, art.split).to(cfg.device)
        return net, _fresh_loader(ctx, cfg.seed + m)

    t0 = time.perf_counter()
    ensemble = train_ensemble(
        make_member, ec.members, epochs, cfg.stage1.deterministic_lr, **ctx.trainer
    )
    seconds = time.perf_counter() - t0
    pred = ensemble.predict(art.eval_data, keep_samples=True)
    members = [classification_metrics(p, pred.targets) for p in pred.samples]
    ctx.keep("ensemble", Trained(ensemble, None, None), pred)
    return ctx.record(
        "ensemble",
        pred,
        seconds,
        ensemble.num_params(),
        members=ensemble.num_members,
        epochs=int(epochs),
        member_accuracy=[m["accuracy"] for m in members],
        member_nll=[m["nll"] for m in members],
    )


def _map_network(ctx):
    """``(network, source, seconds)``: the deterministic row's network, else one trained
    as it would be (its initialisation, a fresh loader of the run's seed, its epochs)."""
    cfg = ctx.cfg
    epochs = cfg.stage1.deterministic_epochs
    if ctx.deterministic is not None and ctx.deterministic[1] == epochs:
        return copy.deepcopy(ctx.deterministic[0]), "the deterministic row", 0.0
    seed_everything(cfg.seed)
    net, seconds = ctx.train_deterministic(epochs, train_loader(ctx.art.split, cfg.data, cfg.seed))
    return net, "trained for laplace as the deterministic row", seconds


def run_laplace(ctx) -> dict:
    """Post-hoc Laplace (``cfg.laplace``) on the run's deterministic network; its record
    (``subset``, ``hessian``, ``pred_type``, ``prior_structure``, ``prior_precision``,
    ``covered_params``, ``map_network``, ``map_train_seconds``)."""
    cfg, art = ctx.cfg, ctx.art
    lc = cfg.laplace
    net, source, map_seconds = _map_network(ctx)
    loader = make_loader(art.split.train, lc.batch_size, shuffle=False)
    t0 = time.perf_counter()
    post = fit_laplace(
        net,
        loader,
        subset=lc.subset,
        hessian=lc.hessian,
        prior_structure=lc.prior_structure,
        marglik_steps=lc.marglik_steps,
        marglik_lr=lc.marglik_lr,
        pred_type=lc.pred_type,
        progress=ctx.progress,
    )
    seconds = time.perf_counter() - t0
    pred = post.predict(art.eval_data, cfg.num_samples, cfg.seed)
    ctx.keep("laplace", Trained(post, None, None), pred)
    n_net = sum(p.numel() for p in net.parameters())
    prior = [float(v) for v in post.prior_precision.tolist()]
    return ctx.record(
        "laplace",
        pred,
        seconds,
        n_net,
        stored=n_net + post.num_factor_values(),
        subset=lc.subset,
        hessian=lc.hessian,
        pred_type=lc.pred_type,
        prior_structure=lc.prior_structure,
        prior_precision=prior[0] if len(prior) == 1 else prior,
        covered_params=post.n_params,
        map_network=source,
        map_train_seconds=map_seconds,
    )


def run_mcmc_method(ctx) -> dict:
    """The MCMC reference posterior (``cfg.mcmc``) on a copy of the run's initial network
    (its start with ``mcmc.init = "network"``); its record (``kernel``, ``chains``,
    ``draws_per_chain``, ``warmup_steps``, ``thin``, ``divergences``,
    ``divergence_share``, ``mean_tree_depth``, ``step_size``), predicted by all the kept
    draws."""
    from ..infer.mcmc import run_mcmc

    cfg, art = ctx.cfg, ctx.art
    mc = cfg.mcmc
    seed_everything(cfg.seed)
    train = eval_data(art.split.train, cfg.device)
    model = build_model(copy.deepcopy(ctx.net), cfg.prior, len(art.split.train))
    t0 = time.perf_counter()
    post = run_mcmc(
        model,
        train,
        kernel=mc.kernel,
        num_samples=mc.num_samples,
        warmup_steps=mc.warmup_steps,
        num_chains=mc.num_chains,
        thin=mc.thin,
        seed=cfg.seed,
        init=mc.init,
        init_scale=mc.init_scale,
        target_accept_prob=mc.target_accept_prob,
        max_tree_depth=mc.max_tree_depth,
        step_size=mc.step_size,
        num_steps=mc.num_steps,
        temperature=mc.temperature,
        jit_compile=mc.jit_compile,
        max_params=mc.max_params,
        progress=ctx.progress,
    )
    seconds = time.perf_counter() - t0
    pred = post.predict(art.eval_data, num_samples=None)
    ctx.keep("mcmc", Trained(post, None, None), pred)
    stats = post.sample_stats
    iterations = mc.num_samples * mc.num_chains
    return ctx.record(
        "mcmc",
        pred,
        seconds,
        model.num_weights,
        stored=post.num_params(),
        kernel=mc.kernel,
        chains=post.num_chains,
        draws_per_chain=int(post.draws.shape[1]),
        warmup_steps=mc.warmup_steps,
        thin=mc.thin,
        divergences=int(sum(post.settings["divergences"])),
        divergence_share=sum(post.settings["divergences"]) / iterations,
        mean_tree_depth=float(stats["tree_depth"].float().mean()),
        step_size=[float(v) for v in stats["step_size"][:, -1]],
    )
