"""Non-Bayesian and post-hoc baselines the BNNs are compared with: the deterministic
network (also trained for the Bayesian pipeline's epochs with early stopping), deep
ensembles, post-hoc Laplace (laplace-torch, optional) and the INT8-quantised mean-field
BNN."""

from .deterministic import train_deterministic
from .draws import DrawBaseline, draw_probs
from .early_stopping import train_early_stopped
from .ensemble import Ensemble, train_ensemble
from .laplace import LaplacePosterior
from .laplace_fit import MissingLaplaceError, fit_laplace
from .quantized import dequantize, quantize_mean_field, quantized_size_mb

__all__ = [
    "DrawBaseline",
    "Ensemble",
    "LaplacePosterior",
    "MissingLaplaceError",
    "dequantize",
    "draw_probs",
    "fit_laplace",
    "quantize_mean_field",
    "quantized_size_mb",
    "train_deterministic",
    "train_early_stopped",
    "train_ensemble",
]
