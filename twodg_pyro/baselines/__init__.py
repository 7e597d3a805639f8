"""Training the non-Bayesian baselines the BNNs are compared with: the deterministic
network (also trained for the Bayesian pipeline's epochs with early stopping) and the
INT8-quantised mean-field BNN.  The trained baselines themselves (a network, a deep
ensemble, post-hoc Laplace, MCMC) are trained methods: :mod:`twodg_pyro.methods`."""

from .deterministic import train_deterministic
from .early_stopping import train_early_stopped
from .quantized import dequantize, quantize_mean_field, quantized_size_mb

__all__ = [
    "dequantize",
    "quantize_mean_field",
    "quantized_size_mb",
    "train_deterministic",
    "train_early_stopped",
]
