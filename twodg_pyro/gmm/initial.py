"""The initial mixture of an EM fit: k-means clusters of a subsample and their moments."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .kmeans import kmeans_plusplus, lloyd, nearest_centre

__all__ = ["initial_mixture", "subsample_size"]


def subsample_size(n: int, k: int, subsample: int | None) -> int:
    """Points the initialisation of ``K = k`` components uses out of ``n``: ``subsample``
    (default ``max(50_000, 25 K)``), at least ``K``, at most ``n``."""
    n_sub = subsample or max(50_000, 25 * k)
    return int(min(n, max(n_sub, k)))


def initial_mixture(
    z: Any,
    k: int,
    gen: torch.Generator,
    *,
    init: str,
    lloyd_iter: int,
    subsample: int | None,
    reg: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Initial weights, means and covariances (float64) of ``k`` components on ``z``.

    ``z`` is ``(N, 2)`` (or anything with ``shape``, ``device`` and row indexing); the
    random draws come from ``gen``.  A random subsample of :func:`subsample_size` points
    is clustered: ``init = "random"`` takes ``k`` distinct points of it as centres;
    ``"kmeans++"`` and ``"kmeans"`` seed by greedy k-means++ (3 trials per centre) on
    ``max(10_000, 4 K)`` of its points, then run ``lloyd_iter`` (``"kmeans"``: 100)
    Lloyd iterations on the subsample.  The parameters are those of the hard clusters
    (shrunk towards the pooled within-cluster covariance by one pseudo-point), with
    ``reg`` added to every covariance's diagonal.
    """
    n = int(z.shape[0])
    n_sub = subsample_size(n, k, subsample)
    sub = z[torch.randperm(n, generator=gen, device=z.device)[:n_sub]] if n_sub < n else z
    if init == "random":
        pick = torch.randperm(n_sub, generator=gen, device=z.device)[:k]
        centres = sub[pick]
        labels, _ = nearest_centre(sub, centres)
    else:
        n_seed = int(min(n_sub, max(10_000, 4 * k)))
        if n_sub < n or n_seed == n_sub:
            seed_set = sub[:n_seed]  # `sub` is already a random subset (or all points)
        else:  # input order may be meaningful (e.g. weights layer by layer): draw
            seed_set = sub[torch.randperm(n_sub, generator=gen, device=z.device)[:n_seed]]
        centres = kmeans_plusplus(seed_set, k, generator=gen, n_local_trials=3)
        iters = lloyd_iter if init == "kmeans++" else 100
        if iters > 0:
            centres, labels, _ = lloyd(sub, centres, max_iter=iters)
        else:
            labels, _ = nearest_centre(sub, centres)
    return _params_from_labels(sub, labels, centres, k, reg)


def _params_from_labels(
    x: Tensor, labels: Tensor, centres: Tensor, k: int, reg: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights, means, covariances (float64) of hard clusters.

    ``pi_k = (n_k + 1) / (n + K)``; ``m_k`` the cluster mean (the centre if empty);
    ``S_k = (sum_{i in k} (x_i - m_k)(x_i - m_k)^T + W) / (n_k + 1) + reg I`` with
    ``W`` the pooled within-cluster covariance (one pseudo-point of shrinkage).
    """
    x64 = x.to(torch.float64)
    n = int(x.shape[0])
    counts = torch.bincount(labels, minlength=k).to(torch.float64)
    sums = torch.zeros(k, 2, dtype=torch.float64, device=x.device).index_add_(0, labels, x64)
    mu = torch.where(
        counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centres.to(torch.float64)
    )
    d = x64 - mu[labels]
    outer = torch.stack((d[:, 0] ** 2, d[:, 0] * d[:, 1], d[:, 1] ** 2), dim=1)
    acc = torch.zeros(k, 3, dtype=torch.float64, device=x.device).index_add_(0, labels, outer)
    pooled = acc.sum(dim=0) / n
    if float(pooled[0]) <= 0 or float(pooled[2]) <= 0:
        pooled = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64, device=x.device) / k
    c3 = (acc + pooled) / (counts + 1.0)[:, None]
    cov = torch.stack(
        (torch.stack((c3[:, 0] + reg, c3[:, 1]), -1), torch.stack((c3[:, 1], c3[:, 2] + reg), -1)),
        dim=-2,
    )
    w = (counts + 1.0) / (n + k)
    return w, mu, cov
