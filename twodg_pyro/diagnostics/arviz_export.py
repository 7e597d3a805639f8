r"""ArviZ export of a trained BNN, and the ArviZ statistics the library reports.

**Every ArviZ call of the library lives in this module** (a move to ArviZ 1.x, whose
``DataTree`` replaces ``InferenceData``, touches this file only).

InferenceData from SVI draws
----------------------------
``az.from_pyro`` needs an MCMC object, so :func:`to_inference_data` builds the
``InferenceData`` with ``az.from_dict`` from ``S`` independent draws
:math:`w^{(s)} \sim q(w)` of the guide on one chain (``chain`` axis of size 1, ``draw``
axis of size ``S``).  The draws are those of the library's evaluations
(:mod:`twodg_pyro.evaluation`): the same ``seed`` and ``num_samples`` give the draws of
:func:`~twodg_pyro.evaluation.seeded_predict`, so the Bayesian model average of the
exported ``class_probs`` is the prediction behind the results table.  Groups (``N``
exported examples, ``C`` classes):

``posterior``
    **one variable per Pyro sample site, named as the site** (``"layers.0.weight"``,
    ``"layers.0.bias"``; a rank-1 BNN's factor sites ``"layers.0.r"``, ``"layers.0.s"``),
    with named dimensions: ``<site>_out``, ``<site>_in`` (Linear and Conv weights, then
    ``<site>_k0``, ``<site>_k1``, ... over the kernel), ``<site>_out`` (biases),
    ``<site>_component`` (the ``M`` rows of a rank-1 factor), else ``<site>_dim_<i>``;
    each dimension's coordinate is the index into the site's tensor.  With the ``tied``
    tying also ``component_value`` (``component``): the value :math:`z_{k,0}` shared by
    the weights of component ``k`` in that draw.
``posterior_predictive``
    ``y`` (``obs``): a label drawn from :math:`p(y \mid x_n, w^{(s)})` (ArviZ's convention:
    the observed variable's name); classification adds ``class_probs`` (``obs``,
    ``class``), the per-draw class probabilities (a rank-1 draw's: the mean over its
    ``M`` components, as :func:`~twodg_pyro.predict.predict` averages them).
``log_likelihood``
    ``y`` (``obs``): :math:`\log p(y_n \mid x_n, w^{(s)})` per example, unscaled, computed
    in float64 without cancellation (:mod:`twodg_pyro.diagnostics._draws`; float32
    ``log_softmax`` rounds a confident prediction's log-likelihood to exactly 0, which
    made PSIS-LOO NaN) and stored on a grid of :data:`LOG_LIKELIHOOD_GRID` (2**-50
    nats): the finest differences ArviZ's PSIS can use (:func:`_on_grid`).
``observed_data``
    ``y`` (``obs``): the labels.
``constant_data``
    ``example_index`` (``obs``): the position of each exported example in the evaluation
    data; the guide's variational parameters at the exported coordinates (constant over
    draws, so kept out of the posterior): mean-field and rank-1 ``<site>.loc`` and
    ``<site>.scale``; SSVI the same (0 outside the subspace) and ``<site>.active``;
    shared-GMM ``<site>.kind`` (0 outlier, 1 plain inlier, 2 ellipse weight) and
    ``<site>.component`` (a plain inlier's component, else -1), ``centre``
    (``component``, ``coord``), ``covariance`` (``component``, ``coord``, ``coord_``),
    ``component_count`` :math:`N_k`, and ``outlier_loc``/``outlier_scale`` (``outlier``:
    the global flat index of each outlier weight).

**Metadata** is on every group (``idata.posterior.attrs`` and the others, not only
``idata.attrs``): ``inference_library`` ("pyro") and its version, ``creation_library``
("twodg_pyro") and its version, ``method`` (``mean_field``, ``2dg``, ``rank1``,
``ssvi``), ``guide``, ``tying`` and ``coordinates`` (2DG), ``seed``, ``num_draws``,
``sample_chunk``, ``n_examples`` and ``n_examples_total``, ``max_site_values`` and
``thinned_sites``; ArviZ adds ``created_at`` and ``arviz_version``.

**Thinning for large networks** (``max_site_values``, default 10,000): a site with more
coordinates than that is exported on a seeded sub-grid: along each dimension a sorted
random subset of its indices (smaller dimensions such as a 3x3 kernel are kept whole
first, the budget shared out over the others), at most ``max_site_values`` values in
all.  The named dimensions stay, and their coordinates are the original indices, so
``idata.posterior["fc1.weight"].sel({"fc1.weight_out": 3})`` still means row 3.  The
sub-grid depends on ``seed`` and the site only.  ``max_site_values=None`` exports every
coordinate (on ResNet-50, 25 million per draw).  Per-layer summaries were the
alternative; a sub-grid keeps what ArviZ users plot and summarise: real draws of real
weights, addressed as in the network.

A Pyro autoguide (``AutoNormal``, ...) is refused with a one-line ``TypeError`` naming
the guide to use: its draws are not per-site objects the library can read.

PSIS-LOO, model comparison, summaries and netCDF files: :mod:`.arviz_stats`.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import torch
from tqdm.auto import tqdm

from ..guide import BNNGuide
from ..predict import _device_of
from ._draws import (
    SAMPLE_CHUNK,
    batches,
    check_guide,
    chunks,
    count_examples,
    forward,
    quiet,
    seeded,
    subset,
    to_numpy,
)

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.x refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = [
    "DEFAULT_MAX_SITE_VALUES",
    "LOG_LIKELIHOOD_GRID",
    "method_of",
    "site_dims",
    "thinned_coordinates",
    "to_inference_data",
]

#: Values per site exported by default (see "Thinning" in the module docstring).
DEFAULT_MAX_SITE_VALUES = 10_000

_KIND_OUTLIER, _KIND_PLAIN, _KIND_ELLIPSE = 0, 1, 2


# ---------------------------------------------------------------------------- names
def method_of(guide) -> str:
    """The method name of a guide (:attr:`~twodg_pyro.guide.BNNGuide.method`:
    ``"mean_field"``, ``"2dg"``, ``"rank1"``, ``"ssvi"``), else the guide's class name."""
    method = guide.method if isinstance(guide, BNNGuide) else None
    return method or type(guide).__name__


