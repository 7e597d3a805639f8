"""Variational families (guides) over the sample sites of a :class:`~twodg_pyro.model.BNNModel`."""

from .mean_field import MeanFieldGuide, paper_initial_scales
from .shared_gmm import TYINGS, SharedGMMGuide

__all__ = ["MeanFieldGuide", "SharedGMMGuide", "TYINGS", "paper_initial_scales"]
