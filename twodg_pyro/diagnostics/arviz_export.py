r"""ArviZ export and VI diagnostics of a trained BNN guide.

**Every ArviZ call of the library lives in this module** (a move to ArviZ 1.x, whose
``DataTree`` replaces ``InferenceData``, touches this file only).

InferenceData from SVI draws
----------------------------
``az.from_pyro`` needs an MCMC object, so :func:`to_inference_data` builds the
``InferenceData`` with ``az.from_dict`` from ``S`` independent draws
:math:`w^{(s)} \sim q(w)` of the guide, on a chain axis of size 1.  Groups and shapes
(``S = num_samples``, ``N`` evaluation examples, ``C`` classes, ``W`` = ``min(n_weights,
n_w)`` weights, ``O`` = ``min(n_weights, n_out)`` outliers, ``K`` components):

``posterior``
    ``w`` (1, S, W): a seeded random subset of the Bayesian weights, drawn from the
    guide (coordinate ``weight`` = global flat index, sites in network order).
    Shared-GMM guide only -- the variational parameters, which are point estimates in
    VI and therefore constant over draws: ``centre`` (1, S, K, 2), ``covariance``
    (1, S, K, 2, 2), ``component_count`` :math:`N_k` (1, S, K), ``outlier_loc`` and
    ``outlier_scale`` (1, S, O) for a seeded subset of outliers (absent when there are
    none).  With the ``tied`` tying the component *values* are random, one draw per
    component and forward pass: ``component_value`` :math:`z_{k,0}` (1, S, K).  (With
    ``stochastic`` the per-weight :math:`(\tilde\mu_i, \tilde\sigma_i)` are random
    too; they enter ``w`` and are not exported separately.)
``posterior_predictive``
    ``y`` (1, S, N): a label drawn from :math:`p(y \mid x_n, w^{(s)})` (ArviZ's
    convention: same name as the observed variable), and for classification
    ``class_probs`` (1, S, N, C), the per-draw class probabilities (their mean over
    draws is the Bayesian model average that :func:`twodg_pyro.predict.predict` returns).
``log_likelihood``
    ``y`` (1, S, N): :math:`\log p(y_n \mid x_n, w^{(s)})` (unscaled, per example).
``observed_data``
    ``y`` (N,): the labels.
``constant_data``
    ``weight_site`` (W,): position of each exported weight's site in ``attrs["sites"]``;
    shared-GMM: ``weight_kind`` (W,) (0 outlier, 1 plain inlier, 2 ellipse weight) and
    ``weight_component`` (W,) (the plain inlier's component, else -1); mean-field:
    ``weight_loc`` and ``weight_scale`` (W,).

``attrs`` hold the guide's class, tying, coordinates, the seed, the site names and the
structure counts (JSON strings where not scalars, so that netCDF can store them).

VI diagnostics (Yao et al. 2018, "Yes, but did it work?")
---------------------------------------------------------
:func:`vi_diagnostics` computes the importance ratios
:math:`\log r_s = \log p(w^{(s)}, \mathcal D) - \log q(w^{(s)})` and their Pareto
:math:`\hat k` (``az.psislw``).  :math:`\log p(w, \mathcal D) = \log p(w) + \log p(\mathcal D
\mid w)`, the log-likelihood summed over the training data given (by default all of
it); on a subset of ``n`` examples it is scaled by ``N / n`` with ``N`` the model's
data-set size (an unbiased but noisier estimate, which inflates :math:`\hat k`).

:math:`\log q(w)`:

* mean-field: the exact Normal log density;
* shared-GMM, ``representative``: exact.  Weights are independent under this guide;
  outliers are :math:`\mathcal N(\mu_i, \sigma_i^2)`, a plain inlier of component
  :math:`c` is :math:`\mathcal N(m_{c,0}, m_{c,1}^2)` (``log_sigma`` coordinates:
  :math:`e^{m_{c,1}}`), an ellipse weight is the mixture
  :math:`\sum_j \alpha_{ij}\,\mathcal N(m_{c_j,0}, m_{c_j,1}^2)`;
* shared-GMM, ``stochastic``: weights are still independent, but the marginal
  :math:`q_c(w) = \int \mathcal N(w \mid \tilde\mu, \tilde\sigma^2)\,
  \mathcal N((\tilde\mu, \theta) \mid m_c, S_c)\, d\tilde\mu\, d\theta` (with
  :math:`\tilde\sigma = |\theta|` or :math:`e^\theta`) has no closed form.  We integrate
  :math:`\tilde\mu` out analytically (given :math:`\theta`, :math:`w` is Normal with
  mean :math:`m_{c,0} + S_{c,01}/S_{c,11}(\theta - m_{c,1})` and variance
  :math:`S_{c,00} - S_{c,01}^2/S_{c,11} + \tilde\sigma(\theta)^2`) and :math:`\theta` by
  Gauss-Hermite quadrature with ``quadrature_nodes`` nodes (default 64): a deterministic,
  near-exact marginal (``log_q_method = "quadrature"``); ellipse weights mix these over
  their alphas;
* shared-GMM, ``tied``: all weights of a component share one value per draw, so the
  joint :math:`q(w)` has no density on :math:`\mathbb R^{n_w}` and the importance ratio
  is not defined.  We use the product of the exact per-weight marginals
  (:math:`\mathcal N(m_{c,0}, S_{c,00})`, mixtures for ellipse weights) as a surrogate
  (``log_q_method = "marginal_product"``, ``exact = False``): its :math:`\hat k`
  compares the posterior with that surrogate, not with the tied guide, and is reported
  for completeness only.

A guide of another kind can provide ``log_q(weights) -> (S,)`` itself.

PSIS-LOO (:func:`loo`) runs ``az.loo`` on the ``log_likelihood`` group with
``reff = 1`` (draws from :math:`q` are independent); it treats :math:`q` as the
posterior, i.e. it estimates the leave-one-out predictive of the variational
approximation.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import vmap
from tqdm.auto import tqdm

from ..io.files import atomic_write

with warnings.catch_warnings():  # ArviZ 0.23 announces its 1.x refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

__all__ = [
    "to_inference_data",
    "vi_diagnostics",
    "loo",
    "summary",
    "save_inference_data",
    "load_inference_data",
    "class_probabilities",
    "guide_log_q",
    "NETCDF_ENGINE",
]

#: netCDF backend of :func:`save_inference_data`.  ``h5netcdf`` is a dependency of
#: ArviZ 0.23 itself (and ArviZ's default); the groups of an InferenceData need netCDF4
#: (HDF5) files, which scipy's netCDF3 writer cannot hold.
NETCDF_ENGINE = "h5netcdf"

_KIND_OUTLIER, _KIND_PLAIN, _KIND_ELLIPSE = 0, 1, 2
_MIN_SIGMA = 1e-8


# ---------------------------------------------------------------------------- helpers
def _is_shared_gmm(guide) -> bool:
    from ..guides.shared_gmm import SharedGMMGuide

    return isinstance(guide, SharedGMMGuide)


def _is_mean_field(guide) -> bool:
    from ..guides.mean_field import MeanFieldGuide

    return isinstance(guide, MeanFieldGuide)


def _device(guide) -> torch.device:
    for t in guide.parameters():
        return t.device
    for t in guide.buffers():
        return t.device
    return torch.device("cpu")


@contextmanager
def _seeded(seed: int, device: torch.device):
    """Seed torch's global RNG (the guides draw from it) without disturbing the caller's."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(seed))
        yield


