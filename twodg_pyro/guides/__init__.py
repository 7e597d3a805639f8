"""Variational families (guides) over the sample sites of a :class:`~twodg_pyro.bnn.BNNModel`.

Every guide is a :class:`~twodg_pyro.guide.BNNGuide` (the protocol, stated in
:mod:`twodg_pyro.guide`): mean-field, the shared-GMM guide of stage 3 with its three
tyings (:mod:`.tyings`), rank-1 and SSVI.
"""

from ..guide import BNNGuide, GuideSample, MarginalDensity, NoSiteDensityError
from .base import GuideDraw
from .mean_field import MeanFieldGuide, paper_initial_scales
from .pruning import prune_guide
from .rank1 import CauchyPrior, Rank1BNNModel, Rank1Guide, rank1_prior
from .shared_gmm import SharedGMMGuide
from .ssvi import SSVIGuide
from .ssvi_subspace import SubspaceUpdate
from .tyings import TYINGS, Representative, Stochastic, Tied, Tying, TyingName, tying_named

__all__ = [
    "BNNGuide",
    "CauchyPrior",
    "GuideDraw",
    "GuideSample",
    "MarginalDensity",
    "MeanFieldGuide",
    "NoSiteDensityError",
    "Rank1BNNModel",
    "Rank1Guide",
    "Representative",
    "SSVIGuide",
    "SharedGMMGuide",
    "Stochastic",
    "SubspaceUpdate",
    "TYINGS",
    "Tied",
    "Tying",
    "TyingName",
    "paper_initial_scales",
    "prune_guide",
    "rank1_prior",
    "tying_named",
]
