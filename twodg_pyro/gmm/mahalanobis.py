"""Mahalanobis check and alpha-blending of "ellipse" points (2DGBNN Stage 2, Sec. 4.3, Eq. 7).

For a point ``x`` and component ``k``: ``D2_k(x) = (x - m_k)^T S_k^{-1} (x - m_k)``.
A point assigned to component ``c`` is an *ellipse* point when
``D2_c(x) > threshold`` (default ``5.991``, the 95% quantile of chi-square with 2
degrees of freedom). It is then tied to its ``k`` nearest components by
Mahalanobis distance with blending weights
``alpha_j = N(x | m_j, S_j) / sum_{l in nearest} N(x | m_l, S_l)``, computed in log
space (a softmax of ``-0.5 D2_j - 0.5 log det S_j``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .linalg2x2 import _check_finite_rows, _check_int, _shape, check_spd, inv2x2, logdet2x2

CHI2_2DOF_95 = 5.991
_LOG_2PI = math.log(2.0 * math.pi)
#: (point, component) distances per chunk of the ellipse step: temporaries of 1 MiB stay in
#: the cache (at K = 6000, 6-7x faster than chunks of 2^24; every row's distances, top-k and
#: softmax are the same whatever the chunk)
_CHUNK_ELEMS = 1 << 18


def _check_inputs(points: Tensor, means: Tensor, covs: Tensor) -> None:
    if not isinstance(points, Tensor) or points.dim() != 2 or points.shape[1] != 2:
        raise ValueError(f"points must be an (N, 2) tensor, got {_shape(points)}")
    _check_finite_rows("points", points)
    if not isinstance(means, Tensor) or means.dim() != 2 or means.shape[1] != 2:
        raise ValueError(f"means must be a (K, 2) tensor, got {_shape(means)}")
    if means.shape[0] < 1:
        raise ValueError("means must hold at least one component")
    if not isinstance(covs, Tensor) or tuple(covs.shape) != (means.shape[0], 2, 2):
        raise ValueError(f"covs must have shape ({means.shape[0]}, 2, 2), got {_shape(covs)}")
    check_spd(covs, "covs")


def _quad(d0: Tensor, d1: Tensor, pa: Tensor, pb: Tensor, pc: Tensor) -> Tensor:
    return pa * d0 * d0 + 2.0 * pb * d0 * d1 + pc * d1 * d1


def _d2_all(
    points: Tensor, means: Tensor, prec: Tensor, chunk_size: int, const: Tensor | None = None
) -> Tensor:
    """``(N, K)`` squared Mahalanobis distances ``D2`` to every component (with ``const``:
    ``const - 0.5 D2``), ``chunk_size`` rows at a time, on the centred differences."""
    pa, pb, pc = prec[:, 0, 0], prec[:, 0, 1], prec[:, 1, 1]
    out = torch.empty(points.shape[0], means.shape[0], dtype=points.dtype, device=points.device)
    for s in range(0, points.shape[0], chunk_size):
        x = points[s : s + chunk_size]
        d0 = x[:, 0:1] - means[None, :, 0]
        d1 = x[:, 1:2] - means[None, :, 1]
        q = _quad(d0, d1, pa, pb, pc)
        out[s : s + chunk_size] = q if const is None else const - 0.5 * q
    return out


def gaussian_log_prob(
    points: Tensor, means: Tensor, covs: Tensor, *, chunk_size: int = 65_536
) -> Tensor:
    """Log-density of every point under every component: ``(N, K)``.

    ``log N(x | m, S) = -log(2 pi) - 0.5 log det S - 0.5 (x - m)^T S^{-1} (x - m)``,
    evaluated on the centred differences ``x - m`` (no expanded quadratic, so no
    cancellation), in chunks of ``chunk_size`` points.
    """
    _check_inputs(points, means, covs)
    return _d2_all(points, means, inv2x2(covs), chunk_size, -_LOG_2PI - 0.5 * logdet2x2(covs))


def mahalanobis_squared(
    points: Tensor, means: Tensor, covs: Tensor, *, chunk_size: int = 65_536
) -> Tensor:
    """``D2[i, k] = (x_i - m_k)^T S_k^{-1} (x_i - m_k)``; ``(N, K)``, ``chunk_size`` rows at a time.

    Evaluated on the centred differences (no expanded quadratic).
    """
    _check_inputs(points, means, covs)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _d2_all(points, means, inv2x2(covs), chunk_size)


def _check_assign(assign: Tensor, n: int, k: int) -> None:
    if not isinstance(assign, Tensor) or assign.is_floating_point() or assign.is_complex():
        raise ValueError("assign must be an integer tensor of component indices")
    if tuple(assign.shape) != (n,):
        raise ValueError(f"assign must have shape ({n},), got {tuple(assign.shape)}")
    bad = (assign < 0) | (assign >= k)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"assign[{i}] = {int(assign[i])} is not a component index in [0, {k})")


def mahalanobis_squared_own(points: Tensor, means: Tensor, covs: Tensor, assign: Tensor) -> Tensor:
    """Distance to the own component, ``(N,)``.

    ``D2_i = (x_i - m_{c_i})^T S_{c_i}^{-1} (x_i - m_{c_i})`` with ``c_i = assign[i]``.
    """
    _check_inputs(points, means, covs)
    _check_assign(assign, int(points.shape[0]), int(means.shape[0]))
    return _d2_own(points, means, inv2x2(covs), assign)


def _d2_own(points: Tensor, means: Tensor, prec: Tensor, assign: Tensor) -> Tensor:
    p = prec[assign]
    d = points - means[assign]
    return _quad(d[:, 0], d[:, 1], p[:, 0, 0], p[:, 0, 1], p[:, 1, 1])


@dataclass
class EllipseAssignment:
    """Result of :func:`ellipse_assign`.

    Attributes:
        mask: ``(N,)`` bool, ``D2`` to the own component ``> threshold``.
        indices: ``(n_e,)`` positions of the ellipse points (``nonzero(mask)``).
        components: ``(n_e, k)`` the ``k`` nearest components by Mahalanobis distance,
            nearest first.
        alphas: ``(n_e, k)`` blending weights ``proportional to N(x | m_j, S_j)``, rows sum to 1.
        d2_own: ``(N,)`` squared Mahalanobis distance to the own component.
        k: number of neighbours actually used (``min(k, K)``).
    """

    mask: Tensor
    indices: Tensor
    components: Tensor
    alphas: Tensor
    d2_own: Tensor
    k: int


def ellipse_assign(
    points: Tensor,
    means: Tensor,
    covs: Tensor,
    assign: Tensor,
    *,
    threshold: float = CHI2_2DOF_95,
    k: int = 5,
    chunk_size: int = 65_536,
    progress: bool = False,
    scope: tuple[Tensor, Tensor] | None = None,
) -> EllipseAssignment:
    """Flag ellipse points and compute their ``k`` nearest components and blending weights.

    ``mask_i = D2_{c_i}(x_i) > threshold``. For flagged points, ``components`` are the
    ``k`` smallest ``D2_j(x_i)`` over all ``K`` components (nearest first),
    and ``alphas = softmax_j(-0.5 D2_j - 0.5 log det S_j)`` over those ``k``, i.e.
    ``N(x | m_j, S_j)`` normalised to sum to one (the ``2 pi`` factor cancels). If
    ``k > K`` all ``K`` components are used (``k = K``). Work is chunked over
    ``chunk_size`` points; no Python loop over points or components. ``progress`` shows
    a tqdm bar (``"Mahalanobis"``, on stderr) over the flagged points.

    ``scope = (group, allowed)`` (``(N,)`` group of each point, ``(G, K)`` bool) restricts
    a point's candidates to the components its group allows (a layer's own, with a
    codebook per layer): they rank first, and only a group with fewer than ``k`` of them
    borrows the nearest others (every ``alpha`` still from the true ``D2``).
    """
    _check_inputs(points, means, covs)
    n, kk = int(points.shape[0]), int(means.shape[0])
    _check_assign(assign, n, kk)
    try:
        thr = float(threshold)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}") from exc
    if not math.isfinite(thr) or thr <= 0:
        raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
    _check_int("k", k, 1)
    _check_int("chunk_size", chunk_size, 1)
    if scope is not None and (scope[0].shape != (n,) or scope[1].shape[1:] != (kk,)):
        raise ValueError(f"scope must be ((N,) groups, (G, K) mask) for {n} points, K = {kk}")
    k_eff = min(k, kk)
    prec = inv2x2(covs)
    half_logdet = 0.5 * logdet2x2(covs)
    d2_own = _d2_own(points, means, prec, assign)
    mask = d2_own > thr
    idx = torch.nonzero(mask).flatten()
    n_e = int(idx.numel())
    comps = torch.empty(n_e, k_eff, dtype=torch.long, device=points.device)
    alphas = torch.empty(n_e, k_eff, dtype=points.dtype, device=points.device)
    rows = max(1, min(chunk_size, _CHUNK_ELEMS // kk))
    with tqdm(total=n_e, desc="Mahalanobis", unit="pt", disable=not progress, leave=False) as bar:
        bar.set_postfix_str(f"K {kk}, flagged {n_e} of {n}")
        for s in range(0, n_e, rows):
            sel = idx[s : s + rows]
            d2 = _d2_all(points[sel], means, prec, rows)
            key = d2
            if scope is not None:  # the group's components first, then the others
                ok = scope[1][scope[0][sel]]
                key = torch.where(ok, d2, d2 + d2.amax(1, keepdim=True) + 1.0)
            nb = torch.topk(key, k_eff, dim=1, largest=False, sorted=True).indices
            val = d2.gather(1, nb)
            comps[s : s + rows] = nb
            alphas[s : s + rows] = torch.softmax(-0.5 * val - half_logdet[nb], dim=1)
            bar.update(int(sel.numel()))
    return EllipseAssignment(
        mask=mask, indices=idx, components=comps, alphas=alphas, d2_own=d2_own, k=k_eff
    )
