"""What the library's guides share besides the protocol (:mod:`twodg_pyro.guide`): the
site distribution that gives stock Pyro ELBOs a
guide's density (:class:`GuideDraw`), and the diagonal Normal family of the mean-field
and rank-1 guides (:class:`DiagonalNormalGuide`)."""

from __future__ import annotations

from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.util import sum_rightmost
from torch import nn
from torch.distributions import Distribution, register_kl

from ..guide import BNNGuide, FastStepGuide, GuideSample, MarginalDensity, kl_or_estimate
from ..nn.flat_storage import pack
from ..nn.functional import softplus
from ..nn.sites import BayesianSite
from ..pyro_params import params_are_local, plate_batch_shape
from .fast_normal import draw_kl, fused_draw_kl


class GuideDraw(dist.Delta):
    r"""A guide's draw at a site, :math:`\delta_v`, carrying the guide's log-density
    :math:`\log q(v)` (computed on demand).

    Like the ``Delta(value, log_density=...)`` of Pyro's ``AutoContinuous`` guides,
    ``log_prob(v)`` is the guide's density of its own draw, so every stock ELBO
    (``Trace_ELBO``, ``TraceMeanField_ELBO``, ``TraceGraph_ELBO``, ...) gets the right
    :math:`\log q`; no closed-form KL is registered for it, so ``TraceMeanField_ELBO``
    falls back to :math:`\log q - \log p` at the draw.  The density is a function
    evaluated at the first ``log_prob`` only: :func:`~twodg_pyro.infer.fit`, which
    uses the guide's own KL terms, never pays for it.

    Args:
        v: the drawn value, ``batch_shape + event_shape``.
        log_density: a function returning :math:`\log q(v)` of shape ``batch_shape`` (it
            may raise :class:`~twodg_pyro.guide.NoSiteDensityError` where there is none).
        event_dim: the number of rightmost dimensions of ``v`` that form one event.
    """

    def __init__(self, v: torch.Tensor, log_density: Callable[[], torch.Tensor], event_dim: int):
        batch_dim = v.dim() - event_dim
        # Delta.__init__ would build a zero log_density tensor; the density comes later
        Distribution.__init__(self, v.shape[:batch_dim], v.shape[batch_dim:], validate_args=False)
        self.v = v
        self._density_fn = log_density
        self._density: torch.Tensor | None = None

    @property
    def log_density(self) -> torch.Tensor:  # type: ignore[override]
        r""":math:`\log q(v)`, ``batch_shape``."""
        if self._density is None:
            self._density = self._density_fn()
        return self._density

    @log_density.setter
    def log_density(self, value) -> None:  # Delta.expand assigns it
        self._density = value

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        density = self.log_density
        if x is self.v:
            return density
        same = (x == self.v).type(x.dtype).log()
        return sum_rightmost(same, self.event_dim) + density

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        # as a plain Delta: one draw repeated (the guides draw per particle themselves)
        return dist.Delta(self.v, self.log_density, event_dim=self.event_dim).expand(batch_shape)


@register_kl(GuideDraw, Distribution)
@register_kl(GuideDraw, dist.Distribution)  # beats Pyro's (Delta, Distribution) -log p(v)
def _kl_guide_draw(p, q):
    # no closed form: TraceMeanField_ELBO then uses log q - log p at the draw
    raise NotImplementedError


def _normal_base(prior, event_dim: int):
    """``(loc, scale)`` of a prior that is a Normal over the site's ``event_dim`` rightmost
    dimensions (``Normal(...).to_event(event_dim)``), else ``None``."""
    if event_dim:
        if type(prior) is not dist.Independent or prior.reinterpreted_batch_ndims != event_dim:
            return None
        prior = prior.base_dist
    return (prior.loc, prior.scale) if type(prior) is dist.Normal else None


def scalar_prior(fn: dist.Distribution) -> dist.Distribution | None:
    """The one scalar distribution behind a prior expanded over a site, or ``None`` when the
    prior differs between weights."""
    base = fn.base_dist if isinstance(fn, dist.Independent) else fn
    params = {}
    for name in base.arg_constraints:
        value = base.__dict__.get(name)
        if value is None:
            continue
        if not torch.is_tensor(value) or (value.numel() > 1 and any(value.stride())):
            return None
        params[name] = value[(0,) * value.dim()]  # an element, no copy of an expanded tensor
    try:
        return type(base)(**params, validate_args=False)
    except (TypeError, ValueError):
        return None


