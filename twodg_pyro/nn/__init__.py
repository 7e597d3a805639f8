"""Turning a torch network into a set of Bayesian sample sites."""

from .norm_stats import recompute_norm_stats
from .sites import DEFAULT_LAYER_TYPES, BayesianSite, find_sites

__all__ = ["BayesianSite", "DEFAULT_LAYER_TYPES", "find_sites", "recompute_norm_stats"]