@contextmanager
def _quiet():
    """Silence ArviZ's warnings about one chain (no R-hat) and constant variables."""
    # ArviZ 0.23 logs through its own Logger instance (not registered with logging)
    logger = getattr(az, "_log", None) or logging.getLogger("arviz")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _layout(guide) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """``(site name, flat offset, numel, shape)`` in network order."""
    out, off = [], 0
    for s in guide.sites:
        out.append((s.name, off, s.numel, tuple(s.shape)))
        off += s.numel
    return out


def _flatten(weights: dict[str, torch.Tensor], layout) -> torch.Tensor:
    """``{site: (s, *shape)}`` -> ``(s, n_w)`` in layout order."""
    return torch.cat([weights[name].reshape(weights[name].shape[0], -1) for name, *_ in layout], 1)


def _draw_chunk(guide, s: int):
    """``s`` joint draws: ``(weights {site: (s, *shape)}, flat (s, n_w), extras)``.

    For the shared-GMM guide the guide's own draw is used, so that the tied tying's
    component values ``z_{k,0}`` of the same draws are available.
    """
    if _is_shared_gmm(guide) and hasattr(guide, "_draw"):
        flat, cache = guide._draw(s)
        return guide._split(flat), flat, cache
    weights = guide.sample_weights(s)
    return weights, _flatten(weights, _layout(guide)), {}


