"""Spatially blocked, candidate-pruned E-step for 2-D Gaussian mixtures (private engine).

The points are sorted into *cells* of equal size with small bounding boxes
(``_layout``); per cell, box bounds on every component's log-density drop the
components that cannot carry a responsibility above ``exp(-margin)`` there
(:func:`make_plan`); the :class:`Engine` then runs one batched GEMM per group of cells
over its candidates only, in cell-local coordinates (``_layout``).  Sufficient
statistics ``sum r phi(u)`` are formed by a second GEMM ``phi^T R`` in float32 inside
the cell and mapped to the global origin, ``sum r phi(x) = T(z) sum r phi(u)``, in
float64.

**Candidate pruning.** For a cell ``B`` and a component ``k`` with precision ``P_k``,
eigenvalues ``l_min <= l_max`` and ``c_k = log pi_k - 0.5 log det S_k - log 2 pi``:

* ``UB_k = c_k - 0.5 l_min dist(B, m_k)^2`` bounds ``log pi_k N(x | m_k, S_k)``
  from above for every ``x`` in the box (``dist`` is the Euclidean distance from
  ``m_k`` to the box);
* ``LB_k = c_k - 0.5 l_max far(B, m_k)^2`` bounds it from below (``far`` is the
  distance to the farthest corner), so ``max_j LB_j <= max_j log pi_j N(x | j)``.

A component whose ``UB_k < max_j LB_j - margin`` has responsibility below
``exp(-margin)`` at every point of the cell and is dropped from the cell's
*candidate list* (found in two levels: blocks of 8 cells against all components,
then each cell against its block's list). With ``margin = 20`` the truncation
changes each responsibility by less than ``K exp(-20) ~ 2e-9 K`` (relative): a
truncated-posterior EM that is exact to that tolerance, and the hard assignment
``argmax_k`` is exact (the best component is always a candidate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._layout import CellLayout, Components, shift_matrices

#: cells per block of the first pruning level
_BLOCK = 8
#: (block, component) bounds evaluated at once
_BOUND_CHUNK = 1 << 22
#: the share of the K components above which a group of cells evaluates all of them
_DENSE_FRACTION = 0.5


def _by_bucket(bucket: Tensor) -> tuple[Tensor, ...]:
    """The indices of ``bucket (B,)`` grouped by value, the groups in increasing order."""
    order = torch.argsort(bucket)
    _, sizes = torch.unique_consecutive(bucket[order], return_counts=True)
    return torch.split(order, sizes.tolist())


def _compact(mask: Tensor, fill: int, values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(cand (B, max count), counts (B,))``: row-wise columns (or ``values[r, c]``) of the
    True entries of ``mask (B, W)``, padded with ``fill``."""
    counts = mask.sum(dim=1)
    r, c = torch.nonzero(mask, as_tuple=True)
    start = torch.cumsum(counts, 0) - counts
    width = max(1, int(counts.max()))
    cand = torch.full((int(mask.shape[0]), width), fill, dtype=torch.long, device=mask.device)
    cand[r, torch.arange(int(r.shape[0]), device=mask.device) - start[r]] = (
        c if values is None else values[r, c]
    )
    return cand, counts


@dataclass
class Plan:
    """Candidate lists: groups ``(cell_ids (G,), cand (G, C) or None for all K)``."""

    groups: list[tuple[Tensor, Tensor | None]]
    mean_candidates: float  # padded candidates evaluated per point


