r"""Priors over the Bayesian parameter tensors.

A prior maps each :class:`~twodg_pyro.nn.BayesianSite` to a Pyro distribution whose
``batch_shape`` is the site's shape (one independent scalar prior per weight); the
model program wraps it with ``to_event`` to make it one sample site per tensor.
Swapping the prior is one argument::

    BNNModel(net, prior=LaplacePrior(scale=0.1))
    BNNModel(net, prior=LayerwiseNormalPrior(gain=1.0))
    BNNModel(net, prior=lambda site: dist.StudentT(3.0, 0.0, 0.1))
    BNNModel(net, prior=PretrainedPrior.from_network(net, scale=0.03))

Any ``pyro.distributions`` distribution with scalar events can be used: a prior
with a registered KL against the guide (Normal) gives an analytic KL in the ELBO,
any other a Monte Carlo estimate.

**Device and dtype.**  A prior follows the network: the model calls
``prior(site, like=parameter)`` with the site's network parameter, and
:meth:`Prior.__call__` returns the distribution with every tensor parameter on
``like``'s device and, if floating, in ``like``'s dtype (:func:`distribution_to`), so a
network moved to CUDA or cast to float64 gets its prior there without further code.
A prior's numbers made with :meth:`Prior.constant` (the library's priors) are created
there directly, once per device and dtype; tensors made elsewhere (a user's
distribution, stored tensors) are copied once per source tensor, device and dtype
(weakly cached).  So no prior costs a host-to-device copy per step.  Without ``like``
the prior is on the CPU in torch's default dtype.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Literal, get_args

import pyro
import pyro.distributions as dist
import torch
from torch.utils.weak import WeakIdKeyDictionary

from .nn.sites import BayesianSite

__all__ = [
    "Prior",
    "NormalPrior",
    "LaplacePrior",
    "LayerwiseNormalPrior",
    "PretrainedPrior",
    "SitePrior",
    "as_prior",
    "distribution_to",
    "PRIOR_KINDS",
    "PriorKind",
]


def _positive(value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return value


#: device/dtype copies of distribution parameters: source tensor -> {(device, dtype):
#: (source version, copy)}; an entry lives as long as its source tensor.
_MOVED: WeakIdKeyDictionary = WeakIdKeyDictionary()
_CPU = torch.device("cpu")


def _tensor_to(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``t`` on ``device``, floating tensors in ``dtype`` (integer ones keep theirs); ``t``
    itself when it is there already.  Copies of tensors without gradients are cached
    (per source tensor and its in-place version), so a fixed prior parameter is copied to
    the GPU once, not at every step."""
    target = dtype if t.is_floating_point() else t.dtype
    if t.device == device and t.dtype == target:
        return t
    if t.requires_grad:  # a learnt prior parameter: keep the graph, no caching
        return t.to(device=device, dtype=target)
    per = _MOVED.get(t)
    if per is None:
        per = _MOVED[t] = {}
    hit = per.get((device, target))
    if hit is not None and hit[0] == t._version:
        return hit[1]
    moved = t.to(device=device, dtype=target)
    per[(device, target)] = (t._version, moved)
    return moved


def distribution_to(
    d: dist.Distribution, device: torch.device | str, dtype: torch.dtype
) -> dist.Distribution:
    """``d`` with its tensor parameters on ``device`` and floating ones in ``dtype``.

    Rebuilds ``d`` from its ``arg_constraints`` parameters (``Normal``, ``Laplace``,
    ``StudentT``, ``LogNormal``, ... any distribution whose constructor takes them), through
    ``Independent`` and ``MixtureSameFamily`` wrappers; returns ``d`` itself when every
    parameter is there already.

    Raises:
        TypeError: ``d`` cannot be rebuilt from its parameters and has some elsewhere
            (build such a prior from tensors on the network's device instead).
    """
    device = torch.device(device)
    if isinstance(d, dist.Independent):
        base = distribution_to(d.base_dist, device, dtype)
        if base is d.base_dist:
            return d
        return dist.Independent(base, d.reinterpreted_batch_ndims, validate_args=False)
    if isinstance(d, dist.MixtureSameFamily):
        mix = distribution_to(d.mixture_distribution, device, dtype)
        comp = distribution_to(d.component_distribution, device, dtype)
        if mix is d.mixture_distribution and comp is d.component_distribution:
            return d
        return dist.MixtureSameFamily(mix, comp, validate_args=False)
    params, moved, changed = {}, {}, False
    attrs = d.__dict__
    for name in d.arg_constraints:
        value = attrs.get(name)
        if value is None:
            if not isinstance(getattr(type(d), name, None), property):
                continue  # a lazily computed alternative parameterisation (probs/logits)
            value = getattr(d, name, None)  # e.g. LogNormal's loc/scale (properties)
        if isinstance(value, torch.Tensor):
            params[name] = value
    if "logits" in params and "probs" in params:
        del params["probs"]
    for name, value in params.items():
        moved[name] = new = _tensor_to(value, device, dtype)
        changed = changed or new is not value
    if not changed:
        return d
    try:
        # no validation, also of parts built inside (StudentT's Chi2): it would read
        # values back from the device
        with pyro.validation_enabled(False):
            return type(d)(**moved, validate_args=False)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"cannot move a {type(d).__name__} prior to {device} / {dtype} by rebuilding it "
            f"from its parameters ({e}); build it from tensors on the network's device and "
            "dtype instead"
        ) from e


