"""Per-draw class probabilities ``(S, N, C)`` of any baseline on arbitrary inputs: the
ensemble's members, the Laplace approximation's seeded draws, or a plain network as one
draw (``S = 1``)."""

from __future__ import annotations

import torch
from torch import nn

from ..prediction import deterministic_predict

__all__ = ["draw_probs"]


def draw_probs(obj, x, num_samples: int = 30, seed: int = 0) -> torch.Tensor:
    """Per-draw class probabilities ``(S, N, C)`` of ``obj`` on inputs ``x`` (a tensor, a
    pair ``(X, y)`` or batches), on the CPU.

    * an :class:`~twodg_pyro.baselines.Ensemble`: its ``M`` members (``S = M``;
      ``num_samples`` and ``seed`` are ignored);
    * a :class:`~twodg_pyro.baselines.LaplacePosterior`: ``num_samples`` draws seeded
      with ``seed``;
    * a plain ``nn.Module`` (a deterministic network): its softmax, ``S = 1``.

    Raises:
        TypeError: another kind of object.
    """
    if hasattr(obj, "sample_probs"):
        return obj.sample_probs(x, num_samples=num_samples, seed=seed)
    if isinstance(obj, nn.Module):
        return deterministic_predict(obj, x).mean.unsqueeze(0)
    raise TypeError(
        f"draw_probs takes an Ensemble, a LaplacePosterior or a network, got {type(obj).__name__}"
    )
