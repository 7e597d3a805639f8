r"""Sparse Subspace Variational Inference (Li et al., 2024) as a guide over a ``BNNModel``.

**Posterior.**  Each Bayesian tensor keeps a fixed number of *active* coordinates
:math:`\Gamma` (``density`` of its size, at least one); the rest are exactly zero:

.. math::
    q_\Gamma(\theta) = \prod_{i \in \Gamma} \mathcal N(\theta_i \mid \mu_i, \sigma_i^2)
        \prod_{i \notin \Gamma} \delta_0(\theta_i),
    \qquad \sigma_i = \operatorname{softplus}(\rho_i).

Only the active flat indices and their :math:`(\mu_i, \rho_i)` are stored, so the guide
trains :math:`2 s` scalars, :math:`s = \sum_\text{sites} |\Gamma_\text{site}|`; every
sampled weight is dense with exact zeros outside :math:`\Gamma`.

**KL.**  As in the paper, the prior is restricted to the same subspace,
:math:`p_\Gamma(\theta) = \prod_{i\in\Gamma} p(\theta_i) \prod_{i\notin\Gamma}\delta_0(\theta_i)`,
so the inactive point masses cancel and

.. math::
    \mathrm{KL}(q_\Gamma \,\|\, p_\Gamma)
        = \sum_{i \in \Gamma} \mathrm{KL}\big(\mathcal N(\mu_i, \sigma_i^2) \,\|\, p(\theta_i)\big),

in closed form for a Normal prior and by the one-sample estimate
:math:`\log q(\theta_i) - \log p(\theta_i)` otherwise (:meth:`SSVIGuide.site_kl`, used by
:class:`~twodg_pyro.infer.DecomposedELBO`).  Stock Pyro ELBOs get the same bound: each
weight site's ``log_prob`` is :meth:`SSVIGuide.site_log_density`, whose point masses are
measured against the prior as above.

**Subspace updates** (:class:`~twodg_pyro.guides.ssvi_subspace.SubspaceUpdate`, a
training-loop callback, and its removal scores) are in :mod:`twodg_pyro.guides.ssvi_subspace`.

Local reparameterisation does not apply here: the sites of a ``BNNModel`` are whole
weight tensors, sampled as such.
"""

from __future__ import annotations

from functools import partial

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.kl import kl_divergence
from torch import nn

from ..bnn import BNNModel, require_model
from ..guide import BNNGuide, GuideSample
from ..nn.functional import inverse_softplus
from ..nn.sites import BayesianSite
from .base import GuideDraw, LocScaleParameters, particle_batch_shape, site_key
from .mean_field import check_init_scale, initial_means, paper_initial_scales


def _check_density(density) -> float:
    if isinstance(density, bool) or not isinstance(density, (int, float)):
        raise ValueError(f"density must be a number in (0, 1], got {density!r}")
    density = float(density)
    if not (0.0 < density <= 1.0):
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    return density


def _unwrap(d: dist.Distribution) -> dist.Distribution:
    """The per-coordinate distribution under ``Independent`` wrappers."""
    while isinstance(d, torch.distributions.Independent):
        d = d.base_dist
    return d


