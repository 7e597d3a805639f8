"""Two-dimensional Gaussian mixture fitted by (mini-batch) EM, in pure torch.

Model: ``p(x) = sum_k pi_k N(x | m_k, S_k)`` with ``x`` in R^2, full covariances.

The fit works in standardised coordinates ``z = (x - mean(X)) / std(X)`` (per
dimension); the fitted attributes are mapped back to data units. Every E-step
runs through a spatially blocked, candidate-pruned engine (see ``_cells``): the
points are sorted into small cells and each cell only evaluates the components
that can carry a responsibility above ``exp(-prune_margin)`` there, which keeps
``K`` in the thousands affordable for millions of points, and memory bounded by
``chunk_size``.

EM (Dempster et al. 1977) on the standardised data:

* E-step: ``r_ik = pi_k N(z_i | m_k, S_k) / sum_j pi_j N(z_i | m_j, S_j)``;
* sufficient statistics ``s_k = (1/N) sum_i r_ik [1, z_i, z_i z_i^T]``;
* M-step: ``pi_k = s0_k``, ``m_k = s1_k / s0_k``,
  ``S_k = s2_k / s0_k - m_k m_k^T + reg_covar I``.

Mini-batch mode (``batch_size`` set) is the online EM of Cappé & Moulines (2009):
``s <- (1 - gamma_t) s + gamma_t s_hat(batch; theta_t)``, ``theta_{t+1} = M(s)``
with ``gamma_t = (t + learning_offset)^(-learning_decay)``, ``t = 0, 1, ...``.
Batches are stratified: each takes the same number of random points from every
spatial cell. After ``n_epochs`` epochs, full-data EM iterations (at most
``max_iter``) polish the solution.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ._cells import (
    CellLayout,
    Components,
    Engine,
    PassResult,
    Plan,
    build_cells,
    default_cell_size,
    make_plan,
)
from .kmeans import kmeans_plusplus, lloyd, nearest_centre

__all__ = ["GaussianMixture2D", "NotFittedError", "as_points"]

_INITS = ("kmeans++", "kmeans", "random")
#: cap on (point, candidate) pairs held in the E-step work buffer (128 MiB in float32)
_MAX_ELEMS = 1 << 25
#: pruning margin (nats) of the hard assignment: any margin >= 0 keeps each point's best
#: component (see ``_cells``); 2 nats absorb the float32 rounding of the bounds
_ARGMAX_MARGIN = 2.0


class NotFittedError(ValueError, AttributeError):
    """Raised when a method needing fitted parameters is called before ``fit``."""


def as_points(
    x: Any, name: str = "X", *, dtype: torch.dtype | None = None, device: Any = None
) -> Tensor:
    """Convert ``x`` (tensor or array-like) to a finite ``(N, 2)`` tensor, or raise ValueError.

    The message names ``name``, the offending shape, or the number of non-finite
    entries and the first row holding one.
    """
    if isinstance(x, Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a tensor or array of shape (N, 2): {exc}") from exc
    if t.dim() != 2 or t.shape[1] != 2:
        raise ValueError(f"{name} must have shape (N, 2), got {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} must contain at least one point, got shape {tuple(t.shape)}")
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64, torch.int16)):
        raise ValueError(f"{name} must be real-valued, got dtype {t.dtype}")
    t = t.to(device=device if device is not None else t.device, dtype=dtype or t.dtype)
    bad = ~torch.isfinite(t)
    n_bad = int(bad.sum())
    if n_bad:
        row = int(torch.nonzero(bad.any(dim=1))[0, 0])
        raise ValueError(
            f"{name} contains {n_bad} non-finite value(s) (NaN or inf); first at row {row}: "
            f"{t[row].tolist()}"
        )
    return t


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


class _FitProgress:
    """The fit's tqdm bar (``"GMM EM"``, on stderr): one tick per online-EM step and per
    full-data iteration; the postfix shows the phase, the mean log-likelihood per point in
    data units (the running batch mean during online EM), ``K`` and the components
    re-seeded so far. It only reads numbers the fit has computed anyway."""

    def __init__(self, enabled: bool, total: int = 0, log_jac: float = 0.0, k: int = 0):
        self.bar = tqdm(total=total, desc="GMM EM", unit="step", disable=not enabled, leave=False)
        self.log_jac, self.k = log_jac, k

    def add(self, steps: int) -> None:
        if not self.bar.disable:
            self.bar.total += steps
            self.bar.refresh()

    def tick(self, phase: str, ll: float, reseeded: int) -> None:
        if self.bar.disable:
            return
        ll_data = f"{ll - self.log_jac:.5g}"
        self.bar.set_postfix_str(f"{phase}, ll {ll_data}, K {self.k}, reseeded {reseeded}", False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class GaussianMixture2D:
    """Full-covariance Gaussian mixture on 2-D points, fitted by EM or mini-batch online EM.

    Args:
        n_components: number of components ``K >= 1`` (at most the number of points).
        max_iter: maximum full-data EM iterations (``>= 0``). In mini-batch mode
            they run after the stochastic epochs, as a polish.
        tol: convergence threshold (``> 0``) on the change of the mean log-likelihood
            per point between full-data iterations.
        batch_size: ``None`` for full-batch EM; an int for online EM with batches of
            about this many points: each batch takes the same number of random points
            (at least one) from every spatial cell, so it is stratified over the plane.
        n_epochs: passes of online EM over the data (mini-batch mode only).
        learning_decay: ``kappa`` in ``gamma_t = (t + learning_offset)^(-kappa)``, in (0.5, 1].
        learning_offset: ``>= 1``; ``1`` means the first batch replaces the initial
            statistics.
        init: ``"kmeans++"`` (greedy k-means++ seeding, 3 trials per centre, on a
            subsample of ``max(10_000, 4 K)`` points, then
            ``init_lloyd_iter`` Lloyd iterations on a subsample), ``"kmeans"`` (the same
            but Lloyd until no label changes, at most 100 iterations) or ``"random"``
            (``K`` distinct random points as centres, no Lloyd). Initial weights, means
            and covariances are those of the resulting hard clusters (covariances
            shrunk towards the pooled within-cluster covariance by one pseudo-point).
        init_lloyd_iter: Lloyd iterations for ``"kmeans++"``.
        init_subsample: points used by the initialisation (default
            ``min(N, max(50_000, 25 K))``).
        reg_covar: ``> 0``, added to the diagonal of every covariance *in standardised
            coordinates*, i.e. ``reg_covar * Var(X[:, d])`` in data units.
        chunk_size: maximum points per E-step chunk; the work buffer further holds at
            most ``2^25`` (point, component) pairs.
        prune_margin: components whose log-density bound is more than this many nats
            below the best in a cell are skipped there (``inf`` = dense E-step).
        random_state: seed (int) or None.
        device: torch device; default the input tensor's device (CPU for arrays).
        dtype: ``torch.float32`` or ``torch.float64`` for the E-step (statistics are
            always accumulated in float64).
        verbose: print progress.
        progress: show a tqdm bar (``"GMM EM"``, on stderr) over the online-EM steps
            and full-data iterations, with the mean log-likelihood, ``K`` and the
            re-seeded count; it does not change the fit.

    Fitted attributes: ``weights_ (K,)``, ``means_ (K, 2)``, ``covariances_ (K, 2, 2)``
    (data units), ``n_iter_`` (full-data EM iterations), ``n_epochs_`` and ``n_steps_``
    (online EM), ``converged_``, ``lower_bound_`` (mean log-likelihood per fit point
    under the fitted parameters), ``counts_`` (hard-assignment counts on the fit data,
    LongTensor ``(K,)``), ``n_reseeded_`` (components re-seeded because they emptied).
    """

    def __init__(
        self,
        n_components: int,
        *,
        max_iter: int = 100,
        tol: float = 1e-4,
        batch_size: int | None = None,
        n_epochs: int = 5,
        learning_decay: float = 0.6,
        learning_offset: float = 1.0,
        init: str = "kmeans++",
        init_lloyd_iter: int = 5,
        init_subsample: int | None = None,
        reg_covar: float = 1e-6,
        chunk_size: int = 250_000,
        prune_margin: float = 20.0,
        random_state: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        verbose: bool = False,
        progress: bool = False,
    ) -> None:
        self.n_components = n_components
        self.max_iter = max_iter
        self.tol = tol
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.learning_decay = learning_decay
        self.learning_offset = learning_offset
        self.init = init
        self.init_lloyd_iter = init_lloyd_iter
        self.init_subsample = init_subsample
        self.reg_covar = reg_covar
        self.chunk_size = chunk_size
        self.prune_margin = prune_margin
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.verbose = verbose
        self.progress = progress
        self._validate_params()

    # ------------------------------------------------------------------ validation
    def _validate_params(self) -> None:
        k = self.n_components
        if not _is_int(k) or k < 1:
            raise ValueError(f"n_components must be an integer >= 1, got {k!r}")
        if not _is_int(self.max_iter) or self.max_iter < 0:
            raise ValueError(f"max_iter must be an integer >= 0, got {self.max_iter!r}")
        for name in ("tol", "reg_covar"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if self.batch_size is not None and (not _is_int(self.batch_size) or self.batch_size < 1):
            raise ValueError(f"batch_size must be None or an integer >= 1, got {self.batch_size!r}")
        if not _is_int(self.n_epochs) or self.n_epochs < 1:
            raise ValueError(f"n_epochs must be an integer >= 1, got {self.n_epochs!r}")
        if not (0.5 < float(self.learning_decay) <= 1.0):
            raise ValueError(f"learning_decay must be in (0.5, 1], got {self.learning_decay!r}")
        if not (float(self.learning_offset) >= 1.0):
            raise ValueError(f"learning_offset must be >= 1, got {self.learning_offset!r}")
        if self.init not in _INITS:
            raise ValueError(f"init must be one of {_INITS}, got {self.init!r}")
        if not _is_int(self.init_lloyd_iter) or self.init_lloyd_iter < 0:
            raise ValueError(
                f"init_lloyd_iter must be an integer >= 0, got {self.init_lloyd_iter!r}"
            )
        if self.init_subsample is not None and (
            not _is_int(self.init_subsample) or self.init_subsample < 1
        ):
            raise ValueError(
                f"init_subsample must be None or an integer >= 1, got {self.init_subsample!r}"
            )
        if not _is_int(self.chunk_size) or self.chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {self.chunk_size!r}")
        if not (float(self.prune_margin) > 0):
            raise ValueError(f"prune_margin must be > 0, got {self.prune_margin!r}")
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {self.dtype!r}")
        if self.random_state is not None and not _is_int(self.random_state):
            raise ValueError(f"random_state must be None or an int, got {self.random_state!r}")

    def _device_for(self, x: Any) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        if isinstance(x, Tensor):
            return x.device
        return torch.device("cpu")

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = torch.Generator(device=device)
        gen.manual_seed(self._seed())
        return gen

    # ------------------------------------------------------------------ seams
    # The EM below is written once.  In one process the methods of this section are
    # trivial; a subclass whose processes each hold a shard of the points (see
    # twodg_pyro.distributed.DistributedGaussianMixture2D) overrides them, and only them,
    # to fit the mixture of all the shards: sums over points become sums over processes,
    # and the random draws that decide the mixture are agreed on.
    def _is_main(self) -> bool:
        """Whether this process reports (warnings, ``verbose`` lines, the progress bar)."""
        return True

    def _seed(self) -> int:
        """The fit's seed: ``random_state``, or a fresh one (the same on every process)."""
        if self.random_state is not None:
            return int(self.random_state)
        return int.from_bytes(os.urandom(8), "little") % (2**63)

    def _shard(self, x: Tensor) -> tuple[Tensor, int, int]:
        """``(local points, global row of the first one, global number of points N)``."""
        return x, 0, int(x.shape[0])

    def _standardise(self, x64: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Per-dimension mean and population standard deviation of all ``n`` points."""
        return x64.mean(dim=0), x64.std(dim=0, correction=0)

    def _initial_params(
        self, z: Tensor, offset: int, n: int, gen: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Initial weights, means, covariances (:meth:`_initialise` on all ``n`` points,
        drawing from ``gen``); identical on every process."""
        return self._initialise(z, gen)

    def _layout(
        self, z: Tensor, n: int, gen: torch.Generator
    ) -> tuple[CellLayout, torch.Generator]:
        """Spatial cells of the local points (sized for ``n`` points in all), and the
        generator that shuffles them for online EM. ``gen`` must be left as the
        single-process layout leaves it: re-seeding draws from it afterwards."""
        return build_cells(z, default_cell_size(n, self.n_components), self.dtype, gen), gen

    def _global_points(self, z: Tensor, offset: int, n: int) -> Any:
        """All ``n`` standardised points as the M-step sees them: it reads ``shape[0]``,
        ``device`` and ``z[rows]`` (the rows re-seeded components move to)."""
        return z

    def _online_schedule(self, layout: CellLayout) -> tuple[int, int]:
        """``(cols, n_steps)``: online step ``j`` uses columns ``[j cols, (j + 1) cols)``
        of every local cell (a stratified batch of about ``batch_size`` points)."""
        m = layout.cell_size
        cols = int(min(m, max(1, round(self.batch_size / layout.n_cells))))
        return cols, math.ceil(m / cols)

    def _reduce_estep(self, res: PassResult) -> PassResult:
        """Hook on every E-step result (``ll_sum``, ``weight_sum``, ``stats``); identity
        here, a sum over processes in the distributed subclass."""
        return res

    def _all_sum(self, t: Tensor) -> Tensor:
        """``t`` summed over processes (identity in one process)."""
        return t

    def _gather_labels(self, labels: Tensor) -> Tensor:
        """The labels ``fit_predict`` returns, from those of the local points."""
        return labels

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any) -> GaussianMixture2D:
        """Fit the mixture to ``X`` (``(N, 2)`` tensor or array) and return ``self``."""
        self._fit(X)
        return self

    def fit_predict(self, X: Any) -> Tensor:
        """Fit, then return the hard assignment ``argmax_k r_ik`` of every point (no extra pass)."""
        return self._fit(X)

    def _fit(self, X: Any) -> Tensor:
        self._validate_params()
        device = self._device_for(X)
        x = as_points(X, "X", device=device)
        x, offset, n = self._shard(x)
        k = self.n_components
        if k > n:
            raise ValueError(
                f"n_components={k} is larger than the number of points N={n}; "
                "use at most one component per point"
            )
        x64 = x.to(torch.float64)
        loc, scale = self._standardise(x64, n)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        z = ((x64 - loc) / scale).to(self.dtype)
        del x64
        gen = self._generator(device)
        self._n_fit = n
        name = type(self).__name__
        verbose = self.verbose and self._is_main()

        t0 = time.perf_counter()
        w, mu, cov = self._initial_params(z, offset, n, gen)
        layout, shuffle_gen = self._layout(z, n, gen)
        if verbose:
            print(
                f"[{name}] init {self.init!r} and {layout.n_cells} cells of "
                f"{layout.cell_size} points: {time.perf_counter() - t0:.2f} s"
            )
        engine = Engine(self.dtype, device, self.chunk_size, _MAX_ELEMS)
        zg = self._global_points(z, offset, n)
        log_jac = float(torch.log(scale).sum())
        self.n_reseeded_ = 0
        self.n_epochs_ = 0
        self.n_steps_ = 0
        self.n_iter_ = 0
        converged = False
        bar = _FitProgress(self.progress and self._is_main(), self.max_iter, log_jac, k)
        try:
            if self.batch_size is not None:
                w, mu, cov, converged = self._online_em(
                    zg, layout, engine, w, mu, cov, gen, shuffle_gen, bar
                )
            if self.max_iter > 0:
                w, mu, cov, converged = self._batch_em(zg, layout, engine, w, mu, cov, gen, bar)
        finally:
            bar.close()
        if self.max_iter > 0 and not converged and self.batch_size is None and self._is_main():
            warnings.warn(
                f"{name} did not converge in max_iter={self.max_iter} "
                f"iterations (tol={self.tol}); increase max_iter or tol",
                RuntimeWarning,
                stacklevel=3,
            )
        self.converged_ = converged

        comps = Components.from_params(w, mu, cov)
        plan = make_plan(layout, comps, margin=self.prune_margin)
        res = engine.run(layout, comps, plan, want_argmax=True)
        engine.release()
        self.lower_bound_ = float(self._all_sum(res.ll_sum)) / n - log_jac
        labels = res.argmax
        self.counts_ = self._all_sum(torch.bincount(labels, minlength=k))
        self._set_params(w, mu, cov, loc, scale)
        return self._gather_labels(labels)

    def _set_params(self, w: Tensor, mu: Tensor, cov: Tensor, loc: Tensor, scale: Tensor) -> None:
        self._w64, self._mu64, self._cov64 = w, mu, cov
        self._loc, self._scale = loc, scale
        d = scale
        self.weights_ = w.to(self.dtype)
        self.means_ = (mu * d + loc).to(self.dtype)
        c = cov * (d[None, :, None] * d[None, None, :])
        self.covariances_ = (0.5 * (c + c.transpose(1, 2))).to(self.dtype)

    def _initialise(self, z: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        n = int(z.shape[0])
        k = self.n_components
        n_sub = self.init_subsample or max(50_000, 25 * k)
        n_sub = int(min(n, max(n_sub, k)))
        sub = z[torch.randperm(n, generator=gen, device=z.device)[:n_sub]] if n_sub < n else z
        if self.init == "random":
            pick = torch.randperm(n_sub, generator=gen, device=z.device)[:k]
            centres = sub[pick]
            labels, _ = nearest_centre(sub, centres)
        else:
            n_seed = int(min(n_sub, max(10_000, 4 * k)))
            if n_sub < n or n_seed == n_sub:
                seed_set = sub[:n_seed]  # `sub` is already a random subset (or all points)
            else:  # input order may be meaningful (e.g. weights layer by layer): draw
                seed_set = sub[torch.randperm(n_sub, generator=gen, device=z.device)[:n_seed]]
            centres = kmeans_plusplus(seed_set, k, generator=gen, n_local_trials=3)
            iters = self.init_lloyd_iter if self.init == "kmeans++" else 100
            if iters > 0:
                centres, labels, _ = lloyd(sub, centres, max_iter=iters)
            else:
                labels, _ = nearest_centre(sub, centres)
        return _params_from_labels(sub, labels, centres, k, self.reg_covar)

    # ------------------------------------------------------------------ EM loops
    def _m_step(self, s: Tensor, z: Tensor, gen: torch.Generator) -> tuple[Tensor, ...]:
        """M-step on per-point statistics ``s (K, 6)``; re-seeds emptied components.

        Returns ``(weights, means, covs, s, n_dead)``; ``s`` is updated for re-seeded
        components so that it stays consistent with the parameters.
        """
        n = self._n_fit
        k = self.n_components
        n0 = s[:, 0]
        dead = n0 * n < min(1.0, 0.1 * n / k)
        n_dead = int(dead.sum())
        mu, cov = _moments(s, self.reg_covar)
        if n_dead:
            live = ~dead
            if bool(live.any()):
                wl = n0[live] / n0[live].sum()
                base = (cov[live] * wl[:, None, None]).sum(dim=0)
            else:
                base = torch.eye(2, dtype=torch.float64, device=s.device)
            rows = torch.randint(int(z.shape[0]), (n_dead,), generator=gen, device=z.device)
            mu[dead] = z[rows].to(torch.float64)
            cov[dead] = base
            s = s.clone()
            share = n0.sum() / k
            md = mu[dead]
            cb = base - self.reg_covar * torch.eye(2, dtype=torch.float64, device=s.device)
            s[dead, 0] = share
            s[dead, 1:3] = share * md
            s[dead, 3] = share * (cb[0, 0] + md[:, 0] ** 2)
            s[dead, 4] = share * (cb[0, 1] + md[:, 0] * md[:, 1])
            s[dead, 5] = share * (cb[1, 1] + md[:, 1] ** 2)
            self.n_reseeded_ += n_dead
        w = s[:, 0] / s[:, 0].sum()
        return w, mu, cov, s, n_dead

    def _batch_em(
        self,
        z: Tensor,
        layout: CellLayout,
        engine: Engine,
        w: Tensor,
        mu: Tensor,
        cov: Tensor,
        gen: torch.Generator,
        bar: _FitProgress | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, bool]:
        bar = bar or _FitProgress(False)
        n = self._n_fit
        prev = -math.inf
        converged = False
        for it in range(1, self.max_iter + 1):
            t0 = time.perf_counter()
            comps = Components.from_params(w, mu, cov)
            plan = make_plan(layout, comps, margin=self.prune_margin)
            res = self._reduce_estep(engine.run(layout, comps, plan, want_stats=True))
            ll = float(res.ll_sum) / n
            w, mu, cov, _, n_dead = self._m_step(res.stats / n, z, gen)
            self.n_iter_ = it
            change = ll - prev
            bar.tick(f"iter {it}", ll, self.n_reseeded_)
            if self.verbose and self._is_main():
                print(
                    f"[{type(self).__name__}] EM iter {it}: mean log-lik {ll:.6f} "
                    f"(change {change:.3g}, candidates/point {plan.mean_candidates:.1f}, "
                    f"reseeded {n_dead}, {time.perf_counter() - t0:.2f} s)"
                )
            if abs(change) < self.tol and n_dead == 0:
                converged = True
                break
            prev = ll
        return w, mu, cov, converged

    def _online_em(
        self,
        z: Tensor,
        layout: CellLayout,
        engine: Engine,
        w: Tensor,
        mu: Tensor,
        cov: Tensor,
        gen: torch.Generator,
        shuffle_gen: torch.Generator,
        bar: _FitProgress | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, bool]:
        """Online EM; ``gen`` draws re-seeded rows, ``shuffle_gen`` shuffles the cells."""
        bar = bar or _FitProgress(False)
        reg_eye = self.reg_covar * torch.eye(2, dtype=torch.float64, device=w.device)
        s = _stats_from_params(w, mu, cov - reg_eye)
        m = layout.cell_size
        cols, n_steps = self._online_schedule(layout)
        bar.add(self.n_epochs * n_steps)
        replan_every = max(1, n_steps // 4)
        comps = Components.from_params(w, mu, cov)
        k = self.n_components
        t = 0
        prev = None
        converged = False
        gamma = math.nan
        for epoch in range(1, self.n_epochs + 1):
            t0 = time.perf_counter()
            layout.shuffle_within_cells(shuffle_gen)
            ll_acc = 0.0
            w_acc = 0.0
            plan: Plan | None = None
            for j in range(n_steps):
                c0 = j * cols
                if c0 < m:
                    if plan is None or j % replan_every == 0:
                        plan = make_plan(layout, comps, margin=self.prune_margin)
                    cs = (c0, min(m, c0 + cols))
                    res = engine.run(layout, comps, plan, cols=cs, want_stats=True)
                else:  # this process's cells are used up (sharded fits): it adds nothing
                    zero = torch.zeros((), dtype=torch.float64, device=w.device)
                    stats = torch.zeros(k, 6, dtype=torch.float64, device=w.device)
                    res = PassResult(zero, zero, stats, None, None)
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
                bar.tick(f"epoch {epoch}/{self.n_epochs}", ll_acc / w_acc, self.n_reseeded_)
            self.n_epochs_ = epoch
            self.n_steps_ = t
            ll = ll_acc / max(w_acc, 1.0)
            if self.verbose and self._is_main():
                print(
                    f"[{type(self).__name__}] epoch {epoch}: mean batch log-lik {ll:.6f} "
                    f"({n_steps} steps of ~{cols * layout.n_cells} points, gamma {gamma:.3g}, "
                    f"{time.perf_counter() - t0:.2f} s)"
                )
            if prev is not None and abs(ll - prev) < self.tol:
                converged = True
                break
            prev = ll
        return w, mu, cov, converged

    # ------------------------------------------------------------------ inference
    def _check_fitted(self) -> None:
        if not hasattr(self, "_w64"):
            raise NotFittedError(
                "this GaussianMixture2D is not fitted yet; call fit(X) before using it"
            )

    def _prepare(self, X: Any) -> tuple[CellLayout, Components]:
        self._check_fitted()
        device = self._w64.device
        x = as_points(X, "X", device=device)
        z = ((x.to(torch.float64) - self._loc) / self._scale).to(self.dtype)
        layout = build_cells(z, default_cell_size(int(z.shape[0]), self.n_components), self.dtype)
        return layout, Components.from_params(self._w64, self._mu64, self._cov64)

    def predict(self, X: Any) -> Tensor:
        """Hard assignment ``argmax_k pi_k N(x | m_k, S_k)`` of each point; LongTensor ``(N,)``.

        Exact: the best component of every point is among the candidates of its cell
        whatever the pruning margin, so this pass prunes with ``min(prune_margin, 2)``
        nats instead of ``prune_margin`` (several times fewer candidates for large ``K``).
        """
        layout, comps = self._prepare(X)
        plan = make_plan(layout, comps, margin=min(float(self.prune_margin), _ARGMAX_MARGIN))
        engine = Engine(self.dtype, comps.mean.device, self.chunk_size, _MAX_ELEMS)
        return engine.run(layout, comps, plan, want_argmax=True).argmax

    def score_samples(self, X: Any) -> Tensor:
        """Per-point log-density ``log sum_k pi_k N(x | m_k, S_k)`` in data units; ``(N,)``."""
        layout, comps = self._prepare(X)
        plan = make_plan(layout, comps, margin=self.prune_margin)
        engine = Engine(self.dtype, comps.mean.device, self.chunk_size, _MAX_ELEMS)
        lse = engine.run(layout, comps, plan, want_lse=True).lse
        return lse - torch.log(self._scale).sum().to(lse.dtype)

    def score(self, X: Any) -> float:
        """Mean log-likelihood per point ``(1/N) sum_i log p(x_i)``, as scikit-learn's ``score``."""
        return float(self.score_samples(X).to(torch.float64).mean())

    def predict_proba(self, X: Any) -> Tensor:
        """Responsibilities ``r_ik = pi_k N(x_i | k) / sum_j pi_j N(x_i | j)``; dense ``(N, K)``."""
        layout, comps = self._prepare(X)
        n_cells = layout.n_cells
        plan = Plan([(torch.arange(n_cells, device=layout.feats.device), None)], 0.0)
        out = torch.empty(
            layout.n_points, self.n_components, dtype=self.dtype, device=layout.feats.device
        )
        engine = Engine(self.dtype, comps.mean.device, self.chunk_size, _MAX_ELEMS)
        engine.run(layout, comps, plan, resp_out=out)
        return out

    def bic(self, X: Any) -> float:
        """Bayesian information criterion ``-2 N score(X) + (6K - 1) log N`` (lower is better)."""
        n = int(as_points(X, "X").shape[0])
        n_params = 6 * self.n_components - 1
        return -2.0 * self.score(X) * n + n_params * math.log(n)

    def __repr__(self) -> str:
        return (
            f"GaussianMixture2D(n_components={self.n_components}, batch_size={self.batch_size}, "
            f"init={self.init!r}, reg_covar={self.reg_covar}, dtype={self.dtype})"
        )


# ---------------------------------------------------------------------- helpers
def _moments(s: Tensor, reg: float) -> tuple[Tensor, Tensor]:
    """Means and regularised covariances from statistics ``s (K, 6)`` (float64).

    ``m = s1 / s0``, ``S = s2 / s0 - m m^T`` projected to PSD (variances clamped at
    0, ``|S12| <= sqrt(S11 S22)``), plus ``reg I``.
    """
    n0 = s[:, 0].clamp_min(torch.finfo(torch.float64).tiny)
    mu = s[:, 1:3] / n0[:, None]
    cxx = (s[:, 3] / n0 - mu[:, 0] ** 2).clamp_min(0.0)
    cyy = (s[:, 5] / n0 - mu[:, 1] ** 2).clamp_min(0.0)
    lim = torch.sqrt(cxx * cyy)
    cxy = torch.maximum(torch.minimum(s[:, 4] / n0 - mu[:, 0] * mu[:, 1], lim), -lim)
    cov = torch.stack(
        (torch.stack((cxx + reg, cxy), dim=-1), torch.stack((cxy, cyy + reg), dim=-1)), dim=-2
    )
    return mu, cov


def _stats_from_params(w: Tensor, mu: Tensor, cov: Tensor) -> Tensor:
    """Per-point statistics implied by the parameters: ``w [1, m, S + m m^T]``; ``(K, 6)``."""
    return torch.stack(
        (
            w,
            w * mu[:, 0],
            w * mu[:, 1],
            w * (cov[:, 0, 0] + mu[:, 0] ** 2),
            w * (cov[:, 0, 1] + mu[:, 0] * mu[:, 1]),
            w * (cov[:, 1, 1] + mu[:, 1] ** 2),
        ),
        dim=1,
    )


def _params_from_labels(
    x: Tensor, labels: Tensor, centres: Tensor, k: int, reg: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Weights, means, covariances (float64) of hard clusters.

    ``pi_k = (n_k + 1) / (n + K)``; ``m_k`` the cluster mean (the centre if empty);
    ``S_k = (sum_{i in k} (x_i - m_k)(x_i - m_k)^T + W) / (n_k + 1) + reg I`` with
    ``W`` the pooled within-cluster covariance (one pseudo-point of shrinkage).
    """
    x64 = x.to(torch.float64)
    n = int(x.shape[0])
    counts = torch.bincount(labels, minlength=k).to(torch.float64)
    sums = torch.zeros(k, 2, dtype=torch.float64, device=x.device).index_add_(0, labels, x64)
    mu = torch.where(
        counts[:, None] > 0, sums / counts.clamp_min(1.0)[:, None], centres.to(torch.float64)
    )
    d = x64 - mu[labels]
    outer = torch.stack((d[:, 0] ** 2, d[:, 0] * d[:, 1], d[:, 1] ** 2), dim=1)
    acc = torch.zeros(k, 3, dtype=torch.float64, device=x.device).index_add_(0, labels, outer)
    pooled = acc.sum(dim=0) / n
    if float(pooled[0]) <= 0 or float(pooled[2]) <= 0:
        pooled = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64, device=x.device) / k
    c3 = (acc + pooled) / (counts + 1.0)[:, None]
    cov = torch.stack(
        (torch.stack((c3[:, 0] + reg, c3[:, 1]), -1), torch.stack((c3[:, 1], c3[:, 2] + reg), -1)),
        dim=-2,
    )
    w = (counts + 1.0) / (n + k)
    return w, mu, cov
