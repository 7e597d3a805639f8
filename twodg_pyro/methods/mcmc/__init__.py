"""The MCMC reference posterior in one place: its settings (:class:`MCMCConfig`), the
potential over the flat weight vector, Pyro's NUTS / HMC recording every iteration
(:func:`run_mcmc`), the chains as a trained method (:class:`MCMCPosterior`) and their
ArviZ tree and convergence report (:mod:`.arviz`).

The names load on first use (PEP 562): the run's settings read :class:`MCMCConfig`
without importing the sampler.
"""

from __future__ import annotations

from ..._lazy import lazy_names

_M = "twodg_pyro.methods.mcmc."
#: exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "MCMCConfig": _M + "settings",
    "DEFAULT_MAX_PARAMS": _M + "settings",
    "FlatPotential": _M + "potential",
    "flat_potential": _M + "potential",
    "MCMCPosterior": _M + "posterior",
    "STAT_NAMES": _M + "sampler",
    "TooLargeForMCMCError": _M + "sampler",
    "run_mcmc": _M + "sampler",
    "mcmc_report": _M + "arviz",
    "mcmc_tree": _M + "arviz",
    "plot_mcmc_chains": _M + "arviz",
    "report_lines": _M + "arviz",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
