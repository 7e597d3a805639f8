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
  predicted by ``num_samples`` draws seeded with ``seed``.

Every record has ``method``, ``accuracy``, ``nll``, ``ece``, ``brier``,
``trainable_params``, ``stored_params`` (floating-point numbers kept for prediction),
``size_mb`` (``stored_params`` at float32) and ``train_seconds``, plus the method's own
fields.  The trained objects are in ``art.trained[method]`` (a
:class:`~twodg_pyro.pipeline.trained.Trained` whose ``model`` is the object and ``guide``
``None``), their predictions in ``art.predictions[method]``;
:func:`method_probs` gives any method's per-draw probabilities on other inputs.
:func:`write_baseline_files` writes their model files
(:func:`~twodg_pyro.io.save_baseline`), which ``twodg-pyro evaluate`` reads.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..baselines import draw_probs, fit_laplace, train_early_stopped, train_ensemble
from ..data import make_loader
from ..evaluation import seeded_predict
from ..metrics import classification_metrics
from ..prediction import Prediction, deterministic_predict
from .alternatives import size_mb
from .artifacts import model_evaluation, model_file_name, network_spec
from .builders import build_net, eval_data, seed_everything, train_loader
from .diagnostics_steps import StepWriter
from .results import evaluation_of
from .trained import Trained

if TYPE_CHECKING:
    from .context import RunContext

__all__ = [
    "BASELINE_METHODS",
    "matched_epochs",
    "method_probs",
    "run_deterministic_matched",
    "run_ensemble",
    "run_laplace",
    "write_baseline_files",
]

#: The baselines that get a model file (``model_<method>.pt``), in registry order.
BASELINE_METHODS = ("deterministic_matched", "ensemble", "laplace")


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
    loader = train_loader(ctx.art.split, ctx.cfg.data, seed)
    return ctx.execution.shard(loader, seed)


def _trainer(ctx, recipe: dict) -> dict:
    cfg = ctx.cfg
    return {
        "train": ctx.execution.train_deterministic,
        "device": cfg.device,
        "progress": ctx.progress,
        **recipe,
    }


def _keep(ctx, method: str, obj, pred: Prediction) -> dict:
    """Keep ``obj`` and its prediction in the run's artifacts; the metrics."""
    ctx.art.trained[method] = Trained(obj, None, None)
    ctx.art.predictions[method] = Prediction(mean=pred.mean, targets=pred.targets)
    return classification_metrics(pred.mean, pred.targets)


def _val_data(split, device):
    """The validation examples on ``device`` (``None`` without a validation split)."""
    val = split.val
    if val is None or len(val) == 0:
        return None
    return eval_data(val, device)


def run_deterministic_matched(ctx: RunContext, recipe: dict) -> dict:
    """The deterministic network trained for :func:`matched_epochs`, early-stopped on the
    validation NLL (``cfg.deterministic_matched``); its record (``epochs``,
    ``epochs_trained``, ``best_epoch``, ``best_val_nll``, ``validation``, ``patience``)."""
    cfg, art = ctx.cfg, ctx.art
    epochs = matched_epochs(cfg)
    seed_everything(cfg.seed)
    net = copy.deepcopy(ctx.net)
    t0 = time.perf_counter()
    net, report = train_early_stopped(
        net,
        _fresh_loader(ctx, cfg.seed),
        _val_data(art.split, cfg.device),
        epochs,
        cfg.stage1.deterministic_lr,
        patience=cfg.deterministic_matched.patience,
        **_trainer(ctx, recipe),
    )
    seconds = time.perf_counter() - t0
    pred = ctx.execution.predict(lambda d: deterministic_predict(net, d), art.eval_data, cfg.device)
    metrics = _keep(ctx, "deterministic_matched", net, pred)
    n = sum(p.numel() for p in net.parameters())
    return {
        "method": "deterministic_matched",
        **metrics,
        "trainable_params": n,
        "stored_params": n,
        "size_mb": size_mb(n),
        "epochs": report["epochs"],
        "epochs_trained": report["epochs_trained"],
        "best_epoch": report["best_epoch"],
        "best_val_nll": report["best_val_nll"],
        "validation": report["validation"],
        "patience": cfg.deterministic_matched.patience,
        "train_seconds": seconds,
        **ctx.execution.record_fields(),
    }


