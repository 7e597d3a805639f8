"""The ``laplace`` row: post-hoc Laplace (``cfg.laplace``, laplace-torch) around the run's
deterministic network (the deterministic row's, else one trained as it would be) or, with
``laplace.network = "mean_field"`` / ``"2dg"``, the posterior means of stage 1 / of the
run's 2DG BNN (:func:`~twodg_pyro.methods.fit_laplace`), predicted by ``num_samples``
draws seeded with ``seed``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...data import make_loader
from ...methods import fit_laplace
from .deterministic import map_network
from .mean_field import stage1, trainable_params

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    """Post-hoc Laplace (``cfg.laplace``) around the network ``laplace.network`` names;
    its record (``subset``, ``hessian``, ``pred_type``, ``prior_structure``,
    ``prior_precision``, ``covered_params``, ``map_network``, ``map_train_seconds``).
    Its trainable parameters are those that trained the network (stage 1's guide's
    around its posterior means, the 2DG row's around the 2DG BNN's)."""
    lc = ctx.cfg.laplace
    if lc.network == "mean_field":
        method, map_seconds = stage1(ctx)
        net, source = method.mean_network(), "stage 1's posterior means"
        n_train = trainable_params(method)
    elif lc.network == "2dg":  # the settings ask for the 2dg row, which runs first
        row = next(r for r in ctx.art.records if r["method"] == "2dg")
        net, source = ctx.art.trained["2dg"].mean_network(), "the 2DG BNN's posterior means"
        n_train, map_seconds = row["trainable_params"], row["train_seconds"]
    else:
        net, source, map_seconds = map_network(ctx)
        n_train = None
    loader = make_loader(ctx.art.split.train, lc.batch_size, shuffle=False)
    post, seconds = ctx.timed(fit_laplace, net, loader, lc, progress=ctx.progress)
    n_net = sum(p.numel() for p in net.parameters())
    prior = [float(v) for v in post.prior_precision.tolist()]
    return ctx.finish(
        "laplace",
        post,
        seconds,
        n_net if n_train is None else n_train,
        stored=n_net + post.num_factor_values(),
        **post.settings,
        network=lc.network,
        prior_structure=lc.prior_structure,
        prior_precision=prior[0] if len(prior) == 1 else prior,
        covered_params=post.n_params,
        map_network=source,
        map_train_seconds=map_seconds,
    )
