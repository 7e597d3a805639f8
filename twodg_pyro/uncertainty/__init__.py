r"""Evaluation where Bayesian networks matter: out-of-distribution detection, distribution
shift and selective prediction.

* :mod:`.scores` -- per-example predictive entropy, mutual information, expected entropy
  and :math:`1 - \max p` from per-draw probabilities ``(S, N, C)``;
* :mod:`.detection` -- AUROC, AUPR and FPR at 95 % TPR with OOD as the positive class;
* :mod:`.selective` -- the risk-coverage curve, AURC and E-AURC;
* :mod:`.ood_sets` -- built-in OOD sets (rotated, flipped, inverted, noise, blobs,
  upsampled digits) and test sets read from local folders, in the normalised input space;
* :mod:`.corruptions` -- seven corruption families at five severities (and CIFAR-10-C);
* :mod:`.draws` -- NLL and OOD AUROC against the number of posterior draws, and the
  fewest draws that keep them within a tolerance of 30 draws;
* :mod:`.calibration` -- post-hoc temperature scaling of a predictive, fitted on held-out
  data;
* :mod:`.report` -- the whole record of a prediction function, a BNN or a plain network;
* :mod:`.plots` -- score histograms and metric-versus-severity figures (imported on
  first use: matplotlib stays out of the start-up of everything that imports this).

Library code: nothing here imports :mod:`twodg_pyro.pipeline`.
"""

from .calibration import apply_temperature, fit_temperature
from .corruptions import CORRUPTIONS, SEVERITIES, SEVERITY_PARAMETERS, corrupt, load_cifar10c
from .detection import fpr_at_tpr, ood_metrics
from .draws import draws_curve, sufficient_draws
from .ood_sets import BUILTIN_OOD_SETS, FOLDER_OOD_SETS, builtin_ood_sets, folder_ood_set
from .report import evaluate_uncertainty, evaluate_uncertainty_net, uncertainty_report
from .scores import (
    expected_entropy,
    max_prob_score,
    mutual_information,
    predictive_entropy,
    uncertainty_scores,
)
from .selective import aurc, optimal_aurc, risk_coverage_curve, selective_metrics

__all__ = [
    "BUILTIN_OOD_SETS",
    "CORRUPTIONS",
    "FOLDER_OOD_SETS",
    "SEVERITIES",
    "SEVERITY_PARAMETERS",
    "apply_temperature",
    "aurc",
    "builtin_ood_sets",
    "corrupt",
    "draws_curve",
    "evaluate_uncertainty",
    "fit_temperature",
    "evaluate_uncertainty_net",
    "expected_entropy",
    "folder_ood_set",
    "fpr_at_tpr",
    "load_cifar10c",
    "max_prob_score",
    "mutual_information",
    "ood_metrics",
    "optimal_aurc",
    "plot_score_histograms",
    "plot_shift",
    "predictive_entropy",
    "risk_coverage_curve",
    "selective_metrics",
    "sufficient_draws",
    "uncertainty_report",
    "uncertainty_scores",
]


def __getattr__(name: str):
    if name in ("plot_score_histograms", "plot_shift"):
        from . import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
