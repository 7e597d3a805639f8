r"""The shared-GMM guide's density :math:`\log q(w)` of a joint draw of all Bayesian tensors.

What the importance ratios of the VI diagnostics (:func:`~twodg_pyro.diagnostics.vi_diagnostics`,
Pareto :math:`\hat k`) need: the log density of ``S`` draws ``{site: (S, *site.shape)}``
under a guide, marginal over any auxiliary variable the guide draws on the way; each
guide returns it from :meth:`~twodg_pyro.guide.BNNGuide.marginal_log_density`
(:func:`guide_log_q`).  This module holds the mixture machinery of
:class:`~twodg_pyro.guides.SharedGMMGuide`, whose outliers are
:math:`\mathcal N(\mu_i, \sigma_i^2)` and whose inliers follow their tying
(:mod:`~twodg_pyro.guides.tyings`):

* ``representative``: exact.  Weights are independent; a plain inlier of component
  :math:`c` is :math:`\mathcal N(m_{c,0}, m_{c,1}^2)` (``log_sigma`` coordinates:
  :math:`e^{m_{c,1}}`), an ellipse weight is the mixture
  :math:`\sum_j \alpha_{ij}\,\mathcal N(m_{c_j,0}, m_{c_j,1}^2)`;
* ``stochastic``: weights are still independent, but the marginal
  :math:`q_c(w) = \int \mathcal N(w \mid \tilde\mu, \tilde\sigma^2)\,
  \mathcal N((\tilde\mu, \theta) \mid m_c, S_c)\, d\tilde\mu\, d\theta` (with
  :math:`\tilde\sigma = |\theta|` or :math:`e^\theta`) has no closed form.  We
  integrate :math:`\tilde\mu` out analytically (given :math:`\theta`, :math:`w` is
  Normal with mean :math:`m_{c,0} + S_{c,01}/S_{c,11}(\theta - m_{c,1})` and variance
  :math:`S_{c,00} - S_{c,01}^2/S_{c,11} + \tilde\sigma(\theta)^2`) and :math:`\theta`
  by Gauss-Hermite quadrature with ``quadrature_nodes`` nodes (default 64): a
  deterministic, near-exact marginal (method ``"quadrature"``); ellipse weights mix
  these over their alphas;
* ``tied``: all weights of a component share one value per draw, so the joint
  :math:`q(w)` has no density on :math:`\mathbb R^{n_w}`.  We use the product of the
  exact per-weight marginals (:math:`\mathcal N(m_{c,0}, S_{c,00})`, mixtures for
  ellipse weights) as a surrogate (method ``"marginal_product"``, not exact).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..guide import LOG_Q_METHODS, BNNGuide, MarginalDensity
from ..nn.functional import softplus
from ..sharing.structure import plane_sigma

__all__ = [
    "LOG_Q_METHODS",
    "ComponentMarginals",
    "component_marginals",
    "guide_log_q",
    "log_q_fn",
    "mixture_log_prob",
    "shared_mixture_log_q",
    "stochastic_component_marginals",
]

_LOG_2PI = math.log(2 * math.pi)
_GROUP_ELEMENTS = 1 << 22  # draws are evaluated in groups of about this many terms


class ComponentMarginals(NamedTuple):
    r"""Each component's marginal of one weight tied to it, as a Gaussian mixture over
    ``J`` nodes: :math:`q_k(w) = \sum_j e^{\ell_{kj}} \mathcal N(w \mid a_{kj}, b_{kj}^2)`,
    the tensors ``(K, J)``, and how exact it is (``method``, :data:`LOG_Q_METHODS`)."""

    log_weights: torch.Tensor
    means: torch.Tensor
    sds: torch.Tensor
    method: str


def stochastic_component_marginals(
    m: torch.Tensor, cov: torch.Tensor, coordinates: str, nodes: int = 64
) -> ComponentMarginals:
    r"""The ``stochastic`` tying's marginal of a weight of each component
    :math:`\mathcal N(m_k, S_k)` (``m (K, 2)``, ``cov (K, 2, 2)``): :math:`\tilde\mu`
    integrated out analytically, :math:`\theta` by Gauss-Hermite quadrature with ``nodes``
    nodes (module docstring)."""
    x, h = np.polynomial.hermite.hermgauss(int(nodes))
    x = torch.as_tensor(x, dtype=m.dtype, device=m.device)
    log_h = torch.as_tensor(np.log(h / math.sqrt(math.pi)), dtype=m.dtype, device=m.device)
    s00, s01, s11 = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1].clamp_min(1e-30)
    theta = m[:, 1:2] + (2 * s11).sqrt()[:, None] * x  # (K, J) nodes over theta ~ N(m1, S11)
    cond_mean = m[:, :1] + (s01 / s11)[:, None] * (theta - m[:, 1:2])
    cond_var = (s00 - s01**2 / s11).clamp_min(0.0)[:, None]
    sd = (cond_var + plane_sigma(theta, coordinates) ** 2).sqrt()
    return ComponentMarginals(log_h.expand_as(theta), cond_mean, sd, "quadrature")


def component_marginals(guide, nodes: int = 64) -> ComponentMarginals:
    """Each component's marginal of a weight tied to it under ``guide``'s tying
    (:meth:`~twodg_pyro.guides.tyings.Tying.component_marginals`): ``(log weights, means,
    sds, method)``, the tensors ``(K, J)`` (``J = 1`` for ``representative`` and
    ``tied``, ``nodes`` for ``stochastic``)."""
    return guide.tying_rule.component_marginals(guide, int(nodes))


def _mixture_table(log_w, mean, sd):
    """Per-weight constants of ``log sum_j w_j N(x | mean_j, sd_j^2)``: ``(const, mean, 1/sd)``."""
    return log_w - sd.log() - 0.5 * _LOG_2PI, mean, 1.0 / sd


def mixture_log_prob(w: torch.Tensor, table) -> torch.Tensor:
    """``logsumexp_j (const_j - (w - mean_j)^2 / (2 sd_j^2))`` for ``w (g, n)`` and a
    table of three ``(n, J)`` tensors ``(const, mean, 1/sd)``: returns ``(g, n)``."""
    const, mean, inv_sd = table
    z = (w[..., None] - mean) * inv_sd
    return torch.logsumexp(const - 0.5 * z**2, -1)


def shared_mixture_log_q(guide, marginals: ComponentMarginals) -> MarginalDensity:
    r"""The shared-GMM guide's :math:`\log q(w)` of draws ``(S, n_w)``: outliers' Normals,
    plain inliers' component marginals, ellipse weights' mixtures of them over their
    alphas, with the per-weight tables built once."""
    log_w, mean, sd, method = marginals
    J = log_w.shape[1]
    out_idx, plain_idx, ell_idx = guide.outlier_index, guide.plain_index, guide.ellipse_index
    loc = guide.outlier_loc.detach()
    scale = softplus(guide.outlier_rho.detach())
    c = guide.plain_component
    plain = _mixture_table(log_w[c], mean[c], sd[c])
    ell = None
    if ell_idx.numel():
        e_c, n_e = guide.ellipse_components, ell_idx.numel()
        lw = log_w[e_c] + guide.ellipse_alphas.clamp_min(1e-38).log()[..., None]  # (n_e, k, J)
        ell = _mixture_table(
            lw.reshape(n_e, -1), mean[e_c].reshape(n_e, -1), sd[e_c].reshape(n_e, -1)
        )
    n_terms = plain_idx.numel() + (ell[0].numel() // J if ell is not None else 0)
    group = max(1, _GROUP_ELEMENTS // max(1, n_terms * J))

    def fn(weights, flat: torch.Tensor | None = None) -> torch.Tensor:
        if flat is None:  # (S, n_w) in the guide's site order
            flat = torch.cat([weights[s.name].flatten(1) for s in guide.sites], 1)
        total = flat.new_zeros(flat.shape[0])
        if out_idx.numel():
            z = (flat[:, out_idx] - loc) / scale
            total += (-0.5 * z**2 - scale.log() - 0.5 * _LOG_2PI).sum(-1)
        for g0 in range(0, flat.shape[0], group):
            rows = slice(g0, g0 + group)
            if plain_idx.numel():
                total[rows] += mixture_log_prob(flat[rows][:, plain_idx], plain).sum(-1)
            if ell is not None:
                total[rows] += mixture_log_prob(flat[rows][:, ell_idx], ell).sum(-1)
        return total

    return MarginalDensity(fn, method)


def log_q_fn(guide, quadrature_nodes: int = 64):
    """``(fn(weights, flat=None) -> log q (S,), method)`` for ``guide``: the function
    evaluates draws ``{site: (S, *shape)}`` (``flat``: the same draws as ``(S, n_w)`` in
    site order, when the caller has them); the guide's
    :meth:`~twodg_pyro.guide.BNNGuide.marginal_log_density`.

    Raises:
        TypeError: not one of the library's guides (a
            :class:`~twodg_pyro.guide.BNNGuide`).
    """
    if not isinstance(guide, BNNGuide):
        raise TypeError(
            f"no log q(w) for a {type(guide).__name__}: supported are MeanFieldGuide, "
            "SharedGMMGuide, Rank1Guide and SSVIGuide, or a subclass of "
            "twodg_pyro.guide.BNNGuide implementing marginal_log_density"
        )
    return guide.marginal_log_density(quadrature_nodes)


@torch.no_grad()
def guide_log_q(
    guide, weights: dict[str, torch.Tensor], quadrature_nodes: int = 64
) -> tuple[torch.Tensor, str]:
    """``(log q(w) per draw (S,), method)`` for draws ``{site: (S, *shape)}`` of ``guide``.

    ``method`` is ``"exact"``, ``"quadrature"`` (stochastic tying) or
    ``"marginal_product"`` (tied tying; a surrogate, see the module docstring).
    """
    fn, method = log_q_fn(guide, quadrature_nodes)
    return fn(weights), method
