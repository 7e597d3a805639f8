"""Weight sharing: outliers, the sharing structure, its construction and refinement, and
the stage-3 refinement hooks that apply it to a trained guide."""

from .build import build_sharing, weight_points
from .hooks import MahalanobisHook, MergeHook
from .outliers import OutlierReport, mean_gradients, select_outliers
from .refine import apply_mapping, drop_small_components, hard_assign, reassign
from .structure import FORMAT_VERSION, SharingStructure, SiteLayout

__all__ = [
    "FORMAT_VERSION",
    "MahalanobisHook",
    "MergeHook",
    "OutlierReport",
    "SharingStructure",
    "SiteLayout",
    "apply_mapping",
    "build_sharing",
    "drop_small_components",
    "hard_assign",
    "mean_gradients",
    "reassign",
    "select_outliers",
    "weight_points",
]
