r"""Diagnostics of a trained BNN, on ArviZ 1.x (an ``xarray.DataTree``) or 0.x (an
``InferenceData``), whichever is installed (:mod:`._arviz` is the only module that
knows which):

* the export (:mod:`.arviz_export`: posterior, predictive, log-likelihood, observed and
  constant data, ``sample_stats`` with ``log_p`` and ``log_q`` of every draw, the 2DG
  sharing structure as a group of its own);
* ArviZ's statistics of it (:mod:`.arviz_stats`: PSIS-LOO with :math:`\hat k` per
  observation, comparison with stable stacking weights, summaries, files);
* the VI diagnostics (:mod:`.vi`: Pareto :math:`\hat k` of :math:`p/q` over all weights;
  :mod:`.blocks`: per layer, the outliers, each mixture component);
* figures: ArviZ's (:mod:`.posterior_plots`: forest of the components, pair plot of
  weights, PPC of the class frequencies) and the library's own (:mod:`.plots`).

The guides' marginal densities that :math:`\log q` needs are in
:mod:`twodg_pyro.guides.marginal_density`.
"""

from ..guides.marginal_density import guide_log_q
from ._arviz import ARVIZ_MAJOR, ARVIZ_VERSION, DATATREE, group, group_names, loo_data, summary
from ._draws import log_prior
from .arviz_export import (
    DEFAULT_MAX_SITE_VALUES,
    SHARING_GROUP,
    method_of,
    site_dims,
    thinned_coordinates,
    to_datatree,
    to_inference_data,
)
from .arviz_stats import (
    NETCDF_ENGINE,
    class_probabilities,
    compare,
    khat_threshold,
    load_inference_data,
    loo,
    save_inference_data,
    stacking_weights,
)
from .blocks import Block, block_khat, default_blocks
from .plots import plot_elbo_terms, plot_merges, plot_reliability, plot_sharing_plane
from .posterior_plots import plot_class_ppc, plot_component_forest, plot_weight_pairs
from .vi import khat_assessment, vi_diagnostics

__all__ = [
    "ARVIZ_MAJOR",
    "ARVIZ_VERSION",
    "Block",
    "DATATREE",
    "DEFAULT_MAX_SITE_VALUES",
    "NETCDF_ENGINE",
    "SHARING_GROUP",
    "block_khat",
    "class_probabilities",
    "compare",
    "default_blocks",
    "group",
    "group_names",
    "guide_log_q",
    "khat_assessment",
    "khat_threshold",
    "load_inference_data",
    "log_prior",
    "loo",
    "loo_data",
    "method_of",
    "plot_class_ppc",
    "plot_component_forest",
    "plot_elbo_terms",
    "plot_merges",
    "plot_reliability",
    "plot_sharing_plane",
    "plot_weight_pairs",
    "save_inference_data",
    "site_dims",
    "stacking_weights",
    "summary",
    "thinned_coordinates",
    "to_datatree",
    "to_inference_data",
    "vi_diagnostics",
]
