"""ArviZ's own figures of an exported tree (:mod:`.arviz_export`), written as PNG files:
a forest plot of the 2DG mixture's components, a pair plot of a few weights, and the
posterior predictive check of the class frequencies.

They are drawn by ArviZ (``arviz_plots`` with its matplotlib backend on ArviZ 1.x,
``az.plot_*`` on 0.x, through :mod:`._arviz`), which draws through ``pyplot``: each
figure is written atomically and closed, so none is left open.  Use a non-interactive
backend (``matplotlib.use("Agg")``) on a machine without a display.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..files.atomic import atomic_write
from . import _arviz as A


def _save(fig, path: str | os.PathLike) -> Path:
    import matplotlib.pyplot as plt

    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)


def plot_component_forest(tree, path: str | os.PathLike) -> Path:
    """Forest plot of ``posterior.component_value``: per component of the 2DG mixture,
    the credible interval of a weight tied to it (its centre and spread, as drawn).

    Raises:
        ValueError: the tree has no ``component_value`` (not a shared-GMM guide's).
    """
    post = A.group(tree, "posterior")
    if post is None or "component_value" not in post:
        raise ValueError(
            "the tree has no posterior component_value: export a shared-GMM (2DG) guide"
        )
    return _save(A.plot("forest", tree, ["component_value"], combined=True), path)


def weight_coords(tree, var_name: str, n: int = 3) -> dict:
    """Coordinates of ``n`` values of posterior variable ``var_name``: along its last
    dimension, the first ``n`` exported indices, at the first index of the others."""
    da = A.group(tree, "posterior")[var_name]
    dims = [d for d in da.dims if d not in A.SAMPLE_DIMS]
    if not dims:
        return {}
    out = {d: [da[d].values[0]] for d in dims[:-1]}
    out[dims[-1]] = list(da[dims[-1]].values[: int(n)])
    return out


def plot_weight_pairs(
    tree, path: str | os.PathLike, var_name: str | None = None, coords: dict | None = None
) -> Path:
    """Pair plot of a few weights' draws (``var_name``: a posterior variable, default the
    first site; ``coords``: which values, default :func:`weight_coords`, three): a
    mean-field guide's are uncorrelated by construction, the ``tied`` tying's weights of
    one component lie on the diagonal."""
    post = A.group(tree, "posterior")
    var_name = var_name or next(iter(post.data_vars))
    if var_name not in post:
        raise ValueError(f"no posterior variable {var_name!r}; the tree has {list(post.data_vars)}")
    coords = weight_coords(tree, var_name) if coords is None else coords
    return _save(A.plot("pair", tree, [var_name], coords, marginals=True), path)


def plot_class_ppc(tree, path: str | os.PathLike, num_samples: int = 50, seed: int = 0) -> Path:
    """Posterior predictive check of the class frequencies: how often each class is
    observed (``observed_data.y``) against how often the draws predict it
    (``posterior_predictive.y``)."""
    if A.group(tree, "posterior_predictive") is None or A.group(tree, "observed_data") is None:
        raise ValueError("the tree has no posterior_predictive or observed_data group")
    return _save(A.plot_discrete_ppc(tree, "y", num_samples, seed), path)
