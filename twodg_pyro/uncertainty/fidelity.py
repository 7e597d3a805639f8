r"""How close an approximate predictive comes to a reference one (HMC's): the scores of
Izmailov et al. (2021), "What are Bayesian neural network posteriors really like?".

For predictive distributions :math:`p_n = p(\cdot \mid x_n)` of an approximation and
:math:`p^\star_n` of the reference on inputs :math:`x_1..x_N` (``(N, C)`` class
probabilities each):

.. math::
    \text{agreement} = \frac1N \sum_n \mathbb 1[\arg\max_c p_{nc} = \arg\max_c p^\star_{nc}],
    \qquad
    \text{TV} = \frac1N \sum_n \tfrac12 \sum_c |p_{nc} - p^\star_{nc}|,

agreement in :math:`[0, 1]` (1: the same decisions), TV in :math:`[0, 1]` (0: the same
distributions).  With labels, :func:`fidelity` adds the gaps of NLL and ECE to the
reference (approximation minus reference: positive is worse than HMC for NLL).
"""

from __future__ import annotations

import torch

from ..metrics import ece, nll

__all__ = ["fidelity", "top1_agreement", "total_variation"]


def _pair(p: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p, ref = torch.as_tensor(p).double(), torch.as_tensor(ref).double()
    if p.dim() != 2 or p.shape != ref.shape:
        raise ValueError(
            f"predictive probabilities must both be (N, C) of one shape, got {tuple(p.shape)} "
            f"and {tuple(ref.shape)}"
        )
    if p.shape[0] == 0:
        raise ValueError("no inputs: the predictive probabilities have N = 0 rows")
    return p, ref


def top1_agreement(p: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of inputs where ``p``'s most probable class is ``ref``'s (``(N, C)`` each)."""
    p, ref = _pair(p, ref)
    return float((p.argmax(-1) == ref.argmax(-1)).double().mean())


def total_variation(p: torch.Tensor, ref: torch.Tensor) -> float:
    r"""Mean over inputs of :math:`\tfrac12 \lVert p_n - p^\star_n \rVert_1` (``(N, C)``)."""
    p, ref = _pair(p, ref)
    return float(0.5 * (p - ref).abs().sum(-1).mean())


def fidelity(p: torch.Tensor, ref: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
    """``{"agreement", "tv"}`` of ``p`` against the reference ``ref``; with ``labels``,
    also ``nll``, ``ece`` (of ``p``) and ``nll_gap``, ``ece_gap`` (``p``'s minus
    ``ref``'s)."""
    out = {"agreement": top1_agreement(p, ref), "tv": total_variation(p, ref)}
    if labels is not None:
        p32, r32 = torch.as_tensor(p).float(), torch.as_tensor(ref).float()
        out["nll"] = nll(p32, labels)
        out["ece"] = ece(p32, labels)
        out["nll_gap"] = out["nll"] - nll(r32, labels)
        out["ece_gap"] = out["ece"] - ece(r32, labels)
    return out
