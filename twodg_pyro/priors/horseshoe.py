r"""The regularised horseshoe prior (Piironen and Vehtari 2017), a scale mixture of Normals.

Each weight has its own local scale :math:`\lambda_i`, shrunk by a global scale
:math:`\tau` and softly truncated by a slab of width :math:`c`:

.. math::
    w_i \mid \lambda_i \sim \mathcal N(0, \tau^2 \tilde\lambda_i^2), \qquad
    \tilde\lambda_i^2 = \frac{c^2 \lambda_i^2}{c^2 + \tau^2 \lambda_i^2}, \qquad
    \lambda_i \sim \mathcal C^+(0, 1).

Weights with :math:`\tau\lambda_i \ll c` are shrunk as by the horseshoe (a pole at 0,
Cauchy tails); those with :math:`\tau\lambda_i \gg c` see a :math:`\mathcal N(0, c^2)`
slab, which keeps large weights finite (:math:`c \to \infty` is the plain horseshoe).

**Marginal, per weight.**  The guides of this library are over the weights, so the
local scales are integrated out: :class:`RegularizedHorseshoe` is the marginal
:math:`p(w_i) = \int \mathcal N(w_i; 0, \tau^2\tilde\lambda^2)\, \mathcal C^+(\lambda;
0, 1)\, d\lambda`, one scalar distribution per weight as every prior of the library
(its KL against a guide is the ELBO's Monte Carlo estimate; NUTS uses its gradient).
It samples exactly (:math:`\lambda`, then :math:`w`); its log-density is the integral
over :math:`t = \log\lambda` (density :math:`\operatorname{sech}(t)/\pi`) by the
trapezoidal rule on :data:`NODES` nodes of :math:`[-20, 20]`, exponentially accurate for
this smooth integrand (relative error below :math:`10^{-6}` for :math:`|w| > 10^{-8}\tau`;
``tests/test_horseshoe.py`` checks it against SciPy's adaptive quadrature and the plain
horseshoe's closed form :math:`p(w) = (2\pi^3\tau^2)^{-1/2} e^{u} E_1(u)`,
:math:`u = w^2/2\tau^2`).  At :math:`w = 0` the horseshoe's density is infinite; here it
is that of :math:`\lambda \ge e^{-20}`, finite.

:math:`\tau` and :math:`c` are fixed settings, not latent: in the paper they carry priors
of their own (:math:`\tau \sim \mathcal C^+(0, \tau_0)`, :math:`c^2 \sim
\mathrm{Inv\text{-}Gamma}`), but both are shared by all weights, so integrating them out
would couple every weight of a network.  Piironen and Vehtari's choice of
:math:`\tau_0 = \frac{p_0}{D - p_0} \frac{\sigma}{\sqrt n}` (for :math:`p_0` of
:math:`D` inputs expected relevant) is a guide for ``global_scale``.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch.distributions.utils import broadcast_all

from ..nn.sites import BayesianSite
from .base import Prior, _positive

#: Trapezoidal nodes in :math:`t = \log\lambda` over :math:`[-20, 20]` (step 0.25).
NODES = 161
_T = 20.0


class RegularizedHorseshoe(dist.TorchDistribution):
    r"""The regularised horseshoe's marginal density of one weight (see the module):
    :math:`\tau` = ``global_scale``, :math:`c` = ``slab_scale`` (``inf``: the horseshoe)."""

    arg_constraints = {
        "global_scale": constraints.positive,
        "slab_scale": constraints.positive,
    }
    support = constraints.real

    def __init__(self, global_scale, slab_scale, validate_args=None):
        self.global_scale, self.slab_scale = broadcast_all(global_scale, slab_scale)
        super().__init__(self.global_scale.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(RegularizedHorseshoe, _instance)
        batch_shape = torch.Size(batch_shape)
        new.global_scale = self.global_scale.expand(batch_shape)
        new.slab_scale = self.slab_scale.expand(batch_shape)
        super(RegularizedHorseshoe, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @staticmethod
    def weight_scale(lam: torch.Tensor, tau: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        r""":math:`\tau\tilde\lambda = \tau c \lambda / \sqrt{c^2 + \tau^2\lambda^2}`, the
        weight's standard deviation given :math:`\lambda` (broadcast together)."""
        return tau * lam / (1 + (tau * lam / c).square()).sqrt()

    @torch.no_grad()
    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        tau = self.global_scale
        lam = torch.empty(shape, dtype=tau.dtype, device=tau.device).cauchy_().abs()
        return self.weight_scale(lam, tau, self.slab_scale) * torch.randn_like(lam)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        tau, c = self.global_scale, self.slab_scale
        if not any(tau.stride()) and not any(c.stride()):  # one value, expanded: the nodes once
            tau, c = tau.as_strided((), ()), c.as_strided((), ())
        t = torch.linspace(-_T, _T, NODES, dtype=tau.dtype, device=tau.device)
        step = 2 * _T / (NODES - 1)
        log_w = math.log(2 * step / math.pi) - torch.logaddexp(t, -t)  # sech(t) / pi
        s = self.weight_scale(t.exp(), tau.unsqueeze(-1), c.unsqueeze(-1))
        offset = log_w - s.log() - 0.5 * math.log(2 * math.pi)
        return torch.logsumexp(offset - 0.5 * (value.unsqueeze(-1) / s).square(), -1)


class RegularizedHorseshoePrior(Prior):
    r"""I.i.d. regularised horseshoe (Piironen and Vehtari 2017) for every weight:
    :class:`RegularizedHorseshoe` with global scale :math:`\tau` and slab width :math:`c`
    (see :mod:`twodg_pyro.priors.horseshoe`: the local scales are integrated out, exactly
    in sampling and by quadrature in the log-density; :math:`\tau`, :math:`c` are fixed).

    No closed-form KL against a Normal guide exists: the ELBO uses Monte Carlo (the
    mean-field guide's step is traced, not fast).

    Example::

        model = BNNModel(net, prior=RegularizedHorseshoePrior(global_scale=0.1))

    In run settings: ``prior.kind = "horseshoe"``, ``prior.scale`` :math:`= \tau`,
    ``prior.delta`` :math:`= c` (0, the default: ``slab_scale``'s default 2).

    Args:
        global_scale: :math:`\tau > 0`.
        slab_scale: :math:`c > 0` (the larger, the closer to the plain horseshoe).
    """

    kind = "RegularizedHorseshoePrior"
    aliases = ("horseshoe", "regularized_horseshoe")  # in run settings
    settled = True

    def __init__(self, global_scale: float = 0.1, slab_scale: float = 2.0):
        self.global_scale = _positive(global_scale, "RegularizedHorseshoePrior global_scale")
        self.slab_scale = _positive(slab_scale, "RegularizedHorseshoePrior slab_scale")

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return RegularizedHorseshoe(
            self.constant(self.global_scale), self.constant(self.slab_scale), validate_args=False
        )

    @classmethod
    def from_settings(cls, scale: float, delta: float, net=None) -> RegularizedHorseshoePrior:
        r"""``prior.scale`` is :math:`\tau`, ``prior.delta`` :math:`c` (0: the default)."""
        return cls(scale, delta) if delta > 0 else cls(scale)