def particle_batch_shape() -> tuple[int, ...]:
    """The batch shape of a guide's draw: that of the enclosing vectorised plates
    (:func:`~twodg_pyro.pyro_params.plate_batch_shape`), ``()`` on the library's fast path."""
    return () if params_are_local() else plate_batch_shape()


def site_key(name: str) -> str:
    """A parameter-safe key for a site name (``"layers.0.weight" -> "layers__0__weight"``)."""
    return name.replace(".", "__")


class LocScaleParameters:
    r"""Per-site parameters :math:`\mu` and :math:`\sigma = \operatorname{softplus}(\rho)`:
    the :class:`~torch.nn.ParameterDict` ``locs`` and ``rhos``, keyed by :func:`site_key`
    (tensors of the site's shape; SSVI's: of its active coordinates), trained as the
    groups ``loc`` and ``scale``."""

    locs: nn.ParameterDict
    rhos: nn.ParameterDict

    def loc(self, name: str) -> torch.Tensor:
        r""":math:`\mu` of a site."""
        return self.locs[site_key(name)]

    def scale(self, name: str) -> torch.Tensor:
        r""":math:`\sigma = \operatorname{softplus}(\rho)` of a site."""
        return softplus(self.rhos[site_key(name)])

    def mean_weights(self) -> dict[str, torch.Tensor]:
        r"""Every site's posterior mean :math:`\mu`, detached."""
        return {s.name: self.loc(s.name).detach() for s in self.sites}

    def param_groups(self) -> list[dict]:
        r"""``[{"name": "loc", ...}, {"name": "scale", ...}]``: the :math:`\mu` and the
        :math:`\rho` of every site."""
        return [
            {"name": "loc", "params": list(self.locs.values())},
            {"name": "scale", "params": list(self.rhos.values())},
        ]

    def _coordinates(self, name: str, flat: torch.Tensor) -> torch.Tensor:
        r"""The coordinates of draws ``(S, numel)`` of a site that its :math:`\mu` describe."""
        return flat

    def marginal_log_density(self, quadrature_nodes: int = 64) -> MarginalDensity:
        r"""The exact :math:`\log q(w) = \sum_s \sum_i \log\mathcal N(w_{s,i} \mid
        \mu_{s,i}, \sigma_{s,i}^2)` (for rank-1: all ``M`` rows of every factor site; for
        SSVI: the active coordinates :math:`i \in \Gamma` only, the inactive ones being
        point masses at 0, whose density with respect to the counting measure is 1 -- the
        VI diagnostics pair it with the prior restricted to the same subspace, as the SSVI
        objective does)."""

        def normals(weights, flat=None):
            total = 0.0
            for s in self.sites:
                w = weights[s.name]
                x = self._coordinates(s.name, w.reshape(w.shape[0], -1))
                loc, scale = self.loc(s.name).reshape(-1), self.scale(s.name).reshape(-1)
                total = total + dist.Normal(loc, scale, validate_args=False).log_prob(x).sum(-1)
            return total.detach()

        return MarginalDensity(normals, "exact")