def _batches(data, batch_size: int, max_examples: int | None, seed: int) -> list:
    """Evaluation data as a re-iterable list of ``(x, y)`` batches (``y`` required).

    Accepts a pair of tensors ``(X, y)``, a ``Dataset`` or an iterable of batches.
    ``max_examples`` keeps a seeded random subset (tensors, datasets) or the first
    examples (other iterables).
    """
    gen = torch.Generator().manual_seed(int(seed))
    if torch.is_tensor(data):
        raise ValueError("diagnostics need labelled data: pass (X, y), a Dataset or batches")
    if isinstance(data, (tuple, list)) and len(data) == 2 and torch.is_tensor(data[0]):
        x, y = data
        if max_examples is not None and max_examples < x.shape[0]:
            idx = torch.randperm(x.shape[0], generator=gen)[: int(max_examples)].sort().values
            x, y = x[idx.to(x.device)], y[idx.to(y.device)]
        return list(zip(x.split(batch_size), y.split(batch_size), strict=True))
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        if hasattr(data, "tensors") and len(data.tensors) >= 2:
            return _batches(tuple(data.tensors[:2]), batch_size, max_examples, seed)
        if max_examples is not None and max_examples < len(data):
            idx = torch.randperm(len(data), generator=gen)[: int(max_examples)].sort().values
            data = torch.utils.data.Subset(data, idx.tolist())
        return list(torch.utils.data.DataLoader(data, batch_size=batch_size))
    out, seen = [], 0
    for batch in data:
        x, y = batch[0], batch[1]
        if max_examples is not None and seen + x.shape[0] > max_examples:
            keep = int(max_examples) - seen
            x, y = x[:keep], y[:keep]
        if x.shape[0]:
            out.append((x, y))
        seen += x.shape[0]
        if max_examples is not None and seen >= max_examples:
            break
    return out


def _n_examples(batches) -> int:
    return sum(int(x.shape[0]) for x, _ in batches)


def _forward(model, weights: dict[str, torch.Tensor], batches, device, outputs: bool):
    """Per-draw log-likelihood ``(s, N)`` and, if asked, per-draw outputs ``(s, N, ...)``."""
    if int(getattr(model, "output_components", 1)) != 1:
        raise ValueError(
            "diagnostics need one prediction per weight draw; models with "
            "output_components > 1 (e.g. rank-1 mixtures) are not supported"
        )
    batched = vmap(model.network_forward, in_dims=(0, None), randomness="different")
    lik = model.likelihood
    lls, outs = [], []
    for xb, yb in batches:
        xb, yb = xb.to(device), yb.to(device)
        out = batched(weights, xb)  # (s, B, ...)
        lls.append(lik.distribution(out).log_prob(yb).reshape(out.shape[0], -1))
        if outputs:
            outs.append(out)
    ll = torch.cat(lls, 1)
    return ll, (torch.cat(outs, 1) if outputs else None)


def _chunks(total: int, size: int) -> Iterator[int]:
    done = 0
    while done < total:
        s = min(size, total - done)
        yield s
        done += s


