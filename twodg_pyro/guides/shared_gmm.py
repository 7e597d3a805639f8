r"""The shared-GMM guide of stage 3 (Eqs. 8-10).

Outliers keep their own Normal, :math:`w_i \sim \mathcal N(\mu_i, \sigma_i^2)`.  Every
inlier is tied to a component :math:`c` of the 2-D mixture (an ellipse weight first
draws :math:`c` from its blending weights :math:`\alpha_i`); how it is drawn from the
component :math:`\mathcal N(m_c, S_c)` over the :math:`(\mu, \sigma)` plane is the
*tying*:

``representative`` (default)
    the centre is a shared :math:`(\mu, \sigma)` pair:
    :math:`w_i \sim \mathcal N(m_{c,0}, m_{c,1}^2)`, independently per weight.
``stochastic``
    :math:`(\tilde\mu_i, \tilde\sigma_i) \sim \mathcal N(m_c, S_c)` per weight
    (:math:`\tilde\sigma` kept positive), then
    :math:`w_i \sim \mathcal N(\tilde\mu_i, \tilde\sigma_i^2)`.
``tied``
    one draw :math:`z_k \sim \mathcal N(m_k, S_k)` per component and forward pass,
    shared by all its weights: :math:`w_i = z_{c,0}`.

The KL terms of Eq. 10 match the tying (:meth:`SharedGMMGuide.site_kl`), with
:math:`N_{k,s} = \sum_{i \in s} r_{ik}` (1 for a plain inlier's component,
:math:`\alpha_{ik}` for an ellipse weight):

* representative: :math:`\sum_k N_{k,s}\,\mathrm{KL}(\mathcal N(m_{k,0}, m_{k,1}^2) \| p_s)`;
* stochastic: :math:`\sum_k N_{k,s}\,\mathbb E_{\mathcal N(m_k, S_k)}
  \mathrm{KL}(\mathcal N(\tilde\mu, \tilde\sigma^2) \| p_s)`, exact for a Normal prior
  (:mod:`~twodg_pyro.guides.stochastic_kl`: the Monte Carlo estimate's gradient has
  infinite variance), otherwise estimated at the drawn :math:`(\tilde\mu_i, \tilde\sigma_i)`
  of each weight;
* tied: :math:`\sum_k \frac{N_{k,s}}{N_k}\,\mathrm{KL}(\mathcal N(m_{k,0}, S_{k,00}) \| p_s)`,
  which sums over sites to :math:`\sum_k \mathrm{KL}(q(z_k) \| p)` when all sites share
  the prior;
* outliers: :math:`\sum_{i \in s}\mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2) \| p_s)`.

Closed form for a Normal prior that is the same for every weight of a site; a
Monte Carlo estimate :math:`\log q(w) - \log p(w)` at the drawn weights otherwise.

Each tying is a strategy object (:mod:`~twodg_pyro.guides.tyings`: its draw, KL, site
density, trainable count and marginal); the guide holds what they share.  Drawing is
vectorised: the guide draws the flat vector of all :math:`n_w` weights with gathers over
index tensors built once (:mod:`~twodg_pyro.guides.assignment`), then hands each site
its view.  Gradients reach the component centres, the Cholesky factors of :math:`S_k`
(stochastic, tied) and the outlier parameters.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn

from ..guide import GuideSample, MarginalDensity
from ..infer.elbo import DecomposedELBO
from ..sharing.refine import apply_mapping, merge_point_covariances
from ..sharing.structure import SharingStructure
from .assignment import SiteIndex, WeightKinds, assignment_tables
from .base import BNNGuide, GuideDraw, particle_batch_shape
from .marginal_density import shared_mixture_log_q
from .mean_field import inverse_softplus
from .tyings import (
    TYINGS,
    Conditional,
    SharedDraw,
    StochasticParts,
    Tying,
    TyingName,
    normal_kl,
    tying_named,
)

__all__ = ["SharedGMMGuide", "TYINGS", "TyingName"]

_MIN_SIGMA = 1e-8


def scalar_prior(fn: dist.Distribution) -> dist.Distribution | None:
    """The one scalar distribution behind a prior expanded over a site, or ``None`` when the
    prior differs between weights."""
    base = fn.base_dist if isinstance(fn, dist.Independent) else fn
    params = {}
    for name in base.arg_constraints:
        value = base.__dict__.get(name)
        if value is None:
            continue
        if not torch.is_tensor(value):
            return None
        if value.numel() > 1 and any(st != 0 for st in value.stride()):
            return None
        params[name] = value.reshape(-1)[0]
    try:
        return type(base)(**params, validate_args=False)
    except (TypeError, ValueError):
        return None


def _chol_params(covs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log diag (K, 2), off-diagonal (K,))`` of the Cholesky factors of 2x2 SPD ``covs``."""
    a, b, d = covs[:, 0, 0], covs[:, 1, 0], covs[:, 1, 1]
    l00 = a.clamp_min(1e-30).sqrt()
    l10 = b / l00
    l11 = (d - l10**2).clamp_min(1e-30).sqrt()
    return torch.stack([l00.log(), l11.log()], 1), l10


