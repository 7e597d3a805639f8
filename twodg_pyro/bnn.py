r"""The Bayesian neural network as a Pyro model program.

.. math::
    p(\mathcal D, w) = \prod_{s \in \text{sites}} p(w_s)
        \prod_{n=1}^{N} p(y_n \mid f_w(x_n))

Any ``torch.nn.Module`` becomes a model: its selected Linear/Conv weights and biases
are Pyro sample sites (one per tensor) and the network runs with the sampled values
through :func:`torch.func.functional_call`, so the network itself is never
modified.  Parameters that are not Bayesian (normalisation layers, or layers left
out) stay point estimates, trained alongside the guide; the program declares them to
Pyro (``pyro.param`` statements, see :mod:`twodg_pyro.pyro_params`) so stock
``pyro.infer.SVI`` trains them too.

The network's outputs are the deterministic site ``"logits"`` (:data:`LOGITS_SITE`;
the means for a regression likelihood), so ``poutine.trace`` and
``Predictive(..., return_sites=["logits"])`` return them.  Weights with leading particle
dimensions (``Predictive(parallel=True)``, vectorised ELBO particles) run through the
network in one vectorised call (:func:`torch.func.vmap` over ``functional_call``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, get_args

import pyro
import pyro.poutine as poutine
import torch
from torch import nn
from torch.func import functional_call, vmap

from .likelihoods import Categorical, Likelihood
from .nn.functional import match_input
from .nn.sites import DEFAULT_LAYER_TYPES, BayesianSite, find_sites
from .priors import Prior, as_prior
from .pyro_params import PyroParamsMixin, params_are_local

__all__ = [
    "BNNModel",
    "LOGITS_SITE",
    "NORM_STATS",
    "NormStats",
    "SiteTensors",
    "expected_input",
    "input_mismatch",
    "match_input",
    "require_model",
]

#: Name of the model's deterministic site holding the network's outputs.
LOGITS_SITE = "logits"

#: ``BNNModel(norm_stats=...)``: normalisation statistics while training
NormStats = Literal["batch", "frozen"]
NORM_STATS: tuple[str, ...] = get_args(NormStats)


def require_model(model, who: str, needs: Sequence[str] = ("sites",)) -> nn.Module:
    """``model`` itself when it is a model module with the attributes ``needs`` (a
    :class:`BNNModel`, or a model of the same protocol such as the rank-1 BNN).

    Raises:
        TypeError: anything else, named; a Pyro handler around a model
            (``poutine.scale(model, ...)``) is told to pass the model itself.
    """
    if isinstance(model, nn.Module) and all(hasattr(model, n) for n in needs):
        return model
    inner = poutine.unwrap(model) if callable(model) else model
    if inner is not model and isinstance(inner, nn.Module):
        raise TypeError(
            f"{who} takes the BNNModel itself, got a Pyro handler around a "
            f"{type(inner).__name__} (poutine.scale, poutine.condition, ...): pass the model"
        )
    raise TypeError(f"{who} needs a BNNModel, got {type(model).__name__}")


def expected_input(net: nn.Module) -> str | None:
    """What the network's first layer takes, where it can be read (the first ``Linear``
    or convolution module in registration order): ``"its first layer layers.0 takes 64
    input features"``; ``None`` when there is none."""
    for name, module in net.named_modules():
        where = name or type(net).__name__
        if isinstance(module, nn.Linear):
            return f"its first layer {where} takes {module.in_features} input features"
        if isinstance(module, nn.modules.conv._ConvNd):
            return f"its first layer {where} takes {module.in_channels} input channels"
        if isinstance(module, nn.Embedding):
            return None
    return None


def input_mismatch(net: nn.Module, x: torch.Tensor, error: Exception) -> ValueError:
    """The one-line error of an input ``x`` the network ``net`` cannot run on: the input's
    shape, what the first layer takes (:func:`expected_input`) and torch's message."""
    expected = expected_input(net)
    detail = f" ({expected})" if expected else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ValueError(
        f"input of shape {tuple(x.shape)} does not fit the network {type(net).__name__}"
        f"{detail}: {first}"
    )


