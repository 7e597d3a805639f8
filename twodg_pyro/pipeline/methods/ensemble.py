"""The ``ensemble`` row: ``ensemble.members`` deterministic networks, member ``m``
initialised and shuffled with seed ``seed + m`` (:class:`~twodg_pyro.methods.Ensemble`;
member 0 is the deterministic row's network)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...methods import train_ensemble
from ...metrics import classification_metrics
from ..settings.build import build_net, seed_everything
from .deterministic import recipe
from .deterministic_matched import fresh_loader

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    """A deep ensemble of ``cfg.ensemble.members`` networks; its record (``members``,
    ``epochs``, each member's ``member_accuracy`` and ``member_nll``)."""
    cfg, art = ctx.cfg, ctx.art
    ec = cfg.ensemble
    epochs = ec.epochs if ec.epochs is not None else cfg.stage1.deterministic_epochs

    def make_member(m: int):
        seed_everything(cfg.seed + m)
        net = build_net(cfg.network, art.split).to(cfg.device)
        return net, fresh_loader(ctx, cfg.seed + m)

    lr = cfg.stage1.deterministic_lr
    ensemble, seconds = ctx.timed(
        train_ensemble, make_member, ec.members, epochs, lr, **recipe(ctx)
    )
    pred = ctx.predict(ensemble, keep_samples=True)
    members = [classification_metrics(p, pred.targets) for p in pred.samples]
    ctx.keep("ensemble", ensemble, pred)
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