def _stochastic_coefficients(m0, m1, l00, l10, l11):
    r"""``(m0, m1, sqrt(S11), b sqrt(S11), v)`` of components given their Cholesky factors:
    :math:`S_{11} = l_{10}^2 + l_{11}^2`, :math:`b = S_{01}/S_{11} = l_{00} l_{10}/S_{11}`,
    :math:`v = S_{00} - S_{01}^2/S_{11} = (l_{00} l_{11})^2/S_{11}`; zero for the degenerate
    ``S = 0`` of an outlier."""
    s11 = l10 * l10 + l11 * l11
    pos = s11 > 0
    inv = torch.where(pos, 1.0 / s11.clamp_min(1e-30), torch.zeros_like(s11))
    a = s11.sqrt()
    return m0, m1, a, l00 * l10 * inv * a, (l00 * l11).square() * inv


class SharedGMMGuide(BNNGuide):
    """Stage-3 guide: inliers drawn from the shared mixture, outliers from their own Normals.

    Args:
        model: the :class:`~twodg_pyro.model.BNNModel` whose sites the guide covers.
        structure: the :class:`~twodg_pyro.sharing.SharingStructure` from stages 1-2.
        tying: ``"representative"``, ``"stochastic"`` or ``"tied"``
            (:mod:`~twodg_pyro.guides.tyings`).

    Trainable: component centres (2K) and outlier means and scales (2 per outlier);
    the Cholesky factors of the covariances (3K) only for ``stochastic``/``tied``.

    Attributes:
        tying_rule: the :class:`~twodg_pyro.guides.tyings.Tying` (``tying`` is its name).
        kinds: the number of outliers, plain inliers and ellipse weights.
    """

    method = "2dg"

    def __init__(self, model, structure: SharingStructure, tying: str = "representative"):
        super().__init__()
        self.tying_rule: Tying = tying_named(tying)
        structure.check_matches(model.site_names, [tuple(s.shape) for s in model.sites])
        self.sites = list(model.sites)
        self.coordinates = structure.coordinates
        self._info = dict(structure.info)
        # the guide follows the network's device and dtype, whatever the structure's
        device, dtype = model.device, model.dtype
        self.outlier_loc = nn.Parameter(
            structure.outlier_loc.detach().to(device=device, dtype=dtype).clone()
        )
        self.outlier_rho = nn.Parameter(
            inverse_softplus(structure.outlier_scale.detach().to(device=device, dtype=dtype))
        )
        self._set_components(structure.means, structure.covariances)
        self._set_assignments(structure)
        #: the latest differentiable draw (its program's): what site_kl and log_density use
        self._last: SharedDraw | None = None

    @property
    def tying(self) -> str:
        """The tying's name: ``"representative"``, ``"stochastic"`` or ``"tied"``."""
        return self.tying_rule.name

    # ------------------------------------------------------------------ parameters
    def _set_components(
        self, means: torch.Tensor, covs: torch.Tensor, point_covs: torch.Tensor | None = None
    ) -> None:
        like = self.outlier_loc  # the guide's device and dtype
        means = means.detach().to(device=like.device, dtype=like.dtype)
        covs = covs.detach().to(device=like.device, dtype=like.dtype)
        point_covs = covs if point_covs is None else point_covs
        # the spread of each component's member points, which the Mahalanobis check
        # measures them against (see point_covariances)
        self.register_buffer(
            "point_covs", point_covs.detach().to(device=like.device, dtype=like.dtype).clone()
        )
        m1 = means[:, 1]
        raw = inverse_softplus(m1.clamp_min(_MIN_SIGMA)) if self.coordinates == "sigma" else m1
        self.centre_mu = nn.Parameter(means[:, 0].clone())
        self.centre_raw = nn.Parameter(raw.clone())
        # the centres the inlier points were last synchronised with (see current_points)
        self.register_buffer("anchor_centres", means.clone())
        log_diag, off = _chol_params(covs)
        trainable = self.tying_rule.trains_covariances
        for name, value in (("chol_log_diag", log_diag), ("chol_off", off)):
            if name in self._parameters:
                del self._parameters[name]
            if name in self._buffers:
                del self._buffers[name]
            if trainable:
                setattr(self, name, nn.Parameter(value.clone()))
            else:
                self.register_buffer(name, value.clone())

    def _set_assignments(self, s: SharingStructure) -> None:
        tables = assignment_tables(s, self.outlier_loc.device, self.outlier_loc.dtype)
        for name, tensor, persistent in tables.buffers:
            self.register_buffer(name, tensor, persistent=persistent)
        self._sites: dict[str, SiteIndex] = tables.sites
        self.kinds: WeightKinds = tables.kinds

    # ------------------------------------------------------------------ components
    @property
    def n_components(self) -> int:
        return int(self.centre_mu.shape[0])

    def centre_sigma(self) -> torch.Tensor:
        r""":math:`\sigma` of each centre (``softplus`` or ``exp`` of its raw parameter)."""
        if self.coordinates == "sigma":
            return F.softplus(self.centre_raw).clamp_min(_MIN_SIGMA)
        return self.centre_raw.exp()

    def centres(self) -> torch.Tensor:
        """Component means :math:`m_k` in the mixture's coordinates, ``(K, 2)``."""
        m1 = F.softplus(self.centre_raw) if self.coordinates == "sigma" else self.centre_raw
        return torch.stack([self.centre_mu, m1], 1)

    def cholesky(self) -> torch.Tensor:
        """Lower Cholesky factors :math:`L_k` of :math:`S_k`, ``(K, 2, 2)``."""
        d = self.chol_log_diag.exp()
        zero = torch.zeros_like(self.chol_off)
        row0 = torch.stack([d[:, 0], zero], 1)
        row1 = torch.stack([self.chol_off, d[:, 1]], 1)
        return torch.stack([row0, row1], 1)

    def covariances(self) -> torch.Tensor:
        r""":math:`S_k = L_k L_k^\top`, ``(K, 2, 2)``."""
        L = self.cholesky()
        return L @ L.transpose(-1, -2)

    def point_covariances(self) -> torch.Tensor:
        r"""The spread :math:`\Sigma_k` of each component's member points, ``(K, 2, 2)``,
        which the Mahalanobis check (:math:`D^2 > T_M`) measures a point against.

        Stage 2 sets it to the mixture's covariances.  In the ``representative`` tying it
        is the guide's (untrained) covariances; the ``stochastic`` and ``tied`` tyings
        train their covariances as variational parameters (the spread of the weights'
        posterior, which shrinks away from that of their stage-1 points), so the points'
        spread is kept apart, and a merge combines it exactly
        (:func:`~twodg_pyro.sharing.refine.merge_point_covariances`).
        """
        return self.point_covs

    def current_points(self) -> torch.Tensor:
        r"""The inlier points :math:`x_i` moved with their components since stage 2.

        During stage 3 the centres move (they are trained) while the weights' stage-1
        points :math:`x_i` do not: compared with the moved mixture, most points would sit
        far from their component and the Mahalanobis check would turn them into ellipse
        weights.  A point therefore rides with its component: it keeps its offset from the
        centre it was last assigned to,

        .. math::
            x_i \leftarrow x_i + \sum_k r_{ik}\,(m_k - m_k^{\text{anchor}}),

        (:math:`r_{ik}` = 1 for a plain inlier's component, :math:`\alpha_{ik}` for an
        ellipse weight; :math:`m^{\text{anchor}}` the centres when the points were last
        set), so the check only reacts to changes of the mixture's shape (merges, trained
        covariances), not to the drift of the centres.  Returned in the order of
        :attr:`inlier_points` (plain, then ellipse weights), ``(n_inliers, 2)``.
        """
        with torch.no_grad():
            delta = self.centres() - self.anchor_centres
            shift = delta.index_select(0, self.plain_component.long())
            if self.kinds.ellipses:
                shift_e = (self.ellipse_alphas.unsqueeze(-1) * delta[self.ellipse_components]).sum(
                    1
                )
                shift = torch.cat([shift, shift_e])
            return self.inlier_points + shift.to(self.inlier_points.dtype)

    def component_counts(self) -> torch.Tensor:
        r""":math:`N_k` summed over sites."""
        return self.site_counts.sum(0)

    # ------------------------------------------------------------------ drawing
    def _outlier_m1(self, scale: torch.Tensor) -> torch.Tensor:
        """An outlier's scale in the mixture's second coordinate."""
        return scale if self.coordinates == "sigma" else scale.log()

    def _sigma_of(self, t1: torch.Tensor) -> torch.Tensor:
        r""":math:`\tilde\sigma` from a drawn second coordinate."""
        if self.coordinates == "sigma":
            return t1.abs().clamp_min(_MIN_SIGMA)
        return t1.exp()

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
        out_scale = F.softplus(self.outlier_rho)
        chosen = self._ellipse_components(S)
        flat, ell, values, parts = self.tying_rule.draw(self, S, chosen, out_scale, fast)
        if ell is not None:
            if torch.is_grad_enabled():
                flat = flat.index_copy(1, self.ellipse_index, ell)
            else:
                flat.index_copy_(1, self.ellipse_index, ell)
        return SharedDraw(flat, chosen, values, parts)

    def _gather_rows(self, table: torch.Tensor) -> torch.Tensor:
        """``table[:, nat_index]`` for a ``(S, K + n_out)`` table, row by row: a 1-D
        ``index_select`` per draw (fast, 32-bit index, deterministic backward)."""
        if table.shape[0] == 1:
            return table[0].index_select(0, self.nat_index).unsqueeze(0)
        if not torch.is_grad_enabled():
            out = table.new_empty(table.shape[0], self.nat_index.numel())
            for row, dst in zip(table, out, strict=True):
                torch.index_select(row, 0, self.nat_index, out=dst)
            return out
        return torch.stack([row.index_select(0, self.nat_index) for row in table])

    def _draw_stochastic(self, S: int, chosen, out_scale, fast: bool):
        r""":math:`(\tilde\mu, t) \sim \mathcal N(m_c, S_c)`,
        :math:`w \sim \mathcal N(\tilde\mu, \tilde\sigma(t)^2)`, per weight and draw, with
        :math:`\tilde\mu` integrated out: two normals per weight instead of three.

        With :math:`b = S_{01}/S_{11}` and :math:`v = S_{00} - S_{01}^2/S_{11}`,

        .. math::
            t = m_1 + \sqrt{S_{11}}\,u, \qquad
            w = m_0 + b\,(t - m_1) + \sqrt{v + \tilde\sigma(t)^2}\;\varepsilon,
            \qquad u, \varepsilon \sim \mathcal N(0, 1),

        which is the same joint law of :math:`(t, w)` as drawing :math:`\tilde\mu` first.
        When a Monte Carlo KL needs :math:`\tilde\mu` (a non-Normal prior) it is drawn
        afterwards from :math:`\tilde\mu \mid t, w` (:class:`~twodg_pyro.guides.tyings.Stochastic`),
        so the triple still has the law of the three-normal draw and stays reparameterised.
        """
        n_w = self.nat_index.numel()
        d = self.chol_log_diag.exp()
        zeros = self.outlier_loc.new_zeros(self.kinds.outliers)
        m1 = self.centres()[:, 1]
        # per component (outliers: zero covariance): m0, m1, L00, L10, L11
        cols = [
            torch.cat([self.centre_mu, self.outlier_loc]),
            torch.cat([m1, self._outlier_m1(out_scale)]),
            torch.cat([d[:, 0], zeros]),
            torch.cat([self.chol_off, zeros]),
            torch.cat([d[:, 1], zeros]),
        ]
        coef = _stochastic_coefficients(*cols)  # m0, m1, sqrt(S11), b sqrt(S11), v
        # 1-D gathers: their backward is a fast serial (deterministic) index_add
        per = [c.index_select(0, self.nat_index) for c in coef]  # 5 x (n_w,)
        e_per = None
        if chosen is not None:
            c = chosen.reshape(-1)
            e_per = [col.index_select(0, c).view(chosen.shape) for col in coef]
        if fast:
            flat = self._draw_marginal_into(
                torch.empty(S, n_w, dtype=per[0].dtype, device=per[0].device), *per
            )
            ell = None
            if chosen is not None:
                ell = self._draw_marginal_into(
                    torch.empty(chosen.shape, dtype=per[0].dtype, device=per[0].device), *e_per
                )
            return flat, ell, None

        def draw(p, shape):
            m0, m1_, a, ba, v = p
            u, eps = torch.randn(2, *shape, device=m0.device, dtype=m0.dtype)
            sig = self._sigma_of(torch.addcmul(m1_, a, u))
            cond_mean = torch.addcmul(m0, ba, u)
            return torch.addcmul(cond_mean, torch.sqrt(v + sig * sig), eps), cond_mean, v, sig

        flat, cond_mean, v, sig = draw(per, (S, n_w))
        ell, ellipse = None, None
        if chosen is not None:
            ell, cm_e, v_e, sig_e = draw(e_per, chosen.shape)
            ellipse = Conditional(cm_e, v_e, sig_e)
        # (c, v, sigma~) per weight, assembled only if a Monte Carlo KL asks for them
        return flat, ell, StochasticParts(Conditional(cond_mean, v.expand(S, n_w), sig), ellipse)

    def _draw_marginal_into(self, out, m0, m1_, a, ba, v) -> torch.Tensor:
        """The two-normal draw of :meth:`_draw_stochastic` in place (no gradients)."""
        u = torch.randn(out.shape, device=out.device, dtype=out.dtype)
        t1 = torch.addcmul(m1_, a, u)  # the drawn second coordinate
        torch.addcmul(m0, ba, u, out=out)
        if self.coordinates == "sigma":  # sigma~^2 = t1^2
            var = torch.addcmul(v, t1, t1, out=t1)
        else:  # sigma~^2 = exp(2 t1)
            var = t1.mul_(2).exp_().add_(v)
        eps = torch.randn(out.shape, device=out.device, dtype=out.dtype, out=u)
        return out.addcmul_(var.sqrt_(), eps)

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        lead = flat.shape[:-1]
        layouts = sorted((s.layout for s in self._sites.values()), key=lambda lay: lay.offset)
        offsets = [lay.offset for lay in layouts]
        sizes = [lay.numel for lay in layouts]
        if offsets == [sum(sizes[:i]) for i in range(len(sizes))]:
            # one split: its backward is one concatenation, where per-site slices would
            # each build a zero-filled gradient of all n_w weights (n_sites x n_w work)
            parts = flat.split(sizes, dim=-1)
            return {
                lay.name: part.reshape(*lead, *lay.shape)
                for lay, part in zip(layouts, parts, strict=True)
            }
        return {
            name: flat[..., s.offset : s.offset + s.layout.numel].reshape(*lead, *s.layout.shape)
            for name, s in self._sites.items()
        }

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
        densities = {}

        def site_density(name: str):
            def density():
                if "per_site" not in densities:
                    log_q = self.log_density(last)  # (n, n_w)
                    densities["per_site"] = {
                        k: v.reshape(*batch, -1).sum(-1) for k, v in self._split(log_q).items()
                    }
                return densities["per_site"][name].reshape(batch)

            return density

        return {
            s.name: pyro.sample(
                s.name, GuideDraw(weights[s.name], site_density(s.name), event_dim=len(s.shape))
            )
            for s in self.sites
        }

    def log_density(self, draw: SharedDraw | None = None) -> torch.Tensor:
        r"""Per-weight :math:`\log q(w_i \mid \cdot)` of the latest draw (or of ``draw``),
        ``(S, n_w)``: the guide density whose expectation minus :math:`\mathbb E \log
        p(w)` is the Eq. 10 bound of the tying
        (:meth:`~twodg_pyro.guides.tyings.Tying.log_density`; none for ``tied``)."""
        return self.tying_rule.log_density(self, self._last if draw is None else draw)

    # ------------------------------------------------------------------ KL (Eq. 10)
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
        log_p_elem = None

        def log_p_at(global_idx: torch.Tensor) -> torch.Tensor:
            nonlocal log_p_elem
            if log_p_elem is None:
                base = prior_fn.base_dist if isinstance(prior_fn, dist.Independent) else prior_fn
                log_p_elem = base.log_prob(value).reshape(-1)
            return log_p_elem[global_idx - site.offset]

        base = prior_fn.base_dist if isinstance(prior_fn, dist.Independent) else prior_fn
        # a Normal prior that differs between weights (e.g. PretrainedPrior): closed form,
        # weight by weight, at the prior's entries for the weights concerned
        per_weight = isinstance(base, dist.Normal) and prior is None

        def prior_at(global_idx: torch.Tensor) -> dist.Normal:
            local = global_idx - site.offset
            loc = base.loc.expand(base.batch_shape).reshape(-1).index_select(0, local)
            scale = base.scale.expand(base.batch_shape).reshape(-1).index_select(0, local)
            return dist.Normal(loc, scale, validate_args=False)

        # ---- outliers
        kl_out = zero
        if site.outliers.stop > site.outliers.start:
            idx = self.outlier_index[site.outliers]
            loc = self.outlier_loc[site.outliers]
            scale = F.softplus(self.outlier_rho[site.outliers])
            kl_out = None
            if per_weight:
                kl_out = normal_kl(loc, scale, prior_at(idx)).sum()
            elif prior is not None:
                try:
                    kl_out = normal_kl(loc, scale, prior).sum()
                except NotImplementedError:
                    pass
            if kl_out is None:  # Monte Carlo at the drawn weights
                w = draw.flat[0].index_select(0, idx)
                log_q = dist.Normal(loc, scale, validate_args=False).log_prob(w)
                log_p = prior.log_prob(w) if prior is not None else log_p_at(idx)
                kl_out = (log_q - log_p).sum()
        # ---- inliers
        kl_in = zero
        if site.plain.stop > site.plain.start or site.ellipses.stop > site.ellipses.start:
            kl_in = self.tying_rule.inlier_kl(
                self, draw, site, prior, log_p_at, prior_at if per_weight else None
            )
        return {"kl_inlier": kl_in, "kl_outlier": kl_out}

    # ------------------------------------------------------------------ densities
    def marginal_log_density(self, quadrature_nodes: int = 64) -> MarginalDensity:
        r""":math:`\log q(w)` of joint draws: outliers' Normals, the tying's component
        marginals for plain inliers, their alpha-mixtures for ellipse weights
        (:mod:`~twodg_pyro.guides.marginal_density`; exact for ``representative``,
        quadrature for ``stochastic``, a product-of-marginals surrogate for ``tied``)."""
        marginals = self.tying_rule.component_marginals(self, int(quadrature_nodes))
        return shared_mixture_log_q(self, marginals)

    # ------------------------------------------------------------------ refinement
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # files written before 0.1.0's memory diet carry an unused weight-sized buffer
        state_dict.pop(prefix + "inverse_order", None)
        # files written before the points' spread was kept apart: the saved covariances
        if prefix + "point_covs" not in state_dict and prefix + "chol_log_diag" in state_dict:
            d = state_dict[prefix + "chol_log_diag"].exp()
            off = state_dict[prefix + "chol_off"]
            L = torch.zeros(d.shape[0], 2, 2, dtype=d.dtype, device=d.device)
            L[:, 0, 0], L[:, 1, 0], L[:, 1, 1] = d[:, 0], off, d[:, 1]
            state_dict[prefix + "point_covs"] = L @ L.transpose(-1, -2)
        # files written before the points followed their components: the points are where
        # they were, relative to the saved centres
        if prefix + "anchor_centres" not in state_dict and prefix + "centre_mu" in state_dict:
            raw = state_dict[prefix + "centre_raw"]
            m1 = F.softplus(raw) if self.coordinates == "sigma" else raw
            state_dict[prefix + "anchor_centres"] = torch.stack(
                [state_dict[prefix + "centre_mu"], m1], 1
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_structure(
        self,
        structure: SharingStructure,
        components: bool = True,
        point_covariances: torch.Tensor | None = None,
    ) -> None:
        """Adopt a refined structure (after a merge or a reassignment).

        With ``components=True`` the component parameters are rebuilt from the
        structure's means and covariances (new parameter objects: rebuild the
        optimiser), and the points' spread (:meth:`point_covariances`) is
        ``point_covariances`` (default: the structure's covariances); otherwise they are
        kept and only the assignments change.  Outlier parameters are kept when the set
        of outliers is unchanged.
        """
        structure.check_matches([s.name for s in self.sites], [tuple(s.shape) for s in self.sites])
        if structure.coordinates != self.coordinates:
            raise ValueError(
                f"structure coordinates {structure.coordinates!r} differ from the guide's "
                f"{self.coordinates!r}"
            )
        if not torch.equal(structure.outlier_index, self.outlier_index.cpu()):
            dev, dtype = self.outlier_loc.device, self.outlier_loc.dtype
            self.outlier_loc = nn.Parameter(
                structure.outlier_loc.detach().to(device=dev, dtype=dtype).clone()
            )
            self.outlier_rho = nn.Parameter(
                inverse_softplus(structure.outlier_scale.detach().to(device=dev, dtype=dtype))
            )
        if components:
            self._set_components(structure.means, structure.covariances, point_covariances)
        elif structure.n_gaussians != self.n_components:
            raise ValueError("components=False needs the same number of components")
        else:  # the structure's points are current: they ride from the centres as they are
            self.anchor_centres = self.centres().detach().clone()
        self._set_assignments(structure)
        self._last = None

    def merge(self, mapping: torch.Tensor, means: torch.Tensor, covs: torch.Tensor) -> None:
        r"""Adopt a merge of components (:func:`~twodg_pyro.gmm.merge_components`): old
        component :math:`j` becomes ``mapping[j]`` of the new mixture ``(means, covs)``.

        The inlier points move with their components first (:meth:`current_points`);
        the points' spread of a merged component is that of the merged clouds, exactly
        (:func:`~twodg_pyro.sharing.refine.merge_point_covariances`), where the tying
        trains its covariances (else the new covariances).  The component parameters are
        new tensors (:meth:`component_parameters`): remap the optimiser's rows."""
        point_covs = None
        if self.tying_rule.trains_covariances:
            with torch.no_grad():  # the points' spread: the merged clouds', exactly
                point_covs = merge_point_covariances(
                    self.point_covariances(),
                    self.centres(),
                    self.component_counts(),
                    mapping,
                    means.to(self.point_covariances()),
                )
        merged = apply_mapping(self.structure(current_points=True), mapping, means, covs)
        self.load_structure(merged, point_covariances=point_covs)

    def centre_gradients(self, model, batches, n_batches: int = 1, elbo=None) -> torch.Tensor:
        r""":math:`\partial(-\mathrm{ELBO})/\partial m_k`, ``(K, 2)``, averaged over minibatches."""
        elbo = elbo or DecomposedELBO()
        total = self.centre_mu.new_zeros(self.n_components, 2)
        seen = 0
        for batch in batches:
            x, y = (t.to(self.centre_mu.device) for t in batch[:2])
            g_mu, g_raw = torch.autograd.grad(
                elbo.differentiable_loss(model, self, x, y), [self.centre_mu, self.centre_raw]
            )
            # chain rule from the raw parameter to the coordinate m_{k,1}
            dm1 = torch.sigmoid(self.centre_raw) if self.coordinates == "sigma" else 1.0
            total += torch.stack([g_mu, g_raw / dm1], 1).detach()
            seen += 1
            if seen >= n_batches:
                break
        return total / max(seen, 1)

    # ------------------------------------------------------------------ BNNGuide API
    def param_groups(self) -> list[dict]:
        groups = [
            {"name": "centre", "params": [self.centre_mu, self.centre_raw]},
            {"name": "outlier", "params": [self.outlier_loc, self.outlier_rho]},
        ]
        if self.tying_rule.trains_covariances:
            groups.append({"name": "cov", "params": [self.chol_log_diag, self.chol_off]})
        return groups

    def component_parameters(self) -> list[nn.Parameter]:
        """The centres, and the Cholesky factors where the tying trains them: one row per
        component each."""
        params = [self.centre_mu, self.centre_raw]
        if self.tying_rule.trains_covariances:
            params += [self.chol_log_diag, self.chol_off]
        return params

    def structure(self, current_points: bool = False) -> SharingStructure:
        """The current sharing structure (centres and covariances as trained so far).

        Its ``inlier_points`` are the points as last set (stage 1's, or as of the last
        refinement), which the guide's ``anchor_centres`` complete (files and checkpoints
        keep both); ``current_points=True`` gives them moved with their components
        (:meth:`current_points`), as the refinement hooks compare them with the mixture.
        """
        sites = [s.layout for s in self._sites.values()]
        with torch.no_grad():
            return SharingStructure(
                sites=sites,
                coordinates=self.coordinates,
                means=self.centres().cpu(),
                covariances=self.covariances().cpu(),
                outlier_index=self.outlier_index.cpu(),
                outlier_loc=self.outlier_loc.cpu(),
                outlier_scale=F.softplus(self.outlier_rho).cpu(),
                plain_index=self.plain_index.long().cpu(),
                plain_component=self.plain_component.long().cpu(),
                ellipse_index=self.ellipse_index.cpu(),
                ellipse_components=self.ellipse_components.cpu(),
                ellipse_alphas=self.ellipse_alphas.cpu(),
                inlier_points=(
                    self.current_points() if current_points else self.inlier_points
                ).cpu(),
                info=dict(self._info),
            )
