"""Spatially blocked, candidate-pruned E-step for 2-D Gaussian mixtures (private engine).

The points are sorted into *cells*: a two-level quantile grid (slabs of equal
count along the first coordinate, then equal-count cells along the second inside
each slab), so every cell holds exactly ``m`` points (the last few are padding:
duplicates of a real point with weight 0) and a small bounding box
``[centre - half, centre + half]``.

For a cell ``B`` and a component ``k`` with precision ``P_k``, eigenvalues
``l_min <= l_max`` and ``c_k = log pi_k - 0.5 log det S_k - log 2 pi``:

* ``UB_k = c_k - 0.5 l_min dist(B, m_k)^2`` bounds ``log pi_k N(x | m_k, S_k)``
  from above for every ``x`` in the box (``dist`` is the Euclidean distance from
  ``m_k`` to the box);
* ``LB_k = c_k - 0.5 l_max far(B, m_k)^2`` bounds it from below (``far`` is the
  distance to the farthest corner), so ``max_j LB_j <= max_j log pi_j N(x | j)``.

A component whose ``UB_k < max_j LB_j - margin`` has responsibility below
``exp(-margin)`` at every point of the cell and is dropped from the cell's
*candidate list* (found in two levels: blocks of 8 cells against all components,
then each cell against its block's list). The E-step then runs one batched GEMM
per group of cells over its candidates only. With ``margin = 20`` the truncation
changes each responsibility by less than ``K exp(-20) ~ 2e-9 K`` (relative): a
truncated-posterior EM that is exact to that tolerance, and the hard assignment
``argmax_k`` is exact (the best component is always a candidate).

Log-densities are evaluated as one GEMM, ``phi(u)^T w_k`` with
``phi(u) = [1, u1, u2, u1^2, u1 u2, u2^2]`` in *cell-local* coordinates
``u = x - centre`` and ``w_k = [c_k - 0.5 m'^T P m', (P m')_1, (P m')_2, -P11/2,
-P12, -P22/2]``, ``m' = m_k - centre``. Working in local coordinates keeps the
expanded quadratic free of float32 cancellation for the components near the
cell (the only ones that matter). With ``x = u + z``, ``phi(x) = T(z) phi(u)`` for
a 6x6 matrix ``T(z)``, so the local weights are ``T(z)^T w`` (global weights ``w``).
Sufficient statistics ``sum r phi(u)`` are formed by a second GEMM ``phi^T R`` in
float32 inside the cell and mapped to the global origin, ``sum r phi(x) =
T(z) sum r phi(u)``, in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .linalg2x2 import eigvalsh2x2, inv2x2, logdet2x2

_LOG_2PI = math.log(2.0 * math.pi)
#: log-weight given to the padding ("null") candidate; finite so GEMMs stay NaN-free
_NULL_LOGW = -1e10
#: log-responsibilities (relative to the row maximum) are clamped here before exp:
#: exp() of very negative float32 inputs takes a slow path (4-5x), and exp(-30) = 1e-13.
_CLAMP = 30.0


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


@dataclass
class Components:
    """Mixture parameters in float64, with one trailing "null" component (index ``K``).

    ``const = log pi - 0.5 log det S - log 2 pi``; ``prec = (P11, P12, P22)`` of
    ``P = S^{-1}``; ``lam_min``, ``lam_max`` are the eigenvalues of ``P``.
    """

    const: Tensor
    mean: Tensor
    prec: Tensor
    lam_min: Tensor
    lam_max: Tensor
    n_components: int
    wglobal: Tensor  # (K + 1, 6) GEMM weights at the global origin

    @staticmethod
    def from_params(weights: Tensor, means: Tensor, covs: Tensor) -> Components:
        """Derive evaluation constants from ``weights (K,)``, ``means (K,2)``, ``covs (K,2,2)``."""
        k = int(weights.shape[0])
        w = weights.to(torch.float64)
        mu = means.to(torch.float64)
        s = covs.to(torch.float64)
        p = inv2x2(s)
        lmin, lmax = eigvalsh2x2(p)
        const = torch.log(w) - 0.5 * logdet2x2(s) - _LOG_2PI
        dev = w.device
        one = torch.ones(1, dtype=torch.float64, device=dev)
        const = torch.cat((const, one * _NULL_LOGW))
        mu = torch.cat((mu, torch.zeros(1, 2, dtype=torch.float64, device=dev)))
        prec = torch.cat(
            (
                torch.stack((p[:, 0, 0], p[:, 0, 1], p[:, 1, 1]), dim=1),
                torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64, device=dev),
            )
        )
        a, b, c = prec.unbind(dim=1)
        pm0 = a * mu[:, 0] + b * mu[:, 1]
        pm1 = b * mu[:, 0] + c * mu[:, 1]
        row0 = const - 0.5 * (mu[:, 0] * pm0 + mu[:, 1] * pm1)
        row0[k] = _NULL_LOGW
        wglobal = torch.stack((row0, pm0, pm1, -0.5 * a, -b, -0.5 * c), dim=1)
        wglobal[k, 1:] = 0.0
        return Components(
            const=const,
            mean=mu,
            prec=prec,
            lam_min=torch.cat((lmin, one)),
            lam_max=torch.cat((lmax, one)),
            n_components=k,
            wglobal=wglobal,
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
        if cand is None:
            mean = self.mean[:k].to(f32)[None]
            const = self.const[:k].to(f32)[None]
            lmin = self.lam_min[:k].to(f32)[None]
            lmax = self.lam_max[:k].to(f32)[None]
        else:
            mean = self.mean.to(f32)[cand]
            const = self.const.to(f32)[cand]
            lmin = self.lam_min.to(f32)[cand]
            lmax = self.lam_max.to(f32)[cand]
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


def _compact(mask: Tensor, fill: int, values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Row-wise indices of the True entries of ``mask (B, W)``, padded with ``fill``.

    Returns ``(cand (B, max count), counts (B,))``; with ``values (B, W)``, the entries
    are ``values[r, c]`` instead of the column ``c``.
    """
    counts = mask.sum(dim=1)
    r, c = torch.nonzero(mask, as_tuple=True)
    start = torch.cumsum(counts, 0) - counts
    width = max(1, int(counts.max()))
    cand = torch.full((int(mask.shape[0]), width), fill, dtype=torch.long, device=mask.device)
    cand[r, torch.arange(int(r.shape[0]), device=mask.device) - start[r]] = (
        c if values is None else values[r, c]
    )
    return cand, counts


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


