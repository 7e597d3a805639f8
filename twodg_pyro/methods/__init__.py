"""The trained methods of the results table, each one :class:`TrainedMethod` (the protocol,
:mod:`.base`): a model and its guide (:class:`GuidePosterior`: mean-field, 2DG, rank-1,
SSVI), a network (:class:`Network`), a deep ensemble (:class:`Ensemble`), post-hoc
Laplace (:class:`LaplacePosterior`, fitted with laplace-torch by :func:`fit_laplace`) and
the MCMC reference posterior (:mod:`.mcmc`); any of their files reads back with
:func:`load_method`.

The names load on first use (PEP 562): the run's settings import the methods' settings
sections (``twodg_pyro.methods.mcmc.settings``) without the methods.
"""

from __future__ import annotations

from .._lazy import lazy_names

_M = "twodg_pyro.methods."
#: exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "TrainedMethod": _M + "base",
    "GuidePosterior": _M + "posterior",
    "Network": _M + "network",
    "Ensemble": _M + "ensemble",
    "train_ensemble": _M + "ensemble",
    "LaplacePosterior": _M + "laplace",
    "fit_laplace": _M + "laplace_fit",
    "with_feature_residual": _M + "laplace_fit",
    "FeatureResidual": _M + "feature_residual",
    "MissingLaplaceError": _M + "laplace_fit",
    "MCMCPosterior": _M + "mcmc.posterior",
    "MCMCConfig": _M + "mcmc.settings",
    "run_mcmc": _M + "mcmc.sampler",
    "load_method": _M + "files",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
