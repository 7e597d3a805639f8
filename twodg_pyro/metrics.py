r"""Predictive metrics of the Bayesian model average.

Classification, with :math:`\bar p_n = \frac1S \sum_s p(y \mid x_n, w^{(s)})`:

* accuracy: :math:`\frac1N \sum_n [\arg\max \bar p_n = y_n]`;
* NLL: :math:`-\frac1N \sum_n \log \bar p_{n, y_n}`;
* ECE (15 equal-width confidence bins):
  :math:`\sum_b \frac{|B_b|}{N} |\mathrm{acc}(B_b) - \mathrm{conf}(B_b)|`;
* Brier: :math:`\frac1N \sum_n \sum_c (\bar p_{n,c} - [y_n = c])^2`.

Regression (:func:`regression_metrics`), with the predictive mean :math:`\bar\mu_n` and
standard deviation :math:`\sigma_n` (noise included,
:class:`~twodg_pyro.prediction.Prediction`):

* RMSE: :math:`\sqrt{\frac1N \sum_n (y_n - \bar\mu_n)^2}`;
* Gaussian NLL of the moment-matched predictive :math:`\mathcal N(\bar\mu_n, \sigma_n^2)`:
  :math:`\frac1N \sum_n \big(\tfrac12 \log 2\pi\sigma_n^2 + \frac{(y_n -
  \bar\mu_n)^2}{2\sigma_n^2}\big)`;
* coverage of the central :math:`p` interval :math:`\bar\mu_n \pm z_{(1+p)/2}\,\sigma_n`:
  the fraction of targets inside it (calibrated: :math:`p`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

_EPS = 1e-12


def check_labels(labels: torch.Tensor, n_classes: int | None = None, what: str = "class") -> None:
    """Raise ``ValueError`` naming the first bad label (``what``: whose, e.g. ``"train"``):
    labels that are not integers (their dtype), or a label outside ``[0, n_classes)`` (its
    value, position and the number of bad labels); with ``n_classes=None`` only negative
    labels are out of range."""
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"{what} labels must be integers, got dtype {labels.dtype}")
    bad = labels < 0 if n_classes is None else (labels < 0) | (labels >= int(n_classes))
    if bool(bad.any()):
        flat = bad.reshape(-1)
        first = int(flat.nonzero()[0, 0])
        span = "[0, ...)" if n_classes is None else f"[0, {int(n_classes)})"
        raise ValueError(
            f"{what} label {int(labels.reshape(-1)[first])} at example {first} is out of range "
            f"{span} ({int(flat.sum())} bad label(s))"
        )


def _check(probs: torch.Tensor, labels: torch.Tensor) -> None:
    if probs.dim() != 2 or labels.dim() != 1 or probs.shape[0] != labels.shape[0]:
        raise ValueError(
            f"expected probs (N, C) and labels (N,), got {tuple(probs.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if probs.shape[0] == 0:
        raise ValueError("cannot compute metrics on an empty set (N = 0)")
    check_labels(labels, probs.shape[1])


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of examples whose most probable class is the label."""
    _check(probs, labels)
    return (probs.argmax(-1) == labels).float().mean().item()


def nll(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean negative log predictive probability of the label."""
    _check(probs, labels)
    p = probs.gather(1, labels[:, None]).squeeze(1)
    return (-(p.clamp_min(_EPS)).log()).mean().item()


def reliability_bins(
    probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15
) -> dict[str, torch.Tensor]:
    """Per-bin count, mean confidence and accuracy over equal-width bins of (0, 1]."""
    _check(probs, labels)
    if int(n_bins) < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins!r}")
    conf, pred = probs.max(-1)
    correct = (pred == labels).to(conf.dtype)
    # bin b holds confidences in (b/n, (b+1)/n]
    idx = (torch.ceil(conf * n_bins).long() - 1).clamp(0, n_bins - 1)
    count = torch.bincount(idx, minlength=n_bins).to(conf.dtype)
    conf_sum = torch.bincount(idx, weights=conf, minlength=n_bins)
    acc_sum = torch.bincount(idx, weights=correct, minlength=n_bins)
    safe = count.clamp_min(1)
    return {"count": count, "confidence": conf_sum / safe, "accuracy": acc_sum / safe}


def ece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error with ``n_bins`` equal-width bins (paper: 15)."""
    bins = reliability_bins(probs, labels, n_bins)
    weight = bins["count"] / bins["count"].sum()
    return (weight * (bins["accuracy"] - bins["confidence"]).abs()).sum().item()


def brier(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Multi-class Brier score (sum over classes, mean over examples)."""
    _check(probs, labels)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)
    return ((probs - onehot) ** 2).sum(-1).mean().item()


def classification_metrics(
    probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15
) -> dict[str, float]:
    """``{"accuracy", "nll", "ece", "brier"}`` of predictive probabilities.

    Raises:
        ValueError: shapes that do not pair, no examples, or labels that are not integers
            in ``[0, C)`` (:func:`check_labels`).
    """
    check_labels(labels)
    probs, labels = probs.detach().cpu(), labels.detach().long().cpu()
    if probs.dtype != torch.float64:  # float64 stays (a float64 network's), else float32
        probs = probs.float()
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "ece": ece(probs, labels, n_bins),
        "brier": brier(probs, labels),
    }


#: the central intervals whose coverage :func:`regression_metrics` reports
COVERAGE_LEVELS = (0.5, 0.9, 0.95)


def regression_metrics(
    mean: torch.Tensor,
    std: torch.Tensor,
    targets: torch.Tensor,
    levels: Sequence[float] = COVERAGE_LEVELS,
) -> dict[str, float]:
    r"""``{"rmse", "nll", "coverage_50", "coverage_90", "coverage_95"}`` (one
    ``coverage_<100 p>`` per level :math:`p` of ``levels``) of a predictive mean and
    standard deviation (see the module docstring); a multi-output target's NLL sums over
    its outputs, RMSE and coverage average over every value.

    Raises:
        ValueError: shapes that differ, no examples, targets or a mean that are not finite,
            a standard deviation that is not positive, a level outside (0, 1).
    """
    mean, std = mean.detach().cpu().double(), std.detach().cpu().double()
    y = targets.detach().cpu()
    if not y.is_floating_point():
        raise ValueError(f"regression targets must be floating point, got dtype {y.dtype}")
    y = y.double()
    if not (mean.shape == std.shape == y.shape):
        raise ValueError(
            f"expected mean, std and targets of one shape, got {tuple(mean.shape)}, "
            f"{tuple(std.shape)} and {tuple(y.shape)}"
        )
    if y.numel() == 0:
        raise ValueError("cannot compute metrics on an empty set (N = 0)")
    for name, t in (("targets", y), ("predictive mean", mean)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} hold values that are not finite (NaN or inf)")
    if not bool((std > 0).all()):
        raise ValueError(f"the predictive std must be positive, got minimum {float(std.min())}")
    z = (y - mean) / std
    nll = 0.5 * math.log(2 * math.pi) + std.log() + 0.5 * z.square()
    out = {
        "rmse": (y - mean).square().mean().sqrt().item(),
        "nll": nll.reshape(nll.shape[0], -1).sum(1).mean().item(),
    }
    normal = torch.distributions.Normal(0.0, 1.0)
    for p in levels:
        if not 0 < float(p) < 1:
            raise ValueError(f"coverage levels must be in (0, 1), got {p!r}")
        half = float(normal.icdf(torch.tensor(0.5 + float(p) / 2, dtype=torch.float64)))
        out[f"coverage_{round(100 * float(p))}"] = (z.abs() <= half).double().mean().item()
    return out
