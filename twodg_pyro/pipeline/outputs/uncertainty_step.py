"""The uncertainty columns of a run's results: OOD detection, shift and selective
prediction for every method of the run (``[uncertainty] enabled = true``).

Each record of the results table gets, from
:func:`~twodg_pyro.uncertainty.uncertainty_report` on the method's seeded draws
(``uncertainty.draws``, default the run's ``num_samples``):

* ``mean_mi_clean`` (nats) and ``aurc`` on the evaluation examples;
* ``ood``: ``{set: {"entropy_auroc", "mi_auroc" (Bayesian methods), "maxprob_auroc",
  "aupr", "fpr95"}}`` for every built-in set of ``uncertainty.ood_sets`` (made from the
  evaluation images: :data:`~twodg_pyro.uncertainty.BUILTIN_OOD_SETS`; on the digits
  themselves ``digits_upsampled`` is left out) and every folder
  set of ``uncertainty.folder_sets`` read from ``uncertainty.folder_root``;
* ``shift``: ``{family: {severity: {"accuracy", "nll", "ece"}}}`` for every corruption
  family of ``uncertainty.corruptions`` at ``uncertainty.severities``.

OOD sets and corrupted images are made once per run (seeded with the run's seed), so
every method sees the same inputs.  ``ood_size`` and ``shift_size`` cap the examples of
each OOD set and of the corrupted subset (a seeded subset; absent: all of them).
"""

from __future__ import annotations

import torch

from ...uncertainty import builtin_ood_sets, folder_ood_set, uncertainty_report


def data_tensors(data) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)`` on the CPU of ``(X, y)`` tensors or ``(x, y)`` batches."""
    if isinstance(data, tuple):
        return data[0].cpu(), data[1].cpu()
    batches = list(data)
    return torch.cat([xb.cpu() for xb, _ in batches]), torch.cat([yb.cpu() for _, yb in batches])


def _subset(x: torch.Tensor, size: int | None, generator: torch.Generator) -> torch.Tensor:
    if size is None or size >= x.shape[0]:
        return x
    return x[torch.randperm(x.shape[0], generator=generator)[:size]]


class UncertaintySets:
    """The inputs every method of a run is evaluated on (made once, seeded)."""

    def __init__(self, split, eval_data, settings, seed: int):
        self.settings, self.seed = settings, int(seed)
        self.x, self.y = data_tensors(eval_data)
        info = getattr(split, "info", {}) or {}
        self.mean, self.std = info.get("mean"), info.get("std")
        # flat inputs (the digits MLP): 8x8 images, per-feature stats
        side = int(round(self.x.shape[-1] ** 0.5))
        self.image_shape = (1, side, side) if self.x.dim() == 2 else None
        if self.mean is None or self.std is None:
            raise ValueError(
                "uncertainty.enabled needs the data's normalisation (split.info 'mean' and "
                f"'std'); the {getattr(split, 'name', '?')!r} split has none"
            )
        g = torch.Generator().manual_seed(self.seed)
        # scikit-learn's digits are no OOD set for a model of the digits themselves
        skip = "digits_upsampled" if getattr(split, "name", "") == "digits" else None
        names = [n for n in settings.ood_sets if n != skip]
        self.ood = {
            k: _subset(v, settings.ood_size, g)
            for k, v in builtin_ood_sets(
                self.x, self.mean, self.std, self.seed, names=names, image_shape=self.image_shape
            ).items()
        }
        for name in settings.folder_sets:
            self.ood[name] = folder_ood_set(
                name,
                settings.folder_root,
                self.x.shape[1:] if self.x.dim() == 4 else (1, *self.image_shape[1:]),
                self.mean,
                self.std,
                max_examples=settings.ood_size,
                seed=self.seed,
                flatten=self.x.dim() == 2,
                dtype=self.x.dtype,
            )
        rows = _subset(torch.arange(self.x.shape[0]), settings.shift_size, g)
        self.shift_data = (self.x[rows], self.y[rows])

    def record(self, method, num_samples: int, device, return_scores: bool = False) -> dict:
        """The uncertainty fields of one trained method (a
        :class:`~twodg_pyro.methods.TrainedMethod`, by its ``num_samples`` draws seeded
        with the run's seed; with ``return_scores``, also the per-example scores of the
        clean and OOD inputs under ``"scores"``, for figures)."""

        def fn(x):
            return method.sample_probs(x.to(device), num_samples, self.seed)

        common = {
            "bayesian": method.bayesian,
            "pixel_mean": self.mean,
            "pixel_std": self.std,
            "seed": self.seed,
            "image_shape": self.image_shape,
        }
        s = self.settings
        ood = uncertainty_report(
            fn, (self.x, self.y), self.ood, None, return_scores=return_scores, **common
        )
        shift = {}
        if s.corruptions:
            shift = uncertainty_report(
                fn, self.shift_data, None, s.corruptions, severities=s.severities, **common
            )["shift"]
        out = {
            "mean_mi_clean": ood["mean_mi_clean"],
            "aurc": ood["aurc"],
            "ood": ood["ood"],
            "shift": shift,
            "uncertainty_draws": int(num_samples),
        }
        if return_scores:
            out["scores"] = ood["scores"]
        return out


def add_uncertainty(art, cfg) -> None:
    """Add the uncertainty fields (module docstring) to every record of ``art`` whose
    trained model the run kept."""
    s = cfg.uncertainty
    sets = UncertaintySets(art.split, art.eval_data, s, cfg.seed)
    draws = s.draws if s.draws is not None else cfg.num_samples
    for record in art.records:
        method = art.trained.get(record["method"])
        if method is not None:
            record.update(sets.record(method, draws, cfg.device))
