r"""Out-of-distribution detection metrics of a per-example score.

The OOD examples are the positive class and a higher score means "more OOD" (the scores
of :mod:`.scores`: entropy, MI, :math:`1 - \max p`).  With a threshold :math:`t` flagging
the examples whose score is :math:`\ge t`,

.. math::
    \mathrm{TPR}(t) = \frac{\#\{\text{OOD}: s \ge t\}}{N_\text{out}}, \qquad
    \mathrm{FPR}(t) = \frac{\#\{\text{in}: s \ge t\}}{N_\text{in}},

* **AUROC**: the area under :math:`(\mathrm{FPR}(t), \mathrm{TPR}(t))`, i.e. the probability
  that an OOD example scores above an in-distribution one (ties count one half):
  :math:`\frac{1}{N_\text{in} N_\text{out}} \sum_{i, o} ([s_o > s_i] + \tfrac12 [s_o = s_i])`
  (scikit-learn's ``roc_auc_score``); 0.5 is chance;
* **AUPR** (AUPR-Out): the average precision with OOD positive,
  :math:`\sum_k (R_k - R_{k-1}) P_k` over the thresholds in decreasing order
  (``average_precision_score``, a step sum: no trapezoidal interpolation); chance is
  :math:`N_\text{out} / (N_\text{in} + N_\text{out})`;
* **FPR95**: :math:`\min \{\mathrm{FPR}(t) : \mathrm{TPR}(t) \ge 0.95\}` over the thresholds
  of ``roc_curve`` (every distinct score, ``drop_intermediate=False``): the false positive
  rate at the first threshold that detects at least 95 % of the OOD examples, **without
  interpolation** between thresholds.  Lower is better.

Note: the paper's public evaluation script computes its "FPR95" at a TPR of 85 %
(:func:`fpr_at_tpr` with ``tpr=0.85``), which is a different (smaller or equal) number;
the numbers here are at 95 %.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

ArrayLike = torch.Tensor | np.ndarray | list[float] | tuple[float, ...]


def as_scores(scores: ArrayLike, name: str) -> np.ndarray:
    """A 1-D float64 array of finite scores.

    Raises:
        ValueError: not 1-D, empty, or holding NaN or
            infinite values -- naming ``name``.
    """
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().cpu().double().numpy()
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-example scores, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: at least one score is needed")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(
            f"{name} holds {int(bad.sum())} NaN or infinite value(s), first at index "
            f"{int(np.argmax(bad))}"
        )
    return arr


def ood_labels(scores_in: ArrayLike, scores_out: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, scores)``: the scores concatenated, labels 0 (in) and 1 (OOD)."""
    s_in = as_scores(scores_in, "scores_in")
    s_out = as_scores(scores_out, "scores_out")
    labels = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)]).astype(np.int64)
    return labels, np.concatenate([s_in, s_out])


def fpr_at_tpr(scores_in: ArrayLike, scores_out: ArrayLike, tpr: float = 0.95) -> float:
    r"""The smallest false positive rate over the thresholds whose true positive rate is at
    least :math:`\tau` = ``tpr``: :math:`\min\{\mathrm{FPR}(t) : \mathrm{TPR}(t) \ge \tau\}`
    (interpolation-free; see the module docstring).

    Raises:
        ValueError: ``tpr`` outside ``(0, 1]``, or bad scores (:func:`as_scores`).
    """
    if not (isinstance(tpr, (int, float)) and 0.0 < float(tpr) <= 1.0):
        raise ValueError(f"tpr must be in (0, 1], got {tpr!r}")
    labels, scores = ood_labels(scores_in, scores_out)
    fpr, tprs, _ = roc_curve(labels, scores, drop_intermediate=False)
    # tprs reaches 1 at the last threshold, so the set is never empty; the small
    # tolerance keeps e.g. 19/20 = 0.95 at a TPR of 0.95 despite rounding
    return float(fpr[tprs >= float(tpr) - 1e-12].min())


def ood_metrics(scores_in: ArrayLike, scores_out: ArrayLike, tpr: float = 0.95) -> dict[str, float]:
    """``{"auroc", "aupr", "fpr95"}`` of a score separating OOD (positive, higher score)
    from in-distribution examples; ``fpr95`` is :func:`fpr_at_tpr` at ``tpr``.

    Raises:
        ValueError: empty scores, NaN or infinite scores, scores that are not 1-D --
            naming ``scores_in`` or ``scores_out``.
    """
    labels, scores = ood_labels(scores_in, scores_out)
    return {
        "auroc": float(roc_auc_score(labels, scores)),
        "aupr": float(average_precision_score(labels, scores)),
        "fpr95": fpr_at_tpr(scores_in, scores_out, tpr),
    }
