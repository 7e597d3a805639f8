r"""ArviZ export of a trained BNN: ``S`` draws of the guide and what the Bayesian workflow
needs of them, as an :class:`xarray.DataTree` (ArviZ 1.x) or an ``InferenceData``
(ArviZ 0.x), through :mod:`twodg_pyro.diagnostics._arviz`.

The tree from SVI draws
-----------------------
ArviZ's converters (``from_pyro``, ``from_numpyro_svi``) need a Pyro MCMC or a NumPyro
SVI object, so :func:`to_inference_data` builds the tree from ``S`` independent draws
:math:`w^{(s)} \sim q(w)` of the guide on one chain (``chain`` of size 1, ``draw`` of
size ``S``: the sample dimensions every ArviZ function defaults to).  The draws are those
of the library's evaluations (:mod:`twodg_pyro.evaluation`): the same ``seed`` and
``num_samples`` give the draws of :func:`~twodg_pyro.evaluation.seeded_predict`, so the
model average of the exported ``class_probs`` is the prediction of the results table.
Groups (``N`` exported examples, ``C`` classes):

``posterior``
    **one variable per Pyro sample site, named as the site** (``"layers.0.weight"``,
    ``"layers.0.bias"``; a rank-1 BNN's factor sites ``"layers.0.r"``, ``"layers.0.s"``),
    with named dimensions: ``<site>_out``, ``<site>_in`` (Linear and Conv weights, then
    ``<site>_k0``, ``<site>_k1``, ... over the kernel), ``<site>_out`` (biases),
    ``<site>_component`` (the ``M`` rows of a rank-1 factor), else ``<site>_dim_<i>``;
    each dimension's coordinate is the index into the site's tensor.  A shared-GMM guide
    adds ``component_value`` (``component``): per draw, the value of a weight tied to
    each component (``sharing.representative``; the ``tied`` tying's :math:`z_{k,0}`):
    draws of the component's marginal, what a forest plot of the mixture shows.
``posterior_predictive``
    ``y`` (``obs``): a label drawn from :math:`p(y \mid x_n, w^{(s)})`; classification
    adds ``class_probs`` (``obs``, ``class``), the per-draw class probabilities (a rank-1
    draw's: the mean over its ``M`` components, as :func:`~twodg_pyro.prediction.predict`).
``log_likelihood``
    ``y`` (``obs``, float64): :math:`\log p(y_n \mid x_n, w^{(s)})` per example, unscaled,
    computed without cancellation (:mod:`twodg_pyro.diagnostics._draws`: float32
    ``log_softmax`` rounds a confident prediction's log-likelihood to exactly 0) and
    stored on a grid of :data:`LOG_LIKELIHOOD_GRID` nats (:func:`_on_grid`).
``observed_data``
    ``y`` (``obs``): the labels.
``constant_data``
    ``example_index`` (``obs``): each exported example's position in the data; the
    guide's variational parameters at the exported coordinates: ``<site>.loc`` and
    ``<site>.scale`` (mean-field, rank-1, SSVI; 0 outside SSVI's subspace) and SSVI's
    ``<site>.active``.
``sample_stats``
    per draw, float64: ``log_q`` :math:`\log q(w^{(s)})` (the guide's marginal density,
    :func:`~twodg_pyro.guides.marginal_density.guide_log_q`; attributes ``log_q_method``
    and ``log_q_exact``: the ``tied`` tying's is a surrogate), ``log_prior``
    :math:`\log p(w^{(s)})` and ``log_p`` :math:`\log p(w^{(s)}) + \frac{N}{n}\sum_n \log
    p(y_n \mid x_n, w^{(s)})`, the model's joint density (:mod:`._draws`) over
    ``train_data`` when given, else over the exported examples (attributes
    ``log_p_data``, ``log_p_examples``, ``loglik_scale``).  ``log_p - log_q`` are the
    importance ratios of the PSIS diagnostic of VI; with the exported examples being the
    training set, ``arviz_stats.loo_approximate_posterior(tree, log_p, log_q)`` is the
    approximate-posterior PSIS-LOO of Magnusson et al. (2019).
``sharing`` (shared-GMM guides)
    the sharing structure (:func:`._sites.sharing_group`): the component
    parameters ``centre``, ``covariance``, ``component_count``; each weight's assignment
    ``<site>.kind`` (0 outlier, 1 plain inlier, 2 ellipse weight) and ``<site>.component``
    at the exported coordinates; the outlier set ``outlier_loc``/``outlier_scale`` (its
    coordinate ``outlier``: each outlier's global flat index); ``site_offset``.

**Metadata** is on every group and the root: ``inference_library`` ("pyro") and its
version, ``creation_library`` ("twodg_pyro") and its version, ``method`` (``mean_field``,
``2dg``, ``rank1``, ``ssvi``), ``guide``, ``tying`` and ``coordinates`` (2DG), ``seed``,
``num_draws``, ``sample_chunk``, ``n_examples``, ``n_examples_total``,
``max_site_values``, ``thinned_sites``, ``arviz_major`` and ``arviz_version``
(``arviz.__version__``).

**Thinning** (``max_site_values``, default 10,000): a site with more values than that is
exported on a seeded sub-grid, along each dimension a sorted random subset of its
indices (smaller dimensions such as a 3x3 kernel are kept whole first), so names,
dimensions and coordinates stay those of the network:
``tree.posterior["fc1.weight"].sel({"fc1.weight_out": 3})`` still means row 3.
``max_site_values=None`` exports every value.

A Pyro autoguide (``AutoNormal``, ...) is refused with a one-line ``TypeError`` naming
the guide to use.  PSIS-LOO, comparison, summaries and files: :mod:`.arviz_stats`.
"""

