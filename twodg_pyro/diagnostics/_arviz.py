r"""The installed ArviZ behind one interface: **the only module that knows which major it is.**

ArviZ 1.x (``arviz-base`` / ``arviz-stats`` / ``arviz-plots``, Python >= 3.12) holds a
run's draws in an :class:`xarray.DataTree`; ArviZ 0.x (0.23, the last of its line, and
all that Python 3.11 can install) in an ``arviz.InferenceData``.  Both are called a
*tree* below.  Every function here takes and returns the same Python types on both
majors (NumPy arrays, :class:`xarray.Dataset`, pandas frames, matplotlib figures), so
the rest of :mod:`twodg_pyro.diagnostics` never branches on the version.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import warnings
from contextlib import contextmanager

import numpy as np
import xarray as xr
from scipy.special import log_softmax


def _version() -> str:
    try:
        return importlib.metadata.version("arviz")  # ``arviz.__version__``
    except importlib.metadata.PackageNotFoundError:  # arviz-base/-stats without the meta package
        return importlib.metadata.version("arviz-base")


#: The installed ArviZ's version (``arviz.__version__``; ``arviz-base``'s where only the
#: ArviZ 1.x parts are installed), its major version (0 or 1) and whether its trees are
#: DataTrees.
ARVIZ_VERSION = _version()
ARVIZ_MAJOR = int(ARVIZ_VERSION.split(".")[0])
DATATREE = ARVIZ_MAJOR >= 1
#: The sample dimensions of every sampled group: one chain of independent draws.
SAMPLE_DIMS = ("chain", "draw")
#: The ArviZ warning that Pareto k-hat exceeds its threshold (the library reports k-hat).
_PARETO_WARNING = "Estimated shape parameter of Pareto distribution"

if DATATREE:
    import arviz_base
    import arviz_stats
    from arviz_stats.base import array_stats
else:
    with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.x refactor on import
        warnings.simplefilter("ignore", FutureWarning)
        import arviz as az


@contextmanager
def quiet():
    """Silence ArviZ's warnings and log lines (one chain: no R-hat; constant variables)."""
    logger = (None if DATATREE else getattr(az, "_log", None)) or logging.getLogger("arviz")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _dataset(variables: dict, coords: dict, dims: dict, attrs: dict, sampled: bool):
    used = {d for name in variables for d in dims.get(name, [])}
    coords = {k: v for k, v in coords.items() if k in used}
    dims = {k: v for k, v in dims.items() if k in variables}
    if DATATREE:
        make = arviz_base.dict_to_dataset
        extra = {"sample_dims": list(SAMPLE_DIMS) if sampled else [], "check_conventions": False}
    else:
        make, extra = az.dict_to_dataset, {"default_dims": None if sampled else []}
    return make(variables, attrs=attrs, coords=coords, dims=dims, index_origin=0, **extra)


def build_tree(
    groups: dict[str, dict],
    sampled: set[str],
    coords: dict,
    dims: dict,
    attrs: dict,
    group_coords: dict[str, dict] | None = None,
):
    """A tree of ``groups`` (``{group: {variable: array}}``); the groups in ``sampled``
    have leading ``(chain, draw)`` axes, the others none.  ``coords`` are shared (a
    group's entry in ``group_coords`` overrides them), ``attrs`` go on every group (ArviZ
    readers look at the group's) and on the root."""
    group_coords = group_coords or {}
    with quiet():
        data = {
            name: _dataset(
                v, {**coords, **group_coords.get(name, {})}, dims, attrs, name in sampled
            )
            for name, v in groups.items()
        }
        if DATATREE:
            tree = xr.DataTree.from_dict(data)
            tree.attrs = dict(attrs)
        else:
            tree = az.InferenceData(attrs=dict(attrs), warn_on_custom_groups=False, **data)
    return tree


def group_names(tree) -> list[str]:
    """The names of the tree's groups (``posterior``, ``log_likelihood``, ...)."""
    return list(tree.children) if DATATREE else list(tree.groups())


def group(tree, name: str) -> xr.Dataset | None:
    """Group ``name`` of the tree as an :class:`xarray.Dataset`, or ``None``."""
    if name not in group_names(tree):
        return None
    return tree[name].to_dataset() if DATATREE else getattr(tree, name)


def _psis_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if DATATREE:
        return array_stats.psislw(-rows, r_eff=1.0, axis=-1)  # it smooths the negated input
    with quiet():
        return az.psislw(rows.copy(), reff=1.0)


