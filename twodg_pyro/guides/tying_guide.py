"""What a tying (:mod:`~twodg_pyro.guides.tyings`) reads from the shared-GMM guide it
draws for: :class:`TyingGuide`, which :class:`~twodg_pyro.guides.SharedGMMGuide`
satisfies.  Stated apart so that the tyings name the guide's shape without importing the
guide that imports them."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .assignment import WeightKinds

__all__ = ["TyingGuide"]


class TyingGuide(Protocol):
    """The members of :class:`~twodg_pyro.guides.SharedGMMGuide` that the tyings use: the
    components (centres ``(K, 2)`` in ``coordinates``, their Cholesky factors and
    covariances ``(K, 2, 2)``, member counts), the outliers' parameters, the weights'
    assignment tables and the guide's row gather and stochastic draw."""

    coordinates: str
    kinds: WeightKinds
    centre_mu: torch.Tensor
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

    def _gather_rows(self, table: torch.Tensor) -> torch.Tensor: ...

    def _draw_stochastic(
        self, S: int, chosen: torch.Tensor, out_scale: torch.Tensor, fast: bool
    ) -> tuple[torch.Tensor, torch.Tensor, Any]: ...
