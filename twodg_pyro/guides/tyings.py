r"""How a tied weight is drawn from its component: the three *tyings* of the shared-GMM
guide, each a strategy object with its draw, KL, trainable count and marginal.

Component :math:`k` is a 2-D Gaussian :math:`\mathcal N(m_k, S_k)` over the
:math:`(\mu, \sigma)` plane (or :math:`(\mu, \log\sigma)`); an inlier :math:`i` is tied
to component :math:`c` (an ellipse weight first draws :math:`c` from its blending
weights :math:`\alpha_i`).  With :math:`N_{k,s} = \sum_{i \in s} r_{ik}`
(:mod:`~twodg_pyro.guides.assignment`) the Eq. 10 KL term of the inliers of site
:math:`s` is

``representative`` (:class:`Representative`, default)
    the centre is a shared :math:`(\mu, \sigma)` pair:
    :math:`w_i \sim \mathcal N(m_{c,0}, m_{c,1}^2)`, independently per weight;
    :math:`\sum_k N_{k,s}\,\mathrm{KL}(\mathcal N(m_{k,0}, m_{k,1}^2) \| p_s)`.
``stochastic`` (:class:`Stochastic`)
    :math:`(\tilde\mu_i, \tilde\sigma_i) \sim \mathcal N(m_c, S_c)` per weight, then
    :math:`w_i \sim \mathcal N(\tilde\mu_i, \tilde\sigma_i^2)`;
    :math:`\sum_k N_{k,s}\,\mathbb E_{\mathcal N(m_k, S_k)}\mathrm{KL}(\mathcal
    N(\tilde\mu, \tilde\sigma^2) \| p_s)`, exact for a Normal prior
    (:mod:`~twodg_pyro.guides.stochastic_kl`: the Monte Carlo estimate's gradient has
    infinite variance).
``tied`` (:class:`Tied`)
    one draw :math:`z_k \sim \mathcal N(m_k, S_k)` per component and forward pass,
    shared by all its weights: :math:`w_i = z_{c,0}`;
    :math:`\sum_k \frac{N_{k,s}}{N_k}\,\mathrm{KL}(\mathcal N(m_{k,0}, S_{k,00}) \| p_s)`,
    which sums over sites to :math:`\sum_k \mathrm{KL}(q(z_k) \| p)` when all sites
    share the prior.

Closed form for a Normal prior that is the same for every weight of a site (and, for
``representative``, weight by weight for a Normal prior that differs between weights);
otherwise the one-draw estimate :math:`\log q(w) - \log p(w)` at the drawn weights (for
``representative`` :math:`\log q(w \mid c)` at the drawn component, for ``stochastic``
:math:`\log\mathcal N(w; \tilde\mu, \tilde\sigma^2)` at a :math:`\tilde\mu` drawn from
:math:`\tilde\mu \mid t, w`).

Trainable per component: the centre :math:`m_k` (2) for ``representative``, which keeps
:math:`S_k` from stage 2 for refinement only; the centre and the Cholesky factor of
:math:`S_k` (2 + 3) for ``stochastic`` and ``tied``, where :math:`S_k` shapes the
weights' distribution (:attr:`Tying.trains_covariances`).

The marginal of a tied weight (:meth:`Tying.component_marginals`, the VI diagnostics'
density; :mod:`~twodg_pyro.guides.marginal_density`) is exact for ``representative``, a
quadrature for ``stochastic`` and a product-of-marginals surrogate for ``tied``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

import pyro.distributions as dist
import torch
from pyro.distributions.kl import kl_divergence

from ..guide import NoSiteDensityError
from ..nn.functional import softplus
from .assignment import gather_rows
from .marginal_density import ComponentMarginals, stochastic_component_marginals
from .stochastic_draw import Conditional, StochasticParts, draw_stochastic
from .stochastic_kl import expected_normal_kl

if TYPE_CHECKING:
    from .assignment import SiteIndex, TyingGuide

#: the tyings' names: the settings' choices (``stage3.tying``)
TyingName = Literal["representative", "stochastic", "tied"]
TYINGS: tuple[str, ...] = get_args(TyingName)


def normal_kl(loc: torch.Tensor, scale: torch.Tensor, prior: dist.Distribution) -> torch.Tensor:
    """Elementwise KL(N(loc, scale^2) || prior) in closed form (``NotImplementedError``
    where none is registered)."""
    return kl_divergence(dist.Normal(loc, scale, validate_args=False), prior)


@dataclass
class SharedDraw:
    """One draw of the shared-GMM guide and what its KL and densities need of it.

    Attributes:
        flat: the weights, ``(S, n_w)`` in site order.
        chosen: the component of each ellipse weight in each draw, ``(S, n_e)``.
        component_values: ``tied``: :math:`z_{k,0}` of each component, ``(S, K)``.
        stochastic: ``stochastic`` (with gradients): the conditionals of the draw.
        conditional: the assembled :class:`Conditional` of every weight (memo).
        expected_kl: per prior, the components' expected KL (memo, see
            :meth:`Stochastic.expected_kl`).
    """

    flat: torch.Tensor
    chosen: torch.Tensor | None
    component_values: torch.Tensor | None = None
    stochastic: StochasticParts | None = None
    conditional: Conditional | None = None
    expected_kl: dict = field(default_factory=dict)


class Tying:
    """How a tied weight is drawn from its component (see the module docstring).

    A tying is stateless; the guide passes itself and the draw to each method.
    """

    name: ClassVar[str]
    #: whether the Cholesky factors of :math:`S_k` are trained (the ``cov`` group)
    trains_covariances: ClassVar[bool] = False

    @property
    def parameters_per_component(self) -> int:
        """Trainable scalars per component: the centre (2), and the Cholesky factor (3)
        when :attr:`trains_covariances`."""
        return 5 if self.trains_covariances else 2

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def draw(
        self, guide: TyingGuide, S: int, chosen, out_scale: torch.Tensor, fast: bool
    ) -> tuple[SharedDraw, torch.Tensor | None]:
        """``S`` draws of every weight (``chosen``: the ellipse weights' components): the
        draw, its ellipse weights not yet placed, and those ``(S, n_e)`` (``None``: none)."""
        raise NotImplementedError

    def log_density(self, guide: TyingGuide, draw: SharedDraw) -> torch.Tensor:
        r"""Per-weight :math:`\log q(w_i \mid \cdot)` of ``draw``, ``(S, n_w)``."""
        raise NotImplementedError

    def inlier_kl(
        self, guide: TyingGuide, draw: SharedDraw, site: SiteIndex, prior, log_p_at, prior_at
    ) -> torch.Tensor:
        r""":math:`\mathrm{KL}_{\text{in},s}` of one site: :meth:`normal_kl_terms` for a
        Normal prior, else the tying's per-weight or Monte Carlo terms.

        Args:
            prior: the site's prior as one scalar distribution (``None``: it differs
                between weights).
            log_p_at: ``log_p_at(flat_index)``: the prior's log density of the drawn
                weights at those flat indices (a per-weight prior).
            prior_at: ``prior_at(flat_index)``: a per-weight Normal prior's entries at
                those indices as a Normal, or ``None``.
        """
        if isinstance(prior, dist.Normal):
            counts = guide.site_counts[site.position]
            counts, kl_k = self.normal_kl_terms(guide, counts, prior, draw)
            return (counts * kl_k).sum()
        return self._other_kl(guide, draw, site, prior, log_p_at, prior_at)

    def normal_kl_terms(
        self, guide: TyingGuide, counts: torch.Tensor, prior: dist.Normal, draw: SharedDraw
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(c, kappa)``, the inliers' KL to the Normal ``prior`` being ``(c * kappa).sum()``
        (module docstring; ``counts``: :math:`N_{k,s}` of one site ``(K,)``, or of every
        site ``(n_sites, K)`` against a prior of batch shape ``(n_sites, 1)``)."""
        raise NotImplementedError

    def _other_kl(self, guide, draw, site, prior, log_p_at, prior_at) -> torch.Tensor:
        """:meth:`inlier_kl` for a prior that is not one Normal."""
        raise NotImplementedError

    def component_marginals(self, guide: TyingGuide, nodes: int) -> ComponentMarginals:
        """Each component's marginal of one weight tied to it (module docstring)."""
        raise NotImplementedError

    @staticmethod
    def _inlier_indices(guide: TyingGuide, site: SiteIndex) -> torch.Tensor:
        """The site's plain then ellipse weights, as flat indices."""
        return torch.cat([guide.plain_index[site.plain], guide.ellipse_index[site.ellipses]])

    @staticmethod
    def _estimate(draw: SharedDraw, idx, loc, scale, prior, log_p_at) -> torch.Tensor:
        r""":math:`\sum_i \log\mathcal N(w_i; \text{loc}_i, \text{scale}_i^2) - \log
        p(w_i)` at the drawn weights ``idx``."""
        w = draw.flat[0].index_select(0, idx)
        log_q = dist.Normal(loc, scale, validate_args=False).log_prob(w)
        log_p = prior.log_prob(w) if prior is not None else log_p_at(idx)
        return (log_q - log_p).sum()


