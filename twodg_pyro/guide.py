r"""The guide protocol: what every BNN guide of this library offers, stated once.

A guide :math:`q_\phi(w)` is a distribution over the Bayesian sites
:math:`w = (w_s)_s` of a model (:class:`~twodg_pyro.bnn.BNNModel`: one site per weight
or bias tensor; :class:`~twodg_pyro.guides.Rank1BNNModel`: one per factor tensor).
Training maximises the evidence lower bound (Eq. 10)

.. math::
    \mathcal L(\phi) = \mathbb E_{q_\phi}[\log p(\mathcal D \mid w)]
        - \sum_s \mathrm{KL}\big(q_\phi(w_s) \,\|\, p(w_s)\big),

with the expectation estimated from reparameterised draws :math:`w = w_\phi(\varepsilon)`
and the KL in closed form wherever one exists.  :class:`BNNGuide` is the base class of
every guide of :mod:`twodg_pyro.guides`, in the style of Pyro's ``AutoGuide``: a
``torch.nn.Module`` whose ``forward`` is a Pyro program, plus the members that the
ELBO (:class:`~twodg_pyro.infer.DecomposedELBO`), the training loop
(:func:`~twodg_pyro.infer.fit`), prediction, checkpoints, model files and diagnostics
call -- without probing the guide for what it has.

**The core** (:class:`BNNGuide`: every guide, its ``sites`` in the model's order and its
``method`` name in results and files):

* **Pyro program** (``forward``): one ``pyro.param`` statement per trainable parameter
  (:mod:`twodg_pyro.pyro_params`), then one ``sample`` statement per site whose
  ``log_prob`` is the guide's density of its draw, :math:`\log q_\phi(w_s)` (or raises
  :class:`NoSiteDensityError` naming the loss to use where no density exists); one
  independent draw per entry of enclosing vectorised plates.
* **Draws** (``draw``): every site in one call, ``S`` joint draws
  :math:`w^{(1..S)} \sim q_\phi` vectorised (prediction, diagnostics; the fused training
  step), differentiable when gradients are on.
* **KL** (``site_kl``, ``kl_terms``): the site's share of
  :math:`\mathrm{KL}(q_\phi \| p)` for the guide's latest differentiable draw (its
  program's, or ``draw``'s with gradients on), as named terms (``kl``, or the 2DG
  guide's ``kl_inlier`` and ``kl_outlier``), in closed form where one exists, else the
  one-draw estimate :math:`\log q_\phi(w_s) - \log p(w_s)`.  Summed over the sites they
  are the KL part of the bound (for the shared-GMM tyings, the tying's bound of it).
* **Marginal density** (``marginal_log_density``): :math:`\log q_\phi(w)` of joint
  draws of all sites, marginal over any auxiliary variable the guide draws on the way
  (the importance ratios of the VI diagnostics).
* **Parameters**: ``param_groups`` (named groups, one learning rate each) and
  ``site_parameters`` (a site's variational parameters, for export; none by default);
  ``mean_weights`` (every site's posterior mean, the mean network's weights; a guide
  without them refuses, the default).

Derived, not protocol: ``sample_weights`` (``draw``'s weights), ``num_trainable`` (of
``param_groups``), ``site`` (of ``sites``).  **Extensions**, stated apart and checked
with ``isinstance`` by their users (other guides have none of their members):
:class:`FastStepGuide` (``fast_draw``, ``fast_kl``: the untraced training step of
:mod:`twodg_pyro.infer.fast_step`) and :class:`SharingGuide` (``structure``,
``load_structure``, ``tying``, ``component_parameters``: the 2DG guide's
:class:`~twodg_pyro.sharing.SharingStructure`, for checkpoints, model files, the
refinement hooks and diagnostics).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Protocol, runtime_checkable

import pyro.distributions as dist
import torch
from pyro.distributions.kl import kl_divergence
from torch import nn

from .nn.sites import BayesianSite
from .pyro_params import PyroParamsMixin

if TYPE_CHECKING:
    from .sharing.structure import SharingStructure

__all__ = [
    "LOG_Q_METHODS",
    "BNNGuide",
    "FastStepGuide",
    "GuideSample",
    "MarginalDensity",
    "NoSiteDensityError",
    "SharingGuide",
    "check_guide_sites",
    "kl_or_estimate",
    "require_sharing",
]


class NoSiteDensityError(NotImplementedError):
    """A guide's site has no density a stock Pyro ELBO could use (e.g. the ``tied``
    tying); the message names the loss to use instead on its first line.

    A ``NotImplementedError``, not a ``ValueError``: Pyro wraps a ``ValueError`` raised
    while it scores a trace under its own first line ("Error while computing
    score_parts at site ..."), which would push the way out to the second."""


def _is_point_mass(fn) -> bool:
    """Whether a distribution is a ``Delta`` (possibly wrapped)."""
    while isinstance(fn, (dist.Independent, dist.MaskedDistribution)):
        fn = fn.base_dist
    return isinstance(fn, dist.Delta)


def kl_or_estimate(guide_fn, prior_fn, value: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{KL}(q \| p)` in closed form if registered, else the one-sample
    Monte Carlo estimate :math:`\log q(v) - \log p(v)`, summed over the site.  A point
    mass (``Delta``, whose registered "KL" would drop its ``log_density``) always takes
    the estimate."""
    if _is_point_mass(guide_fn):
        return (guide_fn.log_prob(value) - prior_fn.log_prob(value)).sum()
    try:
        kl = kl_divergence(guide_fn, prior_fn)
    except NotImplementedError:
        kl = guide_fn.log_prob(value) - prior_fn.log_prob(value)
    return kl.sum()


def check_guide_sites(model, guide, who: str) -> None:
    """Raise ``ValueError`` unless a library guide covers exactly the model's sites with
    the model's shapes (a guide built for another network), naming the first site that
    differs and both shapes; nothing for other guides (Pyro's autoguides trace the model)
    or a guide that declares no ``sites``.

    Args:
        model: the model (its ``sites``).
        guide: the guide; checked when it is a :class:`BNNGuide`.
        who: the caller, for the message (``"predict"``, ``"fit"``).
    """
    if not isinstance(guide, BNNGuide) or getattr(guide, "sites", None) is None:
        return
    theirs = {s.name: tuple(s.shape) for s in guide.sites}
    mine = [(s.name, tuple(s.shape)) for s in model.sites]
    for name, shape in mine:
        if name not in theirs:
            raise ValueError(
                f"{who}: the model's site {name!r} {shape} is not in the guide "
                f"{type(guide).__name__} (the guide has {len(theirs)} sites, the model "
                f"{len(mine)}): the guide was built for another network"
            )
        if theirs[name] != shape:
            raise ValueError(
                f"{who}: the guide's site {name!r} has shape {theirs[name]}, the model's "
                f"{shape}: the guide was built for another network"
            )
    extra = [n for n in theirs if n not in dict(mine)]
    if extra:
        raise ValueError(
            f"{who}: the guide's site {extra[0]!r} {theirs[extra[0]]} is not a site of the "
            f"model ({len(extra)} such site(s)): the guide was built for another network"
        )


@dataclass
class GuideSample:
    """One call's draws of every site (:meth:`BNNGuide.draw`).

    Attributes:
        weights: ``{site: tensor}``, each ``site.shape`` or ``(S, *site.shape)``.
        component_values: the values shared by the weights of each mixture component in
            each draw, ``(S, K)`` (the 2DG guide's ``tied`` tying, :math:`z_{k,0}`), else
            ``None``.
    """

    weights: dict[str, torch.Tensor]
    component_values: torch.Tensor | None = None


#: The ``method`` of a :class:`MarginalDensity` and whether it is the exact density.
LOG_Q_METHODS = {"exact": True, "quadrature": True, "marginal_product": False}


class MarginalDensity(NamedTuple):
    r""":math:`\log q(w)` of joint draws (:meth:`BNNGuide.marginal_log_density`).

    ``fn(weights, flat=None)`` takes draws ``{site: (S, *shape)}`` (``flat``: the same
    draws as ``(S, n_w)`` in site order, when the caller has them) and returns ``(S,)``;
    ``method`` says how it is computed (:data:`LOG_Q_METHODS`: ``"exact"``,
    ``"quadrature"``, or the surrogate ``"marginal_product"``)."""

    fn: Callable[..., torch.Tensor]
    method: str

    @property
    def exact(self) -> bool:
        """Whether :attr:`fn` is the exact density (up to quadrature error)."""
        return LOG_Q_METHODS.get(self.method, False)


class BNNGuide(PyroParamsMixin, nn.Module):
    """Base class of the library's guides: the core protocol of the module docstring.

    A subclass sets :attr:`sites` and implements ``forward`` (the Pyro program),
    :meth:`draw`, :meth:`site_kl`, :meth:`marginal_log_density` and
    :meth:`param_groups` (:meth:`site_parameters` has a default, the rest is derived).

    Example::

        class MyGuide(BNNGuide):   # sites, forward, draw, site_kl, marginal_log_density, ...
            method = "my_guide"
        register_guide_file(MyGuide)   # its model file
        fit(model, MyGuide(model), loader, epochs=10)
    """

    #: the Bayesian sites the guide covers, in the model's order
    sites: list[BayesianSite]
    #: the method name in results and files (``"mean_field"``, ``"2dg"``, ...); ``None``:
    #: the class name
    method: ClassVar[str | None] = None

    @abstractmethod
    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """The guide as a Pyro program: ``{site: value}``, one ``sample`` statement per
        site (module docstring)."""

    @abstractmethod
    def draw(self, num_samples: int | None = None) -> GuideSample:
        """Draw every site: ``site.shape`` each, or ``(num_samples, *site.shape)``;
        differentiable when gradients are on (then :meth:`site_kl` refers to it)."""

    def sample_weights(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """The weights of :meth:`draw`: ``{site: tensor}`` (derived)."""
        return self.draw(num_samples).weights

    @abstractmethod
    def site_kl(
        self,
        name: str,
        prior_fn: dist.Distribution,
        value: torch.Tensor,
        guide_fn: dist.Distribution | None = None,
    ) -> dict[str, torch.Tensor]:
        """The KL terms of site ``name`` for the latest draw, by name (module docstring).

        Args:
            name: the site.
            prior_fn: the model's prior of the site (one event).
            value: the site's drawn value.
            guide_fn: the distribution the guide's program emitted at the site, when the
                caller traced it (the ELBO passes it, so that the KL may share the
                draw's parameters); ``None``: the guide's own.
        """

    def kl_terms(
        self, priors: Mapping[str, dist.Distribution], values: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """:meth:`site_kl` summed over the sites, term by term, for the latest draw
        ``values`` (``priors``: each site's prior)."""
        total: dict[str, torch.Tensor] = {}
        for site in self.sites:
            for key, v in self.site_kl(site.name, priors[site.name], values[site.name]).items():
                total[key] = total[key] + v if key in total else v
        return total

    @abstractmethod
    def marginal_log_density(self, quadrature_nodes: int = 64) -> MarginalDensity:
        r""":math:`\log q(w)` of joint draws of all sites, marginal over auxiliary
        variables (see :class:`MarginalDensity`)."""

    @abstractmethod
    def param_groups(self) -> list[dict]:
        """``[{"name": group_name, "params": [...]}, ...]`` covering every parameter."""

    def mean_weights(self) -> dict[str, torch.Tensor]:
        """Every site's posterior mean at the site's shape, by name (the network at these
        weights is :meth:`~twodg_pyro.methods.GuidePosterior.mean_network`).

        Raises:
            TypeError: the guide has no per-weight means (here: none is defined).
        """
        raise TypeError(f"{type(self).__name__} has no per-weight posterior means")

    def site_parameters(self, name: str) -> dict[str, torch.Tensor]:
        """The variational parameters of site ``name`` at the site's shape, by name
        (e.g. ``{"loc": ..., "scale": ...}``), for export; none here."""
        return {}

    def num_trainable(self) -> int:
        """Number of scalar parameters the guide trains (derived)."""
        return sum(p.numel() for g in self.param_groups() for p in g["params"] if p.requires_grad)

    def site(self, name: str) -> BayesianSite:
        """The site called ``name`` (derived)."""
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(f"no site {name!r}; sites are {[s.name for s in self.sites]}")


class FastStepGuide:
    """The fast-step extension of the protocol, mixed into a :class:`BNNGuide`: the
    training step of :class:`~twodg_pyro.infer.DecomposedELBO` without tracing the
    program (:mod:`twodg_pyro.infer.fast_step`), which traces any other guide."""

    @abstractmethod
    def fast_draw(
        self, priors: Mapping[str, dist.Distribution], fused: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """One differentiable draw of every site: the values the guide's program would
        sample, from the same random numbers by the same arithmetic, so that the step
        computes the traced ELBO's loss and gradients (``priors``: each site's, one
        event).  ``None``, before drawing anything, where the guide has no such draw
        (these priors, a subclass's own program): the step then traces.  ``fused``: the
        step asked :meth:`fast_kl` for a fused KL, which the guide may compute with the
        draw (the mean-field guide, :mod:`~twodg_pyro.guides.fast_normal`)."""

    @abstractmethod
    def fast_kl(
        self,
        priors: Mapping[str, dist.Distribution],
        values: Mapping[str, torch.Tensor],
        fused: bool = False,
    ) -> dict[str, torch.Tensor]:
        """The KL terms of the latest :meth:`fast_draw` (``values``), summed over the
        sites in site order as :class:`~twodg_pyro.infer.DecomposedELBO` sums them (the
        guide's ``kl_terms``).  ``fused``: a guide may instead sum them over all sites at
        once, the same terms up to float rounding (the shared-GMM guide,
        :mod:`~twodg_pyro.guides.fast_shared`; the mean-field guide,
        :mod:`~twodg_pyro.guides.fast_normal`)."""


@runtime_checkable
class SharingGuide(Protocol):
    """The sharing-structure extension of the protocol, checked structurally: a guide
    whose inlier weights share the components of a
    :class:`~twodg_pyro.sharing.SharingStructure` (the 2DG guide,
    :class:`~twodg_pyro.guides.SharedGMMGuide`)."""

    #: how inliers are drawn from their component (:mod:`~twodg_pyro.guides.tyings`)
    tying: str

    def structure(self, current_points: bool = False) -> SharingStructure:
        """The current sharing structure (``current_points``: its inlier points moved
        with their components)."""

    def load_structure(self, structure: SharingStructure, **kwargs) -> None:
        """Adopt a (refined or saved) sharing structure."""

    def component_parameters(self) -> list[nn.Parameter]:
        """The trained tensors with one row per mixture component, whose optimiser state
        a merge remaps."""


def require_sharing(guide, who: str) -> None:
    """Raise ``TypeError`` unless ``guide`` has a sharing structure
    (:class:`SharingGuide`), naming ``who`` needs one and the guide's class."""
    if not isinstance(guide, SharingGuide):
        raise TypeError(
            f"{who} needs a guide with a sharing structure (the shared-GMM guide, a "
            f"SharingGuide), got {type(guide).__name__}"
        )
