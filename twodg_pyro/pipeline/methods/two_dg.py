"""The ``2dg`` row: stages 2-3 of Algorithm 1
(:func:`~twodg_pyro.pipeline.methods.algorithm1.run_2dg`) on the mean-field BNN that
stage 1 returns (:func:`~twodg_pyro.pipeline.methods.mean_field.stage1`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .algorithm1 import run_2dg
from .mean_field import stage1

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def run(ctx: RunContext) -> dict:
    """The 2DG BNN's record; its trained method is ``ctx.art.trained["2dg"]``."""
    return run_2dg(ctx, ctx.art.split, stage1(ctx)[0], ctx.art.eval_data)
