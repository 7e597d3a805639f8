"""What every BNN guide of this library offers beyond being a Pyro guide."""

from __future__ import annotations

from abc import abstractmethod

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn

from ..nn.sites import BayesianSite


def site_key(name: str) -> str:
    """A parameter-safe key for a site name (``"layers.0.weight" -> "layers__0__weight"``)."""
    return name.replace(".", "__")


def standard_normal(like: torch.Tensor, num_samples: int | None = None) -> torch.Tensor:
    r""":math:`\mathcal N(0, 1)` noise of ``like``'s shape, or ``(num_samples, *like.shape)``,
    on its device and with its dtype: the noise of one or ``num_samples`` draws of a site."""
    shape = like.shape if num_samples is None else (num_samples, *like.shape)
    return torch.randn(shape, device=like.device, dtype=like.dtype)


class BNNGuide(nn.Module):
    """Base class of the library's guides.

    A guide is a Pyro program with one sample statement per Bayesian site of the
    model.  On top of that it offers:

    * :meth:`sample_weights` -- draws of all Bayesian tensors outside inference,
      vectorised over samples, for fast prediction;
    * :meth:`param_groups` -- its parameters split into named groups (``"loc"``,
      ``"scale"``, ...) so that each can have its own learning rate;
    * :meth:`num_trainable` -- the trainable parameter count it reports.
    """

    sites: list[BayesianSite]

    @abstractmethod
    def sample_weights(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """Draw the Bayesian tensors: shape ``site.shape`` or ``(num_samples, *site.shape)``."""

    @abstractmethod
    def param_groups(self) -> list[dict]:
        """``[{"name": group_name, "params": [...]}, ...]`` covering every parameter."""

    def num_trainable(self) -> int:
        """Number of scalar parameters the guide trains."""
        return sum(p.numel() for g in self.param_groups() for p in g["params"] if p.requires_grad)


class DiagonalNormalGuide(BNNGuide):
    r"""A guide with an independent Normal over every scalar of every site.

    .. math::
        q(w_s) = \prod_i \mathcal N(w_{s,i} \mid \mu_{s,i}, \sigma_{s,i}^2), \qquad
        \sigma = \operatorname{softplus}(\rho)

    A subclass's ``__init__`` sets ``sites`` and the two
    :class:`~torch.nn.ParameterDict` ``locs`` (:math:`\mu`) and ``rhos`` (:math:`\rho`),
    keyed by :func:`site_key`, each tensor of its site's shape.  The Normal is emitted
    at the site itself (one ``Normal(loc, scale).to_event(site dims)`` per site), so an
    ELBO can use a closed-form KL when one is registered for the prior.
    """

    locs: nn.ParameterDict
    rhos: nn.ParameterDict

    def loc(self, name: str) -> torch.Tensor:
        r""":math:`\mu` of a site (the site's shape)."""
        return self.locs[site_key(name)]

    def scale(self, name: str) -> torch.Tensor:
        r""":math:`\sigma = \operatorname{softplus}(\rho)` of a site (the site's shape)."""
        return F.softplus(self.rhos[site_key(name)])

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        r""":math:`q(w_s) = \prod_i \mathcal N(\mu_i, \sigma_i^2)` as one event."""
        d = dist.Normal(self.loc(site.name), self.scale(site.name), validate_args=False)
        return d.to_event(len(site.shape))

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return {
            site.name: pyro.sample(site.name, self.site_distribution(site)) for site in self.sites
        }

    def sample_weights(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        r""":math:`\mu + \sigma \epsilon` per site: shape ``site.shape`` or
        ``(num_samples, *site.shape)``; differentiable when gradients are on, otherwise
        (prediction) one fused pass, in place."""
        out = {}
        for site in self.sites:
            loc, scale = self.loc(site.name), self.scale(site.name)
            eps = standard_normal(loc, num_samples)
            if torch.is_grad_enabled() and (loc.requires_grad or scale.requires_grad):
                out[site.name] = torch.addcmul(loc, scale, eps)
            else:  # prediction: one fused pass, in place
                out[site.name] = torch.addcmul(loc, scale, eps, out=eps)
        return out

    def param_groups(self) -> list[dict]:
        r"""``[{"name": "loc", ...}, {"name": "scale", ...}]``: the :math:`\mu` and the
        :math:`\rho` of every site."""
        return [
            {"name": "loc", "params": list(self.locs.values())},
            {"name": "scale", "params": list(self.rhos.values())},
        ]