def site_dims(site) -> list[str]:
    """Named dimensions of a site's tensor, prefixed with the site's name (see the module
    docstring): ``["fc1.weight_out", "fc1.weight_in"]`` for a Linear weight."""
    n, nd, kind = site.name, len(site.shape), site.layer_type
    if site.param_name in ("r", "s") and nd == 2:  # a rank-1 factor: (M, out) or (M, in)
        names = ["component", "out" if site.param_name == "r" else "in"]
    elif site.param_name == "bias" and nd == 1:
        names = ["out"]
    elif site.param_name == "weight" and kind == "Linear" and nd == 2:
        names = ["out", "in"]
    elif site.param_name == "weight" and kind.startswith("ConvTranspose") and nd >= 3:
        names = ["in", "out", *[f"k{i}" for i in range(nd - 2)]]
    elif site.param_name == "weight" and kind.startswith("Conv") and nd >= 3:
        names = ["out", "in", *[f"k{i}" for i in range(nd - 2)]]
    else:
        names = [f"dim_{i}" for i in range(nd)]
    return [f"{n}_{d}" for d in names]


def thinned_coordinates(
    shape, max_values: int | None, seed: int, salt: int = 0
) -> list[torch.Tensor] | None:
    """The seeded sub-grid of a tensor of ``shape`` with at most ``max_values`` entries:
    one sorted index tensor per dimension, or ``None`` when every entry fits.

    Dimensions are served from the smallest: each keeps
    :math:`\\min(n_d, \\lfloor b^{1/r} \\rfloor)` indices of the remaining budget
    :math:`b` over the :math:`r` dimensions left, so a 3x3 kernel stays whole and the
    product never exceeds ``max_values``.
    """
    shape = [int(d) for d in shape]
    if max_values is None or math.prod(shape) <= int(max_values):
        return None
    if int(max_values) < 1:
        raise ValueError(f"max_site_values must be at least 1 (or None), got {max_values!r}")
    keep = list(shape)
    budget, left = int(max_values), len(shape)
    for d in sorted(range(len(shape)), key=lambda i: shape[i]):
        k = min(shape[d], max(1, int(math.floor(budget ** (1.0 / left) + 1e-9))))
        keep[d], budget, left = k, max(1, budget // k), left - 1
    return [
        subset(n, k, seed, salt=salt * 64 + d) if k < n else torch.arange(n)
        for d, (n, k) in enumerate(zip(shape, keep, strict=True))
    ]


def _take(t: torch.Tensor, grid: list[torch.Tensor] | None, lead: int) -> torch.Tensor:
    """``t[..., grid...]`` with ``lead`` leading dimensions left whole."""
    if grid is None:
        return t
    for d, idx in enumerate(grid):
        t = t.index_select(lead + d, idx.to(t.device))
    return t


# ---------------------------------------------------------------------------- export
def _is_categorical(model) -> bool:
    from ..likelihoods import Categorical

    return isinstance(model.likelihood, Categorical)


def _netcdf_attr(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float, str)):
        return v
    return json.dumps(v)


