"""The initial mixture of an EM fit: k-means clusters of a subsample and their moments.

K-means is greedy k-means++ seeding and chunked Lloyd steps; all distances are squared
Euclidean, ``d(x, c) = |x|^2 - 2 x.c + |c|^2``, evaluated as one GEMM per chunk of points
so that memory stays bounded for large ``K``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .linalg2x2 import mat2x2


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
        centres = sub[torch.randperm(n_sub, generator=gen, device=z.device)[:k]]
    else:
        n_seed = int(min(n_sub, max(10_000, 4 * k)))
        if n_sub < n or n_seed == n_sub:
            seed_set = sub[:n_seed]  # `sub` is already a random subset (or all points)
        else:  # input order may be meaningful (e.g. weights layer by layer): draw
            seed_set = sub[torch.randperm(n_sub, generator=gen, device=z.device)[:n_seed]]
        centres = kmeans_plusplus(seed_set, k, generator=gen, n_local_trials=3)
    # "random": zero Lloyd iterations, i.e. the labels of the nearest centre
    iters = {"random": 0, "kmeans++": lloyd_iter, "kmeans": 100}[init]
    centres, labels, _ = lloyd(sub, centres, max_iter=iters)
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
    counts, mu = _cluster_means(x64, labels, centres.to(torch.float64))
    d = x64 - mu[labels]
    outer = torch.stack((d[:, 0] ** 2, d[:, 0] * d[:, 1], d[:, 1] ** 2), dim=1)
    acc = torch.zeros(k, 3, dtype=torch.float64, device=x.device).index_add_(0, labels, outer)
    pooled = acc.sum(dim=0) / n
    if float(pooled[0]) <= 0 or float(pooled[2]) <= 0:
        pooled = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64, device=x.device) / k
    c3 = (acc + pooled) / (counts + 1.0)[:, None]
    cov = mat2x2(c3[:, 0] + reg, c3[:, 1], c3[:, 1], c3[:, 2] + reg)
    return (counts + 1.0) / (n + k), mu, cov


def _cluster_means(x: Tensor, labels: Tensor, centres: Tensor) -> tuple[Tensor, Tensor]:
    """``(counts, means)`` of the clusters ``labels`` of ``x``; an empty one keeps its centre."""
    k = int(centres.shape[0])
    counts = torch.bincount(labels, minlength=k).to(x.dtype)
    sums = torch.zeros(k, 2, dtype=x.dtype, device=x.device).index_add_(0, labels, x)
    return counts, torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centres)


def kmeans_plusplus(
    x: Tensor,
    n_clusters: int,
    *,
    generator: torch.Generator | None = None,
    n_local_trials: int | None = None,
) -> Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007) of ``n_clusters`` centres.

    The first centre is a uniformly drawn point; each next one is the best (lowest
    potential ``sum_i min_j d(x_i, c_j)``) of ``n_local_trials`` candidates drawn with
    probability proportional to ``D(x)^2``, the squared distance to the nearest
    centre so far. ``n_local_trials`` defaults to ``2 + floor(log K)``.

    Args:
        x: ``(n, 2)`` points.
        n_clusters: number of centres ``K <= n``.
        generator: torch random generator (on ``x.device``).
        n_local_trials: candidates per step.

    Returns:
        ``(K, 2)`` centres, rows of ``x``.
    """
    n = int(x.shape[0])
    if not 1 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be in [1, {n}], got {n_clusters}")
    trials = n_local_trials if n_local_trials is not None else 2 + int(math.log(n_clusters))
    xt = x.t().contiguous()
    xn = x.square().sum(dim=1)
    idx = torch.empty(n_clusters, dtype=torch.long, device=x.device)
    first = torch.randint(n, (1,), generator=generator, device=x.device)
    idx[0] = first[0]
    d = (x - x[first]).square().sum(dim=1)
    dc = torch.empty(trials, n, dtype=x.dtype, device=x.device)
    for k in range(1, n_clusters):
        # (d.sum() <= 0) adds a uniform fallback when every point is already a centre
        probs = d + (d.sum() <= 0).to(d.dtype)
        cand = torch.multinomial(probs, trials, replacement=True, generator=generator)
        c = x[cand]
        # |x - c|^2 = |x|^2 + |c|^2 - 2 c.x, one GEMM for all trials
        torch.addmm(xn.expand(trials, n), c, xt, alpha=-2.0, out=dc)
        dc += c.square().sum(dim=1, keepdim=True)
        torch.minimum(dc, d[None, :], out=dc)
        best = torch.argmin(dc.sum(dim=1))
        d = dc[best].clamp_min(0.0)
        idx[k] = cand[best]
    return x[idx].clone()


def nearest_centre(x: Tensor, centres: Tensor) -> tuple[Tensor, Tensor]:
    """Index of and squared distance to the nearest centre, ``argmin_k |x_i - c_k|^2``.

    Processes ``2^24 // K`` points at a time (one GEMM each). Returns
    ``(labels (n,), d2 (n,))``.
    """
    n = int(x.shape[0])
    k = int(centres.shape[0])
    rows = max(1, (1 << 24) // max(1, k))
    labels = torch.empty(n, dtype=torch.long, device=x.device)
    d2 = torch.empty(n, dtype=x.dtype, device=x.device)
    cn = centres.square().sum(dim=1)
    ct = centres.t().contiguous()
    buf = torch.empty(min(rows, n) * k, dtype=x.dtype, device=x.device)
    for s in range(0, n, rows):
        xs = x[s : s + rows]
        b = int(xs.shape[0])
        out = buf[: b * k].view(b, k)
        torch.addmm(cn[None, :], xs, ct, beta=1.0, alpha=-2.0, out=out)
        val, lab = out.min(dim=1)
        labels[s : s + b] = lab
        d2[s : s + b] = (val + xs.square().sum(dim=1)).clamp_min(0.0)
    return labels, d2


def lloyd(x: Tensor, centres: Tensor, *, max_iter: int = 5) -> tuple[Tensor, Tensor, int]:
    """Lloyd iterations: assign to the nearest centre, move each centre to its cluster mean.

    An empty cluster keeps its centre. Stops after ``max_iter`` iterations, or when
    no label changes.

    Returns:
        ``(centres (K, 2), labels (n,), n_iter)``; ``labels`` are w.r.t. the returned
        centres.
    """
    centres = centres.clone()
    labels, _ = nearest_centre(x, centres)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 - n_iter is returned
        centres = _cluster_means(x, labels, centres)[1]
        new_labels, _ = nearest_centre(x, centres)
        if torch.equal(new_labels, labels):
            break
        labels = new_labels
    return centres, labels, n_iter
