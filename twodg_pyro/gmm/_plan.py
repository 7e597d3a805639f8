"""Candidate pruning: which components each cell evaluates (part of the engine in ``_cells``).

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

from ._components import Components
from ._layout import CellLayout


def _by_bucket(bucket: Tensor) -> tuple[Tensor, ...]:
    """The indices of ``bucket (B,)`` grouped by value, the groups in increasing order."""
    order = torch.argsort(bucket)
    _, sizes = torch.unique_consecutive(bucket[order], return_counts=True)
    return torch.split(order, sizes.tolist())


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
        for sel in _by_bucket(bucket):
            size = int(sel.shape[0])
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
    width = max(int(p[1].shape[1]) for p in parts)
    ids = torch.cat([p[0] for p in parts])
    cand = torch.cat(
        [torch.nn.functional.pad(p[1], (0, width - int(p[1].shape[1])), value=k) for p in parts]
    )
    counts = torch.cat([p[2] for p in parts])
    return ids, cand, counts