class DiagonalNormalGuide(LocScaleParameters, FastStepGuide, BNNGuide):
    r"""A guide with an independent Normal over every scalar of every site.

    .. math::
        q(w_s) = \prod_i \mathcal N(w_{s,i} \mid \mu_{s,i}, \sigma_{s,i}^2), \qquad
        \sigma = \operatorname{softplus}(\rho)

    A subclass's ``__init__`` sets ``sites``, ``locs`` and ``rhos``
    (:class:`LocScaleParameters`, each tensor of its site's shape).  The family is defined
    once, by :meth:`loc` and :meth:`scale`: the program emits
    :meth:`site_distribution` at the site itself (so an ELBO can use a closed-form KL
    when one is registered for the prior), and every draw is :meth:`normal_draws` (the
    fast step's, :meth:`fast_draw`: the same arithmetic, on the sites concatenated).
    """

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        r""":math:`q(w_s) = \prod_i \mathcal N(\mu_i, \sigma_i^2)` as one event."""
        d = dist.Normal(self.loc(site.name), self.scale(site.name), validate_args=False)
        return d.to_event(len(site.shape))

    def normal_draws(
        self, num_samples: int | None = None, rsample: bool = True
    ) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        r"""``({site: w_s}, [(mu_s, sigma_s), ...])``: :math:`w_s = \mu_s + \sigma_s
        \varepsilon_s`, shape ``site.shape`` or ``(num_samples, *site.shape)``, one
        standard normal :math:`\varepsilon_s` per site in site order.  ``rsample``: in
        two roundings, as ``Normal.rsample`` (the program) draws it; else one fused
        ``addcmul``, in place when no gradient is needed (prediction)."""
        out, params = {}, []
        for site in self.sites:
            loc, scale = self.loc(site.name), self.scale(site.name)
            shape = loc.shape if num_samples is None else (num_samples, *loc.shape)
            eps = torch.randn(shape, device=loc.device, dtype=loc.dtype)
            if rsample:
                out[site.name] = loc + eps * scale
            elif torch.is_grad_enabled() and (loc.requires_grad or scale.requires_grad):
                out[site.name] = torch.addcmul(loc, scale, eps)
            else:  # prediction: one fused pass, in place
                out[site.name] = torch.addcmul(loc, scale, eps, out=eps)
            params.append((loc, scale))
        return out, params

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self._param_statements()
        return {
            site.name: pyro.sample(site.name, self.site_distribution(site)) for site in self.sites
        }

    def draw(self, num_samples: int | None = None) -> GuideSample:
        r""":math:`\mu + \sigma \epsilon` per site (:meth:`normal_draws`, fused): shape
        ``site.shape`` or ``(num_samples, *site.shape)``; differentiable when gradients
        are on."""
        return GuideSample(self.normal_draws(num_samples, rsample=False)[0])

    def site_kl(self, name: str, prior_fn, value, guide_fn=None) -> dict[str, torch.Tensor]:
        """``{"kl": ...}``: :func:`~twodg_pyro.guide.kl_or_estimate` of ``guide_fn`` (the
        traced program's) or else :meth:`site_distribution`."""
        fn = guide_fn if guide_fn is not None else self.site_distribution(self.site(name))
        return {"kl": kl_or_estimate(fn, prior_fn, value)}

    def fast_draw(self, priors, fused: bool = False) -> dict[str, torch.Tensor] | None:
        r"""The program's draw and its KL, bit for bit
        (:func:`~twodg_pyro.guides.fast_normal.draw_kl`: the noise and the scales site by
        site, the draw and the closed-form KL on the sites concatenated for a small
        network); ``None`` for a subclass with another program or a prior whose base is
        not a Normal (its KL is then no closed form here).  ``fused``: all sites as one
        flat vector with their KL in one node, to rounding
        (:func:`~twodg_pyro.guides.fast_normal.fused_draw_kl`).  Keeps the KL for
        :meth:`fast_kl`.  On the CPU the first fast draw lays the ``loc`` and ``rho``
        tensors end to end (:func:`~twodg_pyro.nn.flat_storage.pack`: the same tensors and
        values), so that this step and the VON update read them as views, not copies."""
        if type(self).forward is not DiagonalNormalGuide.forward:
            return None
        normals = [_normal_base(priors[s.name], len(s.shape)) for s in self.sites]
        if any(n is None for n in normals):
            return None
        locs = [self.loc(s.name) for s in self.sites]
        rhos = [self.rhos[site_key(s.name)] for s in self.sites]
        if locs[0].device.type == "cpu":  # before any scale is taken from them
            pack(locs)
            pack(rhos)
        if fused:
            values, self._fast = fused_draw_kl(self, locs, rhos, normals)
        else:
            scales = [self.scale(s.name) for s in self.sites]
            values, self._fast = draw_kl(self, locs, scales, normals)
        return {s.name: v for s, v in zip(self.sites, values, strict=True)}

    def fast_kl(self, priors, values, fused: bool = False) -> dict[str, torch.Tensor]:
        r""":math:`\sum_s \sum_i \mathrm{KL}(\mathcal N(\mu_{s,i}, \sigma_{s,i}^2) \|
        \mathcal N(m_{s,i}, s_{s,i}^2))` in closed form
        (:func:`~twodg_pyro.guides.fast_normal.normal_normal_kl`), as :meth:`fast_draw`
        computed it."""
        kl, self._fast = self._fast, None
        return {"kl": kl}

    def site_parameters(self, name: str) -> dict[str, torch.Tensor]:
        r"""``{"loc": mu, "scale": sigma}`` of a site."""
        return {"loc": self.loc(name), "scale": self.scale(name)}
