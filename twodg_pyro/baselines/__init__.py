"""Non-Bayesian and post-hoc baselines the BNNs are compared with."""

from .deterministic import train_deterministic
from .quantized import dequantize, quantize_mean_field, quantized_size_mb

__all__ = ["dequantize", "quantize_mean_field", "quantized_size_mb", "train_deterministic"]