def _subset(n: int, k: int, seed: int, salt: int = 0) -> torch.Tensor:
    """Sorted seeded random subset of ``min(k, n)`` indices of ``range(n)``."""
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + salt)
    return torch.randperm(n, generator=gen)[: min(int(k), n)].sort().values


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# ---------------------------------------------------------------------------- export
@torch.no_grad()
def to_inference_data(
    model,
    guide,
    data,
    num_samples: int = 30,
    n_weights: int = 200,
    seed: int = 0,
    batch_size: int = 512,
    sample_chunk: int = 10,
    max_examples: int | None = None,
    progress: bool = False,
) -> az.InferenceData:
    """Export ``num_samples`` guide draws and their predictions on ``data`` to ArviZ.

    Args:
        model: the :class:`~twodg_pyro.model.BNNModel`.
        guide: a mean-field, shared-GMM, or any guide with ``sample_weights``.
        data: evaluation data with labels: ``(X, y)`` tensors, a ``Dataset`` or an
            iterable of ``(x, y)`` batches.
        num_samples: draws ``S`` (the ``draw`` axis).
        n_weights: size of the seeded random subset of weights (and of outliers) exported.
        seed: seeds the draws and the subsets (the caller's RNG state is restored).
        batch_size, sample_chunk: examples per forward pass and draws evaluated at once.
        max_examples: export only a seeded random subset of this many examples.
        progress: a tqdm bar (``"export"``) over the draws.

    Returns:
        ``az.InferenceData`` with the groups described in the module docstring.
    """
    S = int(num_samples)
    if S < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples!r}")
    if int(n_weights) < 1:
        raise ValueError(f"n_weights must be at least 1, got {n_weights!r}")
    model.eval()
    device = _device(guide)
    batches = _batches(data, int(batch_size), max_examples, seed)
    if not batches:
        raise ValueError("no evaluation data (empty data set)")
    labels = torch.cat([yb.cpu() for _, yb in batches])
    layout = _layout(guide)
    n_w = sum(n for _, _, n, _ in layout)
    w_idx = _subset(n_w, n_weights, seed)
    shared = _is_shared_gmm(guide)
    tied = shared and guide.tying == "tied"
    is_cat = _is_categorical(model)

    w_draws, ll_draws, y_draws, p_draws, z_draws = [], [], [], [], []
    bar = tqdm(total=S, desc="export", unit="draw", disable=not progress, leave=False)
    with bar, _seeded(seed, device):
        for s in _chunks(S, int(sample_chunk)):
            weights, flat, extra = _draw_chunk(guide, s)
            w_draws.append(flat[:, w_idx.to(flat.device)].cpu())
            ll, out = _forward(model, weights, batches, device, outputs=True)
            ll_draws.append(ll.cpu())
            y_draws.append(model.likelihood.distribution(out).sample().cpu())
            if is_cat:
                p_draws.append(out.softmax(-1).cpu())
            if tied and "z0" in extra:
                z_draws.append(extra["z0"].cpu())
            bar.update(s)

    posterior = {"w": _np(torch.cat(w_draws))[None]}
    dims: dict[str, list[str]] = {"w": ["weight"]}
    coords: dict = {"weight": _np(w_idx), "obs": np.arange(labels.shape[0])}
    ends = np.cumsum([n for _, _, n, _ in layout])
    constant = {"weight_site": np.searchsorted(ends, _np(w_idx), side="right")}
    dims["weight_site"] = ["weight"]
    attrs = {
        "inference": "Pyro SVI (draws from the variational guide; chain axis of size 1)",
        "guide": type(guide).__name__,
        "num_samples": S,
        "seed": int(seed),
        "n_weights_total": int(n_w),
        "sites": json.dumps([name for name, *_ in layout]),
    }

    def const_over_draws(t: torch.Tensor) -> np.ndarray:
        a = _np(t)
        return np.broadcast_to(a, (1, S, *a.shape)).copy()

    if shared:
        st = guide.structure()
        coord_names = ["mu", "sigma"] if st.coordinates == "sigma" else ["mu", "log_sigma"]
        coords.update(
            component=np.arange(st.n_gaussians), coord=coord_names, coord_=list(coord_names)
        )
        posterior["centre"] = const_over_draws(st.means)
        posterior["covariance"] = const_over_draws(st.covariances)
        posterior["component_count"] = const_over_draws(st.component_counts())
        dims.update(
            centre=["component", "coord"],
            covariance=["component", "coord", "coord_"],
            component_count=["component"],
        )
        if z_draws:
            posterior["component_value"] = _np(torch.cat(z_draws))[None]
            dims["component_value"] = ["component"]
        if st.n_outliers:  # (a structure without outliers has no outlier variables)
            o_sel = _subset(st.n_outliers, n_weights, seed, salt=1)
            posterior["outlier_loc"] = const_over_draws(st.outlier_loc[o_sel])
            posterior["outlier_scale"] = const_over_draws(st.outlier_scale[o_sel])
            dims.update(outlier_loc=["outlier"], outlier_scale=["outlier"])
            coords["outlier"] = _np(st.outlier_index[o_sel])
        kind = torch.full((n_w,), _KIND_OUTLIER, dtype=torch.int8)
        kind[st.plain_index] = _KIND_PLAIN
        kind[st.ellipse_index] = _KIND_ELLIPSE
        comp = torch.full((n_w,), -1, dtype=torch.long)
        comp[st.plain_index] = st.plain_component
        constant["weight_kind"] = _np(kind[w_idx])
        constant["weight_component"] = _np(comp[w_idx])
        dims.update(weight_kind=["weight"], weight_component=["weight"])
        attrs.update(
            tying=guide.tying,
            coordinates=st.coordinates,
            counts=json.dumps(st.counts()),
            weight_kind_codes=json.dumps({"outlier": 0, "plain": 1, "ellipse": 2}),
        )
    elif _is_mean_field(guide):
        locs = torch.cat([guide.loc(name).detach().reshape(-1) for name, *_ in layout])
        scales = torch.cat([guide.scale(name).detach().reshape(-1) for name, *_ in layout])
        constant["weight_loc"] = _np(locs[w_idx.to(locs.device)])
        constant["weight_scale"] = _np(scales[w_idx.to(scales.device)])
        dims.update(weight_loc=["weight"], weight_scale=["weight"])

    predictive = {"y": _np(torch.cat(y_draws))[None]}
    dims["y"] = ["obs"]
    if p_draws:
        probs = torch.cat(p_draws)
        predictive["class_probs"] = _np(probs)[None]
        dims["class_probs"] = ["obs", "class"]
        coords["class"] = np.arange(probs.shape[-1])
    return az.from_dict(
        posterior=posterior,
        posterior_predictive=predictive,
        log_likelihood={"y": _np(torch.cat(ll_draws))[None]},
        observed_data={"y": _np(labels)},
        constant_data=constant,
        coords=coords,
        dims=dims,
        attrs=attrs,
    )


