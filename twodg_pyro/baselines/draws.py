"""Per-draw class probabilities ``(S, N, C)`` of any baseline on arbitrary inputs: the
ensemble's members, the Laplace approximation's seeded draws, or a plain network as one
draw (``S = 1``)."""

from __future__ import annotations

import torch
from torch import nn

from ..prediction import Prediction, _batches, _targets, deterministic_predict


def prediction_draws(model, num_samples: int) -> int:
    """Network evaluations per example of one prediction of a baseline ``model`` asked
    for ``num_samples`` draws: its :meth:`DrawBaseline.draws_per_prediction`, or one
    forward pass for a network."""
    if isinstance(model, DrawBaseline):
        return model.draws_per_prediction(num_samples)
    return 1


class DrawBaseline(nn.Module):
    """A baseline predicting by the average of its draws' class probabilities (an
    :class:`~twodg_pyro.baselines.Ensemble`'s members, a
    :class:`~twodg_pyro.baselines.LaplacePosterior`'s seeded draws); a subclass gives
    ``_draws(batches, num_samples, seed)``, the ``(S, N, C)`` probabilities on the CPU."""

    def draws_per_prediction(self, num_samples: int) -> int:
        """Draws (network evaluations per example) of one prediction asked for
        ``num_samples`` draws: ``num_samples`` here; a subclass whose draws are fixed
        (an ensemble's members, an MCMC posterior's kept draws) gives its own."""
        return int(num_samples)

    @torch.no_grad()
    def sample_probs(
        self, x, num_samples: int | None = 30, seed: int | None = 0, batch_size: int = 512
    ) -> torch.Tensor:
        """Per-draw class probabilities ``(S, N, C)`` on inputs ``x`` (a tensor, a pair
        ``(X, y)`` or batches), on the CPU: ``num_samples`` draws seeded with ``seed`` (the
        same draws for every batch and batching; an ensemble ignores both: its draws are
        its ``M`` members, nothing is random)."""
        self.eval()
        return self._draws(_batches(x, int(batch_size)), num_samples, seed)

    @torch.no_grad()
    def predict(
        self,
        data,
        num_samples: int | None = 30,
        seed: int | None = 0,
        batch_size: int = 512,
        keep_samples: bool = False,
    ) -> Prediction:
        """The average of :meth:`sample_probs` on ``data`` (inputs, ``(X, y)`` or batches):
        a :class:`~twodg_pyro.prediction.Prediction` (``samples``: the per-draw
        probabilities when ``keep_samples``)."""
        self.eval()
        parts = _batches(data, int(batch_size))
        probs = self._draws(parts, num_samples, seed)
        return Prediction(
            mean=probs.mean(0), targets=_targets(parts), samples=probs if keep_samples else None
        )


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