#: the library priors a run's settings name (``prior.kind``)
PriorKind = Literal["normal", "laplace", "layerwise", "pretrained"]
PRIOR_KINDS: tuple[str, ...] = get_args(PriorKind)


class Prior(ABC):
    """Maps a Bayesian site to its prior: ``p(w_site) = prod_i p_i(w_i)``.

    A subclass implements :meth:`site_distribution`; the device and dtype of the
    distribution are handled here, for every prior (see the module docstring).
    """

    @abstractmethod
    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        """The prior of one site, with scalar events broadcastable to ``site.shape``."""

    def constant(self, value: float) -> torch.Tensor:
        """``value`` as a 0-d tensor on the device and in the dtype of the call being
        answered (:meth:`__call__`'s ``like``; outside a call, float64 on the CPU), the
        same object for the same value, device and dtype: a fixed parameter made once per
        device and dtype, from the exact float64 value."""
        cache = self.__dict__.setdefault("_constants", {})
        key = (float(value), *self.__dict__.get("_target", (_CPU, torch.float64)))
        t = cache.get(key)
        if t is None:
            t = torch.tensor(float(value), dtype=torch.float64)
            t = cache[key] = t.to(device=key[1], dtype=key[2])
        return t

    def __call__(self, site: BayesianSite, like: torch.Tensor | None = None) -> dist.Distribution:
        """The prior of ``site`` expanded to its shape, as one Pyro sample site.

        Args:
            site: the Bayesian site.
            like: the site's network parameter (or any tensor on the network's device, in
                its dtype): the distribution's parameters are put on its device and, if
                floating, in its dtype.  ``None``: the CPU and torch's default dtype.

        Returns a distribution with ``event_shape == site.shape``.
        """
        if like is None:
            device, dtype = _CPU, torch.get_default_dtype()
        else:
            device, dtype = like.device, like.dtype
        outer = self.__dict__.get("_target")
        self._target = (device, dtype)  # what constant() makes its tensors for
        try:
            d = self.site_distribution(site)
        finally:
            if outer is None:
                del self._target
            else:
                self._target = outer
        try:  # parameters made elsewhere (a user's distribution, stored tensors)
            d = distribution_to(d, device, dtype)
        except TypeError as e:
            raise TypeError(f"prior for site {site.name!r}: {e}") from e
        if d.event_shape != torch.Size():
            raise ValueError(
                f"prior for site {site.name!r} must have scalar events, got "
                f"event_shape={tuple(d.event_shape)}"
            )
        return d.expand(site.shape).to_event(len(site.shape))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class NormalPrior(Prior):
    r"""I.i.d. Normal prior :math:`w_i \sim \mathcal N(\text{loc}, \text{scale}^2)`."""

    def __init__(self, scale: float = 1.0, loc: float = 0.0):
        self.loc = float(loc)
        self.scale = _positive(scale, "NormalPrior scale")

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return dist.Normal(self.constant(self.loc), self.constant(self.scale), validate_args=False)


class LaplacePrior(Prior):
    r"""I.i.d. Laplace prior :math:`p(w_i) = \frac{1}{2b} e^{-|w_i - \text{loc}|/b}`.

    No closed-form KL against a Normal guide exists: the ELBO uses Monte Carlo.
    """

    def __init__(self, scale: float = 1.0, loc: float = 0.0):
        self.loc = float(loc)
        self.scale = _positive(scale, "LaplacePrior scale")

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return dist.Laplace(self.constant(self.loc), self.constant(self.scale), validate_args=False)


