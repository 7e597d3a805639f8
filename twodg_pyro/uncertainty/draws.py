r"""How many posterior draws a prediction needs: NLL and OOD AUROC against the draws.

A Bayesian prediction averages :math:`S` draws, so it costs :math:`S` forward passes.
:func:`draws_curve` measures what fewer draws lose: from a pool of :math:`P` per-draw
probabilities (seeded draws of one trained model on the test images and on each OOD
set), the figure of :math:`n` draws is the mean over the :math:`\lfloor P / n \rfloor`
disjoint blocks of :math:`n` consecutive draws of the pool (at most ``max_blocks``) of

* the NLL of the block's average on the test images (accuracy beside it), and
* the entropy AUROC of the block's average for each OOD set (OOD positive), and their
  mean over the sets (``mean_auroc``),

with the standard deviation over the blocks (the Monte Carlo spread one prediction of
:math:`n` draws has).  Fewer draws bias the NLL upwards (the log of an average of fewer
probabilities) and blur the entropy; the mean over blocks estimates that bias without
the noise of one seed.  :func:`sufficient_draws` is the smallest :math:`n` whose figures,
and those of every larger :math:`n` measured, lie within a relative ``tolerance`` of the
reference's (30 draws).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from .detection import ood_metrics
from .scores import as_samples, entropy

#: The figures :func:`sufficient_draws` holds within its tolerance by default.
CRITERIA = ("nll", "mean_auroc")


def _block_figures(probs_in, labels, outs: Mapping[str, torch.Tensor], block: slice) -> dict:
    """The figures of the average of the draws ``block`` of the pools."""
    mean_in = probs_in[block].mean(0)
    means_out = {k: v[block].mean(0) for k, v in outs.items()}
    p = mean_in.double().clamp_min(1e-12)
    h_in = entropy(mean_in)
    aurocs = {k: ood_metrics(h_in, entropy(m))["auroc"] for k, m in means_out.items()}
    return {
        "nll": float(-p.gather(1, labels.view(-1, 1)).log().mean()),
        "accuracy": float((mean_in.argmax(1) == labels).double().mean()),
        "auroc": aurocs,
        "mean_auroc": sum(aurocs.values()) / len(aurocs) if aurocs else float("nan"),
    }


def _summary(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0
    return m, sd


def draws_curve(
    probs_in: torch.Tensor,
    labels: torch.Tensor,
    probs_out: Mapping[str, torch.Tensor] | None = None,
    draws: Iterable[int] = range(1, 31),
    max_blocks: int = 16,
) -> dict[int, dict]:
    """NLL, accuracy and OOD AUROC of predictions of ``n`` draws for each ``n`` of
    ``draws``, from a pool of per-draw probabilities (module docstring).

    Args:
        probs_in: ``(P, N, C)`` per-draw probabilities of the ``N`` test images.
        labels: ``(N,)`` their classes.
        probs_out: ``{set: (P, M, C)}`` the same draws on each OOD set (``None``: no AUROC).
        draws: the numbers of draws to measure, each in ``[1, P]``.
        max_blocks: the most disjoint blocks averaged per ``n``.

    Returns:
        ``{n: {"nll", "nll_sd", "accuracy", "accuracy_sd", "mean_auroc", "mean_auroc_sd",
        "auroc": {set: mean over blocks}, "blocks"}}``.

    Raises:
        ValueError: pools of different sizes, a number of draws outside ``[1, P]``, labels
            that do not match the test images.
    """
    probs_in = as_samples(probs_in, "probs_in")
    outs = {k: as_samples(v, f"probs_out[{k!r}]") for k, v in (probs_out or {}).items()}
    P, N = probs_in.shape[0], probs_in.shape[1]
    labels = torch.as_tensor(labels).long().view(-1).cpu()
    if labels.numel() != N:
        raise ValueError(f"labels has {labels.numel()} entries, probs_in {N} test images")
    for k, v in outs.items():
        if v.shape[0] != P:
            raise ValueError(f"probs_out[{k!r}] has {v.shape[0]} draws, probs_in {P}")
    if max_blocks < 1:
        raise ValueError(f"max_blocks must be at least 1, got {max_blocks!r}")
    curve: dict[int, dict] = {}
    for n in draws:
        n = int(n)
        if not 1 <= n <= P:
            raise ValueError(f"draws must be in [1, {P}] (the pool), got {n}")
        blocks = min(P // n, max_blocks)
        figures = [
            _block_figures(probs_in, labels, outs, slice(b * n, (b + 1) * n)) for b in range(blocks)
        ]
        row: dict = {"blocks": blocks}
        for key in ("nll", "accuracy", "mean_auroc"):
            row[key], row[f"{key}_sd"] = _summary([f[key] for f in figures])
        row["auroc"] = {k: _summary([f["auroc"][k] for f in figures])[0] for k in outs}
        curve[n] = row
    return curve


def sufficient_draws(
    curve: Mapping[int, Mapping],
    reference: int = 30,
    tolerance: float = 0.01,
    criteria: Iterable[str] = CRITERIA,
) -> int:
    """The smallest ``n`` of ``curve`` (:func:`draws_curve`) whose figures ``criteria``,
    and those of every ``n`` of the curve between it and ``reference``, are within
    ``tolerance`` (relative) of
    those at ``reference`` draws.  A figure that is NaN (no OOD set) is not checked.

    Raises:
        ValueError: ``reference`` not in the curve, a negative ``tolerance``.
    """
    if reference not in curve:
        raise ValueError(f"reference {reference!r} draws is not in the curve ({sorted(curve)})")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
    criteria = tuple(criteria)
    ref = curve[reference]

    def within(row) -> bool:  # (a NaN reference figure is not checked)
        pairs = ((float(ref[key]), float(row[key])) for key in criteria)
        return all(math.isnan(r) or not abs(v - r) > tolerance * abs(r) for r, v in pairs)

    best = reference
    for n in sorted((n for n in curve if n <= reference), reverse=True):
        if not within(curve[n]):
            break
        best = n
    return best