def make_plan(layout: CellLayout, comps: Components, *, margin: float = 20.0) -> Plan:
    """Prune each cell's candidate components with the box bounds (see module docstring).

    Two levels: blocks of 8 consecutive cells (the union of their boxes) are
    pruned against all ``K`` components, then each cell against its block's
    candidates only; this is exact, because a cell's bounds are at least as tight as
    its block's, and costs ``O(n_cells K / block + n_cells C_block)`` instead of
    ``O(n_cells K)``. Blocks are processed ``2^22 // K`` at a time; inside a chunk,
    cells are grouped by candidate count (geometric buckets of ratio 1.5) and each group
    is padded to its largest count with the null component. Cells (or the whole plan)
    whose count exceeds ``K / 2`` use all components.
    """
    k = comps.n_components
    n_cells = layout.n_cells
    device = layout.feats.device
    all_cells = torch.arange(n_cells, device=device)
    if margin == math.inf or k <= 8:
        return Plan([(all_cells, None)], float(k))
    block = _BLOCK if n_cells >= 4 * _BLOCK and k >= 64 else 1
    n_blocks = math.ceil(n_cells / block)
    pad = n_blocks * block - n_cells
    lo, hi = layout.centre - layout.half, layout.centre + layout.half
    if pad:
        lo = torch.cat((lo, lo[-1:].expand(pad, 2)))
        hi = torch.cat((hi, hi[-1:].expand(pad, 2)))
    blo, bhi = lo.view(n_blocks, block, 2).amin(dim=1), hi.view(n_blocks, block, 2).amax(dim=1)
    bcentre, bhalf = 0.5 * (blo + bhi), 0.5 * (bhi - blo)
    rows = max(1, _BOUND_CHUNK // k)
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
        for sel in _by_bucket(bucket):
            cmax = int(counts[sel].max())
            dense = cmax > _DENSE_FRACTION * k
            groups.append((ids[sel], None if dense else cand[sel, :cmax].contiguous()))
            total += (k if dense else cmax) * int(sel.shape[0])
    mean_count = total / max(1, n_cells)
    if mean_count > _DENSE_FRACTION * k:
        return Plan([(all_cells, None)], float(k))
    return Plan(groups, mean_count)


def _refine_blocks(
    layout: CellLayout, comps: Components, bmask: Tensor, first: int, block: int, margin: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``(cell ids, candidates (n, C) padded with K, counts)`` inside blocks ``first, ...``
    with mask ``bmask``; blocks are bucketed by candidate count (ratio 2) so that each
    bucket's cells are checked against a list padded only to that bucket's width."""
    k = comps.n_components
    n_cells = layout.n_cells
    device = bmask.device
    bcand, bcounts = _compact(bmask, k)
    bucket = torch.floor(torch.log2(bcounts.double().clamp_min(1.0))).long()
    offs = torch.arange(block, device=device)
    parts = []
    for blocks in _by_bucket(bucket):
        width = int(bcounts[blocks].max())
        ids = ((first + blocks)[:, None] * block + offs[None, :]).flatten()
        valid = ids < n_cells
        sub = bcand[blocks, :width].repeat_interleave(block, dim=0)[valid]
        ids = ids[valid]
        cmask = comps.candidate_mask(layout.centre[ids], layout.half[ids], margin, sub)
        cand, counts = _compact(cmask, k, sub)
        parts.append((ids, cand, counts))
    ids, cands, counts = zip(*parts, strict=True)
    width = max(int(c.shape[1]) for c in cands)
    cand = torch.cat(
        [torch.nn.functional.pad(c, (0, width - int(c.shape[1])), value=k) for c in cands]
    )
    return torch.cat(ids), cand, torch.cat(counts)


#: cap on (point, candidate) pairs held in the work buffer (128 MiB in float32)
MAX_ELEMS = 1 << 25
#: log-responsibilities (relative to the row maximum) are clamped here before exp:
#: exp() of very negative float32 inputs takes a slow path (4-5x), and exp(-30) = 1e-13.
_CLAMP = 30.0


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
    """Runs E-step passes over a :class:`CellLayout` with a reusable work buffer of at most
    ``max_elems`` (point, candidate) pairs, in chunks of at most ``chunk_rows`` points."""

    def __init__(
        self,
        dtype: torch.dtype,
        device: torch.device,
        chunk_rows: int,
        max_elems: int = MAX_ELEMS,
    ):
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
        stats = None if stats is None else stats[:k]
        return PassResult(ll_sum, weight_v.sum(dtype=f64), stats, lse_out, am_out)
