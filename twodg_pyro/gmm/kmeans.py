"""K-means for initialising the mixture: greedy k-means++ seeding and chunked Lloyd steps.

All distances are squared Euclidean, ``d(x, c) = |x|^2 - 2 x.c + |c|^2``, evaluated
as one GEMM per chunk of points so that memory stays bounded for large ``K``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["kmeans_plusplus", "nearest_centre", "lloyd"]


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


def nearest_centre(
    x: Tensor, centres: Tensor, *, chunk_elems: int = 1 << 24
) -> tuple[Tensor, Tensor]:
    """Index of and squared distance to the nearest centre, ``argmin_k |x_i - c_k|^2``.

    Processes ``chunk_elems // K`` points at a time. Returns ``(labels (n,), d2 (n,))``.
    """
    n = int(x.shape[0])
    k = int(centres.shape[0])
    rows = max(1, chunk_elems // max(1, k))
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


def lloyd(
    x: Tensor,
    centres: Tensor,
    *,
    max_iter: int = 5,
    tol: float = 0.0,
    chunk_elems: int = 1 << 24,
) -> tuple[Tensor, Tensor, int]:
    """Lloyd iterations: assign to the nearest centre, move each centre to its cluster mean.

    An empty cluster keeps its centre. Stops after ``max_iter`` iterations, or when
    no label changes, or when the largest squared centre shift is ``<= tol``.

    Returns:
        ``(centres (K, 2), labels (n,), n_iter)``; ``labels`` are w.r.t. the returned
        centres.
    """
    k = int(centres.shape[0])
    centres = centres.clone()
    labels, _ = nearest_centre(x, centres, chunk_elems=chunk_elems)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 - n_iter is returned
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        sums = torch.zeros(k, 2, dtype=x.dtype, device=x.device).index_add_(0, labels, x)
        new = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centres)
        shift = float((new - centres).square().sum(dim=1).max())
        centres = new
        new_labels, _ = nearest_centre(x, centres, chunk_elems=chunk_elems)
        changed = bool((new_labels != labels).any())
        labels = new_labels
        if not changed or shift <= tol:
            break
    return centres, labels, n_iter
