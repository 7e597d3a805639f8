r"""Per-example uncertainty scores from per-draw class probabilities.

With the per-draw probabilities :math:`p_{s,n} = p(y \mid x_n, w^{(s)})`, ``samples`` of
shape ``(S, N, C)``, and their model average :math:`\bar p_n = \frac1S \sum_s p_{s,n}`
(all in nats, :math:`0 \log 0 = 0`, probabilities clamped at :math:`10^{-12}` inside the
logarithm):

* predictive entropy (total uncertainty):
  :math:`\mathrm H[\bar p_n] = -\sum_c \bar p_{n,c} \log \bar p_{n,c}`;
* expected entropy (aleatoric part):
  :math:`\mathbb E_s \mathrm H[p_{s,n}] = \frac1S \sum_s \mathrm H[p_{s,n}]`;
* mutual information between the label and the weights (epistemic part, BALD):
  :math:`\mathrm{MI}_n = \mathrm H[\bar p_n] - \mathbb E_s \mathrm H[p_{s,n}] \ge 0`
  (Jensen; clamped at 0 against rounding);
* max-probability score: :math:`1 - \max_c \bar p_{n,c}`.

Higher is more uncertain for every score.  A deterministic network is ``S = 1``: its MI
is exactly 0 and its expected entropy is its entropy.  The entropy of ``C`` classes lies
in :math:`[0, \log C]`; the MI of ``S`` draws in :math:`[0, \min(\log C, \log S)]` (two
disagreeing one-hot draws: :math:`\log 2`).

The sums run in float64 (the MI is a difference of close numbers); the scores come back
in the dtype of the input.
"""

from __future__ import annotations

import torch

_EPS = 1e-12


def as_samples(probs: torch.Tensor, name: str = "probs") -> torch.Tensor:
    """``(S, N, C)`` per-draw probabilities: ``probs`` as given, or ``(N, C)`` as one draw.

    Raises:
        ValueError: another number of dimensions, no examples or classes, or values that
            are NaN, infinite, or outside ``[0, 1]``.
    """
    probs = torch.as_tensor(probs)
    if probs.dim() == 2:
        probs = probs.unsqueeze(0)
    if probs.dim() != 3:
        raise ValueError(
            f"{name} must be (S, N, C) per-draw probabilities or (N, C), got shape "
            f"{tuple(probs.shape)}"
        )
    if 0 in probs.shape:
        raise ValueError(f"{name} is empty: shape {tuple(probs.shape)}")
    if not probs.is_floating_point():
        raise ValueError(f"{name} must be floating probabilities, got {probs.dtype}")
    if not torch.isfinite(probs).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    if probs.min() < 0 or probs.max() > 1 + 1e-6:
        raise ValueError(
            f"{name} must hold probabilities in [0, 1], got values in "
            f"[{probs.min().item():.4g}, {probs.max().item():.4g}]"
        )
    return probs


def entropy(probs: torch.Tensor) -> torch.Tensor:
    r""":math:`-\sum_c p_c \log \max(p_c, 10^{-12})` over the last dimension (nats)."""
    p = probs.double()
    return -(p * p.clamp_min(_EPS).log()).sum(-1)


def predictive_entropy(probs: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm H[\bar p_n]` of ``(S, N, C)`` draws or ``(N, C)`` means: ``(N,)``."""
    return uncertainty_scores(probs)["entropy"]


def expected_entropy(probs: torch.Tensor) -> torch.Tensor:
    r""":math:`\frac1S \sum_s \mathrm H[p_{s,n}]` of ``(S, N, C)`` draws: ``(N,)``."""
    return uncertainty_scores(probs)["expected_entropy"]


def mutual_information(probs: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm H[\bar p_n] - \frac1S\sum_s \mathrm H[p_{s,n}]`, clamped at 0:
    ``(N,)``; exactly 0 for one draw (``(N, C)`` means, or ``S = 1``)."""
    return uncertainty_scores(probs)["mi"]


def max_prob_score(probs: torch.Tensor) -> torch.Tensor:
    r""":math:`1 - \max_c \bar p_{n,c}` of ``(S, N, C)`` draws or ``(N, C)`` means: ``(N,)``."""
    return uncertainty_scores(probs)["maxprob"]


def uncertainty_scores(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """All scores at once (one pass over the draws): ``{name: (N,)}`` for ``entropy``,
    ``maxprob``, ``mi`` and ``expected_entropy``."""
    samples = as_samples(probs)
    d = samples.double()
    mean = d.mean(0)
    total = entropy(mean)
    expected = entropy(d).mean(0)
    mi = (total - expected).clamp_min(0.0) if samples.shape[0] > 1 else torch.zeros_like(total)
    out = {
        "entropy": total,
        "maxprob": 1.0 - mean.max(-1).values,
        "mi": mi,
        "expected_entropy": expected if samples.shape[0] > 1 else total,
    }
    return {k: v.to(samples.dtype) for k, v in out.items()}
