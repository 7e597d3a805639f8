"""Weight sharing: outliers, the sharing structure, its construction and refinement."""

from .build import build_sharing, weight_points
from .outliers import OutlierReport, mean_gradients, select_outliers
from .refine import apply_mapping, drop_small_components, hard_assign, reassign
from .structure import FORMAT_VERSION, SharingStructure, SiteLayout

__all__ = [
    "FORMAT_VERSION",
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
