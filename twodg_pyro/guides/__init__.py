"""Variational families (guides) over the sample sites of a :class:`~twodg_pyro.model.BNNModel`."""

from .base import BNNGuide, GuideDraw, NoSiteDensityError
from .mean_field import MeanFieldGuide, paper_initial_scales
from .rank1 import CauchyPrior, Rank1BNNModel, Rank1Guide, rank1_prior
from .shared_gmm import TYINGS, SharedGMMGuide
from .ssvi import SSVIGuide, SubspaceUpdate

__all__ = [
    "BNNGuide",
    "CauchyPrior",
    "GuideDraw",
    "MeanFieldGuide",
    "NoSiteDensityError",
    "Rank1BNNModel",
    "Rank1Guide",
    "SSVIGuide",
    "SharedGMMGuide",
    "SubspaceUpdate",
    "TYINGS",
    "paper_initial_scales",
    "rank1_prior",
]
