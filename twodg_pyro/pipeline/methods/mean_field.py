"""The ``mean_field`` row: stage 1 of Algorithm 1
(:func:`~twodg_pyro.pipeline.methods.algorithm1.stage1_mean_field`), trained once per run
(:func:`stage1`) for every method that builds on it, and whether its scales settled."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

from ...methods import GuidePosterior
from ..outputs.results import kl_weight_field
from ..settings.build import seed_everything
from .algorithm1 import stage1_mean_field
from .deterministic import initial_network

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def stage1(ctx: RunContext) -> tuple[GuidePosterior, float]:
    """Stage 1's mean-field BNN, trained once per run on first request (from the
    pretrained network, :func:`~.deterministic.initial_network`), and its seconds; kept
    in ``ctx.art.trained["mean_field"]``."""
    if ctx.stage1 is None:
        net = initial_network(ctx)
        seed_everything(ctx.cfg.seed)
        # the live list of records: checkpoints see new rows
        extra = {"records": ctx.art.records}
        ctx.stage1 = ctx.timed(stage1_mean_field, ctx, ctx.art.split, copy.deepcopy(net), extra)
        ctx.art.trained["mean_field"] = ctx.stage1[0]
    return ctx.stage1


def run(ctx: RunContext) -> dict | None:
    """Stage 1's mean-field BNN (its record was restored when resuming from stage 3)."""
    method, seconds = stage1(ctx)
    if ctx.resume_from == "stage3":
        return None
    model, state = method.model, method.state
    return ctx.finish(
        "mean_field",
        method,
        seconds,
        trainable_params(method),
        state=state,
        scale_trajectory=scale_trajectory(state.history),
        scale_convergence=scale_convergence(state.history),
        trainer=ctx.cfg.stage1.trainer,
        **kl_weight_field(ctx.kl_weight("stage1", model)),
    )


def trainable_params(method: GuidePosterior) -> int:
    """Stage 1's trainable parameters: 2 per Bayesian weight and the deterministic ones."""
    deterministic = sum(p.numel() for p in method.model.deterministic_parameters())
    return method.guide.num_trainable() + deterministic


_TRAJECTORY_KEYS = (
    "loss",
    "kl",
    "nll",
    "sigma_median",
    "sigma_ratio_median",
    "sigma_over_spread",
    "sigma_median_by_site",
)


def scale_trajectory(history: list[dict], points: int = 11) -> list[dict]:
    """About ``points`` evenly spaced epochs of a fit's history (always the last), each
    with its ELBO terms and the scales' summary of
    :class:`~twodg_pyro.infer.ScaleTrajectory`: whether the fit converged, in a few
    numbers."""
    if not history:
        return []
    step = max(1, len(history) // max(1, points - 1))
    picked = sorted({*range(0, len(history), step), len(history) - 1})
    return [
        {
            "epoch": history[i].get("epoch", i),
            **{k: history[i][k] for k in _TRAJECTORY_KEYS if k in history[i]},
        }
        for i in picked
    ]


def scale_convergence(history: list[dict], tail: float = 0.1, tol: float = 0.02) -> dict | None:
    r"""Whether a fit's scales settled: the relative change of the median scale over the
    last ``tail`` of its epochs (at least one epoch),
    :math:`|\tilde\sigma_{E} / \tilde\sigma_{E - \lceil tail\,E \rceil} - 1|`, and
    ``converged`` when it is below ``tol``; ``None`` for a history without scales.

    Where the records hold each site's median (``sigma_median_by_site``,
    :class:`~twodg_pyro.infer.ScaleTrajectory`), the same change per site is reported
    too: the largest, ``site_scale_change``, and its ``site`` (information beside
    ``converged``, which a one-weight site's noise alone would otherwise decide)."""
    scales = [h.get("sigma_median") for h in history]
    if len(scales) < 2 or any(v is None for v in scales):
        return None
    back = max(1, math.ceil(tail * len(scales)))
    out = {
        "median_scale_change": _change(scales[-1 - back], scales[-1]),
        "over_epochs": back,
        "tolerance": tol,
    }
    out["converged"] = bool(out["median_scale_change"] < tol)
    first, last = (history[i].get("sigma_median_by_site") for i in (-1 - back, -1))
    if first and last:
        out["site"], out["site_scale_change"] = largest_site_change(first, last)
    return out


def largest_site_change(first: dict[str, float], last: dict[str, float]) -> tuple[str, float]:
    """The site whose median scale changed most from ``first`` to ``last`` (``{site:
    median scale}``, e.g. :func:`~twodg_pyro.infer.callbacks.site_median_scales` at two
    epochs) and that relative change."""
    changes = {k: _change(first[k], v) for k, v in last.items() if k in first}
    site = max(changes, key=changes.get)
    return site, changes[site]


def _change(start: float, end: float) -> float:
    return abs(end / start - 1.0) if start > 0 else math.inf