@torch.no_grad()
def to_inference_data(
    model,
    guide,
    data,
    num_samples: int = 30,
    seed: int = 0,
    *,
    max_site_values: int | None = DEFAULT_MAX_SITE_VALUES,
    max_examples: int | None = None,
    batch_size: int = 512,
    method: str | None = None,
    progress: bool = False,
) -> az.InferenceData:
    """Export ``num_samples`` guide draws and their predictions on ``data`` to ArviZ.

    Args:
        model: the :class:`~twodg_pyro.model.BNNModel` (or
            :class:`~twodg_pyro.guides.Rank1BNNModel`).
        guide: one of the library's guides (mean-field, shared-GMM in any tying, rank-1,
            SSVI); a Pyro autoguide is refused (``TypeError`` naming what to use).
        data: evaluation data with labels: ``(X, y)`` tensors, a ``Dataset`` or an
            iterable of ``(x, y)`` batches.
        num_samples: draws ``S`` (the ``draw`` axis); at least about 30 for PSIS-LOO.
        seed: seeds the draws (those of
            :func:`~twodg_pyro.evaluation.seeded_predict` with the same seed), the thinning
            sub-grids and the example subset; the caller's random state is restored.
        max_site_values: values exported per site (a seeded sub-grid above it; ``None``:
            all).  See "Thinning" in the module docstring.
        max_examples: export only a seeded random subset of this many examples.
        batch_size: examples per forward pass.
        method: the ``method`` attribute (default: from the guide, :func:`method_of`).
        progress: a tqdm bar (``"export"``) over the draws.

    Returns:
        ``az.InferenceData`` with the groups described in the module docstring.

    Raises:
        TypeError: a guide the export cannot read.
        ValueError: no labelled data, ``num_samples < 1``.
    """
    check_guide(guide, "to_inference_data")
    S = int(num_samples)
    if S < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples!r}")
    if max_site_values is not None and int(max_site_values) < 1:
        raise ValueError(f"max_site_values must be at least 1 (or None), got {max_site_values!r}")
    model.eval()
    device = _device_of(guide) or torch.device("cpu")
    data_batches, example_index = batches(
        data, int(batch_size), max_examples, seed, with_index=True
    )
    n_total = count_examples(data)
    n_total = int(example_index.numel()) if n_total is None else n_total
    if not data_batches:
        raise ValueError("no evaluation data (empty data set)")
    labels = torch.cat([yb.cpu() for _, yb in data_batches])
    components = int(model.output_components)
    is_cat = _is_categorical(model)
    grids = {
        s.name: thinned_coordinates(s.shape, max_site_values, seed, salt=i)
        for i, s in enumerate(guide.sites)
    }

    site_draws: dict[str, list[torch.Tensor]] = {s.name: [] for s in guide.sites}
    ll_draws, out_draws, z_draws = [], [], []
    bar = tqdm(total=S, desc="export", unit="draw", disable=not progress, leave=False)
    with bar, seeded(seed, device):
        for s in chunks(S, SAMPLE_CHUNK):
            sample = guide.draw(s)
            weights = sample.weights
            for site in guide.sites:
                site_draws[site.name].append(_take(weights[site.name], grids[site.name], 1).cpu())
            ll, out = forward(model, weights, data_batches, device, outputs=True)
            ll_draws.append(ll.cpu())
            if is_cat:  # per-draw class probabilities in the network's dtype, as predict
                probs = out.softmax(-1)
                out_draws.append((probs.mean(1) if components > 1 else probs).cpu())
            else:
                out_draws.append(out.cpu())
            if sample.component_values is not None:  # the tied tying's z_{k,0}
                z_draws.append(sample.component_values.cpu())
            bar.update(s)

    posterior, dims, coords = {}, {}, {"obs": to_numpy(example_index)}
    thinned = []
    for site in guide.sites:
        names = site_dims(site)
        grid = grids[site.name]
        posterior[site.name] = to_numpy(torch.cat(site_draws[site.name]))[None]
        dims[site.name] = names
        for d, name in enumerate(names):
            coords[name] = to_numpy(grid[d]) if grid is not None else np.arange(site.shape[d])
        if grid is not None:
            thinned.append(site.name)
    constant = {"example_index": to_numpy(example_index)}
    dims["example_index"] = ["obs"]
    structure = guide.structure()  # built once: its checks sort every index
    constant.update(_guide_constants(guide, structure, grids, dims, coords, max_site_values, seed))
    if z_draws:
        posterior["component_value"] = to_numpy(torch.cat(z_draws))[None]
        dims["component_value"] = ["component"]
        coords.setdefault("component", np.arange(posterior["component_value"].shape[-1]))

    outs = torch.cat(out_draws)  # (S, N, C) probabilities, or (S, [M,] N, ...) outputs
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + 7)
    predictive = {"y": to_numpy(_sample_y(model, outs, is_cat, components, gen))[None]}
    dims["y"] = ["obs"]
    if is_cat:
        predictive["class_probs"] = to_numpy(outs)[None]
        dims["class_probs"] = ["obs", "class"]
        coords["class"] = np.arange(outs.shape[-1])

    import pyro

    from .. import __version__

    meta = {
        "inference_library": "pyro",
        "inference_library_version": pyro.__version__,
        "creation_library": "twodg_pyro",
        "creation_library_version": __version__,
        "inference": "variational (SVI): independent draws from the guide, one chain",
        "method": method or method_of(guide),
        "guide": type(guide).__name__,
        "seed": int(seed),
        "num_draws": S,
        "sample_chunk": SAMPLE_CHUNK,
        "n_examples": int(labels.shape[0]),
        "n_examples_total": int(n_total),
        "max_site_values": -1 if max_site_values is None else int(max_site_values),
        "thinned_sites": json.dumps(thinned),
        "sites": json.dumps([s.name for s in guide.sites]),
    }
    if structure is not None:
        meta.update(
            tying=guide.tying,
            coordinates=structure.coordinates,
            counts=json.dumps(structure.counts()),
            weight_kind_codes=json.dumps({"outlier": 0, "plain": 1, "ellipse": 2}),
        )
    if components > 1:
        meta["output_components"] = components
    ll = _on_grid(torch.cat(ll_draws))
    attrs = {k: _netcdf_attr(v) for k, v in meta.items()}
    with quiet():
        idata = az.from_dict(
            posterior=posterior,
            posterior_predictive=predictive,
            log_likelihood={"y": to_numpy(ll)[None]},
            observed_data={"y": to_numpy(labels)},
            constant_data=constant,
            coords=coords,
            dims=dims,
            attrs=attrs,
        )
    for group in idata.groups():
        getattr(idata, group).attrs.update(attrs)
    return idata