def _is_categorical(model) -> bool:
    from ..likelihoods import Categorical

    return isinstance(model.likelihood, Categorical)


def class_probabilities(idata: az.InferenceData) -> tuple[np.ndarray, np.ndarray]:
    """``(mean class probabilities (N, C), labels (N,))`` of an exported InferenceData:
    the Bayesian model average over its draws."""
    if "class_probs" not in getattr(idata, "posterior_predictive", {}):
        raise ValueError("the InferenceData has no posterior_predictive class_probs")
    probs = idata.posterior_predictive["class_probs"].mean(dim=("chain", "draw")).values
    return np.asarray(probs), np.asarray(idata.observed_data["y"].values)


# ---------------------------------------------------------------------------- log q
def _component_marginals(guide, nodes: int):
    r"""Each component's marginal of one tied weight as a Gaussian mixture over its
    quadrature nodes: ``(log weights, means, sds)``, each ``(K, J)``, and the method."""
    tying = guide.tying
    if tying == "representative":
        mu, sd = guide.centre_mu.detach(), guide.centre_sigma().detach()
        return torch.zeros_like(mu)[:, None], mu[:, None], sd[:, None], "exact"
    m = guide.centres().detach()
    cov = guide.covariances().detach()
    if tying == "tied":
        sd = cov[:, 0, 0].clamp_min(1e-30).sqrt()
        return torch.zeros_like(sd)[:, None], m[:, :1], sd[:, None], "marginal_product"
    x, h = np.polynomial.hermite.hermgauss(int(nodes))
    x = torch.as_tensor(x, dtype=m.dtype, device=m.device)
    log_h = torch.as_tensor(np.log(h / math.sqrt(math.pi)), dtype=m.dtype, device=m.device)
    s00, s01, s11 = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1].clamp_min(1e-30)
    theta = m[:, 1:2] + (2 * s11).sqrt()[:, None] * x  # (K, J) nodes over theta ~ N(m1, S11)
    cond_mean = m[:, :1] + (s01 / s11)[:, None] * (theta - m[:, 1:2])
    cond_var = (s00 - s01**2 / s11).clamp_min(0.0)[:, None]
    if guide.coordinates == "sigma":
        sig = theta.abs().clamp_min(_MIN_SIGMA)
    else:
        sig = theta.exp()
    sd = (cond_var + sig**2).sqrt()
    return log_h.expand_as(theta), cond_mean, sd, "quadrature"


