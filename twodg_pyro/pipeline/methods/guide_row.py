"""A guide trained by SVI as a row of the results table, the way the other systems of the
source material train (:mod:`.rank1`, :mod:`.ssvi`): the same network, data, loop and
metrics as the mean-field and 2DG rows, and a record of the same ``results.json``
schema: ``method``, ``accuracy``, ``nll``, ``ece``, ``brier``, ``trainable_params``
(guide parameters plus the network's deterministic ones), ``stored_params`` (the
floating-point numbers a model file keeps for prediction: the same), ``size_mb`` (those
at float32, in :math:`10^6` bytes) and ``train_seconds``, plus the method's own fields.
"""

from __future__ import annotations

from collections.abc import Callable

from ...infer import DecomposedELBO, fit
from ...methods import GuidePosterior


def train_and_record(
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
    state, seconds = ctx.timed(
        fit,
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
    n_guide = guide.num_trainable()
    n_det = sum(p.numel() for p in model.deterministic_parameters())
    return ctx.finish(
        method,
        GuidePosterior(model, guide, method, state),
        seconds,
        n_guide + n_det,
        state=state,
        guide_trainable_params=n_guide,
        **extra(n_guide, n_det),
    )
