"""Diagnostics of a trained BNN: ArviZ export, VI diagnostics (Pareto k-hat, PSIS-LOO),
posterior summaries, and figures.

Every ArviZ call lives in :mod:`twodg_pyro.diagnostics.arviz_export`; the figures in
:mod:`twodg_pyro.diagnostics.plots` use matplotlib only (Agg canvas, PNG files).
"""

from .arviz_export import (
    NETCDF_ENGINE,
    class_probabilities,
    guide_log_q,
    load_inference_data,
    loo,
    save_inference_data,
    summary,
    to_inference_data,
    vi_diagnostics,
)
from .plots import plot_elbo_terms, plot_merges, plot_reliability, plot_sharing_plane

__all__ = [
    "NETCDF_ENGINE",
    "class_probabilities",
    "guide_log_q",
    "load_inference_data",
    "loo",
    "plot_elbo_terms",
    "plot_merges",
    "plot_reliability",
    "plot_sharing_plane",
    "save_inference_data",
    "summary",
    "to_inference_data",
    "vi_diagnostics",
]
