"""The ``laplace`` row: post-hoc Laplace (``cfg.laplace``, laplace-torch) on the run's
deterministic network (the deterministic row's, else one trained as it would be;
:func:`~twodg_pyro.methods.fit_laplace`), predicted by ``num_samples`` draws seeded with
``seed``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...data import make_loader
from ...methods import fit_laplace
from .deterministic import map_network

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    """Post-hoc Laplace (``cfg.laplace``) on the run's deterministic network; its record
    (``subset``, ``hessian``, ``pred_type``, ``prior_structure``, ``prior_precision``,
    ``covered_params``, ``map_network``, ``map_train_seconds``)."""
    lc = ctx.cfg.laplace
    net, source, map_seconds = map_network(ctx)
    loader = make_loader(ctx.art.split.train, lc.batch_size, shuffle=False)
    post, seconds = ctx.timed(fit_laplace, net, loader, lc, progress=ctx.progress)
    n_net = sum(p.numel() for p in net.parameters())
    prior = [float(v) for v in post.prior_precision.tolist()]
    return ctx.finish(
        "laplace",
        post,
        seconds,
        n_net,
        stored=n_net + post.num_factor_values(),
        **post.settings,
        prior_structure=lc.prior_structure,
        prior_precision=prior[0] if len(prior) == 1 else prior,
        covered_params=post.n_params,
        map_network=source,
        map_train_seconds=map_seconds,
    )
