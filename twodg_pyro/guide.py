r"""The guide protocol: what every BNN guide of this library offers, stated once.

A guide :math:`q_\phi(w)` is a distribution over the Bayesian sites
:math:`w = (w_s)_s` of a model (:class:`~twodg_pyro.model.BNNModel`: one site per weight
or bias tensor; :class:`~twodg_pyro.guides.Rank1BNNModel`: one per factor tensor).
Training maximises the evidence lower bound (Eq. 10)

.. math::
    \mathcal L(\phi) = \mathbb E_{q_\phi}[\log p(\mathcal D \mid w)]
        - \sum_s \mathrm{KL}\big(q_\phi(w_s) \,\|\, p(w_s)\big),

with the expectation estimated from reparameterised draws :math:`w = w_\phi(\varepsilon)`
and the KL in closed form wherever one exists.  :class:`BNNGuide` is the base class of
every guide of :mod:`twodg_pyro.guides`, in the style of Pyro's ``AutoGuide``: a
``torch.nn.Module`` whose ``forward`` is a Pyro program, plus the methods that the
ELBO (:class:`~twodg_pyro.infer.DecomposedELBO`), the training loop
(:func:`~twodg_pyro.infer.fit`), prediction, the refinement hooks, checkpoints, model
files and diagnostics call -- without probing the guide for what it has.

**The protocol.**

* **Pyro program** (``forward``): one ``pyro.param`` statement per trainable parameter
  (:mod:`twodg_pyro.pyro_params`), then one ``sample`` statement per site whose
  ``log_prob`` is the guide's density of its draw, :math:`\log q_\phi(w_s)` (or raises
  :class:`NoSiteDensityError` naming the loss to use where no density exists); one
  independent draw per entry of enclosing vectorised plates.
* **Draws** (:meth:`draw`): every site in one call, ``S`` joint draws
  :math:`w^{(1..S)} \sim q_\phi` vectorised (prediction, diagnostics; the fused training
  step), differentiable when gradients are on.  :meth:`sample_weights` is its weights.
* **KL** (:meth:`site_kl`, :meth:`kl_terms`): the site's share of
  :math:`\mathrm{KL}(q_\phi \| p)` for the guide's latest differentiable draw (its
  program's, or :meth:`draw`'s with gradients on), as named terms (``kl``, or the 2DG
  guide's ``kl_inlier`` and ``kl_outlier``), in closed form where one exists, else the
  one-draw estimate :math:`\log q_\phi(w_s) - \log p(w_s)`.  Summed over the sites they
  are the KL part of the bound (for the shared-GMM tyings, the tying's bound of it).
* **Marginal density** (:meth:`marginal_log_density`): :math:`\log q_\phi(w)` of joint
  draws of all sites, marginal over any auxiliary variable the guide draws on the way
  (the importance ratios of the VI diagnostics).
* **Parameters**: :meth:`param_groups` (named groups, one learning rate each),
  :meth:`num_trainable`, :meth:`component_parameters` (the tensors with one row per
  mixture component, whose optimiser state a merge remaps), :meth:`site_parameters`
  (the variational parameters at a site's shape, for export).
* **Fast step** (:meth:`fast_draw`, :meth:`fast_kl`; optional): the training step of
  :class:`~twodg_pyro.infer.DecomposedELBO` without tracing the program
  (:mod:`twodg_pyro.infer.fast_step`): one draw of every site with the program's random
  numbers and arithmetic, and the KL terms as the traced ELBO sums them.  A guide
  without it (``fast_draw`` returns ``None``) is traced.
* **Sharing structure**, where it applies (:meth:`structure`, :meth:`load_structure`,
  :attr:`tying`): the 2DG guide's :class:`~twodg_pyro.sharing.SharingStructure`;
  ``None`` for the others.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

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
    "GuideSample",
    "MarginalDensity",
    "NoSiteDensityError",
    "check_guide_sites",
    "kl_or_estimate",
]


class NoSiteDensityError(ValueError):
    """A guide's site has no density a stock Pyro ELBO could use (e.g. the ``tied``
    tying); the message names the loss to use instead."""


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
    """Base class of the library's guides: the protocol of the module docstring.

    A subclass sets :attr:`sites` and implements ``forward`` (the Pyro program),
    :meth:`draw`, :meth:`param_groups` and :meth:`marginal_log_density`; it overrides
    :meth:`site_kl` unless its sites are plain distributions with a registered or
    estimated KL (:meth:`site_distribution`), and the structure methods where it has a
    sharing structure.
    """

    #: the Bayesian sites the guide covers, in the model's order
    sites: list[BayesianSite]
    #: the method name in results and files (``"mean_field"``, ``"2dg"``, ...); ``None``:
    #: the class name
    method: ClassVar[str | None] = None
    #: how inliers are drawn from their component (the 2DG guide); ``None`` for others
    tying: str | None = None

    # ------------------------------------------------------------------ draws
    @abstractmethod
    def draw(self, num_samples: int | None = None) -> GuideSample:
        """Draw every site: ``site.shape`` each, or ``(num_samples, *site.shape)``;
        differentiable when gradients are on (then :meth:`site_kl` refers to it)."""

    def sample_weights(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """The weights of :meth:`draw`: ``{site: tensor}``."""
        return self.draw(num_samples).weights

    # ------------------------------------------------------------------ KL
    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        """The guide's distribution of one site as one event, for guides whose sites are
        independent plain distributions (mean-field, rank-1)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no per-site distribution: it overrides site_kl"
        )

    def site_kl(
        self,
        name: str,
        prior_fn: dist.Distribution,
        value: torch.Tensor,
        guide_fn: dist.Distribution | None = None,
    ) -> dict[str, torch.Tensor]:
        """The KL terms of site ``name`` for the latest draw: ``{"kl": ...}`` here, the
        closed form if registered, else the one-draw estimate (:func:`kl_or_estimate`).

        Args:
            name: the site.
            prior_fn: the model's prior of the site (one event).
            value: the site's drawn value.
            guide_fn: the distribution the guide's program emitted at the site, when the
                caller traced it (the ELBO passes it, so that the KL shares the draw's
                parameters); ``None``: :meth:`site_distribution`.
        """
        if guide_fn is None:
            guide_fn = self.site_distribution(self.site(name))
        return {"kl": kl_or_estimate(guide_fn, prior_fn, value)}

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

    # ------------------------------------------------------------------ fast step
    def fast_draw(self, priors: Mapping[str, dist.Distribution]) -> dict[str, torch.Tensor] | None:
        """One differentiable draw of every site for the fast training step
        (:mod:`twodg_pyro.infer.fast_step`): the values the guide's program would sample,
        from the same random numbers by the same arithmetic, so that the step computes
        the traced ELBO's loss and gradients.  ``priors``: each site's prior (one event).

        Returns ``None`` (here) when the guide has no such draw, or none for these
        priors; the step then traces the program.  It must return ``None`` before
        drawing anything."""
        return None

    def fast_kl(
        self,
        priors: Mapping[str, dist.Distribution],
        values: Mapping[str, torch.Tensor],
        fused: bool = False,
    ) -> dict[str, torch.Tensor]:
        """The KL terms of the latest :meth:`fast_draw` (``values``), summed over the
        sites in site order as :class:`~twodg_pyro.infer.DecomposedELBO` sums them
        (:meth:`kl_terms` here).  ``fused``: a guide may instead sum them over all sites
        at once, the same terms up to float rounding (the shared-GMM guide,
        :mod:`~twodg_pyro.guides.fast_shared`); ignored here."""
        return self.kl_terms(priors, values)

    # ------------------------------------------------------------------ densities
    @abstractmethod
    def marginal_log_density(self, quadrature_nodes: int = 64) -> MarginalDensity:
        r""":math:`\log q(w)` of joint draws of all sites, marginal over auxiliary
        variables (see :class:`MarginalDensity`)."""

    # ------------------------------------------------------------------ parameters
    @abstractmethod
    def param_groups(self) -> list[dict]:
        """``[{"name": group_name, "params": [...]}, ...]`` covering every parameter."""

    def num_trainable(self) -> int:
        """Number of scalar parameters the guide trains."""
        return sum(p.numel() for g in self.param_groups() for p in g["params"] if p.requires_grad)

    def component_parameters(self) -> list[nn.Parameter]:
        """The trained tensors with one row per mixture component (none here)."""
        return []

    def site_parameters(self, name: str) -> dict[str, torch.Tensor]:
        """The variational parameters of site ``name`` at the site's shape, by name
        (e.g. ``{"loc": ..., "scale": ...}``), for export; none here."""
        return {}

    def site(self, name: str) -> BayesianSite:
        """The site called ``name``."""
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(f"no site {name!r}; sites are {[s.name for s in self.sites]}")

    # ------------------------------------------------------------------ structure
    def structure(self, current_points: bool = False) -> SharingStructure | None:
        """The guide's sharing structure, ``None`` for a guide without one."""
        return None

    def load_structure(self, structure: SharingStructure, **kwargs) -> None:
        """Adopt a (refined or saved) sharing structure.

        Raises:
            TypeError: the guide has no sharing structure.
        """
        raise TypeError(f"{type(self).__name__} has no sharing structure to load")