def psislw(log_ratios) -> tuple[np.ndarray, np.ndarray]:
    r"""Pareto-smoothed importance sampling of log ratios along the last axis.

    Returns ``(log_weights, khat)``: the smoothed, normalised log weights (the shape of
    ``log_ratios``) and the Pareto :math:`\hat k` of each row (its shape less the last
    axis).  Handled here, the same on both majors:

    * a row whose ratios are all equal (e.g. an observation predicted so confidently that
      its log-likelihood is the same float in every draw) has uniform weights and an exact
      estimate: :math:`\hat k` is NaN (nothing to fit; ArviZ 1.x raises, 0.x says inf);
    * a tail that cannot be fitted -- fewer than 21 draws (a tail of fewer than 5), on
      ArviZ 1.x fewer than 30 (its fit needs a tail of 6), or a tail of equal values --
      has :math:`\hat k = \infty` (ArviZ 1.x says NaN) and the raw normalised weights.
    """
    r = np.asarray(log_ratios, dtype=np.float64)
    flat = r.reshape(-1, r.shape[-1])
    n = flat.shape[1]
    lw, khat = log_softmax(flat, axis=-1), np.full(flat.shape[0], np.nan)
    varying = ~np.all(flat == flat[:, :1], axis=1)  # (none when there are no draws)
    if varying.any() and math.ceil(min(0.2 * n, 3 * math.sqrt(n))) < 5:  # PSIS's tail length
        khat[varying] = np.inf
    elif varying.any():
        rows = np.flatnonzero(varying)
        try:
            lw[rows], khat[rows] = _psis_rows(flat[rows])
        except (ValueError, IndexError):  # one row's tail is flat: fit row by row
            for i in rows:
                try:
                    w, k = _psis_rows(flat[i : i + 1])
                    lw[i], khat[i] = w[0], np.asarray(k).reshape(-1)[0]
                except (ValueError, IndexError):
                    khat[i] = np.inf
    khat[varying & np.isnan(khat)] = np.inf  # 1.x: no fit below 30 draws or on odd tails
    lw = lw - np.logaddexp.reduce(lw, axis=1, keepdims=True)
    return lw.reshape(r.shape), khat.reshape(r.shape[:-1])


