"""Weight sharing: outliers, the sharing structure, its construction and refinement, and
the stage-3 refinement hooks that apply it to a trained guide; the method's settings,
:class:`SharingConfig`, are here too."""

from .build import (
    Inliers,
    WeightPoints,
    assemble_structure,
    assign_points,
    blend_ellipses,
    build_sharing,
    build_sharing_from_points,
    find_outliers,
    fit_layer_mixtures,
    fit_mixture,
    gather_points,
    merge_to_fixed_point,
    mixture_sample,
    outlier_gradients,
    points_from_arrays,
    reduce_cluster_sizes,
    weight_points,
)
from .config import SharingConfig
from .hooks import MahalanobisHook, MergeHook, PinPruned, PruneRamp
from .outliers import OutlierReport, mean_gradients, select_outliers
from .prune import PruneReport, inlier_snr, prune_further, prune_structure
from .refine import (
    apply_mapping,
    drop_small_components,
    hard_assign,
    nearest_components,
    reassign,
)
from .structure import FORMAT_VERSION, SharingStructure, SiteLayout

__all__ = [
    "FORMAT_VERSION",
    "Inliers",
    "MahalanobisHook",
    "MergeHook",
    "OutlierReport",
    "PinPruned",
    "PruneRamp",
    "PruneReport",
    "SharingConfig",
    "SharingStructure",
    "SiteLayout",
    "WeightPoints",
    "apply_mapping",
    "assemble_structure",
    "assign_points",
    "blend_ellipses",
    "build_sharing",
    "build_sharing_from_points",
    "drop_small_components",
    "find_outliers",
    "fit_layer_mixtures",
    "fit_mixture",
    "gather_points",
    "hard_assign",
    "nearest_components",
    "mean_gradients",
    "merge_to_fixed_point",
    "mixture_sample",
    "outlier_gradients",
    "inlier_snr",
    "points_from_arrays",
    "prune_further",
    "prune_structure",
    "reassign",
    "reduce_cluster_sizes",
    "select_outliers",
    "weight_points",
]
