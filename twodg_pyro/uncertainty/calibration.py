r"""Post-hoc temperature scaling of a predictive distribution (Guo et al., 2017).

A predictive :math:`p(y \mid x)` (one network's softmax, or the mean over a posterior's
draws) is recalibrated by one temperature :math:`T > 0`,

.. math:: p_T(y \mid x) = \frac{p(y \mid x)^{1/T}}{\sum_{c} p(c \mid x)^{1/T}},

chosen to minimise the NLL on held-out (validation) data.  For a single network this is
the usual scaling of the logits (:math:`\log p` differs from the logits by a constant per
input); for a Bayesian predictive it tempers the averaged distribution, so a posterior that
is under- or over-confident on average is compared with what calibration alone gives.
The ranking of classes, and so the accuracy, is unchanged.
"""

from __future__ import annotations

import math

import torch

from ..metrics import check_labels

_EPS = 1e-12


def apply_temperature(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    r""":math:`p_T`: ``probs`` ``(N, C)`` tempered by ``temperature`` (module docstring)."""
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return torch.softmax(probs.clamp_min(_EPS).log() / temperature, dim=-1)


def fit_temperature(
    probs: torch.Tensor, labels: torch.Tensor, bounds: tuple[float, float] = (0.05, 20.0)
) -> float:
    r"""The temperature in ``bounds`` that minimises the NLL of :func:`apply_temperature`
    on ``(probs, labels)``: a golden-section search over :math:`\log T` (the NLL of
    tempered log-probabilities is convex in :math:`1/T`, so it has one minimum).

    Raises:
        ValueError: ``probs`` is not ``(N, C)`` with ``N`` labels in ``[0, C)``.
    """
    if probs.dim() != 2 or probs.shape[0] != labels.shape[0] or probs.shape[0] == 0:
        raise ValueError(
            f"probs must be (N, C) with N = len(labels) > 0, got {tuple(probs.shape)} "
            f"and {tuple(labels.shape)} labels"
        )
    check_labels(labels, probs.shape[1])
    logp = probs.double().clamp_min(_EPS).log()
    rows = torch.arange(len(labels))

    def loss(log_t: float) -> float:
        z = torch.log_softmax(logp / math.exp(log_t), dim=-1)
        return float(-z[rows, labels].mean())

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(60):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = loss(b)
    return math.exp((lo + hi) / 2)
