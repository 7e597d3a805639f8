r"""ArviZ statistics of an exported tree (:mod:`.arviz_export`): PSIS-LOO, model comparison,
posterior summaries, the Pareto :math:`\hat k` threshold, and the netCDF files.

PSIS-LOO
--------
:func:`loo` runs ArviZ's PSIS-LOO (``arviz_stats.loo`` on 1.x, ``az.loo`` on 0.x) on the
``log_likelihood`` group with ``reff = 1`` (draws from :math:`q` are independent): the
leave-one-out predictive of the variational approximation, treating :math:`q` as the
posterior.  Each observation has its Pareto :math:`\hat k`; above
:func:`khat_threshold` :math:`= \min(1 - 1/\log_{10} S, 0.7)` its estimate is unreliable
(Vehtari et al. 2024).  An observation whose log-likelihood is the same float in every
draw (a prediction so confident that :math:`\log p` is exactly 0) has uniform weights
and an exact estimate: its :math:`\hat k` is NaN (ArviZ 1.x's own ``loo`` raises on it,
0.x reports :math:`\infty`), counted in ``n_constant``.

Comparison without numerical warnings
-------------------------------------
:func:`compare` ranks the methods of one run (ArviZ's ``compare`` on the PSIS-LOO
objects of :func:`loo_data`) and puts in the stacking weights of
:func:`stacking_weights`.  ArviZ's own stacking (0.23 and 1.3 alike) maximises
:math:`\sum_i \log \sum_k w_k e^{\mathrm{elpd}_{ik}}` with the exponentials taken as
they are: an observation whose pointwise elpd is below about -745 in every method (the
main job's 2DG and mean-field BNNs each have one near -1,300: with 30 draws PSIS cannot
smooth its ratios, :math:`\hat k = \infty`) underflows to 0 in every column, and
:math:`\log 0` gave ``divide by zero encountered in log`` and the gradient's
:math:`0/0` ``invalid value encountered in divide`` -- and weights from a failed
optimisation.  The objective is unchanged by subtracting each row's maximum, so
:func:`stacking_weights` works in log space and never underflows.  A deterministic
network has no posterior draws and is not an input of :func:`compare`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ..files.atomic import atomic_write
from . import _arviz as A
from ._arviz import loo_data

#: netCDF backend of :func:`save_inference_data` (netCDF4/HDF5: a tree's groups need it).
NETCDF_ENGINE = "h5netcdf"


def khat_threshold(num_samples: int) -> float:
    r"""The sample-size-dependent Pareto :math:`\hat k` threshold
    :math:`\min(1 - 1/\log_{10} S, 0.7)` (Vehtari et al. 2024, "Pareto smoothed importance
    sampling"): below it the importance-sampling estimate is reliable with ``S`` draws.
    ArviZ's ``good_k``; ``-inf`` for fewer than 2 draws."""
    S = int(num_samples)
    if S < 2:
        return -math.inf
    return min(1.0 - 1.0 / math.log10(S), 0.7)


def class_probabilities(tree) -> tuple[np.ndarray, np.ndarray]:
    """``(mean class probabilities (N, C), labels (N,))`` of an exported tree: the
    Bayesian model average over its draws."""
    pp = A.group(tree, "posterior_predictive")
    if pp is None or "class_probs" not in pp:
        raise ValueError("the tree has no posterior_predictive class_probs")
    probs = pp["class_probs"].mean(dim=A.SAMPLE_DIMS).values
    return np.asarray(probs), np.asarray(A.group(tree, "observed_data")["y"].values)


def psislw(log_ratios, reff: float = 1.0) -> tuple[np.ndarray, float]:
    """PSIS of one vector of log importance ratios (ArviZ's, :func:`._arviz.psislw`):
    ``(smoothed normalised log weights, Pareto k-hat)``.  ``reff`` must be 1 (independent
    draws)."""
    if reff != 1.0:
        raise ValueError(f"reff must be 1.0 (independent draws from q), got {reff!r}")
    lw, khat = A.psislw(np.asarray(log_ratios, dtype=np.float64).reshape(-1))
    return lw, float(khat)


def loo(tree, pointwise: bool = False) -> dict:
    r"""PSIS-LOO of the tree (module docstring), as plain numbers.

    Returns ``elpd_loo``, ``se``, ``p_loo``, ``n_samples``, ``n_data_points``,
    ``warning`` (ArviZ's flag), ``good_k`` (= :func:`khat_threshold`), ``max_pareto_k``,
    ``n_bad_k`` (observations with :math:`\hat k` above ``good_k``), ``n_inf_k`` (tails
    that could not be fitted), ``n_constant`` (exact: :math:`\hat k` NaN),
    ``max_pareto_k_varying`` and ``n_bad_k_varying`` (the same two, over the
    non-constant observations: kept for older reports) and ``scale``; with
    ``pointwise`` also ``pareto_k`` and ``elpd_i``, arrays ``(n_obs,)``.

    Any of the numbers may be NaN or infinite (fewer than 21 draws: :math:`\hat k =
    \infty`); callers format them with that in mind.
    """
    f = A.elpd_fields(loo_data(tree))
    k = f["pareto_k"]
    constant = np.isnan(k)
    fitted = k[~constant]
    good = f["good_k"]
    out = {
        "elpd_loo": f["elpd"],
        "se": f["se"],
        "p_loo": f["p"],
        "n_samples": f["n_samples"],
        "n_data_points": f["n_data_points"],
        "warning": f["warning"],
        "good_k": good,
        "max_pareto_k": float(fitted.max()) if fitted.size else math.nan,
        "n_bad_k": int((fitted > good).sum()),
        "n_inf_k": int(np.isinf(fitted).sum()),
        "n_constant": int(constant.sum()),
        "scale": f["scale"],
    }
    out["max_pareto_k_varying"], out["n_bad_k_varying"] = out["max_pareto_k"], out["n_bad_k"]
    if pointwise:
        out.update(pareto_k=k, elpd_i=f["elpd_i"])
    return out


def stacking_weights(elpd_i: np.ndarray) -> np.ndarray:
    r"""Stacking weights of ``K`` models from their pointwise elpd ``(n_obs, K)``: the
    :math:`w` on the simplex maximising :math:`\sum_i \log \sum_k w_k
    e^{\mathrm{elpd}_{ik}}` (Yao et al. 2018), in log space (each row shifted by its
    maximum, :math:`w = \operatorname{softmax}(0, \theta)`), so no exponential underflows.
    """
    from scipy.optimize import minimize
    from scipy.special import log_softmax, logsumexp, softmax

    z = np.asarray(elpd_i, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    n, K = z.shape
    if K == 1:
        return np.ones(1)

    def objective(theta):
        log_w = log_softmax(np.concatenate([[0.0], theta]))
        a = z + log_w
        r = softmax(a, axis=1)  # each observation's responsibility of each model
        w = np.exp(log_w)
        grad = -(r.sum(0) - n * w)[1:]
        return -float(logsumexp(a, axis=1).sum()), grad

    res = minimize(objective, np.zeros(K - 1), jac=True, method="L-BFGS-B")
    return softmax(np.concatenate([[0.0], res.x]))


def compare(trees: dict):
    """ArviZ's comparison of the PSIS-LOO of several methods' trees (a pandas
    ``DataFrame``, best first; ArviZ 1.x's columns ``rank``, ``elpd``, ``p``,
    ``elpd_diff``, ``se``, ``dse``, ``weight``, ...; 0.x's ``elpd_loo``, ``p_loo``, ...),
    with the stable stacking weights of :func:`stacking_weights` (module docstring).

    Raises:
        ValueError: fewer than two trees, or trees whose observations differ (exported on
            other examples: use the same data, ``seed`` and ``max_examples``).
    """
    if len(trees) < 2:
        raise ValueError(f"compare needs at least two exported trees, got {len(trees)}")
    ref_name, ref = next(iter(trees.items()))
    y0 = np.asarray(A.group(ref, "observed_data")["y"].values)
    for name, tree in trees.items():
        y = np.asarray(A.group(tree, "observed_data")["y"].values)
        if y.shape != y0.shape or not np.array_equal(y, y0):
            raise ValueError(
                f"tree {name!r} holds other observations than {ref_name!r} "
                f"({y.shape[0]} against {y0.shape[0]} examples, or other labels): export "
                "every method on the same data with the same seed and max_examples"
            )
    elpds = {name: loo_data(tree) for name, tree in trees.items()}
    table = A.compare_table(elpds)
    pointwise = np.stack([A.elpd_fields(e)["elpd_i"] for e in elpds.values()], axis=1)
    weights = dict(zip(elpds, stacking_weights(pointwise), strict=True))
    table["weight"] = [weights[name] for name in table.index]
    return table


def save_inference_data(tree, path: str | os.PathLike) -> Path:
    """Write an exported tree as netCDF4 (``h5netcdf``) atomically: a temporary file in
    the same folder, renamed into place.  Read it with :func:`load_inference_data`
    (``xarray.open_datatree`` on ArviZ 1.x, ``az.from_netcdf`` on 0.x)."""
    path = Path(path)
    # h5py crashes the process when the disk fills mid-write: refuse before writing when
    # the free space cannot hold the data (plus room for the file's own structure)
    size = sum(int(A.group(tree, name).nbytes) for name in A.group_names(tree))
    write = lambda tmp: tree.to_netcdf(str(tmp), engine=NETCDF_ENGINE)  # noqa: E731
    try:
        atomic_write(path, write, size_hint=size + 256 * 1024)
    except ImportError as e:  # ArviZ 1.x does not depend on a netCDF4 writer
        raise ImportError(
            f"writing a netCDF4 file needs h5netcdf and h5py (pip install h5netcdf h5py): {e}"
        ) from e
    return path


def load_inference_data(path: str | os.PathLike):
    """Read a file written by :func:`save_inference_data`, fully into memory."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    return A.from_netcdf(str(path), NETCDF_ENGINE)