from __future__ import annotations

import json

import numpy as np
import pyro
import torch
from tqdm.auto import tqdm

from .._version import __version__
from ..evaluation import SAMPLE_CHUNK, seeded
from ..guide import SharingGuide
from ..guides.marginal_density import LOG_Q_METHODS, log_q_fn
from ..likelihoods import Categorical, RegressionLikelihood
from ..prediction import _device_of
from . import _arviz as A
from ._draws import (
    batches,
    check_guide,
    chunks,
    count_examples,
    forward,
    likelihood_scale,
    log_prior,
    n_examples,
    to_numpy,
)
from ._sites import (
    KIND_CODES,
    component_representatives,
    gather_flat,
    guide_constants,
    method_of,
    sharing_group,
    site_dims,
    take,
    thinned_coordinates,
)

#: Values per site exported by default (see "Thinning" in the module docstring).
DEFAULT_MAX_SITE_VALUES = 10_000
#: The name of the group holding a shared-GMM guide's sharing structure.
SHARING_GROUP = "sharing"
#: The grid (nats) the exported log-likelihood is stored on: 2**-50, about 8.9e-16.
LOG_LIKELIHOOD_GRID = 2.0**-50
_SAMPLED = {"posterior", "posterior_predictive", "log_likelihood", "sample_stats"}


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
    train_data=None,
    max_train_examples: int | None = None,
    max_site_values: int | None = DEFAULT_MAX_SITE_VALUES,
    max_examples: int | None = None,
    batch_size: int = 512,
    method: str | None = None,
    quadrature_nodes: int = 64,
    progress: bool = False,
):
    """Export ``num_samples`` guide draws and their predictions on ``data`` to ArviZ.

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel` (or
            :class:`~twodg_pyro.guides.Rank1BNNModel`).
        guide: one of the library's guides (mean-field, shared-GMM in any tying, rank-1,
            SSVI); a Pyro autoguide is refused (``TypeError`` naming what to use).
        data: evaluation data with labels: ``(X, y)`` tensors, a ``Dataset`` or an
            iterable of ``(x, y)`` batches.
        num_samples: draws ``S`` (the ``draw`` axis); at least about 30 for PSIS-LOO.
        seed: seeds the draws (those of
            :func:`~twodg_pyro.evaluation.seeded_predict` with the same seed), the thinning
            sub-grids and the example subsets; the caller's random state is restored.
        train_data: the data of ``sample_stats.log_p`` (the training data: the target of
            the VI diagnostics); ``None``: the exported examples.
        max_train_examples: a seeded subset of ``train_data`` (``log_p`` scaled by N / n).
        max_site_values: values exported per site (a seeded sub-grid above it; ``None``:
            all).  See "Thinning" in the module docstring.
        max_examples: export only a seeded random subset of this many examples.
        batch_size: examples per forward pass.
        method: the ``method`` attribute (default: from the guide, :func:`method_of`).
        quadrature_nodes: of ``log_q`` for the ``stochastic`` tying.
        progress: a tqdm bar (``"export"``) over the draws.

    Returns:
        an ``xarray.DataTree`` (ArviZ 1.x) or ``arviz.InferenceData`` (0.x) with the groups
        of the module docstring.

    Raises:
        TypeError: a guide the export cannot read.
        ValueError: no labelled data, ``num_samples < 1``, ``max_site_values < 1``.
    """
    check_guide(guide, "to_inference_data")
    S = int(num_samples)
    if S < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples!r}")
    model.eval()
    device = _device_of(guide) or torch.device("cpu")
    data_batches, example_index = batches(
        data, int(batch_size), max_examples, seed, with_index=True
    )
    if not data_batches:
        raise ValueError("no evaluation data (empty data set)")
    n_total = count_examples(data)
    n_total = int(example_index.numel()) if n_total is None else n_total
    p_batches = data_batches
    if train_data is not None:
        p_batches = batches(train_data, int(batch_size), max_train_examples, seed)
        if not p_batches:
            raise ValueError("no training data (empty data set) for sample_stats.log_p")
    scale = likelihood_scale(model, p_batches)
    log_q, q_method = log_q_fn(guide, quadrature_nodes)
    labels = torch.cat([yb.cpu() for _, yb in data_batches])
    components = int(model.output_components)
    is_cat = isinstance(model.likelihood, Categorical)
    grids = {
        s.name: thinned_coordinates(s.shape, max_site_values, seed, salt=i)
        for i, s in enumerate(guide.sites)
    }
    structure = guide.structure() if isinstance(guide, SharingGuide) else None  # built once
    reps = component_representatives(structure) if structure is not None else None

    site_draws: dict[str, list[torch.Tensor]] = {s.name: [] for s in guide.sites}
    ll_draws, out_draws, comp_draws = [], [], []
    stats: dict[str, list[torch.Tensor]] = {"log_p": [], "log_q": [], "log_prior": []}
    bar = tqdm(total=S, desc="export", unit="draw", disable=not progress, leave=False)
    with bar, seeded(seed, device):
        for s in chunks(S):
            sample = guide.draw(s)
            weights = sample.weights
            for site in guide.sites:
                site_draws[site.name].append(take(weights[site.name], grids[site.name], 1).cpu())
            ll, out = forward(model, weights, data_batches, device, outputs=True)
            ll_draws.append(ll.cpu())
            if is_cat:  # per-draw class probabilities in the network's dtype, as predict
                probs = out.softmax(-1)
                out_draws.append((probs.mean(1) if components > 1 else probs).cpu())
            else:
                out_draws.append(out.cpu())
            if sample.component_values is not None:  # the tied tying's z_{k,0}
                comp_draws.append(sample.component_values.cpu())
            elif reps is not None:
                comp_draws.append(gather_flat(weights, guide.sites, reps[1]).cpu())
            lik = ll
            if p_batches is not data_batches:
                lik, _ = forward(model, weights, p_batches, device, outputs=False)
            prior = log_prior(model, guide, weights).to(torch.float64).cpu()
            stats["log_prior"].append(prior)
            stats["log_p"].append(prior + scale * lik.to(torch.float64).cpu().sum(1))
            stats["log_q"].append(log_q(weights).to(torch.float64).cpu())
            bar.update(s)

    dims = {s.name: site_dims(s) for s in guide.sites}
    coords: dict = {"obs": to_numpy(example_index)}
    for site in guide.sites:
        grid = grids[site.name]
        for d, name in enumerate(dims[site.name]):
            coords[name] = to_numpy(grid[d]) if grid is not None else np.arange(site.shape[d])
    thinned = [name for name, grid in grids.items() if grid is not None]
    posterior = {name: to_numpy(torch.cat(v))[None] for name, v in site_draws.items()}
    group_coords: dict[str, dict] = {}
    if comp_draws:
        posterior["component_value"] = to_numpy(torch.cat(comp_draws))[None]
        dims["component_value"] = ["component"]
        n_k = posterior["component_value"].shape[-1]
        ks = reps[0] if sample.component_values is None else np.arange(n_k)
        group_coords["posterior"] = {"component": ks}

    outs = torch.cat(out_draws)  # (S, N, C) probabilities, or (S, [M,] N, ...) outputs
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + 7)
    predictive = {"y": to_numpy(_sample_y(model, outs, is_cat, components, gen))[None]}
    dims["y"], dims["example_index"] = ["obs"], ["obs"]
    if is_cat:
        predictive["class_probs"] = to_numpy(outs)[None]
        dims["class_probs"] = ["obs", "class"]
        coords["class"] = np.arange(outs.shape[-1])
    ll = _on_grid(torch.cat(ll_draws).to(torch.float64))
    groups = {
        "posterior": posterior,
        "posterior_predictive": predictive,
        "log_likelihood": {"y": to_numpy(ll)[None]},
        "observed_data": {"y": to_numpy(labels)},
        "constant_data": {
            "example_index": to_numpy(example_index),
            **guide_constants(guide, grids, dims),
        },
        "sample_stats": {k: to_numpy(torch.cat(v))[None] for k, v in stats.items()},
    }
    if structure is not None:
        groups[SHARING_GROUP] = sharing_group(
            guide, structure, grids, dims, coords, max_site_values, seed
        )

    meta = {
        "inference_library": "pyro",
        "inference_library_version": pyro.__version__,
        "creation_library": "twodg_pyro",
        "creation_library_version": __version__,
        "inference": "variational (SVI): independent draws from the guide, one chain",
        "arviz_major": A.ARVIZ_MAJOR,
        "arviz_version": A.ARVIZ_VERSION,
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
        "log_q_method": q_method,
        "log_q_exact": LOG_Q_METHODS.get(q_method, False),
        "log_p_data": "exported examples" if p_batches is data_batches else "train_data",
        "log_p_examples": n_examples(p_batches),
        "loglik_scale": scale,
    }
    if structure is not None:
        meta.update(
            tying=guide.tying,
            coordinates=structure.coordinates,
            counts=json.dumps(structure.counts()),
            weight_kind_codes=json.dumps(KIND_CODES),
        )
    if components > 1:
        meta["output_components"] = components
    attrs = {k: _netcdf_attr(v) for k, v in meta.items()}
    return A.build_tree(groups, _SAMPLED, coords, dims, attrs, group_coords)


#: ArviZ 1.x's name for what the function returns.
to_datatree = to_inference_data


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
    out = outs
    if components > 1:  # (S, M, N, ...): one component per draw and example
        m = torch.randint(components, (outs.shape[0], 1, *outs.shape[2:]), generator=gen)
        out = outs.gather(1, m).squeeze(1)
    lik = model.likelihood
    if isinstance(lik, RegressionLikelihood):
        loc, scale = lik.loc_scale(out.to(torch.float64), 1)
        noise = torch.randn(loc.shape, generator=gen, dtype=torch.float64)
        return (loc + torch.as_tensor(scale, dtype=torch.float64) * noise).detach()
    with torch.random.fork_rng():  # another likelihood: its own sampler, seeded by gen
        torch.manual_seed(int(torch.randint(2**62, (), generator=gen)))
        return lik.batched_distribution(out, 1).sample().to(torch.float64)
