r"""The Bayesian neural network as a Pyro model program.

.. math::
    p(\mathcal D, w) = \prod_{s \in \text{sites}} p(w_s)
        \prod_{n=1}^{N} p(y_n \mid f_w(x_n))

Any ``torch.nn.Module`` becomes a model: its selected Linear/Conv weights and biases
are Pyro sample sites (one per tensor) and the network runs with the sampled values
through :func:`torch.func.functional_call`, so the network itself is never
modified.  Parameters that are not Bayesian (normalisation layers, or layers left
out) stay point estimates, trained alongside the guide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import pyro
import torch
from torch import nn
from torch.func import functional_call

from .likelihoods import Categorical, Likelihood
from .nn.sites import DEFAULT_LAYER_TYPES, BayesianSite, find_sites
from .priors import Prior, as_prior

__all__ = ["BNNModel", "match_input"]


def match_input(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` on ``like``'s device, in ``like``'s dtype if ``x`` is floating (integer inputs,
    e.g. token ids, keep theirs); ``x`` itself when it is there already."""
    if x.is_floating_point():
        if x.dtype != like.dtype or x.device != like.device:
            return x.to(device=like.device, dtype=like.dtype)
        return x
    return x if x.device == like.device else x.to(like.device)


class BNNModel(nn.Module):
    """Pyro model ``p(w) p(y | f_w(x))`` around any torch network.

    Args:
        net: the deterministic network; its current Bayesian parameter values are the
            initial means of a guide (pretrained or fresh initialisation).
        prior: a :class:`~twodg_pyro.priors.Prior`, a distribution, a per-site
            function, or a float (Normal scale). Default ``NormalPrior(1.0)``.
        likelihood: a :class:`~twodg_pyro.likelihoods.Likelihood`, or an int ``N`` for
            a categorical likelihood over ``N`` training examples.
        layer_types, include, exclude, bias: which parameters are Bayesian
            (see :func:`~twodg_pyro.nn.find_sites`).

    Calling the model ``model(x, y)`` samples every site from the prior (or replays
    the guide's values under SVI) and observes ``y``.
    """

    def __init__(
        self,
        net: nn.Module,
        prior: Prior | Callable | float | None = None,
        likelihood: Likelihood | int = 1,
        layer_types: Iterable[type[nn.Module]] = DEFAULT_LAYER_TYPES,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        bias: bool = True,
    ):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.sites: list[BayesianSite] = find_sites(net, layer_types, include, exclude, bias)
        self.prior = as_prior(prior)
        self.likelihood = (
            likelihood if isinstance(likelihood, Likelihood) else Categorical(int(likelihood))
        )
        # The Bayesian tensors stay in the network as frozen initial values: they are
        # never used by the model (functional_call overrides them) but keep `net`
        # runnable on its own and give guides their initial means.
        params = dict(net.named_parameters())
        for site in self.sites:
            params[site.name].requires_grad_(False)
        self.net = net
        # (owning module, parameter name) of each site: the current parameter (its device
        # and dtype after .to(...)) is one dict lookup away at every step
        self._site_slots = [
            (net.get_submodule(site.module_name), site.param_name) for site in self.sites
        ]

    # ------------------------------------------------------------------ helpers
    @property
    def site_names(self) -> list[str]:
        """Names of the Bayesian sample sites, in network order."""
        return [s.name for s in self.sites]

    @property
    def num_weights(self) -> int:
        """``n_w``: number of Bayesian scalar weights."""
        return sum(s.numel for s in self.sites)

    def site_parameter(self, i: int) -> torch.Tensor:
        """The network's (frozen) parameter of the ``i``-th site: its device and dtype are
        those of the site's prior and of the guides built on the model."""
        module, name = self._site_slots[i]
        return module._parameters[name]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the network's Bayesian parameters (``float32`` unless cast)."""
        return self.site_parameter(0).dtype

    @property
    def device(self) -> torch.device:
        """The device of the network's Bayesian parameters."""
        return self.site_parameter(0).device

    def initial_values(self) -> dict[str, torch.Tensor]:
        """The network's current values of the Bayesian tensors (detached copies)."""
        params = dict(self.net.named_parameters())
        return {s.name: params[s.name].detach().clone() for s in self.sites}

    def deterministic_parameters(self) -> list[nn.Parameter]:
        """Point-estimated parameters of the network (e.g. BatchNorm affine)."""
        return [p for p in self.net.parameters() if p.requires_grad]

    def prior_distribution(self, site: BayesianSite):
        """The prior of one site as used by the model program (``event_shape = shape``),
        on the network's device and in its dtype."""
        return self.prior(site, self.site_parameter(self.sites.index(site)))

    def network_forward(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor):
        """Run the network with the given Bayesian tensors: :math:`f_w(x)`.

        Floating inputs are cast to the network's dtype and moved to its device (a
        float32 data set feeds a float64 network)."""
        x = match_input(x, self.site_parameter(0))
        return functional_call(self.net, dict(weights), (x,), strict=False)

    # ------------------------------------------------------------------ program
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        weights = {
            site.name: pyro.sample(site.name, self.prior(site, self.site_parameter(i)))
            for i, site in enumerate(self.sites)
        }
        try:
            output = self.network_forward(weights, x)
        except RuntimeError as e:
            if isinstance(e, torch.OutOfMemoryError):
                raise
            raise ValueError(
                f"input of shape {tuple(x.shape)} does not fit the network "
                f"{type(self.net).__name__}: {e}"
            ) from e
        self.likelihood(output, y)
        return output