@dataclass
class Plan:
    """Candidate lists: groups ``(cell_ids (G,), cand (G, C) or None for all K)``."""

    groups: list[tuple[Tensor, Tensor | None]]
    mean_candidates: float  # padded candidates evaluated per point


def make_plan(
    layout: CellLayout,
    comps: Components,
    *,
    margin: float = 20.0,
    dense_fraction: float = 0.5,
    bound_chunk: int = 1 << 22,
    block: int = 8,
) -> Plan:
    """Prune each cell's candidate components with the box bounds (see module docstring).

    Two levels: blocks of ``block`` consecutive cells (the union of their boxes) are
    pruned against all ``K`` components, then each cell against its block's
    candidates only; this is exact, because a cell's bounds are at least as tight as
    its block's, and costs ``O(n_cells K / block + n_cells C_block)`` instead of
    ``O(n_cells K)``. Blocks are processed ``bound_chunk // K`` at a time; inside a
    chunk, cells are grouped by candidate count (geometric buckets of ratio 1.5) and
    each group is padded to its largest count with the null component. Cells (or the
    whole plan) whose count exceeds ``dense_fraction * K`` use all components.
    """
    k = comps.n_components
    n_cells = layout.n_cells
    device = layout.feats.device
    all_cells = torch.arange(n_cells, device=device)
    if margin == math.inf or k <= 8:
        return Plan([(all_cells, None)], float(k))
    block = max(1, block if n_cells >= 4 * block and k >= 64 else 1)
    n_blocks = math.ceil(n_cells / block)
    pad = n_blocks * block - n_cells
    lo = layout.centre - layout.half
    hi = layout.centre + layout.half
    if pad:
        lo = torch.cat((lo, lo[-1:].expand(pad, 2)))
        hi = torch.cat((hi, hi[-1:].expand(pad, 2)))
    blo = lo.view(n_blocks, block, 2).amin(dim=1)
    bhi = hi.view(n_blocks, block, 2).amax(dim=1)
    bcentre, bhalf = 0.5 * (blo + bhi), 0.5 * (bhi - blo)
    rows = max(1, bound_chunk // k)
    groups: list[tuple[Tensor, Tensor | None]] = []
    total = 0
    for s in range(0, n_blocks, rows):
        bmask = comps.candidate_mask(bcentre[s : s + rows], bhalf[s : s + rows], margin)
        if block == 1:
            ids = all_cells[s : s + rows]
            cand, counts = _compact(bmask, k)
        else:
            ids, cand, counts = _refine_blocks(layout, comps, bmask, s, block, margin)
        bucket = torch.floor(torch.log(counts.double().clamp_min(1.0)) / math.log(1.5)).long()
        order = torch.argsort(bucket)
        _, sizes = torch.unique_consecutive(bucket[order], return_counts=True)
        pos = 0
        for size in sizes.tolist():
            sel = order[pos : pos + size]
            pos += size
            cmax = int(counts[sel].max())
            if cmax > dense_fraction * k:
                groups.append((ids[sel], None))
                total += k * size
            else:
                groups.append((ids[sel], cand[sel, :cmax].contiguous()))
                total += cmax * size
    mean_count = total / max(1, n_cells)
    if mean_count > dense_fraction * k:
        return Plan([(all_cells, None)], float(k))
    return Plan(groups, mean_count)


def _refine_blocks(
    layout: CellLayout, comps: Components, bmask: Tensor, first: int, block: int, margin: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Cell-level candidates inside blocks ``first, first + 1, ...`` with mask ``bmask``.

    Blocks are bucketed by candidate count (ratio 2) so that each bucket's cells are
    checked against a list padded only to that bucket's width. Returns the cell ids,
    their candidates ``(n, C)`` (padded with the null index ``K``) and counts.
    """
    k = comps.n_components
    n_cells = layout.n_cells
    device = bmask.device
    bcand, bcounts = _compact(bmask, k)
    bucket = torch.floor(torch.log2(bcounts.double().clamp_min(1.0))).long()
    order = torch.argsort(bucket)
    _, sizes = torch.unique_consecutive(bucket[order], return_counts=True)
    offs = torch.arange(block, device=device)
    parts = []
    pos = 0
    for size in sizes.tolist():
        blocks = order[pos : pos + size]
        pos += size
        width = int(bcounts[blocks].max())
        ids = ((first + blocks)[:, None] * block + offs[None, :]).flatten()
        valid = ids < n_cells
        sub = bcand[blocks, :width].repeat_interleave(block, dim=0)[valid]
        ids = ids[valid]
        cmask = comps.candidate_mask(layout.centre[ids], layout.half[ids], margin, sub)
        cand, counts = _compact(cmask, k, sub)
        parts.append((ids, cand, counts))
    width = max(int(p[1].shape[1]) for p in parts)
    ids = torch.cat([p[0] for p in parts])
    cand = torch.cat(
        [torch.nn.functional.pad(p[1], (0, width - int(p[1].shape[1])), value=k) for p in parts]
    )
    counts = torch.cat([p[2] for p in parts])
    return ids, cand, counts


@dataclass
class PassResult:
    """Output of one E-step pass.

    ``ll_sum``: sum of weighted per-point log-likelihoods (float64 scalar tensor);
    ``weight_sum``: sum of point weights; ``stats``: ``(K, 6)`` float64
    ``[sum r, sum r x1, sum r x2, sum r x1^2, sum r x1 x2, sum r x2^2]`` (global
    standardised coordinates) or None; ``lse`` / ``argmax``: per-point outputs in
    input order (or None).
    """

    ll_sum: Tensor
    weight_sum: Tensor
    stats: Tensor | None
    lse: Tensor | None
    argmax: Tensor | None


class Engine:
    """Runs E-step passes over a :class:`CellLayout` with a reusable work buffer."""

    def __init__(self, dtype: torch.dtype, device: torch.device, chunk_rows: int, max_elems: int):
        self.dtype = dtype
        self.device = device
        self.chunk_rows = max(1, int(chunk_rows))
        self.max_elems = max(1, int(max_elems))
        self._buf: Tensor | None = None

    def _buffer(self, n: int) -> Tensor:
        if self._buf is None or self._buf.numel() < n:
            self._buf = torch.empty(n, dtype=self.dtype, device=self.device)
        return self._buf[:n]

    def release(self) -> None:
        """Free the work buffer."""
        self._buf = None

    def run(
        self,
        layout: CellLayout,
        comps: Components,
        plan: Plan,
        *,
        cols: tuple[int, int] | None = None,
        want_stats: bool = False,
        want_lse: bool = False,
        want_argmax: bool = False,
        resp_out: Tensor | None = None,
    ) -> PassResult:
        """One pass over columns ``cols`` (all if None) of every cell.

        Per chunk of cells: ``L = phi W`` (GEMM), ``M = max_k L``,
        ``R = exp(max(L - M, -30))``, ``s = sum_k R``, ``log p(x) = M + log s``; with
        ``want_stats``, ``phi^T (R / s)`` (GEMM) gives the local sufficient statistics.
        ``resp_out`` (``(N, K)``, dense plans only) receives the responsibilities.
        """
        k = comps.n_components
        c0, c1 = (0, layout.cell_size) if cols is None else cols
        rows = c1 - c0
        feats_v = layout.feats[:, c0:c1]
        weight_v = layout.weight[:, c0:c1]
        index_v = layout.index[:, c0:c1]
        f64 = torch.float64
        ll_sum = torch.zeros((), dtype=f64, device=self.device)
        stats = torch.zeros(k + 1, 6, dtype=f64, device=self.device) if want_stats else None
        n_out = layout.n_points
        lse_out = torch.empty(n_out, dtype=self.dtype, device=self.device) if want_lse else None
        am_out = torch.empty(n_out, dtype=torch.long, device=self.device) if want_argmax else None
        all_k = torch.arange(k, device=self.device)
        for ids, cand in plan.groups:
            c = k if cand is None else int(cand.shape[1])
            per = max(1, min(self.chunk_rows // rows, self.max_elems // (rows * c)))
            for s in range(0, int(ids.shape[0]), per):
                sub = ids[s : s + per]
                csub = None if cand is None else cand[s : s + per]
                b = int(sub.shape[0])
                f = feats_v.index_select(0, sub)
                w = weight_v.index_select(0, sub)
                shift = shift_matrices(layout.centre.index_select(0, sub))
                wk = comps.gemm_weights(shift, csub, self.dtype)
                lg = self._buffer(b * rows * c).view(b, rows, c)
                torch.bmm(f, wk, out=lg)
                mx = lg.amax(dim=-1, keepdim=True)
                am = lg.argmax(dim=-1) if want_argmax else None
                lg.sub_(mx).clamp_(min=-_CLAMP).exp_()
                tot = lg.sum(dim=-1, keepdim=True)
                lse = (mx + torch.log(tot)).squeeze(-1)
                ll_sum += (lse * w).sum(dtype=f64)
                if want_stats:
                    fw = f * (w / tot.squeeze(-1)).unsqueeze(-1)
                    st = torch.bmm(fw.transpose(1, 2), lg).to(f64)
                    # local moments -> global: sum r phi(x) = T(z) sum r phi(u)
                    gst = torch.bmm(shift, st).transpose(1, 2).reshape(-1, 6)
                    idx = all_k.expand(b, k) if csub is None else csub
                    stats.index_add_(0, idx.reshape(-1), gst)
                if want_lse or want_argmax or resp_out is not None:
                    real = w.flatten() > 0
                    dest = index_v.index_select(0, sub).flatten()[real]
                    if want_lse:
                        lse_out[dest] = lse.flatten()[real].to(self.dtype)
                    if want_argmax:
                        glob = am if csub is None else torch.gather(csub, 1, am)
                        am_out[dest] = glob.flatten()[real]
                    if resp_out is not None:
                        if csub is not None:
                            raise RuntimeError("resp_out needs a dense plan")
                        lg.div_(tot)
                        resp_out[dest] = lg.reshape(b * rows, c)[real].to(resp_out.dtype)
        weight_sum = weight_v.sum(dtype=f64)
        return PassResult(
            ll_sum=ll_sum,
            weight_sum=weight_sum,
            stats=None if stats is None else stats[:k],
            lse=lse_out,
            argmax=am_out,
        )