def run_ensemble(ctx: RunContext, recipe: dict) -> dict:
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
        make_member, ec.members, epochs, cfg.stage1.deterministic_lr, **_trainer(ctx, recipe)
    )
    seconds = time.perf_counter() - t0
    pred = ensemble.predict(art.eval_data, keep_samples=True)
    members = [classification_metrics(p, pred.targets) for p in pred.samples]
    metrics = _keep(ctx, "ensemble", ensemble, pred)
    n = ensemble.num_params()
    return {
        "method": "ensemble",
        **metrics,
        "trainable_params": n,
        "stored_params": n,
        "size_mb": size_mb(n),
        "members": ensemble.num_members,
        "epochs": int(epochs),
        "member_accuracy": [m["accuracy"] for m in members],
        "member_nll": [m["nll"] for m in members],
        "train_seconds": seconds,
        **ctx.execution.record_fields(),
    }


def _map_network(ctx, recipe: dict):
    """``(network, source, seconds)``: the deterministic row's network, else one trained
    as it would be (its initialisation, a fresh loader of the run's seed, its epochs)."""
    cfg = ctx.cfg
    epochs = cfg.stage1.deterministic_epochs
    if ctx.deterministic is not None and ctx.deterministic[1] == epochs:
        return copy.deepcopy(ctx.deterministic[0]), "the deterministic row", 0.0
    seed_everything(cfg.seed)
    net = copy.deepcopy(ctx.net)
    t0 = time.perf_counter()
    trainer = _trainer(ctx, recipe)
    train = trainer.pop("train")
    train(net, _fresh_loader(ctx, cfg.seed), epochs, cfg.stage1.deterministic_lr, **trainer)
    return net, "trained for laplace as the deterministic row", time.perf_counter() - t0


def run_laplace(ctx: RunContext, recipe: dict) -> dict:
    """Post-hoc Laplace (``cfg.laplace``) on the run's deterministic network; its record
    (``subset``, ``hessian``, ``pred_type``, ``prior_structure``, ``prior_precision``,
    ``covered_params``, ``map_network``, ``map_train_seconds``)."""
    cfg, art = ctx.cfg, ctx.art
    lc = cfg.laplace
    net, source, map_seconds = _map_network(ctx, recipe)
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
    metrics = _keep(ctx, "laplace", post, pred)
    n_net = sum(p.numel() for p in net.parameters())
    stored = n_net + post.num_factor_values()
    prior = [float(v) for v in post.prior_precision.tolist()]
    return {
        "method": "laplace",
        **metrics,
        "trainable_params": n_net,
        "stored_params": stored,
        "size_mb": size_mb(stored),
        "subset": lc.subset,
        "hessian": lc.hessian,
        "pred_type": lc.pred_type,
        "prior_structure": lc.prior_structure,
        "prior_precision": prior[0] if len(prior) == 1 else prior,
        "covered_params": post.n_params,
        "map_network": source,
        "map_train_seconds": map_seconds,
        "train_seconds": seconds,
        **ctx.execution.record_fields(),
    }


def _draws_of(method: str, obj, draws: dict) -> dict:
    """The evaluation draws of a baseline: an ensemble's ``M`` members, a network's one
    forward pass, Laplace's ``num_samples`` seeded draws."""
    if method == "ensemble":
        return {**draws, "num_samples": int(obj.num_members)}
    if method == "deterministic_matched":
        return {**draws, "num_samples": 1}
    return draws


def write_baseline_files(art, cfg, out_dir) -> dict:
    """Write ``model_<method>.pt`` for every baseline of :data:`BASELINE_METHODS` the run
    trained, with its network spec and ``evaluation`` record (``twodg-pyro evaluate``
    takes its defaults from it).  A file that cannot be written is reported (a warning
    and an ``errors`` entry), the others are still written.

    Returns ``{"files": {name: path}, "errors": {name: message}}``.
    """
    from ..io import save_baseline

    out = Path(out_dir)
    writer = StepWriter(out)
    entries = {m: art.trained[m] for m in BASELINE_METHODS if m in art.trained}
    if entries:
        records = {r.get("method"): r for r in art.records}
        spec = network_spec(cfg.network, art.split)
        draws = evaluation_of(cfg, art.eval_data)
        for method, entry in entries.items():
            evaluation = model_evaluation(
                cfg, method, records.get(method), _draws_of(method, entry.model, draws)
            )

            def save(method=method, obj=entry.model, evaluation=evaluation):
                path = out / model_file_name(method)
                return save_baseline(path, obj, network=spec, evaluation=evaluation, method=method)

            writer.step(f"model_{method}", save)
    writer.close()
    return writer.record()