class SSVIGuide(LocScaleParameters, BNNGuide):
    r"""Mean-field Normal over a sparse subspace of every site of a ``BNNModel``.

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel`.
        density: fraction of each site's coordinates that are active, in (0, 1]
            (``round(density * numel)``, at least 1).
        init_scale: ``"paper"`` (the mean-field guide's initial :math:`\sigma`) or a
            positive float; also used for coordinates added later.
        init_loc: initial means ``{site: tensor}`` (default: the network's values).
        seed: seed of the random initial subspace and scales.

    Raises:
        ValueError: density outside (0, 1], or a bad ``init_scale``.

    Example::

        guide = SSVIGuide(model, density=0.1)   # a mean-field posterior on 10 % of each site
        update = SubspaceUpdate(loader, update_every=5)
        fit(model, guide, loader, epochs=40, callbacks=[update])
        guide.num_active   # the coordinates in the subspace
    """

    method = "ssvi"

    def __init__(
        self,
        model: BNNModel,
        density: float = 0.1,
        init_scale: str | float = "paper",
        init_loc: dict[str, torch.Tensor] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        require_model(model, type(self).__name__, ("sites", "site_parameter"))
        self.density = _check_density(density)
        check_init_scale(init_scale)
        self.init_scale = init_scale
        self.sites = list(model.sites)
        # the model's prior, for the density that stock Pyro ELBOs read (site_log_density)
        self._prior = model.prior
        self._generator = torch.Generator().manual_seed(int(seed))
        self.locs, self.rhos = nn.ParameterDict(), nn.ParameterDict()
        for site, full_loc in zip(self.sites, initial_means(model, init_loc), strict=True):
            key = site_key(site.name)
            k = min(site.numel, max(1, int(round(self.density * site.numel))))
            idx = torch.randperm(site.numel, generator=self._generator)[:k].sort().values
            device = full_loc.device
            self.register_buffer(f"index__{key}", idx.to(device))
            self.locs[key] = nn.Parameter(full_loc.reshape(-1)[idx.to(device)].clone())
            scales = self._initial_scales(site, idx).to(full_loc.dtype)
            self.rhos[key] = nn.Parameter(inverse_softplus(scales).to(device))

    def _initial_scales(self, site: BayesianSite, idx: torch.Tensor) -> torch.Tensor:
        if self.init_scale == "paper":
            return paper_initial_scales(site, self._generator).reshape(-1)[idx.cpu()]
        return torch.full((len(idx),), float(self.init_scale))

    def active_indices(self, name: str) -> torch.Tensor:
        """Flat indices (into ``site.shape``) of the active coordinates of a site."""
        return getattr(self, f"index__{site_key(name)}")

    def active_counts(self) -> dict[str, int]:
        """``{site: |Gamma_site|}``; fixed for the life of the guide."""
        return {s.name: len(self.active_indices(s.name)) for s in self.sites}

    @property
    def num_active(self) -> int:
        """:math:`s`, the number of active coordinates over all sites."""
        return sum(self.active_counts().values())

    def active_mask(self, name: str) -> torch.Tensor:
        """Boolean tensor of the site's shape, ``True`` on active coordinates."""
        site = self.site(name)
        idx = self.active_indices(name)
        mask = torch.zeros(site.numel, dtype=torch.bool, device=idx.device)
        mask[idx] = True
        return mask.reshape(site.shape)

    def active_distribution(self, name: str) -> dist.Normal:
        r""":math:`\prod_{i \in \Gamma} \mathcal N(\mu_i, \sigma_i^2)` of a site's active
        coordinates, batch shape ``(|Gamma|,)``: the guide's one definition of its family,
        which its program, :meth:`draw`, :meth:`site_kl` and densities use."""
        return dist.Normal(self.loc(name), self.scale(name), validate_args=False)

    def densify(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """Scatter active values ``(..., |Gamma|)`` into zeros of shape ``(..., *site.shape)``."""
        site = self.site(name)
        idx = self.active_indices(name)
        batch = values.shape[:-1]
        dense = values.new_zeros(*batch, site.numel).index_copy(-1, idx, values)
        return dense.reshape(*batch, *site.shape)

    def mean_weights(self) -> dict[str, torch.Tensor]:
        r"""The posterior means as dense tensors (:math:`\mu` on :math:`\Gamma`, 0 elsewhere)."""
        return {s.name: self.densify(s.name, self.loc(s.name).detach()) for s in self.sites}

    @torch.no_grad()
    def move(self, name: str, remove: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
        r"""Swap coordinates of a site's subspace.

        Args:
            name: the site.
            remove: positions (into the active list) of coordinates leaving :math:`\Gamma`.
            add: flat indices of inactive coordinates joining it, as many as ``remove``.

        The new active list is the kept coordinates (in their order) followed by the
        added ones, which start at :math:`\mu = 0` and the initial :math:`\sigma`.
        New parameter tensors replace the old ones (rebuild the optimiser).

        Returns:
            the positions of the kept coordinates in the old active list.
        """
        key = site_key(name)
        idx = self.active_indices(name)
        remove = torch.as_tensor(remove, dtype=torch.long, device=idx.device).unique()
        add = torch.as_tensor(add, dtype=torch.long, device=idx.device)
        if len(add) != len(remove):
            raise ValueError(
                f"site {name!r}: {len(remove)} coordinates removed but {len(add)} added; "
                "the subspace size must stay fixed"
            )
        if len(add) and (
            add.unique().numel() != len(add) or self.active_mask(name).reshape(-1)[add].any()
        ):
            raise ValueError(f"site {name!r}: added indices must be distinct and inactive")
        keep = torch.ones(len(idx), dtype=torch.bool, device=idx.device)
        keep[remove] = False
        kept_pos = keep.nonzero().squeeze(1)
        site = self.site(name)
        old_loc, old_rho = self.locs[key], self.rhos[key]
        new_loc = torch.cat([old_loc[kept_pos], old_loc.new_zeros(len(add))])
        added_rho = inverse_softplus(self._initial_scales(site, add).to(old_rho.dtype))
        new_rho = torch.cat([old_rho[kept_pos], added_rho.to(old_rho)])
        setattr(self, f"index__{key}", torch.cat([idx[kept_pos], add]))
        self.locs[key] = nn.Parameter(new_loc)
        self.rhos[key] = nn.Parameter(new_rho)
        return kept_pos

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        r"""The guide as a Pyro program: a dense draw per site, exactly zero off
        :math:`\Gamma`, as a :class:`~twodg_pyro.guides.base.GuideDraw` whose ``log_prob``
        is :meth:`site_log_density` (one draw per entry of enclosing vectorised plates)."""
        self._param_statements()
        batch = particle_batch_shape()
        out = {}
        for site in self.sites:
            active = self.active_distribution(site.name).rsample(batch)
            density = partial(self.site_log_density, site.name, active)
            out[site.name] = pyro.sample(
                site.name, GuideDraw(self.densify(site.name, active), density, len(site.shape))
            )
        return out

    def site_log_density(self, name: str, active: torch.Tensor) -> torch.Tensor:
        r"""The site's guide density for stock Pyro ELBOs at the active values ``active``
        ``(..., |Gamma|)``: :math:`\sum_{i \in \Gamma} \log \mathcal N(\theta_i \mid \mu_i,
        \sigma_i^2) + \sum_{i \notin \Gamma} \log p(\theta_i = 0)`, the point masses
        measured against the subspace-restricted prior (module docstring): the full prior
        of a stock ELBO's :math:`\log q - \log p` gives the inactive coordinates (exactly 0)
        :math:`\log p(0)`, which cancels, leaving the integrand of :meth:`site_kl`."""
        site = self.site(name)
        log_q = self.active_distribution(name).log_prob(active).sum(-1)
        prior = _unwrap(self._prior(site, self.loc(name)))
        zero = self.loc(name).new_zeros(site.shape)
        log_p0 = prior.log_prob(zero).expand(site.shape).reshape(-1)
        inactive = ~self.active_mask(name).reshape(-1)
        return log_q + log_p0[inactive].sum()

    def site_kl(
        self, name: str, prior_fn, value: torch.Tensor, guide_fn=None
    ) -> dict[str, torch.Tensor]:
        r"""``{"kl": sum_{i in Gamma} KL(N(mu_i, sigma_i^2) || p(theta_i))}``: the inactive
        point masses match the subspace-restricted prior and cost nothing."""
        idx = self.active_indices(name)
        site = self.site(name)
        q = self.active_distribution(name)
        base = _unwrap(prior_fn)
        if isinstance(base, torch.distributions.Normal):
            p = dist.Normal(
                base.loc.expand(site.shape).reshape(-1)[idx],
                base.scale.expand(site.shape).reshape(-1)[idx],
                validate_args=False,
            )
            return {"kl": kl_divergence(q, p).sum()}
        active = value.reshape(-1)[idx]
        log_p = base.log_prob(value).expand(site.shape).reshape(-1)[idx]
        return {"kl": (q.log_prob(active) - log_p).sum()}

    def draw(self, num_samples: int | None = None) -> GuideSample:
        """Dense draws, exactly zero outside the subspace: ``site.shape`` or ``(S, *shape)``."""
        lead = () if num_samples is None else (num_samples,)
        return GuideSample(
            {
                s.name: self.densify(s.name, self.active_distribution(s.name).rsample(lead))
                for s in self.sites
            }
        )

    def _coordinates(self, name: str, flat: torch.Tensor) -> torch.Tensor:
        return flat[:, self.active_indices(name)]

    def site_parameters(self, name: str) -> dict[str, torch.Tensor]:
        """``loc`` and ``scale`` (0 off the subspace) and the ``active`` mask of a site."""
        return {
            "loc": self.densify(name, self.loc(name).detach()),
            "scale": self.densify(name, self.scale(name).detach()),
            "active": self.active_mask(name),
        }
