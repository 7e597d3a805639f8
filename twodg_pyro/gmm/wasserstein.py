"""Closed-form 2-Wasserstein distance between 2-D Gaussians.

For ``N(m_a, S_a)`` and ``N(m_b, S_b)``:

``W2^2 = |m_a - m_b|^2 + tr S_a + tr S_b - 2 tr (S_a^{1/2} S_b S_a^{1/2})^{1/2}``.

For 2x2 SPD matrices, ``M = S_a^{1/2} S_b S_a^{1/2}`` has ``tr M = tr(S_a S_b)`` and
``det M = det S_a det S_b``, and a 2x2 SPD ``M`` has
``tr M^{1/2} = sqrt(tr M + 2 sqrt(det M))``; hence

``W2^2 = |m_a - m_b|^2 + tr S_a + tr S_b - 2 sqrt(tr(S_a S_b) + 2 sqrt(det S_a det S_b))``,

with no matrix square root at all. The expression is evaluated symmetrically in
``a`` and ``b`` (bit-identical under swapping), and round-off negatives are
clamped to 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .linalg2x2 import check_spd


def _parts(s: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``a, b, c`` of the symmetrised ``[[a, b], [b, c]]``, its trace and (clamped) det."""
    a = s[..., 0, 0]
    b = 0.5 * (s[..., 0, 1] + s[..., 1, 0])
    c = s[..., 1, 1]
    return a, b, c, a + c, (a * c - b * b).clamp_min(0.0)


def w2_squared(m_a: Tensor, S_a: Tensor, m_b: Tensor, S_b: Tensor) -> Tensor:
    """Squared 2-Wasserstein distance between ``N(m_a, S_a)`` and ``N(m_b, S_b)``.

    Means are ``(..., 2)``, covariances ``(..., 2, 2)``; leading dimensions broadcast.
    ``W2^2 = |m_a - m_b|^2 + tr S_a + tr S_b - 2 sqrt(tr(S_a S_b) + 2 sqrt(det S_a det S_b))``,
    clamped at 0.
    """
    for name, m in (("m_a", m_a), ("m_b", m_b)):
        if m.shape[-1:] != (2,):
            raise ValueError(f"{name} must have shape (..., 2), got {tuple(m.shape)}")
    for name, s in (("S_a", S_a), ("S_b", S_b)):
        if s.dim() < 2 or s.shape[-2:] != (2, 2):
            raise ValueError(f"{name} must have shape (..., 2, 2), got {tuple(s.shape)}")
    dm2 = (m_a - m_b).square().sum(dim=-1)
    a1, b1, c1, t1, d1 = _parts(S_a)
    a2, b2, c2, t2, d2 = _parts(S_b)
    tr_ab = a1 * a2 + 2.0 * (b1 * b2) + c1 * c2  # tr(S_a S_b) for symmetric S_a, S_b
    fid = torch.sqrt((tr_ab + 2.0 * torch.sqrt(d1 * d2)).clamp_min(0.0))
    return (dm2 + (t1 + t2) - 2.0 * fid).clamp_min(0.0)


def pairwise_w2_squared(
    means: Tensor,
    covs: Tensor,
    means_b: Tensor | None = None,
    covs_b: Tensor | None = None,
    *,
    chunk_size: int = 1024,
    validate: bool = True,
) -> Tensor:
    """All-pairs ``W2^2`` between ``(K, 2)``/``(K, 2, 2)`` and a second set (default: itself).

    Returns ``(K, K_b)``; rows are computed ``chunk_size`` at a time so temporaries
    stay at ``O(chunk_size * K_b)``. With ``validate`` the covariances are checked SPD.
    """
    if means_b is None:
        means_b, covs_b = means, covs
    elif covs_b is None:
        raise ValueError("covs_b must be given together with means_b")
    for name, m, s in (("means", means, covs), ("means_b", means_b, covs_b)):
        if m.dim() != 2 or m.shape[1] != 2:
            raise ValueError(f"{name} must have shape (K, 2), got {tuple(m.shape)}")
        if s.shape != (m.shape[0], 2, 2):
            raise ValueError(
                f"covariances for {name} must have shape ({m.shape[0]}, 2, 2), got {tuple(s.shape)}"
            )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if validate:
        check_spd(covs, "covs")
        if covs_b is not covs:
            check_spd(covs_b, "covs_b")
    out = torch.empty(means.shape[0], means_b.shape[0], dtype=means.dtype, device=means.device)
    for s in range(0, means.shape[0], chunk_size):
        e = s + chunk_size
        out[s:e] = w2_squared(means[s:e, None], covs[s:e, None], means_b[None], covs_b[None])
    return out
