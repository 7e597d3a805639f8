r"""The shared-GMM guide's part of the fast training step (:mod:`twodg_pyro.infer.fast_step`):
its draw without its program, and its Eq. 10 KL terms either site by site as the traced
ELBO sums them, or summed over all sites at once (``fused``).

**Fused KL.**  When every site's prior is one Normal :math:`\mathcal N(p_s, s_s^2)` for all
its weights (``NormalPrior``, ``LayerwiseNormalPrior``), the terms of
:mod:`~twodg_pyro.guides.shared_gmm` become one closed form over a ``(n_sites, K)``
table instead of a loop over the sites (each of which rebuilds the components' KL):

.. math::
    \mathrm{KL}_\text{in} = \sum_{s,k} c_{s,k}\,\kappa_{s,k}, \qquad
    \mathrm{KL}_\text{out} = \sum_i \mathrm{KL}\big(\mathcal N(\mu_i, \sigma_i^2) \,\|\,
        \mathcal N(p_{s(i)}, s_{s(i)}^2)\big),

with :math:`c_{s,k} = N_{k,s}` and :math:`\kappa_{s,k} = \mathrm{KL}(\mathcal N(m_{k,0},
m_{k,1}^2) \| p_s)` (``representative``), :math:`\mathbb E_{\mathcal N(m_k, S_k)}
\mathrm{KL}(\mathcal N(\tilde\mu, \tilde\sigma^2) \| p_s)` (``stochastic``), or
:math:`c_{s,k} = N_{k,s}/N_k`, :math:`\kappa_{s,k} = \mathrm{KL}(\mathcal N(m_{k,0},
S_{k,00}) \| p_s)` (``tied``), where :math:`s(i)` is outlier :math:`i`'s site.  The same
bound; summed in another order, so equal to the site-by-site terms up to float rounding
(not bit for bit).  Any other prior takes the site-by-site terms.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
import torch.nn.functional as F

from ..guide import FastStepGuide
from .base import normal_normal_kl, scalar_prior
from .stochastic_kl import expected_normal_kl

__all__ = ["SharedGMMFastStep", "fused_kl"]


def _prior_table(guide, priors):
    """``(p_loc, p_scale)`` per site ``(n_sites, 1)`` and per outlier ``(n_out,)``, or
    ``None`` unless every site's prior is one Normal for all its weights; kept while the
    priors and the assignment tables are the same objects."""
    cache = guide.__dict__.get("_fused_priors")
    if cache is not None and cache[0] is priors and cache[1] is guide._sites:
        return cache[2]
    rows = [None] * len(guide._sites)
    for site in guide.sites:
        p = scalar_prior(priors[site.name])  # one Normal for all its weights, or None
        if type(p) is not dist.Normal:
            return None
        rows[guide._sites[site.name].position] = (p.loc, p.scale)
    p_loc = torch.stack([r[0] for r in rows]).unsqueeze(1)
    p_scale = torch.stack([r[1] for r in rows]).unsqueeze(1)
    out_site = torch.empty(guide.kinds.outliers, dtype=torch.long)
    for s in guide._sites.values():
        out_site[s.outliers] = s.position
    out_site = out_site.to(p_loc.device)
    table = (p_loc, p_scale, p_loc[:, 0][out_site], p_scale[:, 0][out_site])
    if not (p_loc.requires_grad or p_scale.requires_grad):  # a learnt prior: every step
        guide.__dict__["_fused_priors"] = (priors, guide._sites, table)
    return table


def fused_kl(guide, priors) -> dict[str, torch.Tensor] | None:
    """``{"kl_inlier", "kl_outlier"}`` of the guide's latest draw summed over all sites at
    once (module docstring), or ``None`` when a prior is not one Normal per site."""
    table = _prior_table(guide, priors)
    if table is None:
        return None
    p_loc, p_scale, o_loc, o_scale = table
    kl_out = guide.centre_mu.new_zeros(())
    if guide.kinds.outliers:
        scale = F.softplus(guide.outlier_rho)
        kl_out = normal_normal_kl(guide.outlier_loc, scale, o_loc, o_scale).sum()
    counts = guide.site_counts
    tying = guide.tying
    if tying == "representative":
        kl_k = normal_normal_kl(guide.centre_mu, guide.centre_sigma(), p_loc, p_scale)
    elif tying == "stochastic":
        kl_k = expected_normal_kl(
            guide.centres(), guide.covariances(), p_loc, p_scale, guide.coordinates
        )
    elif tying == "tied":
        counts = counts / guide.component_counts().clamp_min(1e-12)
        sd = guide.covariances()[:, 0, 0].clamp_min(1e-30).sqrt()
        kl_k = normal_normal_kl(guide.centre_mu, sd, p_loc, p_scale)
    else:
        return None
    return {"kl_inlier": (counts * kl_k).sum(), "kl_outlier": kl_out}


class SharedGMMFastStep(FastStepGuide):
    """The fast step of :class:`~twodg_pyro.guides.SharedGMMGuide`
    (:class:`~twodg_pyro.guide.FastStepGuide`)."""

    def _mirrors_program(self) -> bool:
        """Whether the class's program is the one :meth:`fast_draw` stands in for (the
        class that mixes this in, not a subclass with its own ``forward``)."""
        owner = next(c for c in type(self).__mro__ if "forward" in vars(c))
        return SharedGMMFastStep in owner.__bases__

    def fast_draw(self, priors) -> dict[str, torch.Tensor] | None:
        """The program's draw without the program: one draw of all weights, kept for the
        KL (:meth:`site_kl`), split into the sites.  ``None`` for a subclass with another
        program."""
        if not self._mirrors_program():
            return None
        self._last = last = self._draw(1)
        return self._split(last.flat[0])

    def fast_kl(self, priors, values, fused: bool = False) -> dict[str, torch.Tensor]:
        """The KL terms of the latest draw: site by site as the traced ELBO sums them
        (:meth:`kl_terms`), or with ``fused`` all sites at once where every prior is one
        Normal per site (:func:`fused_kl`)."""
        if fused:
            terms = fused_kl(self, priors)
            if terms is not None:
                return terms
        return self.kl_terms(priors, values)
