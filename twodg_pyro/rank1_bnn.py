r"""The rank-1 Bayesian neural network's model (Dusenberry et al., ICML 2020): every
selected Linear/Conv weight becomes :math:`W \circ (r s^\top)` (:mod:`twodg_pyro.nn.rank1`)
with ``M`` batch-ensemble components; only the factor vectors are random.  The
objective, the guide and the priors are described in :mod:`twodg_pyro.guides.rank1`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, get_args

import pyro.poutine as poutine
import torch
from torch import nn

from .bnn import SiteTensors, match_input
from .likelihoods import Likelihood
from .nn.rank1 import RANK1_LAYER_TYPES, Rank1Layer, find_rank1_layers, rank1_factors
from .nn.sites import BayesianSite
from .priors import CauchyPrior, NormalPrior, Prior, as_prior

__all__ = ["RANK1_PRIORS", "ROUTINGS", "Rank1BNNModel", "Rank1PriorKind", "Routing", "rank1_prior"]

#: which component an example goes to; the rank-1 factors' prior
Routing = Literal["modulo", "tile"]
ROUTINGS: tuple[str, ...] = get_args(Routing)
Rank1PriorKind = Literal["normal", "cauchy"]
RANK1_PRIORS: tuple[str, ...] = get_args(Rank1PriorKind)


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


def _factor_prior(prior) -> Prior:
    if prior is None or isinstance(prior, str):
        return rank1_prior("normal" if prior is None else prior)
    if isinstance(prior, (int, float)) and not isinstance(prior, bool):
        return rank1_prior("normal", float(prior))
    return as_prior(prior)


class Rank1BNNModel(SiteTensors):
    r"""Pyro model of a rank-1 BNN with ``M`` batch-ensemble components.

    Same constructor surface as :class:`~twodg_pyro.bnn.BNNModel`; its sample sites are
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

    Example::

        model = Rank1BNNModel(MLP(64, (64,), 10), likelihood=N, components=4, routing="modulo")
        guide = Rank1Guide(model)
        fit(model, guide, loader, epochs=40)
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
        super().__init__(net, likelihood)
        if isinstance(components, bool) or not isinstance(components, int) or components < 1:
            raise ValueError(
                f"the number of mixture components M must be an integer >= 1, got {components!r}"
            )
        self.components = components
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; use one of {list(ROUTINGS)}")
        self.routing = routing
        self.layers: list[Rank1Layer] = find_rank1_layers(net, layer_types, include, exclude)
        self.prior = _factor_prior(prior)
        params = dict(net.named_parameters())
        self.sites: list[BayesianSite] = []
        self._factor_sites: dict[str, tuple[str, str]] = {}
        for layer in self.layers:
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
            r_site, s_site = self.sites[-2:]
            self._factor_sites[layer.module_name] = (r_site.name, s_site.name)
        # the layer's shared weight W of each factor site: the device and dtype of its prior
        self._site_weights = [net.get_submodule(site.module_name) for site in self.sites]

    @property
    def factor_sites(self) -> dict[str, tuple[str, str]]:
        """``{module_name: (r_site, s_site)}`` for every rank-1 layer."""
        return dict(self._factor_sites)

    @property
    def output_components(self) -> int:
        """``M``: :meth:`network_forward` returns one output per component."""
        return self.components

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
        :meth:`~twodg_pyro.guides.Rank1Guide.sample_weights`); every example is evaluated
        under every component (the batch is tiled ``M`` times).
        """
        out = self.routed_forward(weights, self._tile(x), self._tiled_assignment(x))
        return out.reshape(self.components, x.shape[0], *out.shape[1:])

    def _tile(self, t: torch.Tensor) -> torch.Tensor:
        """The batch ``t`` repeated ``M`` times."""
        return t.repeat(self.components, *([1] * (t.dim() - 1)))

    def _tiled_assignment(self, x: torch.Tensor) -> torch.Tensor:
        """The component of each example of :meth:`_tile` ``(x)``."""
        m = torch.arange(self.components, device=x.device)
        return m.repeat_interleave(x.shape[0])

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        r"""The model program: the factor sites, each counted :math:`1/M` (so that a stock
        ELBO's KL is the per-component average :math:`\frac1M\sum_m \mathrm{KL}(q_m\|p)`,
        as with :class:`~twodg_pyro.infer.DecomposedELBO`), the routed network, the
        ``"logits"`` site (:data:`~twodg_pyro.bnn.LOGITS_SITE`) and the likelihood."""
        self._param_statements()
        with poutine.scale(scale=1.0 / self.components):
            factors = self._sample_sites()
        for site in self.sites:
            if factors[site.name].dim() != len(site.shape):
                raise ValueError(
                    f"Rank1BNNModel got factors of shape {tuple(factors[site.name].shape)} at "
                    f"site {site.name!r} (shape {tuple(site.shape)}): it does not run on a "
                    "leading particle dimension; use Predictive(..., parallel=False), "
                    "vectorize_particles=False, or twodg_pyro.prediction.predict"
                )
        if self.routing == "tile":
            assignment = self._tiled_assignment(x)
            x, y = self._tile(x), None if y is None else self._tile(y)
        else:
            assignment = self.route(x.shape[0], x.device)
        output = self.routed_forward(factors, x, assignment)
        self._observe(output, y)
        return output