#: The grid (nats) the exported log-likelihood is stored on: 2**-50, about 8.9e-16.
LOG_LIKELIHOOD_GRID = 2.0**-50


def _on_grid(ll: torch.Tensor) -> torch.Tensor:
    r"""``ll`` rounded to multiples of :data:`LOG_LIKELIHOOD_GRID` (values of magnitude
    above 8 are multiples of it already).

    PSIS exponentiates each observation's log ratios; two ratios closer than one float64
    step of :math:`e^x` but distinct as floats (e.g. :math:`-10^{-17}` and
    :math:`-3 \cdot 10^{-17}` beside :math:`-4.5 \cdot 10^{-5}`) make ArviZ 0.23's Pareto
    fit return NaN weights and an ``elpd_loo`` of NaN.  On this grid distinct values stay
    distinct after ``exp``; the rounding (at most :math:`4.4 \cdot 10^{-16}` nats) is below
    anything an importance weight can show.
    """
    return torch.round(ll * 2.0**50) * LOG_LIKELIHOOD_GRID


def _sample_y(model, outs: torch.Tensor, is_cat: bool, components: int, gen) -> torch.Tensor:
    """A label per draw and example from the predictive of that draw, with its own
    generator (the guide's draws are not disturbed)."""
    if is_cat:
        p = outs.to(torch.float64)
        flat = p.reshape(-1, p.shape[-1]).clamp_min(0)
        return torch.multinomial(flat, 1, generator=gen).reshape(p.shape[:-1])
    mean = outs
    if components > 1:  # (S, M, N, ...): one component per draw and example
        m = torch.randint(components, (outs.shape[0], 1, *outs.shape[2:]), generator=gen)
        mean = outs.gather(1, m).squeeze(1)
    scale = float(getattr(model.likelihood, "scale", 1.0))
    noise = torch.randn(mean.shape, generator=gen, dtype=torch.float64)
    y = mean.to(torch.float64) + scale * noise
    return y.squeeze(-1) if y.dim() == 3 and y.shape[-1] == 1 else y


