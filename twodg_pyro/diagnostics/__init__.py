"""Diagnostics of a trained BNN: the ArviZ export (:mod:`.arviz_export`: InferenceData,
PSIS-LOO, model comparison, posterior summaries), the VI diagnostics (:mod:`.vi`: Pareto
k-hat of the importance ratios), and figures (:mod:`.plots`).

Every ArviZ call lives in :mod:`twodg_pyro.diagnostics.arviz_export` (the export) and
:mod:`twodg_pyro.diagnostics.arviz_stats` (PSIS-LOO, comparison, summaries, files); the figures in
:mod:`twodg_pyro.diagnostics.plots` use matplotlib only (Agg canvas, PNG files); the
guides' marginal densities that the k-hat needs are in
:mod:`twodg_pyro.guides.marginal_density`.
"""

from ..guides.marginal_density import guide_log_q
from .arviz_export import (
    DEFAULT_MAX_SITE_VALUES,
    method_of,
    site_dims,
    thinned_coordinates,
    to_inference_data,
)
from .arviz_stats import (
    NETCDF_ENGINE,
    class_probabilities,
    compare,
    load_inference_data,
    loo,
    save_inference_data,
    summary,
)
from .plots import plot_elbo_terms, plot_merges, plot_reliability, plot_sharing_plane
from .vi import log_prior, vi_diagnostics

__all__ = [
    "DEFAULT_MAX_SITE_VALUES",
    "NETCDF_ENGINE",
    "class_probabilities",
    "compare",
    "guide_log_q",
    "load_inference_data",
    "log_prior",
    "loo",
    "method_of",
    "plot_elbo_terms",
    "plot_merges",
    "plot_reliability",
    "plot_sharing_plane",
    "save_inference_data",
    "site_dims",
    "summary",
    "thinned_coordinates",
    "to_inference_data",
    "vi_diagnostics",
]
