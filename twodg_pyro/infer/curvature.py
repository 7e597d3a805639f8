r"""The curvature of a trained network and what it derives: per-layer prior scales by
empirical Bayes and the mean-field scales at their optimum under a quadratic loss.

For a categorical likelihood over :math:`N` training examples the generalised
Gauss-Newton matrix of the summed negative log-likelihood at the weights :math:`\hat w`
is the Fisher information

.. math::
    G = \sum_{n=1}^{N} \mathbb E_{y \sim p(y \mid f_{\hat w}(x_n))}
        \big[\nabla_w \log p(y \mid x_n, w)\, \nabla_w \log p(y \mid x_n, w)^\top\big],

whose diagonal :func:`diagonal_fisher` estimates without bias with one label drawn from
the network's own predictive per example (``labels="sampled"``; ``"true"``: the
empirical Fisher, with the data's labels).

With a Normal prior :math:`\mathcal N(0, s_l^2)` on the weights of site :math:`l` and a
KL weight (temperature) :math:`\beta`, the loss :math:`E_q[\text{nll}] + \beta\,
\mathrm{KL}(q \,\|\, p)` of a mean-field Gaussian :math:`q` under the quadratic model of
the nll is minimised by

.. math:: \sigma_i^2 = \Big(\frac{G_{ii}}{\beta} + \frac{1}{s_l^2}\Big)^{-1},

the diagonal of the precision, not of the covariance (:func:`curvature_scales`).  The
prior scale that maximises the Laplace evidence of the tempered posterior (type-II
maximum likelihood, per site) is the fixed point of

.. math:: s_l^2 = \frac{1}{P_l} \sum_{i \in l} \big(\hat w_i^2 + \sigma_i^2\big),

the EM update of MacKay's evidence framework (:func:`empirical_bayes_scales`).  Both
depend only on the network, its data and :math:`\beta`: nothing is set per architecture.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from ..likelihoods import Categorical

FisherLabels = str  # "sampled" | "true"


def _batches(data) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches of a ``TensorDataset``, of ``(X, y)`` tensors, of any other
    map-style ``Dataset`` (batched by a ``DataLoader``) or of an iterable of batches."""
    tensors = getattr(data, "tensors", None)
    if tensors is not None:
        yield tensors[0], tensors[1]
        return
    if isinstance(data, (tuple, list)) and len(data) == 2 and torch.is_tensor(data[0]):
        yield data[0], data[1]
        return
    if isinstance(data, torch.utils.data.Dataset) and hasattr(data, "__len__"):
        data = torch.utils.data.DataLoader(data, batch_size=256)
    yield from data