class LayerwiseNormalPrior(Prior):
    r"""Fan-in scaled Normal: :math:`w_i \sim \mathcal N(0, \text{gain}^2 / \text{fan\_in})`.

    The scale follows the layer like He/LeCun initialisation, so wide layers get
    tighter priors. ``bias_scale`` (if given) overrides the scale of bias sites.
    """

    def __init__(self, gain: float = 1.0, bias_scale: float | None = None):
        self.gain = _positive(gain, "LayerwiseNormalPrior gain")
        self.bias_scale = None if bias_scale is None else _positive(bias_scale, "bias_scale")

    def scale_for(self, site: BayesianSite) -> float:
        """Prior standard deviation of the weights of ``site``."""
        if site.param_name == "bias" and self.bias_scale is not None:
            return self.bias_scale
        return self.gain / math.sqrt(site.fan_in)

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        return dist.Normal(
            self.constant(0.0), self.constant(self.scale_for(site)), validate_args=False
        )


class PretrainedPrior(Prior):
    r"""Empirical-Bayes prior centred at given (e.g. pretrained) weights:

    .. math:: w_i \sim \mathcal N\big(\hat w_i,\ (s + \delta\,|\hat w_i|)^2\big).

    With ``delta = 0`` every weight has the same scale ``s``; ``delta > 0`` widens the
    prior of large weights (MOPED, Krishnan et al. 2020, sets a scale proportional to
    ``|w|``; ``s`` keeps it positive for weights near zero).  Centred at a deterministic
    network's trained weights, the KL term no longer pulls every mean to zero: it keeps
    the posterior near the pretrained solution, and ``s`` bounds how far the scales grow.
    The prior is different for every weight: the ELBO's KL is closed form against a
    Normal guide, per weight.

    Args:
        values: ``{site name: tensor}`` of centres (any superset of the model's sites).
        scale: ``s``, the prior standard deviation of a zero weight (positive).
        delta: ``delta >= 0``.
    """

    def __init__(self, values: Mapping[str, torch.Tensor], scale: float = 0.1, delta: float = 0.0):
        self.scale = _positive(scale, "PretrainedPrior scale")
        delta = float(delta)
        if not math.isfinite(delta) or delta < 0:
            raise ValueError(f"PretrainedPrior delta must be a finite number >= 0, got {delta!r}")
        self.delta = delta
        self.values = {k: v.detach().clone() for k, v in values.items()}
        for k, v in self.values.items():
            if not torch.isfinite(v).all():
                raise ValueError(f"PretrainedPrior centre {k!r} holds NaN or infinite values")

    @classmethod
    def from_network(cls, net: torch.nn.Module, scale: float = 0.1, delta: float = 0.0):
        """Centred at ``net``'s current parameters."""
        return cls(dict(net.named_parameters()), scale, delta)

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        if site.name not in self.values:
            raise KeyError(f"PretrainedPrior has no centre for site {site.name!r}")
        loc = self.values[site.name]
        if tuple(loc.shape) != tuple(site.shape):
            raise ValueError(
                f"PretrainedPrior centre of {site.name!r} has shape {tuple(loc.shape)}, "
                f"the site has {tuple(site.shape)}"
            )
        return dist.Normal(loc, self.scale + self.delta * loc.abs(), validate_args=False)

    def __repr__(self) -> str:
        return (
            f"PretrainedPrior(scale={self.scale!r}, delta={self.delta!r}, sites={len(self.values)})"
        )


class SitePrior(Prior):
    """A user-supplied prior: one distribution for all sites, a mapping from site name
    to distribution (with an optional ``default``), or a function ``site -> distribution``.
    """

    def __init__(
        self,
        prior: dist.Distribution
        | Mapping[str, dist.Distribution]
        | Callable[[BayesianSite], dist.Distribution],
        default: dist.Distribution | None = None,
    ):
        if not isinstance(prior, (dist.Distribution, Mapping)) and not callable(prior):
            raise TypeError(
                f"SitePrior needs a distribution, a mapping or a callable, got {type(prior)}"
            )
        self.prior = prior
        self.default = default

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        if isinstance(self.prior, dist.Distribution):
            return self.prior
        if isinstance(self.prior, Mapping):
            d = self.prior.get(site.name, self.default)
            if d is None:
                raise KeyError(
                    f"SitePrior has no distribution for site {site.name!r} and no default; "
                    f"known sites: {sorted(self.prior)}"
                )
            return d
        d = self.prior(site)
        if not isinstance(d, dist.Distribution):
            raise TypeError(
                f"the prior function returned {type(d).__name__} for site {site.name!r}, "
                "expected a pyro distribution"
            )
        return d


def as_prior(prior: Prior | dist.Distribution | Callable | float | None) -> Prior:
    """Coerce a user's prior argument: ``None`` -> ``NormalPrior(1.0)``, a float ->
    ``NormalPrior(float)``, a distribution, mapping or callable -> :class:`SitePrior`."""
    if prior is None:
        return NormalPrior(1.0)
    if isinstance(prior, Prior):
        return prior
    if isinstance(prior, (int, float)) and not isinstance(prior, bool):
        return NormalPrior(float(prior))
    return SitePrior(prior)
