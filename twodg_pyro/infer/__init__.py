"""Inference: the decomposed ELBO, the SVI training loop, its state, optimiser, callbacks
and checkpoints, and the curvature that initialises a fit (empirical-Bayes prior scales,
the mean-field scales at their quadratic optimum), a KL temperature tied to the data
size, and the natural-gradient (variational online Newton) optimiser of the mean-field guide."""

from .callbacks import Callback, EarlyStopping, KLAnnealing, ScaleTrajectory
from .checkpoint import Checkpoint, CheckpointData, load_checkpoint, restore_state, resume_fit
from .curvature import curvature_scales, diagonal_fisher, empirical_bayes_scales
from .elbo import DecomposedELBO
from .optim import build_optimizer, guide_param_groups, remap_optimizer_rows
from .state import TrainState
from .temperature import data_size_kl_weight, resolve_kl_weight
from .trainer import TrainingStep, fit
from .von import VariationalOnlineNewton

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointData",
    "DecomposedELBO",
    "EarlyStopping",
    "KLAnnealing",
    "ScaleTrajectory",
    "TrainState",
    "TrainingStep",
    "VariationalOnlineNewton",
    "build_optimizer",
    "curvature_scales",
    "data_size_kl_weight",
    "diagonal_fisher",
    "empirical_bayes_scales",
    "fit",
    "guide_param_groups",
    "load_checkpoint",
    "remap_optimizer_rows",
    "resolve_kl_weight",
    "restore_state",
    "resume_fit",
]
