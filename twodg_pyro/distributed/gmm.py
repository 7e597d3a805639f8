r"""The 2-D Gaussian mixture fitted across processes: each rank holds a shard of the points.

EM only needs, per component :math:`k`, the sufficient statistics
:math:`s_k = \sum_i r_{ik}\,[1,\ z_i,\ z_i z_i^\top]` (count, first and second moments) and
the log-likelihood; both are sums over points, so the sum over ranks of the per-shard
sums is the full-data sum.  :class:`DistributedGaussianMixture2D` is
:class:`~twodg_pyro.gmm.GaussianMixture2D` — the same EM code — with its process seams
(``_shard``, ``_standardise``, ``_seed``, ``_initial_params``, ``_layout``,
``_global_points``, ``_online_schedule``, ``_reduce_estep``, ``_all_sum``,
``_gather_labels``, ``_is_main``) filled in:

* the standardisation :math:`z = (x - \bar x) / s_x` from all-reduced sums (two passes,
  as the single-process fit);
* the initialisation decided on rank 0 and broadcast: rank 0 runs the single-process
  initialisation (subsample, k-means++, Lloyd) with the same random stream, reading the
  rows it draws from the ranks that hold them; weights, means, covariances and the
  generator's state are then broadcast.  The stream is advanced as the single-process
  fit advances it, so a component re-seeded mid-EM picks the same data row;
* every E-step's statistics all-reduce-summed (``_reduce_estep``), after which every rank
  runs the same deterministic M-step: all ranks hold the same mixture after every
  iteration, and take every branch (convergence, re-seeding) together.

Full-batch EM therefore gives the single-process fit on the concatenated points up to
floating-point summation order (the E-step runs on per-shard spatial cells; with
pruning, the truncated responsibilities, below :math:`e^{-20}`, depend on the cells).
Online EM (``batch_size``) draws each step's stratified batch from every rank's shard
(``batch_size`` is the global batch; every rank takes the same number of steps), so it
is an online EM of the same kind, not the same random path as a single process.

Inference methods (``predict``, ``score_samples``, ...) run locally on whatever points
they are given.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from ..gmm._cells import PassResult
from ..gmm._layout import CellLayout, build_cells, default_cell_size, grid_shape
from ..gmm.initial import subsample_size
from ..gmm.mixture import GaussianMixture2D
from . import env


class _GlobalPoints:
    """Stand-in for the full standardised data inside ``GaussianMixture2D._m_step``.

    The M-step only reads ``z.shape[0]``, ``z.device`` and ``z[rows]`` (the points a
    re-seeded component moves to); here indexing fetches the rows from the ranks that
    hold them.  It is a collective: every rank calls it with the same rows, which the
    all-reduced statistics guarantee.
    """

    def __init__(self, z_local: Tensor, offset: int, n: int):
        self.z_local, self.offset = z_local, int(offset)
        self.shape, self.device = (int(n), 2), z_local.device

    def __getitem__(self, rows: Tensor) -> Tensor:
        rows = torch.as_tensor(rows, device=self.device).reshape(-1)
        return _fetch_rows(self.z_local, self.offset, rows, to_all=True)


def _fetch_rows(z_local: Tensor, offset: int, rows: Tensor, to_all: bool) -> Tensor:
    """``z[rows]`` of the global array, each rank filling the rows it holds (exact: the
    other ranks add zeros).  ``to_all=False`` only makes rank 0's copy complete."""
    n_local = int(z_local.shape[0])
    buf = torch.zeros(rows.shape[0], 2, dtype=torch.float64, device=z_local.device)
    mine = (rows >= offset) & (rows < offset + n_local)
    buf[mine] = z_local[rows[mine] - offset].to(torch.float64)
    if env.is_distributed():
        dev = env._comm_device()
        b = buf.to(dev)
        if to_all:
            torch.distributed.all_reduce(b)
        else:
            torch.distributed.reduce(b, dst=0)
        buf = b.to(z_local.device)
    return buf.to(z_local.dtype)