class Representative(Tying):
    r"""The centre is a shared :math:`(\mu, \sigma)` pair:
    :math:`w_i \sim \mathcal N(m_{c,0}, m_{c,1}^2)`, independently per weight (default)."""

    name = "representative"

    @staticmethod
    def normals(guide, out_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale)`` of each weight's Normal, ``(n_w,)`` in site order: its
        component's centre, or its own (outliers, of scale ``out_scale``)."""
        loc = torch.cat([guide.centre_mu, guide.outlier_loc])
        scale = torch.cat([guide.centre_sigma(), out_scale])
        return loc.index_select(0, guide.nat_index), scale.index_select(0, guide.nat_index)

    def draw(self, guide, S, chosen, out_scale, fast):
        loc, scale = self.normals(guide, out_scale)
        eps = torch.randn(S, loc.numel(), device=loc.device, dtype=loc.dtype)
        flat = torch.addcmul(loc, scale, eps, out=None if torch.is_grad_enabled() else eps)
        ell = None
        if chosen is not None:
            c = chosen.reshape(-1)
            ell = torch.addcmul(
                guide.centre_mu.index_select(0, c),
                guide.centre_sigma().index_select(0, c),
                torch.randn(c.numel(), device=loc.device, dtype=loc.dtype),
            ).view(chosen.shape)
        return SharedDraw(flat, chosen), ell

    def log_density(self, guide, draw) -> torch.Tensor:
        r""":math:`\log\mathcal N(w_i; \mu_i, \sigma_i^2)` with the parameters of the
        weight's own Normal (outliers), its component's centre (plain inliers) or the
        centre of the component drawn from its alphas (ellipse weights):
        :math:`\mathbb E[\log q(w \mid c) - \log p(w)] = \sum_k \alpha_k
        \mathrm{KL}(\mathcal N(m_{k,0}, m_{k,1}^2) \| p)`."""
        loc, scale = self.normals(guide, softplus(guide.outlier_rho))
        flat, chosen = draw.flat, draw.chosen
        if chosen is not None:
            shape = (flat.shape[0], loc.shape[0])
            loc = loc.expand(shape).index_copy(1, guide.ellipse_index, guide.centre_mu[chosen])
            scale = scale.expand(shape).index_copy(
                1, guide.ellipse_index, guide.centre_sigma()[chosen]
            )
        return dist.Normal(loc, scale, validate_args=False).log_prob(flat)

    def normal_kl_terms(self, guide, counts, prior, draw):
        return counts, normal_kl(guide.centre_mu, guide.centre_sigma(), prior)

    def _other_kl(self, guide, draw, site, prior, log_p_at, prior_at) -> torch.Tensor:
        if prior_at is not None:  # per-weight Normal prior: the same bound, weight by weight
            return self._per_weight_kl(guide, site, prior_at)
        comps = guide.plain_component[site.plain]
        if site.ellipses.stop > site.ellipses.start:
            comps = torch.cat([comps, draw.chosen[0, site.ellipses]])
        loc = guide.centre_mu.index_select(0, comps)
        scale = guide.centre_sigma().index_select(0, comps)
        # Monte Carlo at the drawn weights: log q(w | drawn component) - log p(w)
        return self._estimate(draw, self._inlier_indices(guide, site), loc, scale, prior, log_p_at)

    @staticmethod
    def _per_weight_kl(guide, site, prior_at) -> torch.Tensor:
        r""":math:`\sum_i \sum_k r_{ik}\,\mathrm{KL}(\mathcal N(m_{k,0}, m_{k,1}^2) \|
        p_i)` over a site's plain (:math:`r_{ik} = 1` for its component) and ellipse
        (:math:`r_{ik} = \alpha_{ik}`) weights, for a Normal prior :math:`p_i` per weight."""
        mu, sigma = guide.centre_mu, guide.centre_sigma()
        total = mu.new_zeros(())
        if site.plain.stop > site.plain.start:
            comps = guide.plain_component[site.plain].long()
            q = (mu.index_select(0, comps), sigma.index_select(0, comps))
            total = total + normal_kl(*q, prior_at(guide.plain_index[site.plain])).sum()
        if site.ellipses.stop > site.ellipses.start:
            comps = guide.ellipse_components[site.ellipses]  # (n, k)
            p = prior_at(guide.ellipse_index[site.ellipses])
            p = dist.Normal(p.loc.unsqueeze(1), p.scale.unsqueeze(1), validate_args=False)
            kl = normal_kl(mu[comps], sigma[comps], p)
            total = total + (guide.ellipse_alphas[site.ellipses] * kl).sum()
        return total

    def component_marginals(self, guide, nodes) -> ComponentMarginals:
        mu, sd = guide.centre_mu.detach(), guide.centre_sigma().detach()
        return ComponentMarginals(torch.zeros_like(mu)[:, None], mu[:, None], sd[:, None], "exact")


