r"""ArviZ statistics of exported InferenceData (:mod:`.arviz_export`): PSIS-LOO, model
comparison, posterior summaries, and the netCDF files they are kept in.

PSIS-LOO and model comparison
-----------------------------
:func:`loo` runs ``az.loo`` on the ``log_likelihood`` group with ``reff = 1`` (draws from
:math:`q` are independent): it estimates the leave-one-out predictive of the variational
approximation, treating :math:`q` as the posterior.  :func:`compare` ranks the methods
of one run (``az.compare`` on their PSIS-LOO, same ``reff``): every InferenceData must
hold the same observations.  A deterministic network has no posterior draws (its log
score is the NLL of the results table) and is not an input of :func:`compare`.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np

from ..io.files import atomic_write
from ._draws import quiet

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.x refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = [
    "NETCDF_ENGINE",
    "class_probabilities",
    "compare",
    "load_inference_data",
    "loo",
    "psislw",
    "save_inference_data",
    "summary",
]

#: netCDF backend of :func:`save_inference_data`.  ``h5netcdf`` is a dependency of
#: ArviZ 0.23 itself (and ArviZ's default); the groups of an InferenceData need netCDF4
#: (HDF5) files, which scipy's netCDF3 writer cannot hold.
NETCDF_ENGINE = "h5netcdf"


def class_probabilities(idata: az.InferenceData) -> tuple[np.ndarray, np.ndarray]:
    """``(mean class probabilities (N, C), labels (N,))`` of an exported InferenceData:
    the Bayesian model average over its draws."""
    if "class_probs" not in getattr(idata, "posterior_predictive", {}):
        raise ValueError("the InferenceData has no posterior_predictive class_probs")
    probs = idata.posterior_predictive["class_probs"].mean(dim=("chain", "draw")).values
    return np.asarray(probs), np.asarray(idata.observed_data["y"].values)


# ---------------------------------------------------------------------------- statistics
def psislw(log_ratios: np.ndarray, reff: float = 1.0) -> tuple[np.ndarray, float]:
    """``az.psislw`` of one vector of log importance ratios: ``(smoothed normalised log
    weights, Pareto k-hat)``."""
    with quiet():
        lw, khat = az.psislw(np.asarray(log_ratios, dtype=np.float64).copy(), reff=reff)
    return np.asarray(lw), float(np.asarray(khat))


def _finite_or_nan(x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def loo(idata: az.InferenceData) -> dict:
    """PSIS-LOO (``az.loo``, ``reff = 1``) from the ``log_likelihood`` group.

    Returns ``elpd_loo``, ``se``, ``p_loo``, ``n_samples``, ``n_data_points``,
    ``warning`` (ArviZ's flag), ``good_k`` (ArviZ's sample-size-dependent threshold),
    ``max_pareto_k``, ``n_bad_k`` (observations with :math:`\\hat k` above ``good_k``),
    ``n_inf_k`` (those whose tail could not be fitted) and ``scale``.

    An observation whose log-likelihood is the same in every draw (a prediction so
    confident that :math:`\\log p` rounds to the same float64 in every draw, usually
    exactly 0) has uniform importance weights: its leave-one-out term is exact, but
    ArviZ finds no tail to fit and reports :math:`\\hat k = \\infty`.  ``n_constant``
    counts them, and ``max_pareto_k_varying`` / ``n_bad_k_varying`` are the
    :math:`\\hat k` figures over the other observations.

    Any of the numbers may be NaN or infinite (fewer than about 25 draws: ArviZ reports
    :math:`\\hat k = \\infty`); callers format them with that in mind.
    """
    with quiet():
        res = az.loo(idata, pointwise=True, reff=1.0)
    k = np.asarray(res.pareto_k.values, dtype=np.float64)
    good = _finite_or_nan(getattr(res, "good_k", 0.7))
    ll = np.asarray(idata.log_likelihood["y"].values, dtype=np.float64)
    ll = ll.reshape(-1, ll.shape[-1])
    constant = np.all(ll == ll[:1], axis=0)  # the same in every draw: uniform weights
    rest = k[~constant]
    return {
        "elpd_loo": _finite_or_nan(res.elpd_loo),
        "se": _finite_or_nan(res.se),
        "p_loo": _finite_or_nan(res.p_loo),
        "n_samples": int(res.n_samples),
        "n_data_points": int(res.n_data_points),
        "warning": bool(res.warning),
        "good_k": good,
        "max_pareto_k": float(np.nanmax(k)) if k.size and not np.all(np.isnan(k)) else math.nan,
        "n_bad_k": int((k > good).sum()),
        "n_inf_k": int(np.isinf(k).sum()),
        "n_constant": int(constant.sum()),
        "max_pareto_k_varying": float(rest.max()) if rest.size else math.nan,
        "n_bad_k_varying": int((rest > good).sum()),
        "scale": str(res.scale),
    }


def compare(idatas: dict[str, az.InferenceData]):
    """``az.compare`` of the PSIS-LOO (``reff = 1``) of several methods' InferenceData
    (a pandas ``DataFrame``, best first: ``rank``, ``elpd_loo``, ``p_loo``,
    ``elpd_diff``, ``weight`` (stacking), ``se``, ``dse``, ``warning``, ``scale``).

    Raises:
        ValueError: fewer than two InferenceData, or InferenceData whose observations
            differ (exported on other examples: use the same data, ``seed`` and
            ``max_examples``).
    """
    if len(idatas) < 2:
        raise ValueError(f"compare needs at least two InferenceData, got {len(idatas)}")
    ref_name, ref = next(iter(idatas.items()))
    y0 = np.asarray(ref.observed_data["y"].values)
    for name, idata in idatas.items():
        y = np.asarray(idata.observed_data["y"].values)
        if y.shape != y0.shape or not np.array_equal(y, y0):
            raise ValueError(
                f"InferenceData {name!r} holds other observations than {ref_name!r} "
                f"({y.shape[0]} against {y0.shape[0]} examples, or other labels): export "
                "every method on the same data with the same seed and max_examples"
            )
    with quiet():
        elpd = {name: az.loo(idata, pointwise=True, reff=1.0) for name, idata in idatas.items()}
        return az.compare(elpd, ic="loo")


def summary(idata: az.InferenceData, var_names: list[str] | None = None, **kwargs):
    """``az.summary`` of the exported posterior (a pandas ``DataFrame``).

    With one chain ``r_hat`` is NaN.  ``kwargs`` go to ``az.summary`` (e.g.
    ``kind="stats"`` for the moments and HDI only, which is fast on many variables).
    """
    with quiet():
        return az.summary(idata, var_names=var_names, **kwargs)


# ---------------------------------------------------------------------------- files
def save_inference_data(idata: az.InferenceData, path: str | os.PathLike) -> Path:
    """Write ``idata`` as netCDF4 (``h5netcdf`` engine) atomically: a temporary file in
    the same folder, renamed into place.  Load it back with :func:`load_inference_data`
    or ``az.from_netcdf``."""
    path = Path(path)
    atomic_write(path, lambda tmp: idata.to_netcdf(tmp, engine=NETCDF_ENGINE))
    return path


def load_inference_data(path: str | os.PathLike) -> az.InferenceData:
    """Read a file written by :func:`save_inference_data`, fully into memory."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {str(path)!r}")
    with quiet():
        idata = az.from_netcdf(str(path), engine=NETCDF_ENGINE)
    for group in idata.groups():
        getattr(idata, group).load()
    return idata
