r"""Priors with one scalar distribution for every weight of a site, given by a few
numbers: Normal, Laplace, Cauchy and the fan-in scaled Normal."""

from __future__ import annotations

import math
from typing import ClassVar

import pyro.distributions as dist

from ..nn.sites import BayesianSite
from .base import Prior, _positive


class _LocScalePrior(Prior):
    """I.i.d. ``family(loc, scale)`` for every weight: the shared body of the loc-scale
    priors below (no ``kind``: not a prior of its own)."""

    family: ClassVar[type[dist.Distribution]]

    def __init__(self, scale: float = 1.0, loc: float = 0.0):
        self.loc = float(loc)
        self.scale = _positive(scale, f"{self.family.__name__}Prior scale")

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return self.family(self.constant(self.loc), self.constant(self.scale), validate_args=False)


class NormalPrior(_LocScalePrior):
    r"""I.i.d. Normal prior :math:`w_i \sim \mathcal N(\text{loc}, \text{scale}^2)`.

    Example::

        model = BNNModel(net, prior=NormalPrior(1.0), likelihood=N)   # w ~ N(0, 1)
        NormalPrior(scale=0.1, loc=0.0).site_distribution(site)    # N(0, 0.1^2) per weight
    """

    kind = "NormalPrior"
    aliases = ("normal",)  # in run settings
    settled = True
    family = dist.Normal


class LaplacePrior(_LocScalePrior):
    r"""I.i.d. Laplace prior :math:`p(w_i) = \frac{1}{2b} e^{-|w_i - \text{loc}|/b}`.

    No closed-form KL against a Normal guide exists: the ELBO uses Monte Carlo.

    Example::

        model = BNNModel(net, prior=LaplacePrior(0.1), likelihood=N)
        fit(model, MeanFieldGuide(model), loader, epochs=50)   # its KL by Monte Carlo
    """

    kind = "LaplacePrior"
    aliases = ("laplace",)  # in run settings
    settled = True
    family = dist.Laplace


class CauchyPrior(_LocScalePrior):
    r"""I.i.d. Cauchy prior :math:`p(v) = \frac{1}{\pi \gamma (1 + ((v - \text{loc})/\gamma)^2)}`
    (centred at 1 by default: the rank-1 factors' prior, :func:`~twodg_pyro.guides.rank1_prior`).

    No closed-form KL against a Normal guide exists: the ELBO uses Monte Carlo.
    """

    kind = "CauchyPrior"
    settled = True
    family = dist.Cauchy

    def __init__(self, scale: float = 1.0, loc: float = 1.0):
        super().__init__(scale, loc)


class LayerwiseNormalPrior(Prior):
    r"""Fan-in scaled Normal: :math:`w_i \sim \mathcal N(0, \text{gain}^2 / \text{fan\_in})`.

    The scale follows the layer like He/LeCun initialisation, so wide layers get
    tighter priors. ``bias_scale`` (if given) overrides the scale of bias sites.

    Example::

        model = BNNModel(net, prior=LayerwiseNormalPrior(gain=1.0), likelihood=N)
        # a 400-input layer's weights get N(0, 1/400), a 10-input layer's N(0, 1/10)
    """

    kind = "LayerwiseNormalPrior"
    aliases = ("layerwise",)  # in run settings
    settled = True

    def __init__(self, gain: float = 1.0, bias_scale: float | None = None):
        self.gain = _positive(gain, "LayerwiseNormalPrior gain")
        self.bias_scale = None if bias_scale is None else _positive(bias_scale, "bias_scale")

    def scale_for(self, site: BayesianSite) -> float:
        """Prior standard deviation of the weights of ``site``."""
        if site.param_name == "bias" and self.bias_scale is not None:
            return self.bias_scale
        return self.gain / math.sqrt(site.fan_in)

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return dist.Normal(
            self.constant(0.0), self.constant(self.scale_for(site)), validate_args=False
        )
