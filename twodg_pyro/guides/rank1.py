r"""Rank-1 Bayesian neural networks (Dusenberry et al., ICML 2020) as a model and a guide.

Every selected Linear/Conv weight becomes :math:`W \circ (r s^\top)`
(:mod:`twodg_pyro.nn.rank1`): :math:`W` and the biases (and normalisation layers) stay
deterministic point estimates, trained with the guide; only the factor vectors are
random.  The posterior is a mixture of ``M`` components,

.. math::
    q(r, s) = \frac1M \sum_{m=1}^M q_m(r, s), \qquad
    q_m = \prod_\ell \mathcal N(r_{\ell m} \mid \mu^r_{\ell m}, \mathrm{diag}\sigma^{r\,2}_{\ell m})
        \,\mathcal N(s_{\ell m} \mid \mu^s_{\ell m}, \mathrm{diag}\sigma^{s\,2}_{\ell m}),

so each layer ``l`` has two Pyro sample sites, ``"<layer>.r"`` of shape ``(M, out)`` and
``"<layer>.s"`` of shape ``(M, in)``, one row per component.

**Objective.**  Each example of a minibatch is routed to one component (batch-ensemble
style) and the loss is the average per-component negative ELBO,

.. math::
    \frac1M \sum_{m=1}^M \Big( -\mathbb E_{q_m}[\log p(\mathcal D \mid W, r_m, s_m)]
        + \mathrm{KL}(q_m \,\|\, p) \Big),

estimated by routing example ``i`` of a batch to component ``i mod M`` (``routing=
"modulo"``, the cost of one deterministic forward) or by tiling the batch ``M`` times so
that every example meets every component (``routing="tile"``, ``M`` times the cost, lower
variance); the likelihood's data plate rescales either to the data-set size.  By the
convexity of KL, :math:`\mathrm{KL}(\frac1M\sum_m q_m \| p) \le \frac1M \sum_m
\mathrm{KL}(q_m \| p)`, so this is still a lower bound on the evidence.  As Pyro programs,
the model and the guide count each factor site :math:`1/M` (``poutine.scale``), so the KL
of every ELBO -- :class:`~twodg_pyro.infer.DecomposedELBO` through
:meth:`Rank1Guide.site_kl`, and stock ``Trace_ELBO``/``TraceMeanField_ELBO`` -- is this
per-component average.

**Priors** are centred at 1 (the factors multiply :math:`W`, :func:`rank1_prior`): the
Normal has a closed-form KL against the Normal posterior, the Cauchy the ELBO's
one-sample Monte Carlo estimate.  **Initialisation**: posterior standard deviations near
zero, means at random signs :math:`\pm 1` (as in the paper and BatchEnsemble, so that the
components differ from the first step).  **Prediction** averages the predictive
probabilities over every component (``output_components = M``) and posterior sample.
KL annealing over the first two thirds of training, as in the paper, is
:func:`rank1_kl_annealing`.
"""

from __future__ import annotations

from typing import Literal, get_args

import pyro.poutine as poutine
import torch
from torch import nn

from ..guide import GuideSample, kl_or_estimate
from ..infer.callbacks import KLAnnealing
from ..nn.functional import inverse_softplus
from ..priors import CauchyPrior
from ..rank1_bnn import RANK1_PRIORS, ROUTINGS, Rank1BNNModel, Rank1PriorKind, Routing, rank1_prior
from .base import DiagonalNormalGuide, site_key
from .mean_field import check_init_scale

__all__ = [
    "CauchyPrior",
    "Rank1BNNModel",
    "Rank1Guide",
    "rank1_prior",
    "rank1_kl_annealing",
    "ROUTINGS",
    "INIT_MEANS",
    "RANK1_PRIORS",
    "InitMean",
    "Rank1PriorKind",
    "Routing",
]

#: how the rank-1 factors' means start (the model's routings and priors:
#: :mod:`twodg_pyro.rank1_bnn`, imported here with the model)
InitMean = Literal["random_sign", "ones"]
INIT_MEANS: tuple[str, ...] = get_args(InitMean)


def rank1_kl_annealing(epochs: int, fraction: float = 2.0 / 3.0) -> KLAnnealing:
    r"""Linear KL annealing :math:`\beta: 0 \to 1` over the first ``fraction`` of ``epochs``."""
    if not (0.0 <= fraction <= 1.0):
        raise ValueError(f"annealing fraction must be in [0, 1], got {fraction!r}")
    return KLAnnealing(int(round(fraction * int(epochs))))


