r"""The shared-GMM guide of stage 3 (Eqs. 8-10).

Outliers keep their own Normal, :math:`w_i \sim \mathcal N(\mu_i, \sigma_i^2)`, with the
KL term :math:`\sum_{i \in s}\mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2) \| p_s)` (closed
form for a Normal prior, else the one-draw estimate at the drawn weights).  Every inlier
is tied to a component :math:`c` of the 2-D mixture :math:`\mathcal N(m_c, S_c)` over the
:math:`(\mu, \sigma)` plane (an ellipse weight first draws :math:`c` from its blending
weights :math:`\alpha_i`); how it is drawn from its component, and the inliers' KL term,
is the *tying* (``representative``, ``stochastic`` or ``tied``): a strategy object of
:mod:`~twodg_pyro.guides.tyings`, with its draw, KL, site density, trainable count and
marginal; the guide holds what they share.

Drawing is vectorised: the guide draws the flat vector of all :math:`n_w` weights with
gathers over index tensors built once (:mod:`~twodg_pyro.guides.assignment`), then hands
each site its view.  Gradients reach the component centres, the Cholesky factors of
:math:`S_k` (stochastic, tied) and the outlier parameters.
"""

from __future__ import annotations

import functools
import math

import pyro
import pyro.distributions as dist
import torch

from ..bnn import require_model
from ..guide import BNNGuide, GuideSample, MarginalDensity
from ..nn.functional import softplus
from ..sharing.structure import SharingStructure
from .assignment import assignment_tables
from .base import GuideDraw, particle_batch_shape, scalar_prior
from .fast_shared import SharedGMMFastStep
from .marginal_density import shared_mixture_log_q
from .shared_mixture import SharedMixture
from .tyings import TYINGS, SharedDraw, Tying, TyingName, normal_kl, tying_named

__all__ = ["SharedGMMGuide", "TYINGS", "TyingName"]


