r"""Selective prediction: the risk-coverage curve and its area (AURC, E-AURC).

A classifier that may abstain accepts the examples it is most confident about.  Sort the
``N`` examples by confidence :math:`\kappa_n` in decreasing order (ties keep their input
order: a stable sort), and accept the first :math:`k`; with :math:`e_n = 1` for an error,

.. math::
    \mathrm{coverage}_k = \frac kN, \qquad
    \mathrm{risk}_k = \frac1k \sum_{j \le k} e_{(j)}, \qquad k = 1, \dots, N,

and the area under the risk-coverage curve is the mean risk over the :math:`N` coverages
(Geifman et al., 2019),

.. math:: \mathrm{AURC} = \frac1N \sum_{k=1}^N \mathrm{risk}_k .

The best confidence ranks every correct example before every error; with :math:`E`
errors, :math:`\mathrm{risk}^\star_k = \max(0, k - (N - E)) / k` and
:math:`\mathrm{AURC}^\star = \frac1N \sum_k \mathrm{risk}^\star_k` (about
:math:`r + (1 - r)\log(1 - r)` for an error rate :math:`r`).  The excess
:math:`\text{E-AURC} = \mathrm{AURC} - \mathrm{AURC}^\star \ge 0` removes the part of the
area due to the accuracy alone, leaving the quality of the ranking.  Lower is better for
all three.
"""

from __future__ import annotations

import numpy as np
import torch

from .detection import ArrayLike, as_scores


def _errors(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    conf = as_scores(confidence, "confidence")
    ok = np.asarray(correct.detach().cpu() if isinstance(correct, torch.Tensor) else correct)
    if ok.shape != conf.shape:
        raise ValueError(
            f"correct must have one entry per confidence: shapes {ok.shape} and {conf.shape}"
        )
    if ok.dtype != np.bool_ and not np.isin(ok, (0, 1)).all():
        raise ValueError("correct must hold booleans or 0/1 values")
    return conf, (~ok.astype(bool)).astype(np.float64)


def risk_coverage_curve(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    r"""``(coverage, risk)``, each of length ``N``: :math:`k/N` and the error rate of the
    :math:`k` most confident examples, :math:`k = 1..N` (stable sort on the confidence).

    Raises:
        ValueError: empty or non-finite confidences, or ``correct`` of another shape or
            not boolean.
    """
    conf, err = _errors(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    k = np.arange(1, conf.size + 1, dtype=np.float64)
    return k / conf.size, np.cumsum(err[order]) / k


def aurc(confidence: ArrayLike, correct: ArrayLike) -> float:
    r""":math:`\frac1N\sum_k \mathrm{risk}_k` of :func:`risk_coverage_curve`."""
    return float(risk_coverage_curve(confidence, correct)[1].mean())


def optimal_aurc(correct: ArrayLike) -> float:
    r""":math:`\mathrm{AURC}^\star` of the given correctness: every correct example ranked
    first, :math:`\frac1N \sum_k \max(0, k - (N - E)) / k`."""
    ok = np.asarray(correct.detach().cpu() if isinstance(correct, torch.Tensor) else correct)
    return aurc(ok.astype(np.float64), ok)


def selective_metrics(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    r"""``{"aurc", "aurc_optimal", "eaurc"}`` of the model-average probabilities ``(N, C)``
    with the confidence :math:`\max_c \bar p_{n,c}` and correctness
    :math:`[\arg\max_c \bar p_{n,c} = y_n]`."""
    if probs.dim() != 2 or labels.dim() != 1 or probs.shape[0] != labels.shape[0]:
        raise ValueError(
            f"expected probs (N, C) and labels (N,), got {tuple(probs.shape)} and "
            f"{tuple(labels.shape)}"
        )
    conf, pred = probs.detach().cpu().double().max(-1)
    correct = (pred == labels.detach().cpu()).numpy()
    area, best = aurc(conf, correct), optimal_aurc(correct)
    return {"aurc": area, "aurc_optimal": best, "eaurc": area - best}