def _particle_dims(w: torch.Tensor, site: BayesianSite) -> tuple[int, ...]:
    """The leading (particle) dimensions of a site's value, trailing 1s dropped."""
    lead = list(w.shape[: w.dim() - len(site.shape)])
    while lead and lead[-1] == 1:
        lead.pop()
    return tuple(lead)


class SiteTensors(PyroParamsMixin, nn.Module):
    """What the models share (:class:`BNNModel`, the rank-1 BNN): the network ``net`` and
    the likelihood, and what their sites derive from the network's parameters.  A
    subclass sets ``sites`` and ``prior`` and provides ``site_parameter(i)`` (the network
    tensor behind the ``i``-th site)."""

    def __init__(self, net: nn.Module, likelihood: Likelihood | int):
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.net = net
        self.likelihood = (
            likelihood if isinstance(likelihood, Likelihood) else Categorical(int(likelihood))
        )
        like = next((p for p in net.parameters() if p.is_floating_point()), None)
        if like is not None:  # a learnt noise follows the network (later .to(...) moves both)
            self.likelihood.to(device=like.device, dtype=like.dtype)

    @property
    def site_names(self) -> list[str]:
        """Names of the Bayesian sample sites, in network order."""
        return [s.name for s in self.sites]

    @property
    def num_weights(self) -> int:
        """``n_w``: number of Bayesian scalars."""
        return sum(s.numel for s in self.sites)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the network's Bayesian parameters (``float32`` unless cast)."""
        return self.site_parameter(0).dtype

    @property
    def device(self) -> torch.device:
        """The device of the network's Bayesian parameters."""
        return self.site_parameter(0).device

    def prior_distribution(self, site: BayesianSite):
        """The prior of one site as the model program samples it (``event_shape`` the
        site's), on the network's device and in its dtype."""
        return self.prior(site, self.site_parameter(self.sites.index(site)))

    def deterministic_parameters(self) -> list[nn.Parameter]:
        """Point-estimated parameters of the network (e.g. BatchNorm affine; the rank-1
        BNN's shared weights) and of the likelihood (a learnt noise scale)."""
        return [p for _, p in self.pyro_parameters()]

    def pyro_parameters(self):
        """The point-estimated parameters as ``("net.<name>", parameter)`` and
        ``("likelihood.<name>", parameter)``: what the program declares to Pyro (e.g.
        BatchNorm's affine parameters, a :class:`~twodg_pyro.likelihoods.Gaussian`'s
        learnt ``log_scale``)."""
        for part in ("net", "likelihood"):
            for n, p in getattr(self, part).named_parameters():
                if p.requires_grad:
                    yield f"{part}.{n}", p

    def _sample_sites(self) -> dict[str, torch.Tensor]:
        """The program's sample statement of every site, from its prior."""
        return {
            site.name: pyro.sample(site.name, self.prior(site, self.site_parameter(i)))
            for i, site in enumerate(self.sites)
        }

    def _observe(self, output: torch.Tensor, y, particle_dims: int = 0) -> None:
        """The program's end: the likelihood, and the ``"logits"`` site off the fast path."""
        if params_are_local():  # the fast path: no bookkeeping site
            self.likelihood(output, y)
        else:
            self.likelihood(output, y, particle_dims=particle_dims, outputs_site=LOGITS_SITE)