class SharedGMMGuide(SharedMixture, SharedGMMFastStep, BNNGuide):
    """Stage-3 guide: inliers drawn from the shared mixture, outliers from their own Normals.

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel` whose sites the guide covers.
        structure: the :class:`~twodg_pyro.sharing.SharingStructure` from stages 1-2.
        tying: ``"representative"``, ``"stochastic"`` or ``"tied"``
            (:mod:`~twodg_pyro.guides.tyings`).

    Trainable: component centres (2K) and outlier means and scales (2 per outlier);
    the Cholesky factors of the covariances (3K) only for ``stochastic``/``tied``.

    Besides the core protocol it has both extensions of :mod:`twodg_pyro.guide`: the
    fast step (:class:`~twodg_pyro.guide.FastStepGuide`, :mod:`.fast_shared`) and the
    sharing structure (:class:`~twodg_pyro.guide.SharingGuide`: ``tying`` and
    :mod:`.shared_mixture`'s ``structure``, ``load_structure``, ``component_parameters``).

    Attributes:
        tying_rule: the :class:`~twodg_pyro.guides.tyings.Tying` (``tying`` is its name).
        kinds: the number of outliers, plain inliers and ellipse weights.

    Example::

        structure, report = build_sharing(model, mean_field_guide, loader, SharingConfig())
        guide = SharedGMMGuide(model, structure, tying="representative")
        fit(model, guide, loader, epochs=100, callbacks=[MergeHook(), MahalanobisHook()])
        guide.num_trainable()   # the outliers' and the components' numbers only
    """

    method = "2dg"

    def __init__(self, model, structure: SharingStructure, tying: str = "representative"):
        super().__init__()
        require_model(model, type(self).__name__, ("sites", "site_parameter"))
        if not isinstance(structure, SharingStructure):
            raise TypeError(
                f"{type(self).__name__} needs a SharingStructure (build_sharing's, or "
                f"SharingStructure.load), got {type(structure).__name__}"
            )
        if not isinstance(tying, str):
            raise TypeError(
                f"{type(self).__name__}: tying must be one of {list(TYINGS)}, got "
                f"{type(tying).__name__}"
            )
        self.tying_rule: Tying = tying_named(tying)
        structure.check_matches(model.site_names, [tuple(s.shape) for s in model.sites])
        self.sites = list(model.sites)
        self.coordinates = structure.coordinates
        self._info = dict(structure.info)
        # the guide follows the network's device and dtype, whatever the structure's
        self._set_outliers(structure, model.device, model.dtype)
        self._set_components(structure.means, structure.covariances)
        self._set_assignments(structure)
        #: the latest differentiable draw (its program's): what site_kl and log_density use
        self._last: SharedDraw | None = None

    def __getstate__(self):
        # a copy (deepcopy, pickle) leaves out the latest draw: it holds its graph
        return {**super().__getstate__(), "_last": None}

    @property
    def tying(self) -> str:
        """The tying's name: ``"representative"``, ``"stochastic"`` or ``"tied"``."""
        return self.tying_rule.name

    def _set_assignments(self, s: SharingStructure) -> None:
        buffers, self._sites, self.kinds = assignment_tables(
            s, self.outlier_loc.device, self.outlier_loc.dtype
        )
        for name, tensor, persistent in buffers:
            self.register_buffer(name, tensor, persistent=persistent)
        #: the stored tables, which a loaded state must repeat (see ``load_state_dict``)
        self._tables = [name for name, _, persistent in buffers if persistent]

    def _ellipse_components(self, S: int) -> torch.Tensor | None:
        """Component of each ellipse weight in each of ``S`` draws, ``(S, n_e)``."""
        if not self.kinds.ellipses:
            return None
        pick = torch.multinomial(self.ellipse_alphas, S, replacement=True)  # (n_e, S)
        return self.ellipse_components.gather(1, pick).T

    def _draw(self, S: int, fast: bool = False) -> SharedDraw:
        r"""``S`` draws of all weights, ``(S, n_w)`` in site order, with what the KL needs.

        Every weight is drawn in natural (site) order from per-weight parameters gathered
        through :attr:`nat_index` (outliers are their own degenerate "components"), so a
        draw costs about one normal per weight plus one gather; ellipse weights, whose
        component changes per draw, are drawn apart and copied in (the tying's
        :meth:`~twodg_pyro.guides.tyings.Tying.draw`).  ``fast=True`` (no gradients
        needed: prediction) draws in place and keeps only the weights.
        """
        out_scale = softplus(self.outlier_rho)
        chosen = self._ellipse_components(S)
        draw, ell = self.tying_rule.draw(self, S, chosen, out_scale, fast)
        if ell is not None:
            if torch.is_grad_enabled():
                draw.flat = draw.flat.index_copy(1, self.ellipse_index, ell)
            else:
                draw.flat.index_copy_(1, self.ellipse_index, ell)
        return draw

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        lead = flat.shape[:-1]
        # the sites cover the weights one after another (SharingStructure.validate): one
        # split, whose backward is one concatenation, where per-site slices would each build
        # a zero-filled gradient of all n_w weights (n_sites x n_w work)
        layouts = sorted((s.layout for s in self._sites.values()), key=lambda lay: lay.offset)
        parts = flat.split([lay.numel for lay in layouts], dim=-1)
        return {
            lay.name: part.reshape(*lead, *lay.shape)
            for lay, part in zip(layouts, parts, strict=True)
        }

    def mean_weights(self, differentiable: bool = False) -> dict[str, torch.Tensor]:
        r"""Every weight's posterior mean, per site: its component's centre
        :math:`m_{c,0}` (under every tying: the mean of :math:`\tilde\mu` and of
        :math:`z_{c,0}` too), :math:`\sum_k \alpha_{ik} m_{k,0}` for an ellipse weight,
        its own :math:`\mu` for an outlier (0 for a weight pinned by pruning); detached,
        or ``differentiable`` in the centres and the outlier means (to train the mean
        network, e.g. ``experiments/frontier.py``'s ``tune_mean``)."""
        with torch.set_grad_enabled(differentiable and torch.is_grad_enabled()):
            loc = torch.cat([self.centre_mu, self.outlier_loc]).index_select(0, self.nat_index)
            if self.kinds.ellipses:
                ell = (self.ellipse_alphas * self.centre_mu[self.ellipse_components]).sum(1)
                loc = loc.index_copy(0, self.ellipse_index, ell.to(loc.dtype))
            return self._split(loc)

    def draw(self, num_samples: int | None = None) -> GuideSample:
        """All weights in one draw: ``site.shape`` each, or ``(num_samples, *site.shape)``;
        ``component_values``: the ``tied`` tying's :math:`z_{k,0}`.  With gradients on it
        is the latest draw (:meth:`site_kl`); without, it draws in place (prediction)."""
        S = 1 if num_samples is None else int(num_samples)
        grad = torch.is_grad_enabled()
        d = self._draw(S, fast=not grad)
        if grad:
            self._last = d
        weights = self._split(d.flat)
        values = d.component_values
        if num_samples is None:
            weights = {k: v[0] for k, v in weights.items()}
            values = None if values is None else values[0]
        return GuideSample(weights, values)

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        r"""The guide as a Pyro program: one draw of all weights, one site per tensor.

        Each site is a :class:`~twodg_pyro.guides.base.GuideDraw` whose ``log_prob`` is
        :meth:`log_density` of the draw, so stock Pyro ELBOs estimate the same bound as
        :class:`~twodg_pyro.infer.DecomposedELBO` (``representative``, ``stochastic``);
        for ``tied`` it raises :class:`~twodg_pyro.guide.NoSiteDensityError`.
        Inside vectorised plates it draws one value per plate entry."""
        self._param_statements()
        batch = particle_batch_shape()
        n = math.prod(batch)
        self._last = last = self._draw(n)
        flat = last.flat
        weights = self._split(flat.reshape(*batch, flat.shape[-1]) if batch else flat[0])

        @functools.cache
        def per_site() -> dict[str, torch.Tensor]:  # every site's density, on the first ask
            log_q = self.log_density(last)  # (n, n_w)
            return {k: v.reshape(*batch, -1).sum(-1) for k, v in self._split(log_q).items()}

        return {
            s.name: pyro.sample(
                s.name, GuideDraw(weights[s.name], lambda n=s.name: per_site()[n], s.event_dim)
            )
            for s in self.sites
        }

    def log_density(self, draw: SharedDraw | None = None) -> torch.Tensor:
        r"""Per-weight :math:`\log q(w_i \mid \cdot)` of the latest draw (or of ``draw``),
        ``(S, n_w)``: the guide density whose expectation minus :math:`\mathbb E \log
        p(w)` is the Eq. 10 bound of the tying
        (:meth:`~twodg_pyro.guides.tyings.Tying.log_density`; none for ``tied``)."""
        return self.tying_rule.log_density(self, self._last if draw is None else draw)

    def site_kl(
        self, name: str, prior_fn, value: torch.Tensor, guide_fn=None
    ) -> dict[str, torch.Tensor]:
        """``{"kl_inlier": ..., "kl_outlier": ...}`` of one site for the latest draw: the
        outliers' closed-form (or estimated) KL here, the inliers' the tying's
        (:meth:`~twodg_pyro.guides.tyings.Tying.inlier_kl`)."""
        site = self._sites[name]
        draw = self._last
        prior = scalar_prior(prior_fn)
        zero = self.centre_mu.new_zeros(())
        base = prior_fn.base_dist if isinstance(prior_fn, dist.Independent) else prior_fn
        log_p_elem = functools.cache(lambda: base.log_prob(value).reshape(-1))  # on the first ask

        def log_p_at(global_idx: torch.Tensor) -> torch.Tensor:
            return log_p_elem()[global_idx - site.offset]

        # a Normal prior that differs between weights (e.g. PretrainedPrior): closed form,
        # weight by weight, at the prior's entries for the weights concerned
        per_weight = isinstance(base, dist.Normal) and prior is None

        def prior_at(global_idx: torch.Tensor) -> dist.Normal:
            local = global_idx - site.offset
            loc = base.loc.expand(base.batch_shape).reshape(-1).index_select(0, local)
            scale = base.scale.expand(base.batch_shape).reshape(-1).index_select(0, local)
            return dist.Normal(loc, scale, validate_args=False)

        kl_out = zero
        if site.outliers.stop > site.outliers.start:
            idx = self.outlier_index[site.outliers]
            loc = self.outlier_loc[site.outliers]
            scale = softplus(self.outlier_rho[site.outliers])
            kl_out = None
            if per_weight:
                kl_out = normal_kl(loc, scale, prior_at(idx)).sum()
            elif prior is not None:
                try:
                    kl_out = normal_kl(loc, scale, prior).sum()
                except NotImplementedError:
                    pass
            if kl_out is None:  # Monte Carlo at the drawn weights
                kl_out = Tying._estimate(draw, idx, loc, scale, prior, log_p_at)
        kl_in = zero
        if site.plain.stop > site.plain.start or site.ellipses.stop > site.ellipses.start:
            kl_in = self.tying_rule.inlier_kl(
                self, draw, site, prior, log_p_at, prior_at if per_weight else None
            )
        return {"kl_inlier": kl_in, "kl_outlier": kl_out}

    def marginal_log_density(self, quadrature_nodes: int = 64) -> MarginalDensity:
        r""":math:`\log q(w)` of joint draws: outliers' Normals, the tying's component
        marginals for plain inliers, their alpha-mixtures for ellipse weights
        (:mod:`~twodg_pyro.guides.marginal_density`; exact for ``representative``,
        quadrature for ``stochastic``, a product-of-marginals surrogate for ``tied``)."""
        marginals = self.tying_rule.component_marginals(self, int(quadrature_nodes))
        return shared_mixture_log_q(self, marginals)

    def param_groups(self) -> list[dict]:
        groups = [
            {"name": "centre", "params": [self.centre_mu, self.centre_raw]},
            {"name": "outlier", "params": [self.outlier_loc, self.outlier_rho]},
        ]
        if self.tying_rule.trains_covariances:
            groups.append({"name": "cov", "params": [self.chol_log_diag, self.chol_off]})
        return groups
