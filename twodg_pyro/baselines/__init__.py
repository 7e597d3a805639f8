"""Non-Bayesian and post-hoc baselines the BNNs are compared with."""

from .deterministic import train_deterministic

__all__ = ["train_deterministic"]
