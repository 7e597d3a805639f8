r"""The model's joint log density of guide draws, :math:`\log p(w, \mathcal D) = \log p(w) +
\log p(\mathcal D \mid w)`: the numerator of the importance ratios :math:`p/q` of the VI
diagnostics (:mod:`.vi`, :mod:`.blocks`) and the ``log_p`` of the export's
``sample_stats`` (:mod:`.arviz_export`).

* :math:`\log p(w)`: the model's prior at every site (:func:`log_prior`); for an
  :class:`~twodg_pyro.guides.SSVIGuide` the prior restricted to its active subspace
  :math:`\Gamma`, :math:`p_\Gamma(w) = \prod_{i \in \Gamma} p(w_i)` (its :math:`q` is a
  point mass at 0 elsewhere), as the SSVI objective's KL does.
* :math:`\log p(\mathcal D \mid w)`: the float64 log-likelihood
  (:mod:`twodg_pyro.diagnostics._draws`) summed over the ``n`` examples given and scaled
  by :math:`N / n`, with :math:`N` the model's data-set size (the scale of the model's
  own ELBO): exact on the whole training set, an unbiased estimate on a subset.  A
  rank-1 BNN's likelihood is the equal-weight mixture of its ``M`` components.
"""

from __future__ import annotations

import torch

from ._draws import forward, n_examples

__all__ = ["likelihood_scale", "log_joint", "log_prior", "target"]


def log_prior(model, guide, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    r""":math:`\log p(w)` per draw ``(S,)`` for draws ``{site: (S, *shape)}``; for an
    :class:`~twodg_pyro.guides.SSVIGuide` the prior restricted to its active subspace."""
    from ..guides.ssvi import SSVIGuide, _unwrap

    total = 0.0
    for site in model.sites:
        d = model.prior_distribution(site)
        w = weights[site.name]
        if isinstance(guide, SSVIGuide):
            elementwise = _unwrap(d).log_prob(w).expand(w.shape).reshape(w.shape[0], -1)
            total = total + elementwise[:, guide.active_indices(site.name)].sum(-1)
        else:
            total = total + d.log_prob(w)
    return total


def target(model, guide) -> str:
    """The joint density the ratios' numerator is, in words."""
    from ..guides.ssvi import SSVIGuide

    if int(model.output_components) > 1:
        return "p(w) prod_n (1/M) sum_m p(y_n | x_n, w_m): the M-component ensemble"
    if isinstance(guide, SSVIGuide):
        return "p_Gamma(w) prod_n p(y_n | x_n, w): the prior restricted to the active subspace"
    return "p(w) prod_n p(y_n | x_n, w)"


def likelihood_scale(model, batch_list) -> float:
    """:math:`N / n`: the model's data-set size over the examples in ``batch_list``."""
    return float(model.likelihood.dataset_size) / n_examples(batch_list)


def log_joint(
    model, guide, weights: dict[str, torch.Tensor], batch_list, device, scale: float, ll=None
) -> torch.Tensor:
    r""":math:`\log p(w) + s \sum_n \log p(y_n \mid x_n, w)` per draw, float64 ``(S,)``
    (``ll``: the per-example log-likelihood ``(S, n)`` of these draws, when known)."""
    if ll is None:
        ll, _ = forward(model, weights, batch_list, device, outputs=False)
    prior = log_prior(model, guide, weights).to(torch.float64)
    return prior + float(scale) * ll.to(prior.device).sum(1)
