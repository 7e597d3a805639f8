"""The training loop's callback protocol and a few general callbacks.

A callback sees the whole :class:`~twodg_pyro.infer.state.TrainState` at four
moments; :meth:`Callback.on_epoch_end` may stop training by returning ``True`` (or
setting ``state.stop``).  The guide-refinement hooks of stage 3 (merging,
Mahalanobis reassignment: :mod:`twodg_pyro.sharing.hooks`), SSVI's subspace updates and
the checkpoint writer (:mod:`twodg_pyro.infer.checkpoint`) are callbacks too.
"""

from __future__ import annotations

import math

import torch

from .state import TrainState


class Callback:
    """Base class: override any of the four methods."""

    def on_train_begin(self, state: TrainState) -> None:
        """Called once before the first epoch (also when resuming)."""

    def on_epoch_begin(self, state: TrainState) -> None:
        """Called before each epoch."""

    def on_epoch_end(self, state: TrainState) -> bool | None:
        """Called after each epoch with ``state.history[-1]`` filled; ``True`` stops."""

    def on_train_end(self, state: TrainState) -> None:
        """Called once after the last epoch."""

    def state_dict(self) -> dict:
        """Whatever the callback needs to resume (JSON-serialisable)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`."""

    def last_checkpoint(self) -> str | None:
        """Where the last checkpoint this callback wrote is (for error messages), or
        ``None`` for a callback that writes none."""
        return None


class KLAnnealing(Callback):
    r"""Linear KL annealing: :math:`\beta_e = \beta_0 + (\beta_1 - \beta_0) \min(1, e / E_w)`.

    Sets ``state.elbo.beta`` at the start of each epoch ``e``; after ``warmup_epochs``
    epochs the true ELBO (:math:`\beta_1 = 1`) is optimised.
    """

    def __init__(self, warmup_epochs: int, start: float = 0.0, end: float = 1.0):
        if int(warmup_epochs) < 0:
            raise ValueError(f"warmup_epochs must be >= 0, got {warmup_epochs!r}")
        for what, v in (("start", start), ("end", end)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(
                    f"KLAnnealing {what} must be a finite non-negative number, got {v!r}"
                )
        self.warmup_epochs, self.start, self.end = int(warmup_epochs), float(start), float(end)

    def beta(self, epoch: int) -> float:
        """The KL weight of (0-based) epoch ``epoch``."""
        if self.warmup_epochs == 0:
            return self.end
        frac = min(1.0, epoch / self.warmup_epochs)
        return self.start + (self.end - self.start) * frac

    def on_epoch_begin(self, state: TrainState) -> None:
        state.elbo.beta = self.beta(state.epoch)


class EarlyStopping(Callback):
    """Stops when the mean loss has not improved by ``min_delta`` for ``patience`` epochs."""

    def __init__(self, patience: int = 10, min_delta: float = 0.0, key: str = "loss"):
        if int(patience) < 1:
            raise ValueError(f"patience must be at least 1, got {patience!r}")
        self.patience, self.min_delta, self.key = int(patience), float(min_delta), key
        self.best, self.bad_epochs = math.inf, 0

    def on_epoch_end(self, state: TrainState) -> bool:
        value = state.history[-1][self.key]
        if value < self.best - self.min_delta:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad_epochs = float(state["best"]), int(state["bad_epochs"])


def scale_summary(mu: torch.Tensor, sigma: torch.Tensor) -> dict[str, float]:
    r"""``sigma_median`` (:math:`\operatorname{median}_i \sigma_i`) and
    ``sigma_over_spread`` (that median over :math:`\operatorname{sd}(\mu)`, the
    spread of the means): how large a posterior's scales are beside its weights."""
    median = sigma.median()
    return {
        "sigma_median": float(median),
        "sigma_over_spread": float(median / mu.std().clamp_min(1e-30)),
    }


class ScaleTrajectory(Callback):
    r"""Adds the posterior scales' trajectory to every epoch's record, so that a fit can
    be judged converged by its scales as well as by its ELBO.

    For a guide with ``means_and_scales()`` (the mean-field guide:
    :math:`(\mu_i, \sigma_i)` of every weight) each epoch's record gets

    * ``sigma_median``: :math:`\operatorname{median}_i \sigma_i`;
    * ``sigma_ratio_p10``, ``sigma_ratio_median``, ``sigma_ratio_p90``: percentiles of
      :math:`\sigma_i / \sigma_i^{(0)}` (the scale over its value before training); a
      fit whose every ratio sits at the same value was stopped by the optimiser's step
      size (Adam moves a log-scale by about its learning rate per step), not by the ELBO;
    * ``sigma_over_spread``: :math:`\operatorname{median}_i \sigma_i / \operatorname{sd}(\mu)`,
      the scales relative to the spread of the means;
    * ``sigma_median_by_site`` (a guide with per-site ``sites`` and ``scale(name)``): each
      site's median scale, since a small layer can drift while the median of all weights
      stands still (a 1-32-32-1 MLP's first layer, 32 of its 1,153 weights, grew its
      scales three-fold over tens of thousands of epochs that moved that median < 1 %).

    A guide without ``means_and_scales`` is left alone.  The initial scales are part of
    the callback's state, so a resumed fit reports the same ratios.
    """

    def __init__(self, guide):
        self.guide = guide
        self._initial: torch.Tensor | None = None

    def _scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        fn = getattr(self.guide, "means_and_scales", None)
        if fn is None:
            return None
        mu, sigma = fn()
        return mu.detach().float().cpu(), sigma.detach().float().cpu()

    def on_train_begin(self, state: TrainState) -> None:
        if self._initial is None:
            got = self._scales()
            self._initial = None if got is None else got[1].clamp_min(1e-30)

    def state_dict(self) -> dict:
        return {} if self._initial is None else {"initial": self._initial.clone()}

    def load_state_dict(self, state: dict) -> None:
        if "initial" in state:
            self._initial = torch.as_tensor(state["initial"]).float()

    def on_epoch_end(self, state: TrainState) -> None:
        got = self._scales()
        if got is None or self._initial is None:
            return
        mu, sigma = got
        ratio = sigma / self._initial
        q = torch.quantile(_subsample(ratio), torch.tensor([0.1, 0.5, 0.9])).tolist()
        summary = scale_summary(mu, sigma)
        names = ("sigma_ratio_p10", "sigma_ratio_median", "sigma_ratio_p90")
        state.history[-1].update(
            sigma_median=summary["sigma_median"],
            **dict(zip(names, q, strict=True)),
            sigma_over_spread=summary["sigma_over_spread"],
        )
        by_site = site_median_scales(self.guide)
        if by_site is not None:
            state.history[-1]["sigma_median_by_site"] = by_site


def site_median_scales(guide) -> dict[str, float] | None:
    """Each site's median posterior scale, for a guide with per-site ``sites`` and
    ``scale(name)`` (the mean-field guide); ``None`` for any other."""
    sites, scale = getattr(guide, "sites", None), getattr(guide, "scale", None)
    if sites is None or scale is None:
        return None
    with torch.no_grad():
        return {s.name: float(scale(s.name).median()) for s in sites}


def _subsample(x: torch.Tensor, limit: int = 1_000_000) -> torch.Tensor:
    """At most ``limit`` evenly spaced entries of ``x`` (``torch.quantile``'s size limit)."""
    return x if x.numel() <= limit else x[:: -(-x.numel() // limit)]
