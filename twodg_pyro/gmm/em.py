"""Fitting :class:`~twodg_pyro.gmm.GaussianMixture2D`: (mini-batch) EM on standardised points.

EM (Dempster et al. 1977) on the standardised data ``z``:

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

The loops take the estimator ``gm`` for its settings, its fitted attributes and its
process seams (``_initial_params``, ``_reduce_estep``, ``_all_sum``, ``_is_main``, ...):
the same EM runs in one process and, with the seams filled in, across processes.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ._cells import Engine, PassResult, Plan, make_plan
from ._layout import CellLayout, Components
from .linalg2x2 import mat2x2


class FitProgress(tqdm):
    """The fit's tqdm bar (``"GMM EM"``, on stderr): one tick per online-EM step and per
    full-data iteration; the postfix shows the phase, the mean log-likelihood per point in
    data units (the running batch mean during online EM), ``K`` and the components
    re-seeded so far. It only reads numbers the fit has computed anyway."""

    def __init__(self, enabled: bool, total: int, log_jac: float, k: int):
        super().__init__(total=total, desc="GMM EM", unit="step", disable=not enabled, leave=False)
        self.log_jac, self.k = log_jac, k

    def tick(self, phase: str, ll: float, reseeded: int) -> None:
        ll_data = f"{ll - self.log_jac:.5g}"
        self.set_postfix_str(f"{phase}, ll {ll_data}, K {self.k}, reseeded {reseeded}", False)
        self.update(1)


@dataclass
class _Fit:
    """What every EM iteration of one fit reads."""

    z: Any  #: all standardised points as the M-step sees them (``gm._global_points``)
    layout: CellLayout  #: the cells of this process's points
    engine: Engine
    gen: torch.Generator  #: draws the rows re-seeded components move to
    shuffle_gen: torch.Generator  #: shuffles the cells for online EM
    bar: FitProgress


def run_em(
    gm: Any, z: Tensor, offset: int, n: int, device: torch.device, log_jac: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fit ``gm`` to the standardised points ``z`` (this process's rows, from global row
    ``offset``, of ``n`` in all): initialise, online EM (with ``batch_size``), full-data
    EM (``max_iter > 0``), then a last E-step for ``lower_bound_`` and ``counts_``
    (``log_jac = sum_d log std_d`` maps log-densities to data units).

    Sets the fitted counters (``n_iter_``, ``n_epochs_``, ``n_steps_``, ``n_reseeded_``,
    ``converged_``, ``lower_bound_``, ``counts_``) and returns the float64 weights,
    means and covariances in standardised coordinates, and the local hard labels.
    """
    gen = gm._generator(device)
    gm._n_fit = n
    k = gm.n_components
    t0 = time.perf_counter()
    w, mu, cov = gm._initial_params(z, offset, n, gen)
    layout, shuffle_gen = gm._layout(z, n, gen)
    if gm.verbose and gm._is_main():
        print(
            f"[{type(gm).__name__}] init {gm.init!r} and {layout.n_cells} cells of "
            f"{layout.cell_size} points: {time.perf_counter() - t0:.2f} s"
        )
    engine = Engine(gm.dtype, device, gm.chunk_size)
    zg = gm._global_points(z, offset, n)
    gm.n_reseeded_ = gm.n_epochs_ = gm.n_steps_ = gm.n_iter_ = 0
    converged = False
    bar = FitProgress(gm.progress and gm._is_main(), gm.max_iter, log_jac, k)
    fit = _Fit(zg, layout, engine, gen, shuffle_gen, bar)
    try:
        if gm.batch_size is not None:
            w, mu, cov, converged = _online_em(gm, fit, w, mu, cov)
        if gm.max_iter > 0:
            w, mu, cov, converged = _batch_em(gm, fit, w, mu, cov)
    finally:
        bar.close()
    if gm.max_iter > 0 and not converged and gm.batch_size is None and gm._is_main():
        warnings.warn(
            f"{type(gm).__name__} did not converge in max_iter={gm.max_iter} "
            f"iterations (tol={gm.tol}); increase max_iter or tol",
            RuntimeWarning,
            stacklevel=4,  # the caller of fit / fit_predict
        )
    gm.converged_ = converged

    comps = Components.from_params(w, mu, cov)
    plan = make_plan(layout, comps, margin=gm.prune_margin)
    res = engine.run(layout, comps, plan, want_argmax=True)
    engine.release()
    gm.lower_bound_ = float(gm._all_sum(res.ll_sum)) / n - log_jac
    gm.counts_ = gm._all_sum(torch.bincount(res.argmax, minlength=k))
    return w, mu, cov, res.argmax


