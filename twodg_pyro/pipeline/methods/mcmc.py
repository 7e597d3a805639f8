"""The ``mcmc`` row: the reference posterior, Pyro's NUTS (or HMC) on the run's network,
prior and likelihood over the whole training set (:func:`~twodg_pyro.methods.run_mcmc`
with the run's ``[mcmc]`` settings), predicted by all its kept draws."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from ...methods import run_mcmc
from ..settings.build import build_model, eval_data, seed_everything

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    """The MCMC reference posterior (``cfg.mcmc``) on a copy of the run's initial network
    (its start with ``mcmc.init = "network"``); its record (``kernel``, ``chains``,
    ``draws_per_chain``, ``warmup_steps``, ``thin``, ``divergences``,
    ``divergence_share``, ``mean_tree_depth``, ``step_size``)."""
    cfg, art = ctx.cfg, ctx.art
    mc = cfg.mcmc
    seed_everything(cfg.seed)
    train = eval_data(art.split.train, cfg.device)
    model = build_model(copy.deepcopy(ctx.net), cfg.prior, len(art.split.train))
    post, seconds = ctx.timed(run_mcmc, model, train, mc, seed=cfg.seed, progress=ctx.progress)
    stats = post.sample_stats
    divergences = sum(post.settings["divergences"])
    return ctx.finish(
        "mcmc",
        post,
        seconds,
        model.num_weights,
        stored=post.num_params(),
        kernel=mc.kernel,
        chains=post.num_chains,
        draws_per_chain=int(post.draws.shape[1]),
        warmup_steps=mc.warmup_steps,
        thin=mc.thin,
        divergences=int(divergences),
        divergence_share=divergences / (mc.num_samples * mc.num_chains),
        mean_tree_depth=float(stats["tree_depth"].float().mean()),
        step_size=[float(v) for v in stats["step_size"][:, -1]],
    )
