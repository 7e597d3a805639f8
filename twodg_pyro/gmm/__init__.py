"""Pure-tensor 2-D Gaussian mixture machinery for 2DGBNN (Stage 1 steps 4-5, Stage 2).

* :mod:`.linalg2x2` - closed-form 2x2 SPD algebra and validation;
* :mod:`.mixture` - :class:`GaussianMixture2D`, (mini-batch) EM for millions of points;
* :mod:`.em` - its fit: full-data and online EM;
* :mod:`.initial` - its initialisation: k-means++ seeding and Lloyd iterations;
* :mod:`.wasserstein` - closed-form 2-Wasserstein distances;
* :mod:`.merging` - the paper's and the moment-matching merge, merged to a fixed point;
* :mod:`.mahalanobis` - Mahalanobis check and alpha-blending of ellipse points.
"""

from .initial import kmeans_plusplus, lloyd, nearest_centre
from .linalg2x2 import (
    check_spd,
    cholesky2x2,
    det2x2,
    eigvalsh2x2,
    inv2x2,
    logdet2x2,
    sqrtm2x2,
    trace2x2,
)
from .mahalanobis import (
    CHI2_2DOF_95,
    EllipseAssignment,
    ellipse_assign,
    gaussian_log_prob,
    mahalanobis_squared,
    mahalanobis_squared_own,
)
from .merging import MergeResult, merge_components, merge_moment, merge_paper, remap_assignments
from .mixture import GaussianMixture2D, NotFittedError, as_points
from .wasserstein import pairwise_w2_squared, w2_squared

__all__ = [
    "CHI2_2DOF_95",
    "EllipseAssignment",
    "GaussianMixture2D",
    "MergeResult",
    "NotFittedError",
    "as_points",
    "check_spd",
    "cholesky2x2",
    "det2x2",
    "eigvalsh2x2",
    "ellipse_assign",
    "gaussian_log_prob",
    "inv2x2",
    "kmeans_plusplus",
    "lloyd",
    "logdet2x2",
    "mahalanobis_squared",
    "mahalanobis_squared_own",
    "merge_components",
    "merge_moment",
    "merge_paper",
    "nearest_centre",
    "pairwise_w2_squared",
    "remap_assignments",
    "sqrtm2x2",
    "trace2x2",
    "w2_squared",
]
