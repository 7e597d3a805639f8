"""The ``laplace`` row: post-hoc Laplace (``cfg.laplace``, laplace-torch) around the run's
deterministic network (the deterministic row's, else one trained as it would be) or, with
``laplace.network = "mean_field"``, stage 1's posterior means
(:func:`~twodg_pyro.methods.fit_laplace`), predicted by ``num_samples`` draws seeded with
``seed``."""

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
    around the posterior means)."""
    lc = ctx.cfg.laplace
    if lc.network == "mean_field":
        method, map_seconds = stage1(ctx)
        net, source = method.mean_network(), "stage 1's posterior means"
        n_train = trainable_params(method)
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
