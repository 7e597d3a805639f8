"""Inference: the decomposed ELBO, the SVI training loop and its callbacks."""

from .callbacks import Callback, EarlyStopping, History, KLAnnealing
from .elbo import DecomposedELBO, site_kl
from .trainer import TrainState, fit

__all__ = [
    "Callback",
    "DecomposedELBO",
    "EarlyStopping",
    "History",
    "KLAnnealing",
    "TrainState",
    "fit",
    "site_kl",
]