_LOG_2PI = math.log(2 * math.pi)
_GROUP_ELEMENTS = 1 << 22  # draws are evaluated in groups of about this many terms


def _mixture_table(log_w, mean, sd):
    """Per-weight constants of ``log sum_j w_j N(x | mean_j, sd_j^2)``: ``(const, mean, 1/sd)``."""
    return log_w - sd.log() - 0.5 * _LOG_2PI, mean, 1.0 / sd


def _mixture_log_prob(w: torch.Tensor, table) -> torch.Tensor:
    """``logsumexp_j (const_j - (w - mean_j)^2 / (2 sd_j^2))`` for ``w (g, n)``, table
    ``(n, J)``: returns ``(g, n)``."""
    const, mean, inv_sd = table
    z = (w[..., None] - mean) * inv_sd
    return torch.logsumexp(const - 0.5 * z**2, -1)


def _shared_gmm_log_q_fn(guide, nodes: int):
    """``(fn(flat (s, n_w)) -> log q (s,), method)`` with the per-weight tables built once."""
    log_w, mean, sd, method = _component_marginals(guide, nodes)
    J = log_w.shape[1]
    out_idx, plain_idx, ell_idx = guide.outlier_index, guide.plain_index, guide.ellipse_index
    loc = guide.outlier_loc.detach()
    scale = F.softplus(guide.outlier_rho.detach())
    c = guide.plain_component
    plain = _mixture_table(log_w[c], mean[c], sd[c])
    ell = None
    if ell_idx.numel():
        e_c, n_e = guide.ellipse_components, ell_idx.numel()
        lw = log_w[e_c] + guide.ellipse_alphas.clamp_min(1e-38).log()[..., None]  # (n_e, k, J)
        ell = _mixture_table(
            lw.reshape(n_e, -1), mean[e_c].reshape(n_e, -1), sd[e_c].reshape(n_e, -1)
        )
    n_terms = plain_idx.numel() + (ell[0].numel() // J if ell is not None else 0)
    per_draw = max(1, n_terms * J)
    group = max(1, _GROUP_ELEMENTS // per_draw)

    def fn(flat: torch.Tensor) -> torch.Tensor:
        total = flat.new_zeros(flat.shape[0])
        if out_idx.numel():
            z = (flat[:, out_idx] - loc) / scale
            total += (-0.5 * z**2 - scale.log() - 0.5 * _LOG_2PI).sum(-1)
        for g0 in range(0, flat.shape[0], group):
            rows = slice(g0, g0 + group)
            if plain_idx.numel():
                total[rows] += _mixture_log_prob(flat[rows][:, plain_idx], plain).sum(-1)
            if ell is not None:
                total[rows] += _mixture_log_prob(flat[rows][:, ell_idx], ell).sum(-1)
        return total

    return fn, method


def _log_q_fn(guide, quadrature_nodes: int = 64):
    """``(fn(weights, flat) -> log q (s,), method)`` for ``guide`` (see :func:`guide_log_q`)."""
    if _is_mean_field(guide):

        def mean_field(weights, flat=None):
            total = 0.0
            for s in guide.sites:
                d = torch.distributions.Normal(guide.loc(s.name), guide.scale(s.name))
                w = weights[s.name]
                total = total + d.log_prob(w).reshape(w.shape[0], -1).sum(-1)
            return total.detach()

        return mean_field, "exact"
    if _is_shared_gmm(guide):
        fn, method = _shared_gmm_log_q_fn(guide, quadrature_nodes)
        layout = _layout(guide)

        def shared(weights, flat=None):
            return fn(_flatten(weights, layout) if flat is None else flat)

        return shared, method
    if hasattr(guide, "log_q"):
        return (lambda weights, flat=None: guide.log_q(weights).detach()), "guide.log_q"
    raise TypeError(
        f"no log q(w) for a {type(guide).__name__}: supported are MeanFieldGuide and "
        "SharedGMMGuide, or a guide with a log_q(weights) -> (S,) method"
    )


@torch.no_grad()
def guide_log_q(
    guide, weights: dict[str, torch.Tensor], quadrature_nodes: int = 64
) -> tuple[torch.Tensor, str]:
    """``(log q(w) per draw (S,), method)`` for draws ``{site: (S, *shape)}`` of ``guide``.

    ``method`` is ``"exact"``, ``"quadrature"`` (stochastic tying) or
    ``"marginal_product"`` (tied tying; a surrogate, see the module docstring).
    """
    fn, method = _log_q_fn(guide, quadrature_nodes)
    return fn(weights), method


def _log_prior(model, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    total = 0.0
    for site in model.sites:
        total = total + model.prior_distribution(site).log_prob(weights[site.name])
    return total


# ---------------------------------------------------------------------------- diagnostics
_KHAT_GOOD, _KHAT_OK = 0.5, 0.7
_MIN_KHAT_SAMPLES = 25  # PSIS fits the largest ceil(min(S / 5, 3 sqrt(S))) ratios; ArviZ needs > 4


@torch.no_grad()
def vi_diagnostics(
    model,
    guide,
    train_data,
    num_samples: int = 100,
    seed: int = 0,
    max_examples: int | None = None,
    batch_size: int = 512,
    sample_chunk: int = 10,
    quadrature_nodes: int = 64,
    progress: bool = False,
) -> dict:
    r"""Pareto :math:`\hat k` of the importance ratios :math:`p(w, \mathcal D) / q(w)`.

    Args:
        model, guide: the trained BNN.
        train_data: the training data (``(X, y)``, a ``Dataset`` or batches).
        num_samples: draws from :math:`q`, at least 25 (Yao et al. use about 100 or more;
            with fewer the tail fit is unreliable).
        seed: seeds the draws and an example subset.
        max_examples: use a seeded random subset of this many training examples and scale
            its log-likelihood by ``N / n`` (``N`` = the model's data-set size).
        progress: a tqdm bar (``"k-hat"``) over the draws.

    Returns:
        ``khat``; ``khat_assessment`` (``"good"`` below 0.5, ``"ok"`` below 0.7,
        ``"unreliable"`` otherwise, Yao et al.); ``log_q_method`` and ``exact`` (see the
        module docstring); ``elbo`` (mean log ratio: an estimate of the full-data ELBO,
        when ``exact``); ``log_evidence_is`` (importance-sampling estimate of
        :math:`\log p(\mathcal D)`); ``ess`` (effective sample size of the smoothed
        normalised weights); ``log_ratio_sd``; ``num_samples``, ``n_examples``,
        ``loglik_scale``.
    """
    S = int(num_samples)
    if S < _MIN_KHAT_SAMPLES:
        raise ValueError(
            f"num_samples must be at least {_MIN_KHAT_SAMPLES} for the Pareto fit (its tail "
            f"needs more than 4 draws), got {num_samples!r}"
        )
    model.eval()
    device = _device(guide)
    batches = _batches(train_data, int(batch_size), max_examples, seed)
    if not batches:
        raise ValueError("no training data (empty data set)")
    n = _n_examples(batches)
    scale = model.likelihood.dataset_size / n
    log_q_fn, method = _log_q_fn(guide, quadrature_nodes)
    ratios = []
    bar = tqdm(total=S, desc="k-hat", unit="draw", disable=not progress, leave=False)
    with bar, _seeded(seed, device):
        for s in _chunks(S, int(sample_chunk)):
            weights, flat, _ = _draw_chunk(guide, s)
            ll, _ = _forward(model, weights, batches, device, outputs=False)
            log_p = _log_prior(model, weights) + scale * ll.sum(1)
            log_q = log_q_fn(weights, flat)
            ratios.append((log_p - log_q).double().cpu())
            bar.update(s)
    log_r = torch.cat(ratios).numpy()
    if not np.all(np.isfinite(log_r)):
        raise FloatingPointError(
            f"{int((~np.isfinite(log_r)).sum())} of {S} log importance ratios are not finite"
        )
    with _quiet():
        lw, khat = az.psislw(log_r.copy(), reff=1.0)
    khat = float(np.asarray(khat))
    if khat < _KHAT_GOOD:
        assessment = "good"
    elif khat < _KHAT_OK:
        assessment = "ok"
    else:
        assessment = "unreliable"
    lse = float(np.logaddexp.reduce(log_r))
    return {
        "khat": khat,
        "khat_assessment": assessment,
        "log_q_method": method,
        "exact": method in ("exact", "quadrature"),
        "elbo": float(log_r.mean()),
        "log_evidence_is": lse - math.log(S),
        "ess": float(1.0 / np.exp(np.logaddexp.reduce(2 * np.asarray(lw)))),
        "log_ratio_sd": float(log_r.std()),
        "num_samples": S,
        "n_examples": n,
        "loglik_scale": float(scale),
    }


def loo(idata: az.InferenceData) -> dict:
    """PSIS-LOO (``az.loo``, ``reff = 1``) from the ``log_likelihood`` group.

    Returns ``elpd_loo``, ``se``, ``p_loo``, ``n_samples``, ``n_data_points``,
    ``warning`` (ArviZ's flag), ``good_k`` (ArviZ's sample-size-dependent threshold),
    ``max_pareto_k``, ``n_bad_k`` (observations with :math:`\\hat k` above ``good_k``)
    and ``scale``.  With fewer than about 25 draws the Pareto tails cannot be fitted
    (ArviZ reports :math:`\\hat k = \\infty`): export at least 30 draws.
    """
    with _quiet():
        res = az.loo(idata, pointwise=True, reff=1.0)
    k = np.asarray(res.pareto_k.values)
    good = float(getattr(res, "good_k", 0.7))
    return {
        "elpd_loo": float(res.elpd_loo),
        "se": float(res.se),
        "p_loo": float(res.p_loo),
        "n_samples": int(res.n_samples),
        "n_data_points": int(res.n_data_points),
        "warning": bool(res.warning),
        "good_k": good,
        "max_pareto_k": float(k.max()),
        "n_bad_k": int((k > good).sum()),
        "scale": str(res.scale),
    }


def summary(idata: az.InferenceData, var_names: list[str] | None = None, **kwargs):
    """``az.summary`` of the exported posterior (a pandas ``DataFrame``).

    With one chain ``r_hat`` is NaN; variables constant over draws (the variational
    parameters) have ``sd = 0`` and NaN ESS.  ``kwargs`` go to ``az.summary``.
    """
    with _quiet():
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
    with _quiet():
        idata = az.from_netcdf(str(path), engine=NETCDF_ENGINE)
    for group in idata.groups():
        getattr(idata, group).load()
    return idata
