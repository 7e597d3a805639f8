r"""Outlier rules (Sec. 4.1): which weights keep their own Normal posterior.

Weight :math:`i` of the mean-field BNN is an *outlier* if

* its mean is extreme: :math:`|\mu_i| > \tau_w` (``rule="absolute"``, the paper's,
  :math:`\tau_w = 0.2`), or :math:`|\mu_i|` above the ``mu_quantile`` quantile of all
  :math:`|\mu|` (``rule="quantile"``), or :math:`|\mu_i - \bar\mu_l| > c\, \mathrm{sd}_l(\mu)`
  within its layer :math:`l` (``rule="layer_std"``); **or**
* its gradient is in the top :math:`P_g` of all :math:`|g_j|`, with
  :math:`g = \partial \mathcal L / \partial \mu` averaged over a few minibatches and
  ranked over all Bayesian parameters of the network jointly.

``tau_w = 0.2`` is absolute and tuned on ResNets: on a small MLP it can make half the
weights outliers, hence the scale-aware rules (spec, Stage 1 step 3).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..infer.elbo import DecomposedELBO

#: the mean rules: ``|mu| > tau_w`` (the paper's), a quantile of ``|mu|``, or a multiple of
#: each layer's standard deviation of ``mu``
OutlierRule = Literal["absolute", "quantile", "layer_std"]


@dataclass
class OutlierReport:
    """Which flat weight indices are outliers, and which rule caught them.

    Attributes:
        mask: ``(n_w,)`` bool, True for an outlier.
        by_mean: count caught by the mean rule.
        by_gradient: count caught by the gradient rule.
        both: count caught by both.
        rule: the mean rule used (``absolute``/``quantile``/``layer_std``) and its threshold.
    """

    mask: torch.Tensor
    by_mean: int
    by_gradient: int
    both: int
    rule: str

    @property
    def count(self) -> int:
        """Total number of outliers."""
        return int(self.mask.sum())

    def summary(self) -> dict:
        """JSON-friendly counts."""
        return {
            "n_outliers": self.count,
            "by_mean": self.by_mean,
            "by_gradient": self.by_gradient,
            "by_both": self.both,
            "rule": self.rule,
        }


def check_finite(name: str, t: torch.Tensor, hint: str = "") -> None:
    """Raise ``ValueError`` naming the NaN/infinite entries of ``t`` (then ``hint``)."""
    bad = ~torch.isfinite(t)
    if bad.any():
        first = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{name} has {int(bad.sum())} NaN or infinite value(s) (first at flat index "
            f"{first}){hint}"
        )


def select_outliers(
    mus: torch.Tensor,
    grads: torch.Tensor | None = None,
    *,
    rule: str = "absolute",
    tau_w: float = 0.2,
    mu_quantile: float = 0.99,
    layer_std_multiple: float = 3.0,
    grad_percentile: float = 0.01,
    layer_sizes: Sequence[int] | None = None,
) -> OutlierReport:
    r"""Apply the mean rule and the gradient rule to flat weight means.

    Args:
        mus: ``(n_w,)`` posterior means of all Bayesian weights, flattened in site order.
        grads: ``(n_w,)`` averaged :math:`\partial\mathcal L/\partial\mu`, or ``None`` to
            skip the gradient rule.
        rule: ``"absolute"``, ``"quantile"`` or ``"layer_std"``.
        tau_w: threshold of the absolute rule.
        mu_quantile: quantile of :math:`|\mu|` for the quantile rule, in (0, 1).
        layer_std_multiple: :math:`c` of the layer rule.
        grad_percentile: :math:`P_g`, fraction in [0, 1) of largest :math:`|g|`.
        layer_sizes: number of weights per site (for ``layer_std``).

    Raises:
        ValueError: on a bad threshold, a non-finite mean or gradient, or mismatched sizes.
    """
    mus = mus.detach().reshape(-1)
    check_finite("weight means", mus)
    if rule == "absolute":
        if not (math.isfinite(tau_w) and tau_w > 0):
            raise ValueError(f"tau_w must be a positive number, got {tau_w!r}")
        by_mean = mus.abs() > tau_w
        described = f"absolute |mu| > {tau_w:g}"
    elif rule == "quantile":
        if not (0.0 < mu_quantile < 1.0):
            raise ValueError(f"mu_quantile must be in (0, 1), got {mu_quantile!r}")
        thr = torch.quantile(mus.abs().double(), mu_quantile).item() if mus.numel() else 0.0
        by_mean = mus.abs() > thr
        described = f"quantile |mu| > q{mu_quantile:g} = {thr:.4g}"
    elif rule == "layer_std":
        if not (math.isfinite(layer_std_multiple) and layer_std_multiple > 0):
            raise ValueError(f"layer_std_multiple must be positive, got {layer_std_multiple!r}")
        if layer_sizes is None or sum(layer_sizes) != mus.numel():
            raise ValueError(
                f"layer_std needs layer_sizes summing to {mus.numel()}, got {layer_sizes!r}"
            )
        parts = []
        for chunk in mus.split(list(layer_sizes)):
            sd = chunk.std() if chunk.numel() > 1 else chunk.new_tensor(math.inf)
            parts.append((chunk - chunk.mean()).abs() > layer_std_multiple * sd)
        by_mean = torch.cat(parts)
        described = f"layer |mu - mean| > {layer_std_multiple:g} sd"
    else:
        raise ValueError(
            f"unknown outlier rule {rule!r}; use 'absolute', 'quantile' or 'layer_std'"
        )
    if not (0.0 <= grad_percentile < 1.0):
        raise ValueError(f"grad_percentile (P_g) must be in [0, 1), got {grad_percentile!r}")
    by_grad = torch.zeros_like(by_mean)
    if grads is not None and grad_percentile > 0:
        grads = grads.detach().reshape(-1)
        if grads.shape != mus.shape:
            raise ValueError(f"grads has {grads.numel()} elements, the means have {mus.numel()}")
        check_finite("gradients", grads)
        n_top = int(math.ceil(grad_percentile * mus.numel()))
        by_grad[grads.abs().topk(n_top).indices] = True
    counts = (int(by_mean.sum()), int(by_grad.sum()), int((by_mean & by_grad).sum()))
    return OutlierReport(by_mean | by_grad, *counts, described)


def mean_gradients(
    model, guide, batches: Iterable, n_batches: int, elbo=None, device=None
) -> torch.Tensor:
    r"""Average :math:`\partial(-\mathrm{ELBO})/\partial\mu` over ``n_batches`` minibatches.

    Returns the flat ``(n_w,)`` gradient in site order (the order of
    :meth:`MeanFieldGuide.means_and_scales`).
    """
    if int(n_batches) < 1:
        raise ValueError(f"n_batches must be at least 1, got {n_batches!r}")
    elbo = elbo or DecomposedELBO()
    locs = [guide.loc(s.name) for s in guide.sites]
    total = [torch.zeros_like(p) for p in locs]
    seen = 0
    for batch in itertools.islice(batches, int(n_batches)):
        x, y = batch[0], batch[1]
        if device is not None:
            x, y = x.to(device), y.to(device)
        loss = elbo.differentiable_loss(model, guide, x, y)
        grads = torch.autograd.grad(loss, locs)
        for t, g in zip(total, grads, strict=True):
            t.add_(g)
        seen += 1
    if seen == 0:
        raise ValueError("no minibatch to compute gradients on (empty data)")
    return torch.cat([(t / seen).reshape(-1) for t in total])
