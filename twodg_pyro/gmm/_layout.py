"""The E-step's data (part of the engine in ``_cells``): the points sorted into spatial
cells, and the mixture components as the E-step evaluates them.

The cells are a two-level quantile grid: slabs of equal count along the first
coordinate, then equal-count cells along the second inside each slab, so every cell
holds exactly ``m`` points (the last few are padding: duplicates of a real point with
weight 0) and a small bounding box ``[centre - half, centre + half]``.  Each point is
stored by its features in *cell-local* coordinates ``u = x - centre``.

Log-densities are evaluated as one GEMM, ``phi(u)^T w_k`` with
``phi(u) = [1, u1, u2, u1^2, u1 u2, u2^2]`` in cell-local coordinates and
``w_k = [c_k - 0.5 m'^T P m', (P m')_1, (P m')_2, -P11/2,
-P12, -P22/2]``, ``m' = m_k - centre``, ``c_k = log pi_k - 0.5 log det S_k - log 2 pi``
and ``P_k = S_k^{-1}``. Working in local coordinates keeps the expanded quadratic free
of float32 cancellation for the components near the cell (the only ones that matter).
With ``x = u + z``, ``phi(x) = T(z) phi(u)`` for a 6x6 matrix ``T(z)``
(:func:`shift_matrices`), so the local weights are ``T(z)^T w`` (global weights ``w``),
and local sufficient statistics map to the global origin by ``T(z)``.

:meth:`Components.candidate_mask` holds the box bounds that prune components from a
cell (see ``_cells``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .linalg2x2 import eigvalsh2x2, inv2x2, logdet2x2


@dataclass
class CellLayout:
    """Points of one data set, grouped into spatial cells of equal size ``m``.

    Attributes:
        feats: ``(n_cells, m, 6)`` features ``[1, u1, u2, u1^2, u1 u2, u2^2]``,
            ``u = x - centre`` of the point's cell.
        weight: ``(n_cells, m)`` 1 for a real point, 0 for padding.
        index: ``(n_cells, m)`` row of each point in the input (padding repeats one).
        centre: ``(n_cells, 2)`` float64 box centres.
        half: ``(n_cells, 2)`` float64 box half-widths.
        n_points: number of real points.
    """

    feats: Tensor
    weight: Tensor
    index: Tensor
    centre: Tensor
    half: Tensor
    n_points: int

    @property
    def n_cells(self) -> int:
        return int(self.feats.shape[0])

    @property
    def cell_size(self) -> int:
        return int(self.feats.shape[1])

    def shuffle_within_cells(self, generator: torch.Generator | None) -> None:
        """Permute the points inside every cell at random (for stratified mini-batches)."""
        n, m = self.weight.shape
        perm = torch.argsort(
            torch.rand(n, m, generator=generator, device=self.weight.device), dim=1
        )
        self.feats = torch.gather(self.feats, 1, perm[..., None].expand(n, m, 6))
        self.weight = torch.gather(self.weight, 1, perm)
        self.index = torch.gather(self.index, 1, perm)


def default_cell_size(n_points: int, n_components: int) -> int:
    """Points per cell: about ``N / K`` (one component's share), clipped to [64, 4096]."""
    return int(min(4096, max(64, n_points // max(1, n_components))))


def grid_shape(n_pts: int, cell_size: int) -> tuple[int, int, int]:
    """``(g1, g2, m)``: the ``g1 x g2`` grid of cells of ``m`` points that
    :func:`build_cells` makes for ``n_pts`` points (its one random draw is ``(g1 g2, m)``)."""
    n_target = max(1, math.ceil(n_pts / max(1, cell_size)))
    g1 = max(1, math.ceil(math.sqrt(n_target)))
    g2 = max(1, math.ceil(n_target / g1))
    return g1, g2, math.ceil(n_pts / (g1 * g2))


def build_cells(
    z: Tensor, cell_size: int, dtype: torch.dtype, generator: torch.Generator | None = None
) -> CellLayout:
    """Sort ``z`` (``(N, 2)``) into a quantile grid of cells holding ``~cell_size`` points.

    ``g1 x g2`` cells with ``g1 = ceil(sqrt(n))``, ``g2 = ceil(n / g1)``,
    ``n = ceil(N / cell_size)``; slabs along ``z[:, 0]`` then cells along ``z[:, 1]``.
    Points inside a cell are put in random order.
    """
    n_pts = int(z.shape[0])
    device = z.device
    g1, g2, m = grid_shape(n_pts, cell_size)
    total = g1 * g2 * m
    order = torch.argsort(z[:, 0])
    if total > n_pts:
        order = torch.cat((order, order[-1:].expand(total - n_pts)))
    real = torch.arange(total, device=device) < n_pts
    order = order.view(g1, g2 * m)
    real = real.view(g1, g2 * m)
    o2 = torch.argsort(z[order, 1], dim=1)
    order = torch.gather(order, 1, o2).view(g1 * g2, m)
    real = torch.gather(real, 1, o2).view(g1 * g2, m)
    perm = torch.argsort(torch.rand(g1 * g2, m, generator=generator, device=device), dim=1)
    order = torch.gather(order, 1, perm)
    real = torch.gather(real, 1, perm)

    xs = z[order].to(torch.float64)  # (n_cells, m, 2)
    lo, hi = xs.amin(dim=1), xs.amax(dim=1)
    centre, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    u = (xs - centre[:, None, :]).to(dtype)
    del xs
    u1, u2 = u[..., 0], u[..., 1]
    feats = torch.stack((torch.ones_like(u1), u1, u2, u1 * u1, u1 * u2, u2 * u2), dim=-1)
    return CellLayout(feats, real.to(dtype), order, centre, half, n_pts)


_LOG_2PI = math.log(2.0 * math.pi)
#: log-weight given to the padding ("null") candidate; finite so GEMMs stay NaN-free
_NULL_LOGW = -1e10


@dataclass
class Components:
    """Mixture parameters in float64, with one trailing "null" component (index ``K``).

    ``const = log pi - 0.5 log det S - log 2 pi``; ``lam_min``, ``lam_max`` are the
    eigenvalues of the precision ``P = S^{-1}``.
    """

    const: Tensor
    mean: Tensor
    lam_min: Tensor
    lam_max: Tensor
    n_components: int
    wglobal: Tensor  # (K + 1, 6) GEMM weights at the global origin

    @staticmethod
    def from_params(weights: Tensor, means: Tensor, covs: Tensor) -> Components:
        """Derive evaluation constants from ``weights (K,)``, ``means (K,2)``, ``covs (K,2,2)``."""
        k = int(weights.shape[0])
        w, mu, s = (t.to(torch.float64) for t in (weights, means, covs))
        p = inv2x2(s)
        lmin, lmax = eigvalsh2x2(p)
        const = torch.log(w) - 0.5 * logdet2x2(s) - _LOG_2PI
        a, b, c = p[:, 0, 0], p[:, 0, 1], p[:, 1, 1]
        pm0 = a * mu[:, 0] + b * mu[:, 1]
        pm1 = b * mu[:, 0] + c * mu[:, 1]
        row0 = const - 0.5 * (mu[:, 0] * pm0 + mu[:, 1] * pm1)
        wglobal = torch.stack((row0, pm0, pm1, -0.5 * a, -b, -0.5 * c), dim=1)
        one = torch.ones(1, dtype=torch.float64, device=w.device)
        null = torch.cat((one * _NULL_LOGW, one.new_zeros(5)))[None]  # the null component's row
        return Components(
            const=torch.cat((const, one * _NULL_LOGW)),
            mean=torch.cat((mu, mu.new_zeros(1, 2))),
            lam_min=torch.cat((lmin, one)),
            lam_max=torch.cat((lmax, one)),
            n_components=k,
            wglobal=torch.cat((wglobal, null)),
        )

    def gemm_weights(self, shift: Tensor, cand: Tensor | None, dtype: torch.dtype) -> Tensor:
        """``(B, 6, C)`` weights ``w_k`` in the local coordinates of ``B`` cells.

        ``shift`` is :func:`shift_matrices` of the cell centres; ``cand`` is ``(B, C)``
        component indices, or ``None`` for all ``K`` components. With ``x = u + z``,
        ``phi(x) = T(z) phi(u)``, so the local weights are ``T(z)^T W`` (float64).
        """
        k = self.n_components
        if cand is None:
            g = self.wglobal[:k].t()[None].expand(shift.shape[0], 6, k)
        else:
            g = self.wglobal[cand].transpose(1, 2)
        return torch.bmm(shift.transpose(1, 2), g).to(dtype)

    def candidate_mask(
        self, centre: Tensor, half: Tensor, margin: float, cand: Tensor | None = None
    ) -> Tensor:
        """Bool mask ``UB_k >= max_j LB_j - margin`` for boxes ``centre, half (B, 2)``.

        Over all ``K`` components (``(B, K)``), or over the ``(B, W)`` component indices
        ``cand`` (``(B, W)``; the null index ``K`` is never kept). The maximum of ``LB``
        over a subset is still a valid lower bound of the per-point maximum. Evaluated
        in float32 (the 20-nat margin dwarfs the rounding).
        """
        k = self.n_components
        f32 = torch.float32
        z = centre.to(f32)
        h = half.to(f32)
        rows = (None, slice(None, k)) if cand is None else cand
        mean, const, lmin, lmax = (
            t.to(f32)[rows] for t in (self.mean, self.const, self.lam_min, self.lam_max)
        )
        d0 = (mean[..., 0] - z[:, 0:1]).abs_()
        d1 = (mean[..., 1] - z[:, 1:2]).abs_()
        far = (d0 + h[:, 0:1]).square_()
        far.addcmul_(d1 + h[:, 1:2], d1 + h[:, 1:2])
        lb = torch.addcmul(const, far, lmax, value=-0.5)
        thr = lb.amax(dim=1, keepdim=True) - margin
        del far, lb
        near = d0.sub_(h[:, 0:1]).clamp_min_(0.0).square_()
        gap1 = d1.sub_(h[:, 1:2]).clamp_min_(0.0)
        near.addcmul_(gap1, gap1)
        ub = torch.addcmul(const, near, lmin, value=-0.5)
        keep = ub >= thr
        if cand is not None:
            keep &= cand < k
        return keep


_SHIFT_BASIS: dict[torch.device, Tensor] = {}


def _shift_basis(device: torch.device) -> Tensor:
    """``A (6, 36)`` with ``T(z) = (pz @ A).view(6, 6)``, ``pz = [1, z0, z1, z0^2, z0 z1, z1^2]``.

    ``T(z)`` maps the features ``phi(u) = [1, u0, u1, u0^2, u0 u1, u1^2]`` to
    ``phi(u + z) = T(z) phi(u)``.
    """
    a = torch.zeros(6, 6, 6, dtype=torch.float64)
    for f in range(6):
        a[0, f, f] = 1.0  # identity
    a[1, 1, 0] = a[1, 4, 2] = 1.0  # z0: x0 <- z0, x0 x1 <- z0 u1
    a[1, 3, 1] = 2.0  # x0^2 <- 2 z0 u0
    a[2, 2, 0] = a[2, 4, 1] = 1.0  # z1: x1 <- z1, x0 x1 <- z1 u0
    a[2, 5, 2] = 2.0  # x1^2 <- 2 z1 u1
    a[3, 3, 0] = a[4, 4, 0] = a[5, 5, 0] = 1.0  # z0^2, z0 z1, z1^2 constants
    if device not in _SHIFT_BASIS:
        _SHIFT_BASIS[device] = a.view(6, 36).to(device)
    return _SHIFT_BASIS[device]


def shift_matrices(centre: Tensor) -> Tensor:
    """``(B, 6, 6)`` float64 ``T(z)`` for cell centres ``z (B, 2)``: ``phi(u + z) = T phi(u)``."""
    z0, z1 = centre[:, 0], centre[:, 1]
    pz = torch.stack((torch.ones_like(z0), z0, z1, z0 * z0, z0 * z1, z1 * z1), dim=1)
    return (pz.to(torch.float64) @ _shift_basis(centre.device)).view(-1, 6, 6)
