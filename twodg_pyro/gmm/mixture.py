"""Two-dimensional Gaussian mixture fitted by (mini-batch) EM, in pure torch.

Model: ``p(x) = sum_k pi_k N(x | m_k, S_k)`` with ``x`` in R^2, full covariances.

The fit works in standardised coordinates ``z = (x - mean(X)) / std(X)`` (per
dimension); the fitted attributes are mapped back to data units. Every E-step
runs through a spatially blocked, candidate-pruned engine (see ``_cells``): the
points are sorted into small cells and each cell only evaluates the components
that can carry a responsibility above ``exp(-prune_margin)`` there, which keeps
``K`` in the thousands affordable for millions of points, and memory bounded by
``chunk_size``. The EM itself (full-data and online) is :mod:`.em`; the
initialisation (k-means) is :mod:`.initial`.
"""

from __future__ import annotations

import math
import os
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._cells import Engine, PassResult, make_plan
from ._layout import CellLayout, Components, build_cells, default_cell_size
from .em import m_step, run_em
from .initial import initial_mixture
from .linalg2x2 import _check_finite_rows, _check_int, _is_int

_INITS = ("kmeans++", "kmeans", "random")
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
    _check_finite_rows(name, t)
    return t


@dataclass(eq=False, repr=False)
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

    Example::

        gmm = GaussianMixture2D(n_components=32, random_state=0).fit(points)   # (n, 2)
        labels = gmm.predict(points)
        gmm.means_, gmm.covariances_, gmm.weights_
    """

    n_components: int
    _: KW_ONLY
    max_iter: int = 100
    tol: float = 1e-4
    batch_size: int | None = None
    n_epochs: int = 5
    learning_decay: float = 0.6
    learning_offset: float = 1.0
    init: str = "kmeans++"
    init_lloyd_iter: int = 5
    init_subsample: int | None = None
    reg_covar: float = 1e-6
    chunk_size: int = 250_000
    prune_margin: float = 20.0
    random_state: int | None = None
    device: str | torch.device | None = None
    dtype: torch.dtype = torch.float32
    verbose: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        self._validate_params()

    def _validate_params(self) -> None:
        _check_int("n_components", self.n_components, 1)
        _check_int("max_iter", self.max_iter, 0)
        for name in ("tol", "reg_covar"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        _check_int("batch_size", self.batch_size, 1, none_ok=True)
        _check_int("n_epochs", self.n_epochs, 1)
        if not (0.5 < float(self.learning_decay) <= 1.0):
            raise ValueError(f"learning_decay must be in (0.5, 1], got {self.learning_decay!r}")
        if not (float(self.learning_offset) >= 1.0):
            raise ValueError(f"learning_offset must be >= 1, got {self.learning_offset!r}")
        if self.init not in _INITS:
            raise ValueError(f"init must be one of {_INITS}, got {self.init!r}")
        _check_int("init_lloyd_iter", self.init_lloyd_iter, 0)
        _check_int("init_subsample", self.init_subsample, 1, none_ok=True)
        _check_int("chunk_size", self.chunk_size, 1)
        if not (float(self.prune_margin) > 0):
            raise ValueError(f"prune_margin must be > 0, got {self.prune_margin!r}")
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {self.dtype!r}")
        if self.random_state is not None and not _is_int(self.random_state):
            raise ValueError(f"random_state must be None or an int, got {self.random_state!r}")

    def _device_for(self, x: Any) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return x.device if isinstance(x, Tensor) else torch.device("cpu")

    def _generator(self, device: torch.device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self._seed())

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
        log_jac = float(torch.log(scale).sum())
        w, mu, cov, labels = run_em(self, z, offset, n, device, log_jac)
        self._w64, self._mu64, self._cov64 = w, mu, cov
        self._loc, self._scale = loc, scale
        self.weights_ = w.to(self.dtype)
        self.means_ = (mu * scale + loc).to(self.dtype)
        c = cov * (scale[None, :, None] * scale[None, None, :])
        self.covariances_ = (0.5 * (c + c.transpose(1, 2))).to(self.dtype)
        return self._gather_labels(labels)

    def _initialise(self, z: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Initial weights, means, covariances of the components on ``z`` (see
        :func:`~twodg_pyro.gmm.initial.initial_mixture`)."""
        return initial_mixture(
            z,
            self.n_components,
            gen,
            init=self.init,
            lloyd_iter=self.init_lloyd_iter,
            subsample=self.init_subsample,
            reg=self.reg_covar,
        )

    def _m_step(self, s: Tensor, z: Any, gen: torch.Generator) -> tuple[Tensor, ...]:
        """The M-step of :func:`~twodg_pyro.gmm.em.m_step` on this fit's ``N`` points,
        counting the re-seeded components in ``n_reseeded_``."""
        w, mu, cov, s, n_dead = m_step(s, z, gen, self._n_fit, self.n_components, self.reg_covar)
        self.n_reseeded_ += n_dead
        return w, mu, cov, s, n_dead

    def _prepare(self, X: Any) -> tuple[CellLayout, Components, Engine]:
        """``X``'s cells in the fit's standardised coordinates, the fitted components and
        an E-step engine for them."""
        if not hasattr(self, "_w64"):
            raise NotFittedError(
                "this GaussianMixture2D is not fitted yet; call fit(X) before using it"
            )
        device = self._w64.device
        x = as_points(X, "X", device=device)
        z = ((x.to(torch.float64) - self._loc) / self._scale).to(self.dtype)
        layout = build_cells(z, default_cell_size(int(z.shape[0]), self.n_components), self.dtype)
        comps = Components.from_params(self._w64, self._mu64, self._cov64)
        return layout, comps, Engine(self.dtype, comps.mean.device, self.chunk_size)

    def predict(self, X: Any) -> Tensor:
        """Hard assignment ``argmax_k pi_k N(x | m_k, S_k)`` of each point; LongTensor ``(N,)``.

        Exact: the best component of every point is among the candidates of its cell
        whatever the pruning margin, so this pass prunes with ``min(prune_margin, 2)``
        nats instead of ``prune_margin`` (several times fewer candidates for large ``K``).
        """
        layout, comps, engine = self._prepare(X)
        plan = make_plan(layout, comps, margin=min(float(self.prune_margin), _ARGMAX_MARGIN))
        return engine.run(layout, comps, plan, want_argmax=True).argmax

    def score_samples(self, X: Any) -> Tensor:
        """Per-point log-density ``log sum_k pi_k N(x | m_k, S_k)`` in data units; ``(N,)``."""
        layout, comps, engine = self._prepare(X)
        plan = make_plan(layout, comps, margin=self.prune_margin)
        lse = engine.run(layout, comps, plan, want_lse=True).lse
        return lse - torch.log(self._scale).sum().to(lse.dtype)

    def score(self, X: Any) -> float:
        """Mean log-likelihood per point ``(1/N) sum_i log p(x_i)``, as scikit-learn's ``score``."""
        return float(self.score_samples(X).to(torch.float64).mean())

    def predict_proba(self, X: Any) -> Tensor:
        """Responsibilities ``r_ik = pi_k N(x_i | k) / sum_j pi_j N(x_i | j)``; dense ``(N, K)``."""
        layout, comps, engine = self._prepare(X)
        out = torch.empty(
            layout.n_points, self.n_components, dtype=self.dtype, device=layout.feats.device
        )
        engine.run(layout, comps, make_plan(layout, comps, margin=math.inf), resp_out=out)
        return out

    def bic(self, X: Any) -> float:
        """Bayesian information criterion ``-2 N score(X) + (6K - 1) log N`` (lower is better)."""
        n = int(as_points(X, "X").shape[0])
        n_params = 6 * self.n_components - 1
        return -2.0 * self.score(X) * n + n_params * math.log(n)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_components={self.n_components}, batch_size={self.batch_size}"
            f", init={self.init!r}, reg_covar={self.reg_covar}, dtype={self.dtype})"
        )
