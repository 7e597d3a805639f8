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

**Priors** are centred at 1 (the factors multiply :math:`W`): ``Normal(1, scale)`` or
``Cauchy(1, scale)`` (:func:`rank1_prior`).  The Normal has a closed-form KL against the
Normal posterior; the Cauchy uses the ELBO's one-sample Monte Carlo estimate.

**Initialisation.**  Posterior standard deviations start near zero (``init_scale=1e-3``,
"deterministic initialisation").  Posterior means start at random signs :math:`\pm 1`
(``init_mean="random_sign"``, as in the paper and BatchEnsemble), which makes the
components differ from the first step; ``init_mean="ones"`` starts every component at
the deterministic network.

**Prediction** evaluates every test example under every component and every posterior
sample and averages the predictive probabilities: :meth:`Rank1BNNModel.network_forward`
returns the outputs of all ``M`` components and the model's ``output_components = M``
tells :func:`twodg_pyro.prediction.predict` to average over them too.

KL annealing over the first two thirds of training (as in the paper) is
``KLAnnealing(round(2 * epochs / 3))`` (:func:`rank1_kl_annealing`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, get_args

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from torch import nn

from ..guide import GuideSample, kl_or_estimate
from ..infer.callbacks import KLAnnealing
from ..likelihoods import Categorical, Likelihood
from ..model import LOGITS_SITE, SiteTensors, match_input
from ..nn.functional import inverse_softplus
from ..nn.rank1 import RANK1_LAYER_TYPES, Rank1Layer, find_rank1_layers, rank1_factors
from ..nn.sites import BayesianSite
from ..priors import NormalPrior, Prior, _positive, as_prior
from ..pyro_params import PyroParamsMixin, params_are_local
from .base import DiagonalNormalGuide, site_key, standard_normal

__all__ = [
    "CauchyPrior",
    "Rank1BNNModel",
    "Rank1Guide",
    "rank1_prior",
    "rank1_kl_annealing",
    "ROUTINGS",
    "INIT_MEANS",
    "RANK1_PRIORS",
]

#: which component an example goes to; how the rank-1 factors' means start; their prior
Routing = Literal["modulo", "tile"]
ROUTINGS: tuple[str, ...] = get_args(Routing)
InitMean = Literal["random_sign", "ones"]
INIT_MEANS: tuple[str, ...] = get_args(InitMean)
Rank1PriorKind = Literal["normal", "cauchy"]
RANK1_PRIORS: tuple[str, ...] = get_args(Rank1PriorKind)


class CauchyPrior(Prior):
    r"""I.i.d. Cauchy prior :math:`p(v) = \frac{1}{\pi \gamma (1 + ((v - \text{loc})/\gamma)^2)}`.

    No closed-form KL against a Normal guide exists: the ELBO uses Monte Carlo.
    """

    def __init__(self, scale: float = 1.0, loc: float = 1.0):
        self.loc = float(loc)
        self.scale = _positive(scale, "CauchyPrior scale")

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return dist.Cauchy(self.constant(self.loc), self.constant(self.scale), validate_args=False)


def rank1_prior(kind: str = "normal", scale: float = 1.0) -> Prior:
    r"""The factor prior: ``"normal"`` -> :math:`\mathcal N(1, \text{scale}^2)`,
    ``"cauchy"`` -> :math:`\mathrm{Cauchy}(1, \text{scale})`.

    Raises:
        ValueError: for another ``kind`` or a non-positive ``scale``.
    """
    if kind == "normal":
        return NormalPrior(scale, loc=1.0)
    if kind == "cauchy":
        return CauchyPrior(scale, loc=1.0)
    raise ValueError(f"unknown rank-1 prior {kind!r}; use 'normal' or 'cauchy'")


def rank1_kl_annealing(epochs: int, fraction: float = 2.0 / 3.0) -> KLAnnealing:
    r"""Linear KL annealing :math:`\beta: 0 \to 1` over the first ``fraction`` of ``epochs``."""
    if not (0.0 <= fraction <= 1.0):
        raise ValueError(f"annealing fraction must be in [0, 1], got {fraction!r}")
    return KLAnnealing(int(round(fraction * int(epochs))))


def _factor_prior(prior) -> Prior:
    if prior is None:
        return NormalPrior(1.0, loc=1.0)
    if isinstance(prior, str):
        return rank1_prior(prior)
    if isinstance(prior, (int, float)) and not isinstance(prior, bool):
        return NormalPrior(float(prior), loc=1.0)
    return as_prior(prior)


def _check_components(components) -> int:
    if isinstance(components, bool) or not isinstance(components, int) or components < 1:
        raise ValueError(
            f"the number of mixture components M must be an integer >= 1, got {components!r}"
        )
    return components


class Rank1BNNModel(SiteTensors, PyroParamsMixin, nn.Module):
    r"""Pyro model of a rank-1 BNN with ``M`` batch-ensemble components.

    Same constructor surface as :class:`~twodg_pyro.model.BNNModel`; its sample sites are
    the factor vectors (one site per factor tensor, shape ``(M, dim)``), not the weights.

    Args:
        net: the network; its Linear/Conv weights become the shared :math:`W` and are
            trained as point estimates (with biases and normalisation layers).
        prior: the factor prior: a :class:`~twodg_pyro.priors.Prior` (centre it at 1),
            ``"normal"``/``"cauchy"`` (scale 1), a float ``scale`` of
            :math:`\mathcal N(1, \text{scale}^2)`, or ``None`` (:math:`\mathcal N(1, 1)`).
        likelihood: a :class:`~twodg_pyro.likelihoods.Likelihood` or the data-set size.
        components: ``M``, the number of mixture components (default 4).
        layer_types, include, exclude: which layers get factors (globs on weight names).
        routing: ``"modulo"`` (example ``i`` -> component ``i mod M``) or ``"tile"``
            (every example through every component) during training.

    Raises:
        ValueError: ``M < 1``, an unknown routing, a layer type without rank-1 form, or a
            factor site name that collides with a parameter of ``net``.
    """

    def __init__(
        self,
        net: nn.Module,
        prior: Prior | Callable | float | str | None = None,
        likelihood: Likelihood | int = 1,
        components: int = 4,
        layer_types: Iterable[type[nn.Module]] = RANK1_LAYER_TYPES,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        routing: str = "modulo",
    ):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.components = _check_components(components)
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; use one of {list(ROUTINGS)}")
        self.routing = routing
        self.layers: list[Rank1Layer] = find_rank1_layers(net, layer_types, include, exclude)
        self.prior = _factor_prior(prior)
        self.likelihood = (
            likelihood if isinstance(likelihood, Likelihood) else Categorical(int(likelihood))
        )
        self.net = net
        params = dict(net.named_parameters())
        self.sites: list[BayesianSite] = []
        self._factor_sites: dict[str, tuple[str, str]] = {}
        for layer in self.layers:
            names = []
            for which, dim in (("r", layer.out_features), ("s", layer.in_features)):
                name = f"{layer.module_name}.{which}" if layer.module_name else which
                if name in params:
                    raise ValueError(
                        f"factor site {name!r} collides with a parameter of {type(net).__name__}"
                    )
                self.sites.append(
                    BayesianSite(
                        name=name,
                        module_name=layer.module_name,
                        param_name=which,
                        shape=torch.Size([self.components, dim]),
                        layer_type=layer.layer_type,
                        fan_in=layer.fan_in,
                    )
                )
                names.append(name)
            self._factor_sites[layer.module_name] = (names[0], names[1])
        # the layer's shared weight W of each factor site: the device and dtype of its prior
        self._site_weights = [net.get_submodule(site.module_name) for site in self.sites]

    # ------------------------------------------------------------------ helpers
    @property
    def site_names(self) -> list[str]:
        """Names of the factor sample sites, in network order (``r`` then ``s`` per layer)."""
        return [s.name for s in self.sites]

    @property
    def num_weights(self) -> int:
        """Number of random scalars, ``M * sum over layers of (in + out)``."""
        return sum(s.numel for s in self.sites)

    @property
    def factor_sites(self) -> dict[str, tuple[str, str]]:
        """``{module_name: (r_site, s_site)}`` for every rank-1 layer."""
        return dict(self._factor_sites)

    @property
    def output_components(self) -> int:
        """``M``: :meth:`network_forward` returns one output per component."""
        return self.components

    def deterministic_parameters(self) -> list[nn.Parameter]:
        """The shared weights :math:`W`, the biases and normalisation parameters."""
        return [p for p in self.net.parameters() if p.requires_grad]

    def site_parameter(self, i: int) -> torch.Tensor:
        """The shared weight :math:`W` of the layer of the ``i``-th factor site: its device
        and dtype are those of the site's prior and of the guide."""
        return self._site_weights[i]._parameters["weight"]

    def route(self, batch_size: int, device=None) -> torch.Tensor:
        """Component of each example of a batch under ``"modulo"`` routing: ``i mod M``."""
        return torch.arange(batch_size, device=device) % self.components

    def routed_forward(
        self,
        factors: Mapping[str, torch.Tensor],
        x: torch.Tensor,
        assignment: torch.Tensor,
    ) -> torch.Tensor:
        r"""Run the network with example ``i`` through component ``assignment[i]``.

        Args:
            factors: ``{site: (M, dim)}`` factor values.
            x: inputs ``(B, ...)``.
            assignment: ``(B,)`` component indices.
        """
        per_layer = {
            module: (factors[r_name][assignment], factors[s_name][assignment])
            for module, (r_name, s_name) in self._factor_sites.items()
        }
        with rank1_factors(self.net, per_layer):
            return self.net(match_input(x, self.site_parameter(0)))

    def network_forward(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor):
        r"""Outputs of all ``M`` components: shape ``(M, B, ...)``.

        ``weights`` are factor values ``{site: (M, dim)}`` (one draw of
        :meth:`Rank1Guide.sample_weights`); every example is evaluated under every
        component (the batch is tiled ``M`` times).
        """
        m, b = self.components, x.shape[0]
        tiled = x.repeat(m, *([1] * (x.dim() - 1)))
        assignment = torch.arange(m, device=x.device).repeat_interleave(b)
        out = self.routed_forward(weights, tiled, assignment)
        return out.reshape(m, b, *out.shape[1:])

    # ------------------------------------------------------------------ program
    def pyro_parameters(self):
        """The network's point-estimated parameters (the shared weights :math:`W`, biases,
        normalisation layers) as ``("net.<name>", parameter)``."""
        return ((f"net.{n}", p) for n, p in self.net.named_parameters() if p.requires_grad)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        r"""The model program: the factor sites, each counted :math:`1/M` (so that a stock
        ELBO's KL is the per-component average :math:`\frac1M\sum_m \mathrm{KL}(q_m\|p)`,
        as with :class:`~twodg_pyro.infer.DecomposedELBO`), the routed network, the
        ``"logits"`` site (:data:`~twodg_pyro.model.LOGITS_SITE`) and the likelihood."""
        local = params_are_local()
        if not local:
            self._param_statements()
        with poutine.scale(scale=1.0 / self.components):
            factors = {
                site.name: pyro.sample(site.name, self.prior(site, self.site_parameter(i)))
                for i, site in enumerate(self.sites)
            }
        for site in self.sites:
            if factors[site.name].dim() != len(site.shape):
                raise ValueError(
                    f"Rank1BNNModel got factors of shape {tuple(factors[site.name].shape)} at "
                    f"site {site.name!r} (shape {tuple(site.shape)}): it does not run on a "
                    "leading particle dimension; use Predictive(..., parallel=False), "
                    "vectorize_particles=False, or twodg_pyro.prediction.predict"
                )
        if self.routing == "tile":
            m, b = self.components, x.shape[0]
            x = x.repeat(m, *([1] * (x.dim() - 1)))
            y = None if y is None else y.repeat(m, *([1] * (y.dim() - 1)))
            assignment = torch.arange(m, device=x.device).repeat_interleave(b)
        else:
            assignment = self.route(x.shape[0], x.device)
        output = self.routed_forward(factors, x, assignment)
        if local:  # the fast path: no bookkeeping site
            self.likelihood(output, y)
        else:
            self.likelihood(output, y, outputs_site=LOGITS_SITE)
        return output


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
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be a positive float, got {init_scale!r}")
        self.sites = list(model.sites)
        self.components = model.components
        # the factors follow the network's device and dtype
        device, dtype = model.device, model.dtype
        generator = torch.Generator().manual_seed(int(seed))
        locs, rhos = {}, {}
        for site in self.sites:
            if init_mean == "ones":
                loc = torch.ones(site.shape)
            else:
                loc = torch.randint(0, 2, site.shape, generator=generator).float() * 2 - 1
            rho = inverse_softplus(torch.full(site.shape, init_scale, dtype=dtype))
            locs[site_key(site.name)] = nn.Parameter(loc.to(device=device, dtype=dtype))
            rhos[site_key(site.name)] = nn.Parameter(rho.to(device))
        self.locs = nn.ParameterDict(locs)
        self.rhos = nn.ParameterDict(rhos)

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

    # ------------------------------------------------------------------ BNNGuide API
    def draw(self, num_samples: int | None = None) -> GuideSample:
        """Factor draws: ``(M, dim)`` per site, or ``(num_samples, M, dim)``."""
        # loc + scale * eps in two roundings, not DiagonalNormalGuide's fused addcmul:
        # keeps the factor draws bit for bit what they have always been
        out = {}
        for site in self.sites:
            loc, scale = self.loc(site.name), self.scale(site.name)
            out[site.name] = loc + scale * standard_normal(loc, num_samples)
        return GuideSample(out)
