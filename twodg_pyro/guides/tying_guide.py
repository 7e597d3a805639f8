"""What a tying (:mod:`~twodg_pyro.guides.tyings`) reads from the shared-GMM guide it
draws for: :class:`TyingGuide`, which :class:`~twodg_pyro.guides.SharedGMMGuide`
satisfies.  Stated apart so that the tyings name the guide's shape without importing the
guide that imports them."""

from __future__ import annotations

from typing import Protocol

import torch

from .assignment import WeightKinds

__all__ = ["TyingGuide"]


class TyingGuide(Protocol):
    """The public members of :class:`~twodg_pyro.guides.SharedGMMGuide` that the tyings
    use: the components (centres ``(K, 2)`` in ``coordinates``, the parameters of their
    Cholesky factors, the factors and covariances ``(K, 2, 2)``, member counts), the
    outliers' parameters and the weights' assignment tables
    (:mod:`~twodg_pyro.guides.assignment`)."""

    coordinates: str
    kinds: WeightKinds
    centre_mu: torch.Tensor
    chol_log_diag: torch.Tensor
    chol_off: torch.Tensor
    outlier_loc: torch.Tensor
    outlier_rho: torch.Tensor
    plain_index: torch.Tensor
    plain_component: torch.Tensor
    ellipse_index: torch.Tensor
    ellipse_components: torch.Tensor
    ellipse_alphas: torch.Tensor
    nat_index: torch.Tensor
    site_counts: torch.Tensor

    @property
    def n_components(self) -> int: ...

    def centre_sigma(self) -> torch.Tensor: ...

    def centres(self) -> torch.Tensor: ...

    def cholesky(self) -> torch.Tensor: ...

    def covariances(self) -> torch.Tensor: ...

    def component_counts(self) -> torch.Tensor: ...