def loo_data(tree, var_name: str = "y"):
    r"""ArviZ's own PSIS-LOO object (1.x ``ELPDDataLOO``, 0.x ``ELPDData``) of ``var_name``
    in the tree's ``log_likelihood`` group (``reff = 1``: independent draws; pointwise),
    with the :math:`\hat k` of :func:`psislw` (NaN for an observation whose
    log-likelihood is the same in every draw), for ``compare`` and ArviZ's plots
    (``plot_khat``)."""
    ll = group(tree, "log_likelihood")[var_name]
    obs_dims = [d for d in ll.dims if d not in SAMPLE_DIMS]
    ll = ll.transpose(*obs_dims, *SAMPLE_DIMS)
    lw, khat = psislw(-ll.values.reshape(*ll.shape[: len(obs_dims)], -1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PARETO_WARNING)
        warnings.filterwarnings("ignore", message="The point-wise LOO is the same")
        if DATATREE:
            lw_da = xr.DataArray(lw.reshape(ll.shape), dims=ll.dims, coords=ll.coords)
            k_da = xr.DataArray(khat, dims=obs_dims, coords={d: ll[d] for d in obs_dims})
            return arviz_stats.loo(
                tree, pointwise=True, var_name=var_name, reff=1.0, log_weights=lw_da, pareto_k=k_da
            )
        with quiet():
            res = az.loo(tree, pointwise=True, var_name=var_name, reff=1.0)
    res["pareto_k"] = res["pareto_k"].copy(data=khat)  # the same psislw: only NaN differs
    res["warning"] = bool(np.any(khat > res["good_k"]))
    return res


def elpd_fields(res) -> dict:
    """The numbers of a PSIS-LOO object of either major: ``elpd``, ``se``, ``p``,
    ``n_samples``, ``n_data_points``, ``warning``, ``good_k``, ``scale``, and the
    pointwise ``elpd_i`` and ``pareto_k`` as flat float64 arrays."""
    get = (lambda k: getattr(res, k)) if DATATREE else res.__getitem__
    names = ("elpd", "p", "elpd_i") if DATATREE else ("elpd_loo", "p_loo", "loo_i")
    elpd, p, elpd_i = map(get, names)
    return {
        "elpd": float(elpd),
        "se": float(get("se")),
        "p": float(p),
        "n_samples": int(get("n_samples")),
        "n_data_points": int(get("n_data_points")),
        "warning": bool(get("warning")),
        "good_k": float(get("good_k")),
        "scale": str(get("scale")),
        "elpd_i": np.asarray(elpd_i.values, dtype=np.float64).reshape(-1),
        "pareto_k": np.asarray(get("pareto_k").values, dtype=np.float64).reshape(-1),
    }


def compare_table(elpds: dict):
    """ArviZ's comparison table of PSIS-LOO objects (``arviz_stats.compare`` /
    ``az.compare``), its ``weight`` column from ``method="pseudo-BMA"`` (the caller puts
    the stacking weights in: ArviZ's stacking exponentiates the pointwise elpd unshifted)."""
    with warnings.catch_warnings():
        # ArviZ 0.23 sorts with pandas' deprecated inplace=True (pandas >= 3)
        warnings.filterwarnings("ignore", message="The inplace keyword")
        if DATATREE:
            return arviz_stats.compare(elpds, method="pseudo-BMA", round_to="none")
        return az.compare(elpds, ic="loo", method="pseudo-BMA")


def chain_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """ArviZ's convergence statistics of draws ``values`` of shape ``(chain, draw, ...)``,
    one per trailing entry: ``rhat`` (rank-normalised split R-hat, Vehtari et al. 2021),
    ``ess_bulk`` and ``ess_tail`` (of all chains together), each of shape ``values.shape[2:]``
    (NaN where a value is constant: R-hat is undefined there)."""
    values = np.asarray(values, dtype=float)
    if values.ndim < 2:
        raise ValueError(f"chain_stats needs (chain, draw, ...) values, got shape {values.shape}")
    trailing = values.shape[2:]
    flat = values.reshape(*values.shape[:2], -1)
    with quiet():
        if DATATREE:
            ary = np.moveaxis(flat, (0, 1), (-2, -1))  # (..., chain, draw)
            axes = {"chain_axis": -2, "draw_axis": -1}
            out = {  # ess_tail at 0.x's default quantiles, 5 % and 95 %
                "rhat": array_stats.rhat(ary, **axes, method="rank"),
                "ess_bulk": array_stats.ess(ary, **axes, method="bulk"),
                "ess_tail": array_stats.ess(ary, **axes, method="tail", prob=(0.05, 0.95)),
            }
        else:
            ds = xr.Dataset({"v": (("chain", "draw", "i"), flat)})
            out = {
                "rhat": az.rhat(ds, method="rank")["v"].values,
                "ess_bulk": az.ess(ds, method="bulk")["v"].values,
                "ess_tail": az.ess(ds, method="tail")["v"].values,
            }
    return {k: np.asarray(v, dtype=float).reshape(trailing) for k, v in out.items()}


def summary(tree, var_names: list[str] | None = None, **kwargs):
    """ArviZ's posterior summary of the tree (``arviz_stats.summary`` / ``az.summary``: a
    pandas ``DataFrame`` of plain numbers, one row per value, ``mean``, ``sd``, the
    credible interval and, with the default ``kind``, ``ess_bulk``, ``ess_tail``,
    ``r_hat`` (NaN: one chain)).  ``kwargs`` go to ArviZ (``kind="stats"``: moments and
    interval only, fast)."""
    with quiet():
        if DATATREE:
            kwargs.setdefault("round_to", "none")
            return arviz_stats.summary(tree, var_names=var_names, **kwargs)
        return az.summary(tree, var_names=var_names, **kwargs)


def from_netcdf(path: str, engine: str):
    """Read a netCDF4 file of a tree fully into memory."""
    with quiet():
        if DATATREE:
            return xr.open_datatree(path, engine=engine).load()
        tree = az.from_netcdf(path, engine=engine)
    for name in tree.groups():
        getattr(tree, name).load()
    return tree


def _figure_of(result):
    if DATATREE:
        return result.get_viz("figure")
    return np.atleast_1d(result).ravel()[0].figure


def plot(kind: str, tree, var_names: list[str], coords: dict | None = None, **legacy):
    """The matplotlib figure of ``arviz_plots.plot_<kind>`` (matplotlib backend) on 1.x,
    of ``az.plot_<kind>`` with the ``legacy`` options on 0.x (``forest``, ``pair``, ...)."""
    with quiet():
        if DATATREE:
            import arviz_plots

            pc = getattr(arviz_plots, f"plot_{kind}")(
                tree, var_names=var_names, coords=coords, backend="matplotlib"
            )
        else:
            pc = getattr(az, f"plot_{kind}")(tree, var_names=var_names, coords=coords, **legacy)
    return _figure_of(pc)


def plot_discrete_ppc(tree, var_name: str = "y", num_samples: int = 50, seed: int = 0):
    """Posterior predictive check of a discrete variable (the frequency of each value,
    observed against the draws'): ``plot_ppc_rootogram`` on 1.x, ``plot_ppc`` on 0.x."""
    with quiet():
        if DATATREE:
            import arviz_plots

            pc = arviz_plots.plot_ppc_rootogram(tree, var_names=[var_name], backend="matplotlib")
        else:
            draws = int(np.prod([tree.posterior_predictive.sizes[d] for d in SAMPLE_DIMS]))
            pc = az.plot_ppc(
                tree,
                var_names=[var_name],
                num_pp_samples=min(int(num_samples), draws),
                random_seed=seed,
            )
    return _figure_of(pc)
