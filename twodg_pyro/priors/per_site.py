r"""A zero-mean Normal prior with one scale per site: the prior of empirical Bayes."""

from __future__ import annotations

from collections.abc import Mapping

import pyro.distributions as dist
from torch import nn

from ..nn.sites import BayesianSite
from .base import Prior, _positive


class PerSiteNormalPrior(Prior):
    r""":math:`w_i \sim \mathcal N(0, s_l^2)` for every weight :math:`i` of site :math:`l`,
    with the scales :math:`s_l` given per site.

    The recommended recipe learns them by type-II maximum likelihood from the curvature
    of the pretrained network
    (:func:`~twodg_pyro.infer.curvature.empirical_bayes_scales`; ``prior.kind =
    "empirical_bayes"`` in run settings), so that each layer's prior follows that
    layer's weights, whatever its width or normalisation.  A model file stores the
    scales.

    Args:
        scales: ``{site name: s_l}``, each positive and finite (any superset of the
            model's sites).

    Raises:
        ValueError: a scale that is not positive and finite (naming its site).
    """

    kind = "PerSiteNormalPrior"
    aliases = ("empirical_bayes",)  # in run settings: learnt by stage 1
    settled = True

    def __init__(self, scales: Mapping[str, float]):
        if not isinstance(scales, Mapping) or not scales:
            raise ValueError("PerSiteNormalPrior needs a non-empty {site: scale} mapping")
        self._scales = {
            str(k): _positive(v, f"PerSiteNormalPrior scale of site {k!r}")
            for k, v in scales.items()
        }

    @property
    def scales(self) -> dict[str, float]:
        """``{site name: s_l}`` (a copy)."""
        return dict(self._scales)

    def scale_for(self, site: BayesianSite) -> float:
        """:math:`s_l` of ``site``.

        Raises:
            KeyError: no scale for the site (naming it and the known sites' count).
        """
        if site.name not in self._scales:
            raise KeyError(
                f"PerSiteNormalPrior has no scale for site {site.name!r} "
                f"({len(self._scales)} sites known)"
            )
        return self._scales[site.name]

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return dist.Normal(
            self.constant(0.0), self.constant(self.scale_for(site)), validate_args=False
        )

    def to_spec(self, model=None):
        """``{"kind": "PerSiteNormalPrior", "scales": {site: s_l}}``, no tensors."""
        return {"kind": self.kind, "scales": dict(self._scales)}, {}

    @classmethod
    def from_spec(cls, spec: dict, net: nn.Module, tensors: dict, where: str):
        """The prior of :meth:`to_spec`'s spec.

        Raises:
            ValueError: the spec has no ``scales`` mapping.
        """
        scales = spec.get("scales")
        if not isinstance(scales, Mapping):
            raise ValueError(f"{where!r}: its PerSiteNormalPrior has no 'scales' mapping")
        return cls(scales)

    @classmethod
    def from_settings(cls, scale: float, delta: float, net: nn.Module | None):
        """Refused: the scales are learnt from the data by stage 1 (``prior.kind =
        "empirical_bayes"``), or given in Python."""
        raise ValueError(
            "prior.kind = 'empirical_bayes' is learnt from the pretrained network and the "
            "training data by stage 1 (twodg_pyro.infer.curvature.empirical_bayes_scales); "
            "in Python, build PerSiteNormalPrior({site: scale})"
        )

    def __repr__(self) -> str:
        return f"PerSiteNormalPrior(sites={len(self._scales)})"
