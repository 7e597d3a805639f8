r"""Mean-field Gaussian guide (stage 1 of Algorithm 1).

.. math::
    q(w) = \prod_i \mathcal N(w_i \mid \mu_i, \sigma_i^2), \qquad
    \sigma_i = \operatorname{softplus}(\rho_i)

The guide emits the Normal *at the weight site itself* (one
``Normal(loc, scale).to_event(d)`` per parameter tensor), so an ELBO can use the
closed-form :math:`\mathrm{KL}(q \,\|\, p)` whenever one is registered for the prior,
and a Monte Carlo estimate otherwise.  (Pyro's ``AutoNormal`` samples an auxiliary
site and emits a ``Delta`` at the weight site, which silently turns
``TraceMeanField_ELBO`` into a Monte Carlo KL.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from ..bnn import BNNModel, require_model
from ..nn.functional import MIN_SIGMA, inverse_softplus
from ..nn.sites import BayesianSite
from .base import DiagonalNormalGuide, site_key


def check_init_scale(init_scale: str | float | Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` unless ``init_scale`` is ``"paper"``, a positive finite float or
    a ``{site: tensor}`` mapping (whose values :class:`MeanFieldGuide` checks per site)."""
    if isinstance(init_scale, Mapping):
        return
    if isinstance(init_scale, str):
        if init_scale != "paper":
            raise ValueError(f"init_scale must be 'paper' or a positive float, got {init_scale!r}")
    elif not (math.isfinite(float(init_scale)) and float(init_scale) > 0):
        raise ValueError(f"init_scale must be a positive float, got {init_scale!r}")


def paper_initial_scales(site: BayesianSite, generator: torch.Generator | None = None):
    r"""Initial :math:`\sigma` of the paper (App. I.4), made positive.

    Weights: :math:`|u|`, :math:`u \sim` Xavier-uniform with gain 0.01, i.e.
    :math:`U(-a, a)`, :math:`a = 0.01 \sqrt{6 / (\text{fan\_in} + \text{fan\_out})}`.
    Biases: :math:`|\epsilon|`, :math:`\epsilon \sim \mathcal N(0, 0.001^2)`.
    """
    shape = site.shape
    if site.param_name == "bias" or len(shape) < 2:
        scales = torch.randn(shape, generator=generator).abs() * 1e-3
    else:
        receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
        fan_out = shape[0] * receptive
        bound = 0.01 * math.sqrt(6.0 / (site.fan_in + fan_out))
        scales = (torch.rand(shape, generator=generator) * 2 - 1).abs() * bound
    return scales.clamp_min(MIN_SIGMA)


def initial_means(model, init_loc: Mapping[str, torch.Tensor] | None) -> list[torch.Tensor]:
    """Each site's initial mean in site order, on the device and in the dtype of its network
    tensor (the guide follows the network); ``init_loc`` ``{site: tensor}``, by default the
    network's values.

    Raises:
        TypeError, ValueError: ``init_loc`` is no dict, or lacks a site or a shape.
    """
    init_loc = init_loc if init_loc is not None else model.initial_values()
    if not isinstance(init_loc, Mapping):
        raise TypeError(f"init_loc must be a dict {{site: tensor}}, got {type(init_loc).__name__}")
    missing = [s.name for s in model.sites if s.name not in init_loc]
    if missing:
        raise ValueError(
            f"init_loc has no initial mean for site {missing[0]!r} "
            f"({len(missing)} of {len(model.sites)} sites missing)"
        )
    out = []
    for i, site in enumerate(model.sites):
        like = model.site_parameter(i)
        loc = init_loc[site.name].detach().to(device=like.device, dtype=like.dtype)
        if loc.shape != site.shape:
            raise ValueError(
                f"initial mean of {site.name!r} has shape {tuple(loc.shape)}, "
                f"the site has {tuple(site.shape)}"
            )
        out.append(loc)
    return out


def _given_scale(scales: Mapping[str, torch.Tensor], site: BayesianSite) -> torch.Tensor:
    """The initial scales of ``site`` from a ``{site: tensor}`` mapping, checked: present,
    of the site's shape (or broadcastable to it), finite and positive."""
    if site.name not in scales:
        raise ValueError(f"init_scale has no scales for site {site.name!r}")
    scale = torch.as_tensor(scales[site.name]).detach().cpu()
    try:
        scale = scale.expand(site.shape).clone()
    except RuntimeError as e:
        raise ValueError(
            f"init_scale of site {site.name!r} has shape {tuple(scale.shape)}, the site "
            f"has {tuple(site.shape)}"
        ) from e
    if not (torch.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"init_scale of site {site.name!r} must be positive and finite")
    return scale.clamp_min(MIN_SIGMA)


class MeanFieldGuide(DiagonalNormalGuide):
    r"""Per-weight Normal posterior over every Bayesian site of ``model``.

    Its posterior, sampling and parameter groups are those of
    :class:`~twodg_pyro.guides.base.DiagonalNormalGuide`.

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel`.
        init_scale: ``"paper"`` for the App. I.4 initial :math:`\sigma`, a positive
            float for a constant initial :math:`\sigma`, or ``{site: tensor}`` of initial
            scales per weight (e.g. :func:`~twodg_pyro.infer.curvature.curvature_scales`:
            the optimum under the curvature of the pretrained network).
        init_loc: optional ``{site: tensor}`` of initial means (default: the network's
            current values, pretrained or freshly initialised).
        seed: seed of the random initial scales.

    The parameters are created on the network's device and in its dtype (a float64
    network gets a float64 guide).

    Example::

        guide = MeanFieldGuide(model)   # init_scale="paper": App. I.4's initial sigmas
        fit(model, guide, loader, epochs=150, lr={"loc": 1e-2, "scale": 1e-2})
        guide.loc("layers.0.weight"), guide.scale("layers.0.weight")   # mu, sigma of a site
    """

    method = "mean_field"

    def __init__(
        self,
        model: BNNModel,
        init_scale: str | float | Mapping[str, torch.Tensor] = "paper",
        init_loc: dict[str, torch.Tensor] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        require_model(model, type(self).__name__, ("sites", "site_parameter"))
        self.sites = list(model.sites)
        check_init_scale(init_scale)
        generator = torch.Generator().manual_seed(int(seed))
        self.locs, self.rhos = nn.ParameterDict(), nn.ParameterDict()
        for site, loc in zip(self.sites, initial_means(model, init_loc), strict=True):
            if isinstance(init_scale, Mapping):
                scale = _given_scale(init_scale, site).to(loc.dtype)
            elif init_scale == "paper":  # drawn in float32 on the CPU: the same on any device
                scale = paper_initial_scales(site, generator).to(loc.dtype)
            else:
                scale = torch.full(site.shape, float(init_scale), dtype=loc.dtype)
            self.locs[site_key(site.name)] = nn.Parameter(loc.clone())
            self.rhos[site_key(site.name)] = nn.Parameter(inverse_softplus(scale).to(loc.device))

    def means_and_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        r"""All :math:`(\mu_i, \sigma_i)` flattened in site order: the 2-D points of stage 2."""
        with torch.no_grad():
            mus = torch.cat([self.loc(s.name).reshape(-1) for s in self.sites])
            sigmas = torch.cat([self.scale(s.name).reshape(-1) for s in self.sites])
        return mus, sigmas
