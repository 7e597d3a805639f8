r"""The mixture half of the shared-GMM guide: its components and its sharing structure.

:class:`SharedMixture` holds what the guide shares with stage 2 and the refinement
hooks: the components :math:`\mathcal N(m_k, S_k)` over the :math:`(\mu, \sigma)` (or
:math:`(\mu, \log\sigma)`) plane as parameters (centres; Cholesky factors of
:math:`S_k`, trained where the tying draws with them), the spread of each component's
member points, the inlier points moved with their components, and reading, adopting,
merging and saving the :class:`~twodg_pyro.sharing.SharingStructure`.  It is a base class
of :class:`~twodg_pyro.guides.SharedGMMGuide` (which adds the draws, KL terms and
densities) and works on that guide's attributes.
"""

from __future__ import annotations

import torch
from torch import nn

from ..files.integrity import FieldError, check_field
from ..infer.elbo import DecomposedELBO
from ..nn.functional import MIN_SIGMA, inverse_softplus, softplus
from ..sharing.refine import apply_mapping, merge_point_covariances
from ..sharing.structure import SharingStructure


def _chol_params(covs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log diag (K, 2), off-diagonal (K,))`` of the Cholesky factors of 2x2 SPD ``covs``."""
    a, b, d = covs[:, 0, 0], covs[:, 1, 0], covs[:, 1, 1]
    l00 = a.clamp_min(1e-30).sqrt()
    l10 = b / l00
    l11 = (d - l10**2).clamp_min(1e-30).sqrt()
    return torch.stack([l00.log(), l11.log()], 1), l10


def _cholesky(log_diag: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
    """``(K, 2, 2)`` lower factors from their log diagonals ``(K, 2)`` and off-diagonals."""
    d = log_diag.exp()
    zero = torch.zeros_like(off)
    return torch.stack([torch.stack([d[:, 0], zero], 1), torch.stack([off, d[:, 1]], 1)], 1)


class SharedMixture:
    """The components and sharing structure of :class:`~twodg_pyro.guides.SharedGMMGuide`
    (see the module docstring): with the guide's ``tying``, the
    :class:`~twodg_pyro.guide.SharingGuide` extension of the guide protocol."""

    def _set_outliers(self, s: SharingStructure, device, dtype) -> None:
        loc, scale = (
            t.detach().to(device=device, dtype=dtype) for t in (s.outlier_loc, s.outlier_scale)
        )
        self.outlier_loc = nn.Parameter(loc.clone())
        self.outlier_rho = nn.Parameter(inverse_softplus(scale))

    def _set_components(
        self, means: torch.Tensor, covs: torch.Tensor, point_covs: torch.Tensor | None = None
    ) -> None:
        like = self.outlier_loc  # the guide's device and dtype
        point_covs = covs if point_covs is None else point_covs
        means, covs, point_covs = (t.detach().to(like) for t in (means, covs, point_covs))
        # the spread of each component's member points, which the Mahalanobis check
        # measures them against (see point_covariances)
        self.register_buffer("point_covs", point_covs.clone())
        m1 = means[:, 1]
        raw = inverse_softplus(m1.clamp_min(MIN_SIGMA)) if self.coordinates == "sigma" else m1
        self.centre_mu = nn.Parameter(means[:, 0].clone())
        self.centre_raw = nn.Parameter(raw.clone())
        # the centres the inlier points were last synchronised with (see current_points)
        self.register_buffer("anchor_centres", means.clone())
        log_diag, off = _chol_params(covs)
        trainable = self.tying_rule.trains_covariances
        for name, value in (("chol_log_diag", log_diag), ("chol_off", off)):
            self._parameters.pop(name, None)
            self._buffers.pop(name, None)
            if trainable:
                setattr(self, name, nn.Parameter(value.clone()))
            else:
                self.register_buffer(name, value.clone())

    @property
    def n_components(self) -> int:
        return int(self.centre_mu.shape[0])

    def centre_sigma(self) -> torch.Tensor:
        r""":math:`\sigma` of each centre (``softplus`` or ``exp`` of its raw parameter)."""
        if self.coordinates == "sigma":
            return softplus(self.centre_raw).clamp_min(MIN_SIGMA)
        return self.centre_raw.exp()

    def centres(self) -> torch.Tensor:
        """Component means :math:`m_k` in the mixture's coordinates, ``(K, 2)``."""
        m1 = softplus(self.centre_raw) if self.coordinates == "sigma" else self.centre_raw
        return torch.stack([self.centre_mu, m1], 1)

    def cholesky(self) -> torch.Tensor:
        """Lower Cholesky factors :math:`L_k` of :math:`S_k`, ``(K, 2, 2)``."""
        return _cholesky(self.chol_log_diag, self.chol_off)

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

    @property
    def pruning(self) -> dict:
        """What :func:`~twodg_pyro.sharing.prune.prune_structure` did to the structure
        (``snr``, ``spread``, ``n`` weights, ``components``), or ``{}``."""
        return dict(self._info.get("pruned", {}))

    @property
    def n_pinned(self) -> int:
        """The last components, added by pruning, that the refinement hooks leave as they
        are and :class:`~twodg_pyro.sharing.PinPruned` holds at zero mean."""
        return int(self.pruning.get("components", 0))

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
                outlier_scale=softplus(self.outlier_rho).cpu(),
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

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # files written before 0.1.0's memory diet carry an unused weight-sized buffer
        state_dict.pop(prefix + "inverse_order", None)
        # files written before the points' spread was kept apart: the saved covariances
        if prefix + "point_covs" not in state_dict and prefix + "chol_log_diag" in state_dict:
            L = _cholesky(state_dict[prefix + "chol_log_diag"], state_dict[prefix + "chol_off"])
            state_dict[prefix + "point_covs"] = L @ L.transpose(-1, -2)
        # files written before the points followed their components: the points are where
        # they were, relative to the saved centres
        if prefix + "anchor_centres" not in state_dict and prefix + "centre_mu" in state_dict:
            raw = state_dict[prefix + "centre_raw"]
            m1 = softplus(raw) if self.coordinates == "sigma" else raw
            state_dict[prefix + "anchor_centres"] = torch.stack(
                [state_dict[prefix + "centre_mu"], m1], 1
            )
        # the index tables are those of the structure the guide was built from (a file's
        # structure/ section, a checkpoint's structure): a state that says otherwise
        # would draw with one and report the other
        for name in self._tables:
            saved, mine = state_dict.get(prefix + name), getattr(self, name)
            if torch.is_tensor(saved) and not (
                saved.shape == mine.shape
                and torch.allclose(saved.to(mine), mine, rtol=1e-5, atol=1e-8, equal_nan=False)
            ):
                raise FieldError(
                    f"guide/{prefix}{name} differs from the sharing structure the guide was "
                    "built from (structure/)"
                )
        n_errors = len(args[-1])  # error_msgs
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if len(args[-1]) == n_errors:
            self.check_values()

    def check_values(self) -> None:
        """Refuse values out of range: every floating-point parameter and buffer
        (:func:`~twodg_pyro.files.integrity.check_field`: finite, bounded), and the
        :meth:`structure` they give (its
        :meth:`~twodg_pyro.sharing.SharingStructure.check_values`: centres, covariances,
        outlier scales, blending weights); run on every loaded state (a model file's, a
        checkpoint's) and by the compact loader.

        Raises:
            FieldError: (a ``ValueError``) naming the field and the value.
        """
        for name, t in self.state_dict().items():
            if t.is_floating_point():
                check_field(f"guide/{name}", t)
        self.structure().check_values("guide ")

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
            self._set_outliers(structure, self.outlier_loc.device, self.outlier_loc.dtype)
        if components:
            self._set_components(structure.means, structure.covariances, point_covariances)
        elif structure.n_gaussians != self.n_components:
            raise ValueError("components=False needs the same number of components")
        else:  # the structure's points are current: they ride from the centres as they are
            self.anchor_centres = self.centres().detach().clone()
        self._set_assignments(structure)
        self._info = dict(structure.info)  # e.g. how many weights a pruning ramp has tied
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
