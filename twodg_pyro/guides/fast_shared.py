r"""The shared-GMM guide's part of the fast training step (:mod:`twodg_pyro.infer.fast_step`):
its draw without its program, and its Eq. 10 KL terms either site by site as the traced
ELBO sums them, or summed over all sites at once (``fused``).

**Fused KL.**  When every site's prior is one Normal :math:`\mathcal N(p_s, s_s^2)` for all
its weights (``NormalPrior``, ``LayerwiseNormalPrior``), the inliers' terms of every site
are one closed form :math:`\sum_{s,k} c_{s,k}\,\kappa_{s,k}` over a ``(n_sites, K)`` table
(the tying's :meth:`~twodg_pyro.guides.tyings.Tying.normal_kl_terms`) instead of a loop
over the sites, and the outliers' :math:`\sum_i \mathrm{KL}(\mathcal N(\mu_i,
\sigma_i^2) \| \mathcal N(p_{s(i)}, s_{s(i)}^2))`, :math:`s(i)` outlier :math:`i`'s site.
The same bound; summed in another order, so equal to the site-by-site terms up to float
rounding (not bit for bit).  Any other prior takes the site-by-site terms.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch

from ..guide import FastStepGuide
from ..nn.functional import softplus
from .base import scalar_prior
from .fast_normal import normal_normal_kl


def _prior_table(guide, priors):
    """``(p_loc, p_scale)`` per site ``(n_sites, 1)`` and per outlier ``(n_out,)``, or
    ``None`` unless every site's prior is one Normal for all its weights; kept while the
    priors and the assignment tables are the same objects."""
    cache = guide.__dict__.get("_fused_priors")
    if cache is not None and cache[0] is priors and cache[1] is guide._sites:
        return cache[2]
    rows = [scalar_prior(priors[s.name]) for s in guide.sites]  # in the tables' site order
    if any(type(p) is not dist.Normal for p in rows):  # not one Normal for all its weights
        return None
    p_loc = torch.stack([p.loc for p in rows]).unsqueeze(1)
    p_scale = torch.stack([p.scale for p in rows]).unsqueeze(1)
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
        scale = softplus(guide.outlier_rho)
        kl_out = normal_normal_kl(guide.outlier_loc, scale, o_loc, o_scale).sum()
    prior = dist.Normal(p_loc, p_scale, validate_args=False)
    counts, kl_k = guide.tying_rule.normal_kl_terms(guide, guide.site_counts, prior, guide._last)
    return {"kl_inlier": (counts * kl_k).sum(), "kl_outlier": kl_out}


class SharedGMMFastStep(FastStepGuide):
    """The fast step of :class:`~twodg_pyro.guides.SharedGMMGuide`
    (:class:`~twodg_pyro.guide.FastStepGuide`)."""

    def fast_draw(self, priors, fused: bool = False) -> dict[str, torch.Tensor] | None:
        """The program's draw without the program: one draw of all weights, kept for the
        KL (:meth:`site_kl`), split into the sites (already one flat draw: ``fused``
        changes nothing).  ``None`` for a subclass with another program."""
        # the program it stands in for is that of the class mixing this in, not a subclass's
        owner = next(c for c in type(self).__mro__ if "forward" in vars(c))
        if SharedGMMFastStep not in owner.__bases__:
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