class Rank1Guide(DiagonalNormalGuide):
    r"""Mixture of ``M`` mean-field Normals over the factors of a :class:`Rank1BNNModel`.

    Component ``m`` of site ``"<layer>.r"`` is
    :math:`\mathcal N(\mu_m, \operatorname{diag}\sigma_m^2)`, :math:`\sigma =
    \operatorname{softplus}(\rho)`; a site's parameters are ``(M, dim)`` tensors.
    The :class:`~twodg_pyro.guides.base.DiagonalNormalGuide` methods work on them
    whole: :meth:`loc` and :meth:`scale` are ``(M, dim)``, :meth:`site_distribution`
    holds all ``M`` components of a site as one event of shape ``(M, dim)``.

    Args:
        model: the :class:`Rank1BNNModel`.
        init_scale: initial :math:`\sigma` of every factor (near zero: default 1e-3).
        init_mean: ``"random_sign"`` (means :math:`\pm 1` with probability 1/2 each, as in
            the paper) or ``"ones"``.
        seed: seed of the random signs.

    Raises:
        ValueError: unknown ``init_mean`` or non-positive ``init_scale``.

    Example::

        model = Rank1BNNModel(LeNet5(), likelihood=N, components=4)
        guide = Rank1Guide(model, init_scale=1e-3)
        fit(model, guide, loader, epochs=40, callbacks=[rank1_kl_annealing(40)])
        predict(model, guide, (x, y), num_samples=30)   # 30 draws x 4 components
    """

    method = "rank1"

    def __init__(
        self,
        model: Rank1BNNModel,
        init_scale: float = 1e-3,
        init_mean: str = "random_sign",
        seed: int = 0,
    ):
        super().__init__()
        if not isinstance(model, Rank1BNNModel):
            raise TypeError(f"Rank1Guide needs a Rank1BNNModel, got {type(model).__name__}")
        if init_mean not in INIT_MEANS:
            raise ValueError(f"unknown init_mean {init_mean!r}; use one of {list(INIT_MEANS)}")
        init_scale = float(init_scale)
        check_init_scale(init_scale)
        self.sites = list(model.sites)
        self.components = model.components
        # the factors follow the network's device and dtype
        device, dtype = model.device, model.dtype
        generator = torch.Generator().manual_seed(int(seed))
        self.locs, self.rhos = nn.ParameterDict(), nn.ParameterDict()
        for site in self.sites:
            if init_mean == "ones":
                loc = torch.ones(site.shape)
            else:
                loc = torch.randint(0, 2, site.shape, generator=generator).float() * 2 - 1
            rho = inverse_softplus(torch.full(site.shape, init_scale, dtype=dtype))
            self.locs[site_key(site.name)] = nn.Parameter(loc.to(device=device, dtype=dtype))
            self.rhos[site_key(site.name)] = nn.Parameter(rho.to(device))

    def mean_weights(self) -> dict[str, torch.Tensor]:
        """Refused: the sites are the members' factors, and a rank-1 BNN's weights are a
        mixture of its ``M`` members, not one mean network.

        Raises:
            TypeError: always.
        """
        raise TypeError(
            "Rank1Guide has no per-weight posterior means: its sites are the factors of "
            f"{self.components} mixture members"
        )

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        r"""The factor sites, each counted :math:`1/M` (``poutine.scale``), as in the model:
        the per-component average of the objective."""
        with poutine.scale(scale=1.0 / self.components):
            return super().forward(*args, **kwargs)

    def site_kl(
        self, name: str, prior_fn, value: torch.Tensor, guide_fn=None
    ) -> dict[str, torch.Tensor]:
        r"""``{"kl": sum_m KL(q_m || p)}`` for one factor site; the site's scale
        :math:`1/M` (applied by the ELBO) makes it the per-component average.

        Closed form when registered (Normal prior), else the one-sample Monte Carlo
        estimate :math:`\log q_m(v_m) - \log p(v_m)` (Cauchy prior).  Always of the
        guide's own :meth:`site_distribution` (``guide_fn`` is not used).
        """
        return {"kl": kl_or_estimate(self.site_distribution(self.site(name)), prior_fn, value)}

    def kl_terms(self, priors, values) -> dict[str, torch.Tensor]:
        """The sites' KL terms, each factor site counted :math:`1/M` as in the program."""
        return {k: v / self.components for k, v in super().kl_terms(priors, values).items()}

    def draw(self, num_samples: int | None = None) -> GuideSample:
        """Factor draws: ``(M, dim)`` per site, or ``(num_samples, M, dim)``, in two
        roundings (:meth:`normal_draws` with ``rsample``), not the fused ``addcmul`` of
        :meth:`DiagonalNormalGuide.draw`: the factor draws stay what they have always been."""
        return GuideSample(self.normal_draws(num_samples)[0])
