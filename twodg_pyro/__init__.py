"""twodg_pyro: stochastic weight-sharing Bayesian neural networks in Pyro."""

__version__ = "0.1.0"