class BNNModel(SiteTensors):
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
        norm_stats: how normalisation layers with running statistics (BatchNorm) run
            while the model trains: ``"batch"`` (torch's training mode: each minibatch
            normalised by its own statistics under the current weight draw, the running
            averages updated) or ``"frozen"`` (always the running statistics the network
            came with, e.g. from its pretraining, never updated).  Prediction uses the
            running statistics either way, so ``"frozen"`` makes the training objective
            the function that predicts: under ``"batch"`` every draw is renormalised
            during training, and the noise of the weights is seen at prediction only.
            Their affine parameters are point estimates in both.

    Calling the model ``model(x, y)`` samples every site from the prior (or replays
    the guide's values under SVI), records the outputs at the ``"logits"`` site and
    observes ``y``.  Weights may carry leading particle dimensions (see the module).

    Example::

        model = BNNModel(MLP(64, (128,), 10), prior=NormalPrior(1.0), likelihood=Categorical(N))
        guide = MeanFieldGuide(model)
        fit(model, guide, loader, epochs=150, lr={"loc": 1e-2, "scale": 1e-2})
        probs = predict(model, guide, (x_test, y_test), num_samples=30).mean
    """

    #: outputs of :meth:`network_forward` per draw (a rank-1 BNN's ``M`` components)
    output_components: int = 1

    def __init__(
        self,
        net: nn.Module,
        prior: Prior | Callable | float | None = None,
        likelihood: Likelihood | int = 1,
        layer_types: Iterable[type[nn.Module]] = DEFAULT_LAYER_TYPES,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        bias: bool = True,
        norm_stats: NormStats = "batch",
    ):
        super().__init__(net, likelihood)
        if norm_stats not in NORM_STATS:
            raise ValueError(f"norm_stats must be one of {list(NORM_STATS)}, got {norm_stats!r}")
        self.norm_stats = norm_stats
        self.sites: list[BayesianSite] = find_sites(net, layer_types, include, exclude, bias)
        self.prior = as_prior(prior)
        # The Bayesian tensors stay in the network as frozen initial values: they are
        # never used by the model (functional_call overrides them) but keep `net`
        # runnable on its own and give guides their initial means.
        params = dict(net.named_parameters())
        tied = [s.name for s in self.sites if s.name not in params]  # a second name of one
        if tied:
            first = {id(p): n for n, p in net.named_parameters()}  # its first name
            alias = first[id(net.get_parameter(tied[0]))]
            raise ValueError(
                f"site {tied[0]!r} is the parameter {alias!r} under a second name (tied "
                f"weights): a tensor can be one Bayesian site only; leave one name out, "
                f"e.g. exclude=[{tied[0]!r}]"
            )
        for site in self.sites:
            params[site.name].requires_grad_(False)
        # (owning module, parameter name) of each site: the current parameter (its device
        # and dtype after .to(...)) is one dict lookup away at every step
        self._site_slots = [
            (net.get_submodule(site.module_name), site.param_name) for site in self.sites
        ]
        # one draw may run with the sites' tensors put in their slots (run_network) unless
        # a site's parameter is shared with another name (functional_call ties them)
        names = [id(p) for _, p in net.named_parameters(remove_duplicate=False)]
        self._slots_untied = all(names.count(id(params[s.name])) == 1 for s in self.sites)

    def train(self, mode: bool = True) -> BNNModel:
        """``nn.Module.train``; with ``norm_stats = "frozen"`` the network's normalisation
        layers stay in evaluation mode (their running statistics fixed)."""
        super().train(mode)
        if mode and getattr(self, "norm_stats", "batch") == "frozen":
            for m in self.net.modules():
                if isinstance(m, nn.modules.batchnorm._NormBase):
                    m.eval()
        return self

    def site_parameter(self, i: int) -> torch.Tensor:
        """The network's (frozen) parameter of the ``i``-th site: its device and dtype are
        those of the site's prior and of the guides built on the model."""
        module, name = self._site_slots[i]
        return module._parameters[name]

    def initial_values(self) -> dict[str, torch.Tensor]:
        """The network's current values of the Bayesian tensors (detached copies)."""
        return {s.name: self.site_parameter(i).detach().clone() for i, s in enumerate(self.sites)}

    def network_forward(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor):
        """Run the network with the given Bayesian tensors: :math:`f_w(x)`.

        Floating inputs are cast to the network's dtype and moved to its device (a
        float32 data set feeds a float64 network)."""
        x = match_input(x, self.site_parameter(0))
        return functional_call(self.net, dict(weights), (x,), strict=False)

    def run_network(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor):
        """:meth:`network_forward` of one draw (site-shaped ``weights``), as the program
        runs it.

        Raises:
            ValueError: ``x`` does not fit the network (its shape and the torch error).
        """
        try:
            if type(self).network_forward is BNNModel.network_forward:
                if getattr(self, "_slots_untied", False):
                    return self._slotted_forward(weights, x)
            return self.network_forward(weights, x)
        except RuntimeError as e:
            if isinstance(e, torch.OutOfMemoryError):
                raise
            raise input_mismatch(self.net, x, e) from e

    def _slotted_forward(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor):
        """:meth:`network_forward` with the sites' tensors put in their modules'
        parameter slots for the call and put back after it: the same operations on the
        same tensors (bit for bit), without ``functional_call``'s set-up at every call
        (0.12 ms of a LeNet-5 step, docs/uncertainty.md)."""
        x = match_input(x, self.site_parameter(0))
        saved = [module._parameters[name] for module, name in self._site_slots]
        try:
            for (module, name), site in zip(self._site_slots, self.sites, strict=True):
                module._parameters[name] = weights[site.name]
            return self.net(x)
        finally:
            for (module, name), p in zip(self._site_slots, saved, strict=True):
                module._parameters[name] = p

    def particle_shape(self, weights: Mapping[str, torch.Tensor]) -> tuple[int, ...] | None:
        """The leading particle shape of ``weights`` (``None``: one draw, no leading dims).

        A value of site shape ``s`` may come as ``(*lead, *s)``; trailing 1s of ``lead``
        (the data plate's dimension, which Pyro's plates leave in global sites) are
        dropped and the sites' shapes are broadcast together.

        Raises:
            ValueError: a value whose trailing dimensions are not its site's shape.
        """
        lead = None
        for site in self.sites:
            w = weights[site.name]
            extra = w.dim() - len(site.shape)
            if extra == 0 and w.shape == site.shape:
                continue
            if extra < 0 or tuple(w.shape[extra:]) != tuple(site.shape):
                raise ValueError(
                    f"site {site.name!r} got a value of shape {tuple(w.shape)}; it must end "
                    f"in the site's shape {tuple(site.shape)} (leading dimensions are "
                    "particles)"
                )
            this = _particle_dims(w, site)
            lead = this if lead is None else torch.broadcast_shapes(lead, this)
        return None if lead is None else tuple(lead)

    def particle_forward(
        self, weights: Mapping[str, torch.Tensor], x: torch.Tensor, lead: tuple[int, ...]
    ) -> torch.Tensor:
        r""":math:`f_{w^{(p)}}(x)` for every particle ``p`` of weights with leading shape
        ``lead`` (see :meth:`particle_shape`), in one call: :func:`torch.func.vmap` over
        :meth:`network_forward`.  Returns ``(*lead, B, ...)``.

        Raises:
            ValueError: the network cannot run vectorised (e.g. BatchNorm updating its
                running statistics in training mode), naming the way out.
        """
        n = math.prod(lead)
        flat = {}
        for site in self.sites:
            w = weights[site.name]
            w = w.reshape(*_particle_dims(w, site), *site.shape).expand(*lead, *site.shape)
            flat[site.name] = w.reshape(n, *site.shape)
        if not lead:
            return self.network_forward({k: v[0] for k, v in flat.items()}, x)
        batched = vmap(self.network_forward, in_dims=(0, None), randomness="different")
        try:
            out = batched(flat, x)
        except RuntimeError as e:
            if isinstance(e, torch.OutOfMemoryError):
                raise
            self.run_network({k: v[0] for k, v in flat.items()}, x)  # one draw: the input?
            raise ValueError(
                f"the network {type(self.net).__name__} could not run on {n} weight draws at "
                f"once (particle shape {lead}, input of shape {tuple(x.shape)}): {e}. Run the "
                "draws one at a time (Predictive(..., parallel=False), "
                "vectorize_particles=False), or put the model in eval mode if a layer "
                "updates state in training (BatchNorm)"
            ) from e
        return out.reshape(*lead, *out.shape[1:])

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self._param_statements()
        weights = self._sample_sites()
        lead = self.particle_shape(weights)
        if lead is None:
            output = self.run_network(weights, x)
        else:
            output = self.particle_forward(weights, x, lead)
        self._observe(output, y, 0 if lead is None else len(lead))
        return output
