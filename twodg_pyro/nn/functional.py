"""Small tensor functions shared by the guides, the baselines and the file readers."""

from __future__ import annotations

import torch

#: the smallest sigma of the library: a guide's scale, a component centre's, a drawn
#: weight's, and the smallest ``x`` whose inverse softplus is taken (below it, ``expm1``
#: underflows)
MIN_SIGMA = 1e-8


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\rho = \log(e^{\sigma} - 1)`, stable for small and large ``x``."""
    return torch.where(x > 20.0, x, torch.log(torch.expm1(x.clamp_min(MIN_SIGMA))))
