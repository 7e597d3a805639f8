"""The points of an E-step, sorted into spatial cells (part of the engine in ``_cells``).

The cells are a two-level quantile grid: slabs of equal count along the first
coordinate, then equal-count cells along the second inside each slab, so every cell
holds exactly ``m`` points (the last few are padding: duplicates of a real point with
weight 0) and a small bounding box ``[centre - half, centre + half]``.  Each point is
stored by its features in *cell-local* coordinates ``u = x - centre`` (see
``_components`` for why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


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
    lo = xs.amin(dim=1)
    hi = xs.amax(dim=1)
    centre = 0.5 * (lo + hi)
    half = 0.5 * (hi - lo)
    u = (xs - centre[:, None, :]).to(dtype)
    del xs
    u1, u2 = u[..., 0], u[..., 1]
    feats = torch.stack((torch.ones_like(u1), u1, u2, u1 * u1, u1 * u2, u2 * u2), dim=-1)
    return CellLayout(
        feats=feats,
        weight=real.to(dtype),
        index=order,
        centre=centre,
        half=half,
        n_points=n_pts,
    )
