"""The 2DG method's settings: outliers, the 2-D mixture and its refinement (stage 1
steps 3-5 and stage 2 of Algorithm 1), read by :func:`~twodg_pyro.sharing.build_sharing`
and the refinement hooks.

They belong to the method, not to the application on top: the pipeline's config table
``[sharing]`` is this class as it is (:mod:`twodg_pyro.pipeline.settings.sections`), and
``tp.SharingConfig`` is this class too.  Every threshold of the paper (spec section 4)
is a field with the paper's value as default; a bad value raises
:class:`~twodg_pyro.settings.ConfigError` naming it (``sharing.gmm_max_iter = -1: must
be an integer >= 1``), when the settings are built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from ..gmm.merging import MergeRule, MergeTest
from ..settings import (
    BOOLEAN,
    FRACTION,
    POSITIVE_OR_INF,
    Section,
    at_least,
    finite_at_least_zero,
    in_range,
    optional,
    optional_at_least,
    positive,
    require,
)
from .outliers import OutlierRule
from .structure import Coordinates

__all__ = ["Assignment", "Codebook", "SharingConfig"]

#: one mixture for every layer's inliers, or one per layer (``n_components`` each)
Codebook = Literal["global", "per_layer"]
#: how an inlier picks its component (:func:`~twodg_pyro.sharing.refine.assign_components`)
Assignment = Literal["responsibility", "nearest"]
#: the components an ellipse weight is blended from (``sharing.ellipse_scope``)
EllipseScope = Literal["all", "layer"]


@dataclass
class SharingConfig(Section):
    r"""Outliers, the 2-D mixture and its refinement (stage 1 steps 3-5, stage 2).

    Thresholds, each with one name (spec section 4): ``tau_w`` (the absolute mean rule),
    ``grad_percentile`` (:math:`P_g`), ``n_min`` (:math:`N_\min`), ``mahalanobis_threshold``
    (:math:`T_M`), ``tau_d`` (:math:`T_W`, on :math:`W_2`), ``tau_g`` and ``tau_v`` (the
    merge's gradient and variance tests; ``inf`` skips them).

    Example::

        cfg = SharingConfig(outlier_rule="quantile", mu_quantile=0.995, n_components=32)
        structure, report = build_sharing(model, guide, loader, cfg)
        SharingConfig(n_min=0)   # ConfigError: sharing.n_min = 0: must be an integer >= 1
    """

    section: ClassVar[str] = "sharing"
    coordinates: Coordinates = "sigma"
    outlier_rule: OutlierRule = "absolute"
    tau_w: Annotated[float, positive()] = 0.2
    mu_quantile: Annotated[float, in_range(0, 1, (False, False))] = 0.99
    layer_std_multiple: Annotated[float, positive()] = 3.0
    grad_percentile: Annotated[float, FRACTION] = 0.01
    grad_batches: Annotated[int, at_least(1)] = 4
    n_components: Annotated[int, at_least(1)] = 2000
    #: ``"per_layer"``: a mixture of ``min(n_components, inliers of the layer)``
    #: components fitted to each layer's inliers (a codebook per layer, as per-tensor
    #: quantisation has a scale per tensor), the components then pooled for the rest of
    #: stage 2 and stage 3
    codebook: Codebook = "global"
    #: step 5, each inlier's component: ``"responsibility"`` (the paper: the most
    #: responsible, :math:`\arg\max_k \pi_k \mathcal N(x_i \mid m_k, S_k)`) or
    #: ``"nearest"`` (the component whose Normal :math:`\mathcal N(m_{k,0}, s_k^2)` is
    #: nearest to the weight's stage-1 :math:`\mathcal N(\mu_i, \sigma_i^2)` in
    #: :math:`W_2`, so no weight's mean moves further than to the nearest centre, as in a
    #: quantiser: with few components a broad one is the most responsible for points far
    #: from its centre)
    assignment: Assignment = "responsibility"
    gmm_batch_size: Annotated[
        int | None, optional_at_least(1, "the points per EM mini-batch, or absent for full batches")
    ] = None
    gmm_max_iter: Annotated[int, at_least(1)] = 100
    #: fit the mixture to a seeded random subsample of at most this many inlier points
    #: (every inlier is still assigned by the fitted mixture); absent: all of them
    gmm_max_points: Annotated[
        int | None,
        optional(
            at_least(1),
            "must be an integer >= n_components, or absent to fit the mixture to all inlier points",
        ),
    ] = None
    n_min: Annotated[int, at_least(0)] = 20
    mahalanobis_threshold: Annotated[float, positive()] = 5.991
    k_nearest: Annotated[int, at_least(1)] = 5
    #: an ellipse weight's ``k`` nearest components among all of them (``"all"``, the
    #: paper) or among those its own layer's inliers are tied to (``"layer"``: with
    #: ``codebook = "per_layer"`` it stays in its layer's codebook, whose index the
    #: compact file codes per layer; a layer with fewer than ``k`` borrows the nearest)
    ellipse_scope: EllipseScope = "all"
    merge_rule: MergeRule = "paper"
    merge_test: MergeTest = "both"
    tau_d: Annotated[float, finite_at_least_zero("must be a number >= 0")] = 1e-2
    tau_g: Annotated[float, POSITIVE_OR_INF] = math.inf
    tau_v: Annotated[float, POSITIVE_OR_INF] = math.inf
    use_outliers: Annotated[bool, BOOLEAN] = True
    use_ellipses: Annotated[bool, BOOLEAN] = True
    use_merging: Annotated[bool, BOOLEAN] = True

    def _check(self) -> None:
        require(
            self.k_nearest <= self.n_components,
            "sharing.k_nearest",
            self.k_nearest,
            f"must be an integer <= n_components ({self.n_components}): a point far from "
            "its component is blended from its k nearest components",
        )
        if self.gmm_max_points is not None:
            require(
                self.gmm_max_points >= self.n_components,
                "sharing.gmm_max_points",
                self.gmm_max_points,
                f"must be an integer >= n_components ({self.n_components}), or absent to fit "
                "the mixture to all inlier points",
            )