class _RemotePoints(_GlobalPoints):
    """Rank 0's view of the global points while the other ranks wait in
    :func:`_serve_rows`: indexing asks them for the rows they hold."""

    def __getitem__(self, rows: Tensor) -> Tensor:
        rows = torch.as_tensor(rows, device=self.device).reshape(-1)
        env.broadcast_object(("rows", rows.cpu()))
        return _fetch_rows(self.z_local, self.offset, rows, to_all=False)

    def finish(self, error: str | None = None) -> None:
        env.broadcast_object(("done", None) if error is None else ("error", error))


def _serve_rows(z_local: Tensor, offset: int) -> None:
    """Answer rank 0's :class:`_RemotePoints` requests until it is done."""
    while True:
        kind, payload = env.broadcast_object(None)
        if kind == "done":
            return
        if kind == "error":
            raise RuntimeError(f"rank 0 failed to initialise the mixture: {payload}")
        _fetch_rows(z_local, offset, payload.to(z_local.device), to_all=False)


def _pack(w: Tensor, mu: Tensor, cov: Tensor) -> Tensor:
    return torch.cat([w.reshape(-1), mu.reshape(-1), cov.reshape(-1)]).to(torch.float64)


class DistributedGaussianMixture2D(GaussianMixture2D):
    """:class:`~twodg_pyro.gmm.GaussianMixture2D` fitted by all processes of the group.

    Every rank calls :meth:`fit` at the same time.  Without a process group (or with
    one process) it *is* the single-process fit.

    Args:
        n_components: as :class:`~twodg_pyro.gmm.GaussianMixture2D`, and so are the
            other keyword arguments ``**kwargs`` (``batch_size`` is the global online-EM
            batch).
        sharded: ``False`` (default): every rank passes the same full ``X`` and works
            on its contiguous ``1/W`` slice (the labels returned by ``fit_predict``
            cover all of ``X``).  ``True``: every rank passes its own shard; the fit is
            that of the shards concatenated in rank order, and ``fit_predict`` returns
            the labels of the local shard.

    Fitted attributes are those of the base class, identical on every rank.
    """

    def __init__(self, n_components: int, *, sharded: bool = False, **kwargs: Any) -> None:
        self.sharded = bool(sharded)
        super().__init__(n_components, **kwargs)

    # GaussianMixture2D's EM with its process seams filled in; each is the plain
    # single-process one without a process group of more than one process.
    def _is_main(self) -> bool:
        return env.is_main()

    def _seed(self) -> int:
        seed = super()._seed()
        return seed if self.random_state is not None else int(env.broadcast_object(seed))

    def _shard(self, x: Tensor) -> tuple[Tensor, int, int]:
        """This rank's slice (``sharded=False``) or its own points, with their global
        offset and the global count; every rank needs at least one point."""
        if not env.is_distributed():
            self.n_local_ = int(x.shape[0])
            return super()._shard(x)
        world, rank = env.get_world_size(), env.get_rank()
        n_in = int(x.shape[0])
        if self.sharded:
            sizes = env.all_gather_rows(torch.tensor([n_in], device=x.device)).tolist()
            offset, n = sum(sizes[:rank]), sum(sizes)
            x_local = x
        else:
            env.check_same_across_ranks(
                torch.tensor([float(n_in)]), "the number of points passed to fit (sharded=False)"
            )
            sizes = [n_in // world + (r < n_in % world) for r in range(world)]
            offset, n = sum(sizes[:rank]), n_in
            x_local = x[offset : offset + sizes[rank]]
        if min(sizes) < 1:
            raise ValueError(
                f"every process needs at least one point; shard sizes are {sizes} "
                f"(N={n}, world size {world})"
            )
        self.n_local_ = int(x_local.shape[0])
        return x_local, offset, n

    def _standardise(self, x64: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Mean and standard deviation from all-reduced sums (two passes)."""
        if not env.is_distributed():
            return super()._standardise(x64, n)
        loc = env.all_reduce_sum(x64.sum(dim=0)) / n
        return loc, (env.all_reduce_sum((x64 - loc).square().sum(dim=0)) / n).sqrt()

    def _layout(
        self, z: Tensor, n: int, gen: torch.Generator
    ) -> tuple[CellLayout, torch.Generator]:
        """Cells of the local points, shuffled by a per-rank generator; the shared ``gen``
        advances as the single-process layout advances it, so that the draws that
        follow (re-seeding) are the same as in a single process."""
        if not env.is_distributed():
            return super()._layout(z, n, gen)
        cell_size = default_cell_size(n, self.n_components)
        g1, g2, m = grid_shape(n, cell_size)
        torch.rand(g1 * g2, m, generator=gen, device=z.device)
        local_gen = torch.Generator(device=z.device)
        rank = env.get_rank()
        local_gen.manual_seed((gen.initial_seed() * 1_000_003 + 7919 * (rank + 1)) % (2**63))
        return build_cells(z, cell_size, self.dtype, local_gen), local_gen

    def _global_points(self, z: Tensor, offset: int, n: int) -> Any:
        return _GlobalPoints(z, offset, n) if env.is_distributed() else z

    def _online_schedule(self, layout: CellLayout) -> tuple[int, int]:
        """About ``batch_size * n_local / N`` points a step from this rank; every rank
        takes the largest number of steps (a rank whose cells run out adds nothing)."""
        if not env.is_distributed():
            return super()._online_schedule(layout)
        m = layout.cell_size
        share = self.batch_size * layout.n_points / self._n_fit
        cols = int(min(m, max(1, round(share / layout.n_cells))))
        n_steps = _all_max(math.ceil(m / cols))
        return math.ceil(m / n_steps), n_steps

    def _all_sum(self, t: Tensor) -> Tensor:
        return env.all_reduce_sum(t)

    def _gather_labels(self, labels: Tensor) -> Tensor:
        return labels if self.sharded else env.all_gather_rows(labels)

    def _initial_params(
        self, z: Tensor, offset: int, n: int, gen: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rank 0 runs the single-process initialisation on the global points; the
        result and the generator's state are broadcast.

        When the initialisation uses every point, they are gathered on rank 0.
        Otherwise rank 0 sees the data through :class:`_RemotePoints`: each row set it
        indexes (the subsample, drawn exactly as in a single process) is fetched from
        the ranks that hold it, which serve rank 0 until it is done.
        """
        if not env.is_distributed():
            return super()._initial_params(z, offset, n, gen)
        k = self.n_components
        n_sub = subsample_size(n, k, self.init_subsample)
        main = env.is_main()
        packed = torch.empty(k * 7, dtype=torch.float64, device=z.device)
        if n_sub >= n:
            full = _fetch_rows(z, offset, torch.arange(n, device=z.device), to_all=False)
            if main:
                packed = _pack(*self._initialise(full, gen))
        elif main:
            points = _RemotePoints(z, offset, n)
            try:
                packed = _pack(*self._initialise(points, gen))
            except BaseException as e:
                points.finish(f"{type(e).__name__}: {e}")
                raise
            points.finish()
        else:
            _serve_rows(z, offset)
        packed = env.broadcast_tensor(packed)
        state = gen.get_state()
        gen.set_state(env.broadcast_tensor(state).to(state.device))
        return packed[:k], packed[k : 3 * k].view(k, 2), packed[3 * k :].view(k, 2, 2)

    def _reduce_estep(self, res: PassResult) -> PassResult:
        """Sum a local E-step's ``ll_sum``, ``weight_sum`` and statistics over ranks."""
        if not env.is_distributed():
            return res
        parts = [res.ll_sum.reshape(1), res.weight_sum.reshape(1).to(torch.float64)]
        if res.stats is not None:
            parts.append(res.stats.reshape(-1))
        total = env.all_reduce_sum(torch.cat(parts))
        stats = None if res.stats is None else total[2:].view_as(res.stats)
        return dataclasses.replace(res, ll_sum=total[0], weight_sum=total[1], stats=stats)


def _all_max(value: int) -> int:
    """The largest ``value`` over ranks."""
    if not env.is_distributed():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.long, device=env._comm_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())
