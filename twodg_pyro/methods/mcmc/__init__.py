"""The MCMC reference posterior in one place: its settings (:class:`MCMCConfig`), the
potential over the flat weight vector, Pyro's NUTS / HMC recording every iteration
(:func:`run_mcmc`), the chains as a trained method (:class:`MCMCPosterior`) and their
ArviZ tree and convergence report (:mod:`.arviz`).

The names load on first use (PEP 562): the run's settings read :class:`MCMCConfig`
without importing the sampler.
"""

from __future__ import annotations

from ..._lazy import lazy_names

#: exported name -> the module that defines it
_EXPORTS: dict[str, str] = {
    name: f"twodg_pyro.methods.mcmc.{module}"
    for module, names in {
        "settings": ("MCMCConfig", "DEFAULT_MAX_PARAMS"),
        "potential": ("FlatPotential", "flat_potential"),
        "posterior": ("MCMCPosterior",),
        "sampler": ("STAT_NAMES", "TooLargeForMCMCError", "run_mcmc"),
        "arviz": ("mcmc_report", "mcmc_tree", "plot_mcmc_chains", "report_lines"),
    }.items()
    for name in names
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
