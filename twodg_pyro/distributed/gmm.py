r"""The 2-D Gaussian mixture fitted across processes: each rank holds a shard of the points.

EM only needs, per component :math:`k`, the sufficient statistics
:math:`s_k = \sum_i r_{ik}\,[1,\ z_i,\ z_i z_i^\top]` (count, first and second moments) and
the log-likelihood; both are sums over points, so the sum over ranks of the per-shard
sums is the full-data sum.  :class:`DistributedGaussianMixture2D` is
:class:`~twodg_pyro.gmm.GaussianMixture2D` with

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
import os
import warnings
from typing import Any

import torch
from torch import Tensor

from ..gmm._cells import (
    Components,
    Engine,
    PassResult,
    Plan,
    build_cells,
    default_cell_size,
    make_plan,
)
from ..gmm.mixture import _MAX_ELEMS, GaussianMixture2D, _stats_from_params, as_points
from . import env

__all__ = ["DistributedGaussianMixture2D"]


class _GlobalPoints:
    """Stand-in for the full standardised data inside ``GaussianMixture2D._m_step``.

    The M-step only reads ``z.shape[0]``, ``z.device`` and ``z[rows]`` (the points a
    re-seeded component moves to); here indexing fetches the rows from the ranks that
    hold them.  It is a collective: every rank calls it with the same rows, which the
    all-reduced statistics guarantee.
    """

    def __init__(self, z_local: Tensor, offset: int, n: int):
        self.z_local, self.offset, self.n = z_local, int(offset), int(n)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, 2)

    @property
    def device(self) -> torch.device:
        return self.z_local.device

    @property
    def dtype(self) -> torch.dtype:
        return self.z_local.dtype

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


def _layout_draw_shape(n_pts: int, cell_size: int) -> tuple[int, int]:
    """Shape of the one uniform draw ``build_cells`` makes for ``n_pts`` points."""
    n_target = max(1, math.ceil(n_pts / max(1, cell_size)))
    g1 = max(1, math.ceil(math.sqrt(n_target)))
    g2 = max(1, math.ceil(n_target / g1))
    return g1 * g2, math.ceil(n_pts / (g1 * g2))


class DistributedGaussianMixture2D(GaussianMixture2D):
    """:class:`~twodg_pyro.gmm.GaussianMixture2D` fitted by all processes of the group.

    Every rank calls :meth:`fit` at the same time.  Without a process group (or with
    one process) it *is* the single-process fit.

    Args:
        n_components, **kwargs: as :class:`~twodg_pyro.gmm.GaussianMixture2D`
            (``batch_size`` is the global online-EM batch).
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

    # ------------------------------------------------------------------ fitting
    def _fit(self, X: Any) -> Tensor:
        if not env.is_distributed():
            labels = super()._fit(X)
            self.n_local_ = self._n_fit
            return labels
        self._validate_params()
        world, rank = env.get_world_size(), env.get_rank()
        device = self._device_for(X)
        x = as_points(X, "X", device=device)
        k = self.n_components
        n_in = int(x.shape[0])
        if self.sharded:
            sizes = env.all_gather_rows(torch.tensor([n_in], device=device)).tolist()
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
        if k > n:
            raise ValueError(
                f"n_components={k} is larger than the number of points N={n}; "
                "use at most one component per point"
            )
        n_local = int(x_local.shape[0])
        x64 = x_local.to(torch.float64)
        loc = env.all_reduce_sum(x64.sum(dim=0)) / n
        scale = (env.all_reduce_sum((x64 - loc).square().sum(dim=0)) / n).sqrt()
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        z = ((x64 - loc) / scale).to(self.dtype)
        del x64
        self._n_fit = n

        seed = self.random_state
        if seed is None:
            seed = env.broadcast_object(int.from_bytes(os.urandom(8), "little") % (2**63))
        gen = torch.Generator(device=device)
        gen.manual_seed(int(seed))
        w, mu, cov = self._initialise_distributed(z, offset, n, gen)
        # advance the stream as the single-process fit's cell layout does, so that the
        # draws that follow (re-seeding) are the same as in a single process
        cell_size = default_cell_size(n, k)
        torch.rand(*_layout_draw_shape(n, cell_size), generator=gen, device=device)
        local_gen = torch.Generator(device=device)
        local_gen.manual_seed((int(seed) * 1_000_003 + 7919 * (rank + 1)) % (2**63))
        self._local_gen = local_gen
        layout = build_cells(z, cell_size, self.dtype, local_gen)
        engine = Engine(self.dtype, device, self.chunk_size, _MAX_ELEMS)
        zg = _GlobalPoints(z, offset, n)
        self.n_reseeded_ = 0
        self.n_epochs_ = 0
        self.n_steps_ = 0
        converged = False
        if self.batch_size is not None:
            w, mu, cov, converged = self._online_em(zg, layout, engine, w, mu, cov, gen)
        self.n_iter_ = 0
        if self.max_iter > 0:
            w, mu, cov, converged = self._batch_em(zg, layout, engine, w, mu, cov, gen)
            if not converged and self.batch_size is None and rank == 0:
                warnings.warn(
                    f"DistributedGaussianMixture2D did not converge in max_iter={self.max_iter} "
                    f"iterations (tol={self.tol}); increase max_iter or tol",
                    RuntimeWarning,
                    stacklevel=3,
                )
        self.converged_ = converged

        comps = Components.from_params(w, mu, cov)
        plan = make_plan(layout, comps, margin=self.prune_margin)
        res = engine.run(layout, comps, plan, want_argmax=True)
        engine.release()
        log_jac = float(torch.log(scale).sum())
        self.lower_bound_ = float(env.all_reduce_sum(res.ll_sum)) / n - log_jac
        labels = res.argmax
        self.counts_ = env.all_reduce_sum(torch.bincount(labels, minlength=k))
        self._set_params(w, mu, cov, loc, scale)
        self.n_local_ = n_local
        self._local_gen = None
        if not self.sharded:
            labels = env.all_gather_rows(labels)
        return labels

    def _initialise_distributed(
        self, z: Tensor, offset: int, n: int, gen: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rank 0 runs the single-process initialisation on the global points; the
        result and the generator's state are broadcast.

        When the initialisation uses every point, they are gathered on rank 0.
        Otherwise rank 0 sees the data through :class:`_RemotePoints`: each row set it
        indexes (the subsample, drawn exactly as in a single process) is fetched from
        the ranks that hold it, which serve rank 0 until it is done.
        """
        k = self.n_components
        n_sub = int(min(n, max(self.init_subsample or max(50_000, 25 * k), k)))
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

    def _online_em(
        self,
        z,
        layout,
        engine: Engine,
        w: Tensor,
        mu: Tensor,
        cov: Tensor,
        gen: torch.Generator,
    ) -> tuple[Tensor, Tensor, Tensor, bool]:
        """Online EM (Cappe & Moulines) whose every step uses a stratified batch of about
        ``batch_size * n_local / N`` points from each rank; all ranks take the same steps."""
        if not env.is_distributed():
            return super()._online_em(z, layout, engine, w, mu, cov, gen)
        n = self._n_fit
        reg_eye = self.reg_covar * torch.eye(2, dtype=torch.float64, device=w.device)
        s = _stats_from_params(w, mu, cov - reg_eye)
        m = layout.cell_size
        share = self.batch_size * layout.n_points / n
        cols = int(min(m, max(1, round(share / layout.n_cells))))
        n_steps = _all_max(math.ceil(m / cols))
        cols = math.ceil(m / n_steps)
        replan_every = max(1, n_steps // 4)
        comps = Components.from_params(w, mu, cov)
        k = self.n_components
        t = 0
        prev = None
        converged = False
        gamma = float("nan")
        for epoch in range(1, self.n_epochs + 1):
            layout.shuffle_within_cells(self._local_gen)
            ll_acc = 0.0
            w_acc = 0.0
            plan: Plan | None = None
            for j in range(n_steps):
                c0 = j * cols
                if c0 < m:
                    if plan is None or j % replan_every == 0:
                        plan = make_plan(layout, comps, margin=self.prune_margin)
                    res = engine.run(
                        layout, comps, plan, cols=(c0, min(m, c0 + cols)), want_stats=True
                    )
                else:  # this rank's cells are used up: it contributes nothing this step
                    zero = torch.zeros((), dtype=torch.float64, device=w.device)
                    res = PassResult(
                        ll_sum=zero,
                        weight_sum=zero,
                        stats=torch.zeros(k, 6, dtype=torch.float64, device=w.device),
                        lse=None,
                        argmax=None,
                    )
                res = self._reduce_estep(res)
                wsum = float(res.weight_sum)
                if wsum <= 0:
                    continue
                gamma = (t + self.learning_offset) ** (-self.learning_decay)
                s = (1.0 - gamma) * s + gamma * (res.stats / wsum)
                w, mu, cov, s, n_dead = self._m_step(s, z, gen)
                comps = Components.from_params(w, mu, cov)
                if n_dead:
                    plan = None
                t += 1
                ll_acc += float(res.ll_sum)
                w_acc += wsum
            self.n_epochs_ = epoch
            self.n_steps_ = t
            ll = ll_acc / max(w_acc, 1.0)
            if self.verbose and env.is_main():
                print(
                    f"[DistributedGaussianMixture2D] epoch {epoch}: mean batch log-lik {ll:.6f} "
                    f"({n_steps} steps, gamma {gamma:.3g})"
                )
            if prev is not None and abs(ll - prev) < self.tol:
                converged = True
                break
            prev = ll
        return w, mu, cov, converged

    def __repr__(self) -> str:
        return super().__repr__().replace("GaussianMixture2D(", "DistributedGaussianMixture2D(", 1)


def _all_max(value: int) -> int:
    """The largest ``value`` over ranks."""
    if not env.is_distributed():
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.long, device=env._comm_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())
