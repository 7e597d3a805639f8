"""Spatially blocked, candidate-pruned E-step for 2-D Gaussian mixtures (private engine).

The points are sorted into *cells* of equal size with small bounding boxes
(``_layout``); per cell, box bounds on every component's log-density drop the
components that cannot carry a responsibility above ``exp(-margin)`` there
(``_plan``); the :class:`Engine` then runs one batched GEMM per group of cells over
its candidates only, in cell-local coordinates (``_components``).  Sufficient
statistics ``sum r phi(u)`` are formed by a second GEMM ``phi^T R`` in float32 inside
the cell and mapped to the global origin, ``sum r phi(x) = T(z) sum r phi(u)``, in
float64.

This module is the engine's one entry: the mixture (and its distributed subclass)
import the parts from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._components import Components, shift_matrices
from ._layout import CellLayout, build_cells, default_cell_size, grid_shape
from ._plan import Plan, make_plan

__all__ = [
    "CellLayout",
    "Components",
    "Engine",
    "PassResult",
    "Plan",
    "build_cells",
    "default_cell_size",
    "grid_shape",
    "make_plan",
]

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
        weight_sum = weight_v.sum(dtype=f64)
        return PassResult(
            ll_sum=ll_sum,
            weight_sum=weight_sum,
            stats=None if stats is None else stats[:k],
            lse=lse_out,
            argmax=am_out,
        )