def m_step(
    s: Tensor, z: Any, gen: torch.Generator, n: int, k: int, reg: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """M-step on per-point statistics ``s (K, 6)`` of ``n`` points; re-seeds emptied components.

    A component holding fewer than ``min(1, 0.1 n / K)`` points is moved to a random
    row of ``z`` (drawn from ``gen``) with the pooled covariance of the others and an
    equal share of the weight. Returns ``(weights, means, covs, s, n_dead)``; ``s`` is
    updated for re-seeded components so that it stays consistent with the parameters.
    """
    n0 = s[:, 0]
    dead = n0 * n < min(1.0, 0.1 * n / k)
    n_dead = int(dead.sum())
    mu, cov = _moments(s, reg)
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
        share = (n0.sum() / k).expand(n_dead)
        cb = base - reg * torch.eye(2, dtype=torch.float64, device=s.device)
        s[dead] = _stats_from_params(share, mu[dead], cb.expand(n_dead, 2, 2))
    w = s[:, 0] / s[:, 0].sum()
    return w, mu, cov, s, n_dead


def _batch_em(
    gm: Any, fit: _Fit, w: Tensor, mu: Tensor, cov: Tensor
) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Full-data EM iterations until the mean log-likelihood changes by less than ``tol``
    (with nothing re-seeded), at most ``max_iter``."""
    n = gm._n_fit
    prev = -math.inf
    for it in range(1, gm.max_iter + 1):
        t0 = time.perf_counter()
        comps = Components.from_params(w, mu, cov)
        plan = make_plan(fit.layout, comps, margin=gm.prune_margin)
        res = gm._reduce_estep(fit.engine.run(fit.layout, comps, plan, want_stats=True))
        ll = float(res.ll_sum) / n
        w, mu, cov, _, n_dead = gm._m_step(res.stats / n, fit.z, fit.gen)
        gm.n_iter_ = it
        change = ll - prev
        fit.bar.tick(f"iter {it}", ll, gm.n_reseeded_)
        if gm.verbose and gm._is_main():
            print(
                f"[{type(gm).__name__}] EM iter {it}: mean log-lik {ll:.6f} "
                f"(change {change:.3g}, candidates/point {plan.mean_candidates:.1f}, "
                f"reseeded {n_dead}, {time.perf_counter() - t0:.2f} s)"
            )
        if abs(change) < gm.tol and n_dead == 0:
            return w, mu, cov, True
        prev = ll
    return w, mu, cov, False


def _online_em(
    gm: Any, fit: _Fit, w: Tensor, mu: Tensor, cov: Tensor
) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Online EM epochs until the mean batch log-likelihood of an epoch changes by less
    than ``tol``, at most ``n_epochs``; the cells are shuffled before every epoch."""
    layout, bar = fit.layout, fit.bar
    reg_eye = gm.reg_covar * torch.eye(2, dtype=torch.float64, device=w.device)
    s = _stats_from_params(w, mu, cov - reg_eye)
    m = layout.cell_size
    cols, n_steps = gm._online_schedule(layout)
    bar.total += gm.n_epochs * n_steps
    bar.refresh()
    replan_every = max(1, n_steps // 4)
    comps = Components.from_params(w, mu, cov)
    t = 0
    prev = None
    gamma = math.nan
    for epoch in range(1, gm.n_epochs + 1):
        t0 = time.perf_counter()
        layout.shuffle_within_cells(fit.shuffle_gen)
        ll_acc = w_acc = 0.0
        plan: Plan | None = None
        for j in range(n_steps):
            c0 = j * cols
            if c0 < m:
                if plan is None or j % replan_every == 0:
                    plan = make_plan(layout, comps, margin=gm.prune_margin)
                cs = (c0, min(m, c0 + cols))
                res = fit.engine.run(layout, comps, plan, cols=cs, want_stats=True)
            else:  # this process's cells are used up (sharded fits): it adds nothing
                zero = torch.zeros((), dtype=torch.float64, device=w.device)
                res = PassResult(zero, zero, zero.new_zeros(gm.n_components, 6), None, None)
            res = gm._reduce_estep(res)
            wsum = float(res.weight_sum)
            if wsum <= 0:
                continue
            gamma = (t + gm.learning_offset) ** (-gm.learning_decay)
            s = (1.0 - gamma) * s + gamma * (res.stats / wsum)
            w, mu, cov, s, n_dead = gm._m_step(s, fit.z, fit.gen)
            comps = Components.from_params(w, mu, cov)
            if n_dead:
                plan = None
            t += 1
            ll_acc += float(res.ll_sum)
            w_acc += wsum
            bar.tick(f"epoch {epoch}/{gm.n_epochs}", ll_acc / w_acc, gm.n_reseeded_)
        gm.n_epochs_, gm.n_steps_ = epoch, t
        ll = ll_acc / max(w_acc, 1.0)
        if gm.verbose and gm._is_main():
            print(
                f"[{type(gm).__name__}] epoch {epoch}: mean batch log-lik {ll:.6f} "
                f"({n_steps} steps of ~{cols * layout.n_cells} points, gamma {gamma:.3g}, "
                f"{time.perf_counter() - t0:.2f} s)"
            )
        if prev is not None and abs(ll - prev) < gm.tol:
            return w, mu, cov, True
        prev = ll
    return w, mu, cov, False


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
    return mu, mat2x2(cxx + reg, cxy, cxy, cyy + reg)


def _stats_from_params(w: Tensor, mu: Tensor, cov: Tensor) -> Tensor:
    """Per-point statistics implied by the parameters: ``w [1, m, S + m m^T]``; ``(K, 6)``."""
    m0, m1 = mu[:, 0], mu[:, 1]
    second = (cov[:, 0, 0] + m0**2, cov[:, 0, 1] + m0 * m1, cov[:, 1, 1] + m1**2)
    return w[:, None] * torch.stack((torch.ones_like(w), m0, m1, *second), dim=1)
