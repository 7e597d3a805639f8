"""Variational families (guides) over the sample sites of a :class:`~twodg_pyro.model.BNNModel`."""

from .mean_field import MeanFieldGuide, paper_initial_scales

__all__ = ["MeanFieldGuide", "paper_initial_scales"]