class Stochastic(Tying):
    r""":math:`(\tilde\mu_i, \tilde\sigma_i) \sim \mathcal N(m_c, S_c)` per weight
    (:math:`\tilde\sigma` kept positive), then :math:`w_i \sim \mathcal N(\tilde\mu_i,
    \tilde\sigma_i^2)`; drawn with :math:`\tilde\mu` integrated out
    (:func:`~twodg_pyro.guides.stochastic_draw.draw_stochastic`)."""

    name = "stochastic"
    trains_covariances = True

    def draw(self, guide, S, chosen, out_scale, fast):
        flat, ell, parts = draw_stochastic(guide, S, chosen, out_scale, fast)
        return SharedDraw(flat, chosen, stochastic=parts), ell

    def conditional(self, guide, draw: SharedDraw) -> Conditional:
        r"""``(c, v, sigma~)``, each ``(S, n_w)``, of ``draw``: the mean and variance of
        :math:`\tilde\mu` given :math:`t`, and :math:`\tilde\sigma`."""
        if draw.conditional is None:
            parts = draw.stochastic
            state = parts.plain
            if parts.ellipse is not None:
                state = Conditional._make(
                    full.index_copy(1, guide.ellipse_index, e)
                    for full, e in zip(state, parts.ellipse, strict=True)
                )
            draw.conditional = state
        return draw.conditional

    def log_density(self, guide, draw) -> torch.Tensor:
        r""":math:`\log\mathcal N(w_i; \tilde\mu_i, \tilde\sigma_i^2)` at :math:`\tilde\mu_i`
        drawn from :math:`\tilde\mu \mid t, w` (the draw integrated it out):
        :math:`(\tilde\mu, t, w)` has the law of the three-normal draw, so the expectation
        is :math:`\mathbb E_{(\tilde\mu, \tilde\sigma)}\mathrm{KL}(\mathcal N(\tilde\mu,
        \tilde\sigma^2) \| p)` (a Monte Carlo estimate; ``DecomposedELBO`` computes it
        exactly for a Normal prior)."""
        flat = draw.flat
        c, v, sig = self.conditional(guide, draw)
        # mu~ | t, w ~ N(c + g (w - c), g sig~^2), g = v / (v + sig~^2); exactly c where v = 0
        # (outliers): v is replaced there so that no infinite gradient of a square root at 0
        # meets a zero factor
        pos = v > 0
        v1 = torch.where(pos, v, torch.ones_like(v))
        s2 = sig * sig
        gain = v1 / (v1 + s2)
        mu = c + gain * (flat - c) + torch.sqrt(gain * s2) * torch.randn_like(c)
        mu = torch.where(pos, mu, c)
        return dist.Normal(mu, sig, validate_args=False).log_prob(flat)

    def normal_kl_terms(self, guide, counts, prior, draw):
        return counts, self.expected_kl(guide, draw, prior)  # exact, over (mu~, sigma~)

    def _other_kl(self, guide, draw, site, prior, log_p_at, prior_at) -> torch.Tensor:
        idx = self._inlier_indices(guide, site)
        loc, scale = self._loc_scale(guide, draw, idx)
        return self._estimate(draw, idx, loc, scale, prior, log_p_at)

    def _loc_scale(self, guide, draw, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(mu~, sigma~)`` of the weights ``idx`` of ``draw``, :math:`\tilde\mu` drawn
        from :math:`\tilde\mu \mid t, w \sim \mathcal N\big(c + \frac{v}{v +
        \tilde\sigma^2}(w - c),\ \frac{v\,\tilde\sigma^2}{v + \tilde\sigma^2}\big)`."""
        c, v, sig = (t[0].index_select(0, idx) for t in self.conditional(guide, draw))
        s2 = sig.square()
        w = draw.flat[0].index_select(0, idx)
        gain = v / (v + s2)
        mu = torch.addcmul(c + gain * (w - c), torch.sqrt(gain * s2), torch.randn_like(c))
        return mu, sig

    @staticmethod
    def expected_kl(guide, draw: SharedDraw, prior: dist.Normal) -> torch.Tensor:
        """Per-component expected KL to a Normal prior, computed once per draw and prior.

        Sites share the entry when their prior's parameters are the same tensors (the
        library's priors reuse them: :meth:`~twodg_pyro.priors.Prior.constant`); the key
        is their storage, not their values, so that no GPU value is read back per step.
        The entry holds the tensors, so their memory cannot be reused within the draw."""
        loc, scale = prior.loc, prior.scale
        key = (loc.data_ptr(), scale.data_ptr(), loc.dtype, loc.device)
        table = draw.expected_kl
        if key not in table:
            value = expected_normal_kl(
                guide.centres(), guide.covariances(), loc, scale, guide.coordinates
            )
            table[key] = (loc, scale, value)
        return table[key][2]

    def component_marginals(self, guide, nodes) -> ComponentMarginals:
        return stochastic_component_marginals(
            guide.centres().detach(), guide.covariances().detach(), guide.coordinates, nodes
        )


class Tied(Tying):
    r"""One draw :math:`z_k \sim \mathcal N(m_k, S_k)` per component and forward pass,
    shared by all its weights: :math:`w_i = z_{c,0}`."""

    name = "tied"
    trains_covariances = True

    def draw(self, guide, S, chosen, out_scale, fast):
        L = guide.cholesky()
        like = {"device": L.device, "dtype": L.dtype}
        z = guide.centres() + (L @ torch.randn(S, guide.n_components, 2, 1, **like)).squeeze(-1)
        z0 = z[..., 0]
        eps = torch.randn(S, guide.kinds.outliers, **like)
        w_out = torch.addcmul(guide.outlier_loc, out_scale, eps)
        table = torch.cat([z0, w_out], 1)
        flat = gather_rows(table, guide.nat_index)
        ell = z0.gather(1, chosen) if chosen is not None else None
        return SharedDraw(flat, chosen, component_values=z0), ell

    def log_density(self, guide, draw) -> torch.Tensor:
        """None: raises :class:`~twodg_pyro.guide.NoSiteDensityError`."""
        raise NoSiteDensityError(
            "train SharedGMMGuide(tying='tied') with twodg_pyro.infer.DecomposedELBO (or "
            "twodg_pyro.infer.fit), which uses the guide's own KL terms (guide.site_kl): "
            "it draws one value per component, shared by all the weights tied to it, so a "
            "site's weights have no joint density and the tying's Eq. 10 KL has one term "
            "per component, which no stock Pyro ELBO (Trace_ELBO, TraceMeanField_ELBO, ...) "
            "can express; Predictive and poutine.trace work"
        )

    @staticmethod
    def _sd(guide) -> torch.Tensor:
        r"""The sd :math:`\sqrt{S_{k,00}}` of each component's :math:`z_{k,0}`."""
        return guide.covariances()[:, 0, 0].clamp_min(1e-30).sqrt()

    def normal_kl_terms(self, guide, counts, prior, draw):
        """One term per component, shared among the sites it spans."""
        frac = counts / guide.component_counts().clamp_min(1e-12)
        return frac, normal_kl(guide.centre_mu, self._sd(guide), prior)

    def _other_kl(self, guide, draw, site, prior, log_p_at, prior_at) -> torch.Tensor:
        if prior is None:
            raise ValueError(
                f"tied tying needs a prior that is the same for every weight of site "
                f"{site.layout.name!r}; got a per-weight prior"
            )
        frac = guide.site_counts[site.position] / guide.component_counts().clamp_min(1e-12)
        sd = self._sd(guide)
        z0 = draw.component_values[0]
        log_q = dist.Normal(guide.centre_mu, sd, validate_args=False).log_prob(z0)
        return (frac * (log_q - prior.log_prob(z0))).sum()

    def component_marginals(self, guide, nodes) -> ComponentMarginals:
        sd = self._sd(guide).detach()[:, None]
        m0 = guide.centres().detach()[:, :1]
        return ComponentMarginals(torch.zeros_like(sd), m0, sd, "marginal_product")


_TYINGS: dict[str, Tying] = {t.name: t for t in (Representative(), Stochastic(), Tied())}


def tying_named(name: str) -> Tying:
    """The tying called ``name`` (:data:`TYINGS`).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in _TYINGS:
        raise ValueError(f"unknown tying {name!r}; choose one of {list(TYINGS)}")
    return _TYINGS[name]