def diagonal_fisher(
    model,
    data,
    labels: FisherLabels = "sampled",
    chunk: int = 64,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    r"""The diagonal of the Fisher (Gauss-Newton) matrix of the summed categorical nll at
    the network's current Bayesian weights, per site: :math:`\sum_n g_{n,i}^2` with
    :math:`g_n` the per-example gradient (module docstring).

    The network runs in evaluation mode (normalisation layers use their running
    statistics, as they do in a frozen-statistics model); per-example gradients come
    from :func:`torch.func.vmap` over :func:`torch.func.grad`, ``chunk`` examples at a
    time, and summed outside autograd (memory stays that of one chunk, also when the
    network has trainable parameters that are not Bayesian sites).

    Args:
        model: a :class:`~twodg_pyro.bnn.BNNModel` with a categorical likelihood.
        data: a ``Dataset`` (e.g. a ``TensorDataset`` or a ``Subset``), ``(X, y)``
            tensors, or an iterable of ``(x, y)`` batches: the training set.
        labels: ``"sampled"`` (one label per example from the network's predictive: an
            unbiased estimate of the Gauss-Newton diagonal) or ``"true"`` (the empirical
            Fisher).
        chunk: examples per vectorised gradient call.
        seed: seed of the sampled labels.

    Returns:
        ``{site name: tensor of the site's shape}``, non-negative.

    Raises:
        ValueError: another likelihood than categorical, an unknown ``labels``, a
            ``chunk`` below 1, no data, or a non-finite result (naming the site).
    """
    if not isinstance(model.likelihood, Categorical):
        raise ValueError(
            f"diagonal_fisher needs a categorical likelihood, got {type(model.likelihood).__name__}"
        )
    if labels not in ("sampled", "true"):
        raise ValueError(f"labels must be 'sampled' or 'true', got {labels!r}")
    if int(chunk) < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    net = model.net
    was_training = net.training
    net.eval()
    like = model.site_parameter(0)
    weights = {s.name: model.site_parameter(i).detach() for i, s in enumerate(model.sites)}

    def nll_one(w, x, y):
        out = functional_call(net, w, (x.unsqueeze(0),), strict=False)
        return F.cross_entropy(out, y.unsqueeze(0), reduction="sum")

    per_example = vmap(grad(nll_one), in_dims=(None, 0, 0))
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    out = {k: torch.zeros_like(v) for k, v in weights.items()}
    seen = 0
    try:
        for xb, yb in _batches(data):
            for i in range(0, len(xb), int(chunk)):
                x = xb[i : i + int(chunk)]
                x = x.to(device=like.device, dtype=like.dtype) if x.is_floating_point() else x
                y = yb[i : i + int(chunk)].to(like.device)
                if labels == "sampled":
                    with torch.no_grad():
                        p = functional_call(net, weights, (x,), strict=False).softmax(-1)
                    y = torch.multinomial(p.double().cpu(), 1, generator=generator)
                    y = y.squeeze(-1).to(like.device)
                # outside autograd: the gradients depend on the network's other
                # trainable parameters (e.g. BatchNorm's affine ones), and summing them
                # with a graph would keep every chunk's activations alive
                with torch.no_grad():
                    grads = per_example(weights, x, y)
                    for k in out:
                        out[k] += grads[k].pow(2).sum(0)
                seen += len(x)
    finally:
        net.train(was_training)
    if seen == 0:
        raise ValueError("diagonal_fisher got no examples")
    for k, v in out.items():
        if not torch.isfinite(v).all():
            raise ValueError(f"the Fisher diagonal of site {k!r} is not finite")
    return out


def curvature_scales(
    model,
    fisher: Mapping[str, torch.Tensor],
    kl_weight: float = 1.0,
    prior_scales: Mapping[str, float] | None = None,
) -> dict[str, torch.Tensor]:
    r"""The mean-field scales at the optimum of the quadratic model:
    :math:`\sigma_i = (G_{ii} / \beta + 1 / s_l^2)^{-1/2}` (module docstring).

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel`; its prior gives :math:`s_l^2` as
            the variance of each site's prior (any prior with a finite variance; one
            with none, e.g. Cauchy, adds no precision) unless ``prior_scales`` does.
        fisher: the diagonal of :func:`diagonal_fisher`, per site.
        kl_weight: :math:`\beta > 0`.
        prior_scales: optional ``{site: s_l}``.

    Raises:
        ValueError: a non-positive ``kl_weight``, a site missing from ``fisher`` or of
            another shape.
    """
    beta = float(kl_weight)
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"kl_weight must be a positive number, got {kl_weight!r}")
    out = {}
    for site in model.sites:
        g = fisher.get(site.name)
        if g is None or tuple(g.shape) != tuple(site.shape):
            got = None if g is None else tuple(g.shape)
            raise ValueError(
                f"fisher has no diagonal of shape {tuple(site.shape)} for site "
                f"{site.name!r} (got {got})"
            )
        if prior_scales is not None:
            precision = torch.full_like(g, 1.0 / float(prior_scales[site.name]) ** 2)
        else:
            var = model.prior_distribution(site).base_dist.variance
            precision = torch.where(torch.isfinite(var), 1.0 / var, torch.zeros_like(var))
            precision = precision.to(g).expand_as(g)
        out[site.name] = (g / beta + precision).clamp_min(1e-30).rsqrt()
    return out


def empirical_bayes_scales(
    model,
    fisher: Mapping[str, torch.Tensor],
    kl_weight: float = 1.0,
    iters: int = 200,
    rtol: float = 1e-6,
) -> dict[str, float]:
    r"""Per-site prior standard deviations :math:`s_l` by type-II maximum likelihood:
    the fixed point of :math:`s_l^2 = \frac{1}{P_l}\sum_i (\hat w_i^2 + \sigma_i^2)` with
    :math:`\sigma_i^2 = (G_{ii}/\beta + 1/s_l^2)^{-1}` (module docstring), started at
    :math:`s_l^2 = \frac{1}{P_l}\sum_i \hat w_i^2` and iterated until it moves by less
    than ``rtol`` (at most ``iters`` times).  The means :math:`\hat w` are the network's
    current Bayesian weights.

    Raises:
        ValueError: a non-positive ``kl_weight``, a site missing from ``fisher``.
    """
    beta = float(kl_weight)
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"kl_weight must be a positive number, got {kl_weight!r}")
    out = {}
    for i, site in enumerate(model.sites):
        if site.name not in fisher:
            raise ValueError(f"fisher has no diagonal for site {site.name!r}")
        w2 = model.site_parameter(i).detach().double().pow(2)
        g = fisher[site.name].detach().double() / beta
        s2 = w2.mean().clamp_min(1e-12)
        for _ in range(int(iters)):
            new = (w2 + 1.0 / (g + 1.0 / s2)).mean()
            done = abs(float(new / s2) - 1.0) < rtol
            s2 = new
            if done:
                break
        out[site.name] = float(s2.sqrt())
    return out
