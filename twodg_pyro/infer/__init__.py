"""Inference: the decomposed ELBO, the SVI training loop, its state, optimiser, callbacks
and checkpoints."""

from .callbacks import Callback, EarlyStopping, KLAnnealing, ScaleTrajectory
from .checkpoint import Checkpoint, CheckpointData, load_checkpoint, restore_state, resume_fit
from .elbo import DecomposedELBO
from .optim import build_optimizer, guide_param_groups, remap_optimizer_rows
from .state import TrainState
from .trainer import TrainingStep, fit

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
    "build_optimizer",
    "fit",
    "guide_param_groups",
    "load_checkpoint",
    "remap_optimizer_rows",
    "restore_state",
    "resume_fit",
]
