"""Inference: the decomposed ELBO, the SVI training loop and its callbacks."""

from .callbacks import Callback, EarlyStopping, History, KLAnnealing
from .elbo import DecomposedELBO, site_kl
from .trainer import TrainState, fit, guide_param_groups

__all__ = [
    "Callback",
    "DecomposedELBO",
    "EarlyStopping",
    "History",
    "KLAnnealing",
    "TrainState",
    "fit",
    "guide_param_groups",
    "site_kl",
]