def _guide_constants(guide, st, grids, dims, coords, max_site_values, seed) -> dict:
    """The guide's variational parameters at the exported coordinates (constant_data):
    each site's (:meth:`~twodg_pyro.guide.BNNGuide.site_parameters`), and for a guide
    with a sharing structure each weight's kind and component, the mixture and the
    outliers (``st``: the guide's sharing structure, or ``None``)."""
    out: dict = {}

    def put(site, suffix: str, values: torch.Tensor) -> None:
        name = f"{site.name}.{suffix}"
        out[name] = to_numpy(_take(values.detach().reshape(site.shape), grids[site.name], 0))
        dims[name] = site_dims(site)

    for site in guide.sites:
        for suffix, values in guide.site_parameters(site.name).items():
            put(site, suffix, values)
    if st is not None:
        n_w = st.num_weights
        kind = torch.full((n_w,), _KIND_OUTLIER, dtype=torch.int8)
        kind[st.plain_index] = _KIND_PLAIN
        kind[st.ellipse_index] = _KIND_ELLIPSE
        comp = torch.full((n_w,), -1, dtype=torch.long)
        comp[st.plain_index] = st.plain_component
        off = 0
        for site in guide.sites:
            put(site, "kind", kind[off : off + site.numel])
            put(site, "component", comp[off : off + site.numel])
            off += site.numel
        names = ["mu", "sigma"] if st.coordinates == "sigma" else ["mu", "log_sigma"]
        coords.update(component=np.arange(st.n_gaussians), coord=names, coord_=list(names))
        out["centre"] = to_numpy(st.means)
        out["covariance"] = to_numpy(st.covariances)
        out["component_count"] = to_numpy(st.component_counts())
        dims.update(
            centre=["component", "coord"],
            covariance=["component", "coord", "coord_"],
            component_count=["component"],
        )
        if st.n_outliers:  # (a structure without outliers has no outlier variables)
            limit = st.n_outliers if max_site_values is None else int(max_site_values)
            o_sel = subset(st.n_outliers, limit, seed, salt=1)
            out["outlier_loc"] = to_numpy(st.outlier_loc[o_sel])
            out["outlier_scale"] = to_numpy(st.outlier_scale[o_sel])
            dims.update(outlier_loc=["outlier"], outlier_scale=["outlier"])
            coords["outlier"] = to_numpy(st.outlier_index[o_sel])
    return out
