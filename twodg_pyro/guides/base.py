"""What every BNN guide of this library offers beyond being a Pyro guide."""

from __future__ import annotations

from abc import abstractmethod

import torch
from torch import nn

from ..nn.sites import BayesianSite


def site_key(name: str) -> str:
    """A parameter-safe key for a site name (``"layers.0.weight" -> "layers__0__weight"``)."""
    return name.replace(".", "__")


class BNNGuide(nn.Module):
    """Base class of the library's guides.

    A guide is a Pyro program with one sample statement per Bayesian site of the
    model.  On top of that it offers:

    * :meth:`sample_weights` -- draws of all Bayesian tensors outside inference,
      vectorised over samples, for fast prediction;
    * :meth:`param_groups` -- its parameters split into named groups (``"loc"``,
      ``"scale"``, ...) so that each can have its own learning rate;
    * :meth:`num_trainable` -- the trainable parameter count it reports.
    """

    sites: list[BayesianSite]

    @abstractmethod
    def sample_weights(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """Draw the Bayesian tensors: shape ``site.shape`` or ``(num_samples, *site.shape)``."""

    @abstractmethod
    def param_groups(self) -> list[dict]:
        """``[{"name": group_name, "params": [...]}, ...]`` covering every parameter."""

    def num_trainable(self) -> int:
        """Number of scalar parameters the guide trains."""
        return sum(p.numel() for g in self.param_groups() for p in g["params"] if p.requires_grad)
