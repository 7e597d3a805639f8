r"""What the ArviZ export and the VI diagnostics share: the data batches, the per-draw
log-likelihood, computed stably, and the model's joint log density (the draws are the
guide's, :meth:`~twodg_pyro.guide.BNNGuide.draw`, those of a seeded prediction).

**Log-likelihood, stably.**  A confident prediction's log-likelihood is a tiny
negative number, :math:`\log p_y = -\log(1 + \sum_{j \ne y} e^{f_j - f_y})`.  Computed as
``log_softmax`` it is :math:`f_y - \operatorname{logsumexp}_c f_c`, a difference of two
nearly equal numbers: it rounds to exactly 0.0 once :math:`p_y` is within the dtype's
epsilon of 1 (a logit gap of about 17 in float32, 37 in float64).  On the digits main
job, whose draws have logit gaps of 100-200, 91% of float32 and still 86% of float64
``log_softmax`` values were exactly 0, and PSIS-LOO, which fits a Pareto tail to each
observation's draws, returned :math:`\hat k = \infty` and an ``elpd_loo`` of NaN.  For
a categorical likelihood we therefore compute, in float64,

.. math:: \log p_y = -\operatorname{softplus}\big(\operatorname{logsumexp}_{j \ne y} f_j - f_y\big),
    \qquad \operatorname{softplus}(z) = \log(1 + e^z),

which keeps :math:`\log p_y \approx -e^{z}` down to :math:`e^{z} \approx 10^{-308}` (a
logit gap of about 700) and is exact to rounding for unlikely labels too.  Other
likelihoods are evaluated by their distribution's ``log_prob`` in float64.

**Models with several outputs per draw** (a rank-1 BNN's ``M`` components,
``output_components = M``): one draw of the guide is one value of every site (all ``M``
rows of the factor sites), and its predictive is the equal-weight mixture of the
components, :math:`p(y \mid x, w) = \frac1M \sum_m p(y \mid x, w_m)` (what
:func:`~twodg_pyro.prediction.predict` averages); its log is a log-sum-exp over the
components, also in float64.

**The joint density** of guide draws, :math:`\log p(w, \mathcal D) = \log p(w) +
\log p(\mathcal D \mid w)`: the numerator of the importance ratios :math:`p/q` of the VI
diagnostics (:mod:`.vi`, :mod:`.blocks`) and the ``log_p`` of the export's
``sample_stats`` (:mod:`.arviz_export`).

* :math:`\log p(w)`: the model's prior at every site (:func:`log_prior`); for an
  :class:`~twodg_pyro.guides.SSVIGuide` the prior restricted to its active subspace
  :math:`\Gamma`, :math:`p_\Gamma(w) = \prod_{i \in \Gamma} p(w_i)` (its :math:`q` is a
  point mass at 0 elsewhere), as the SSVI objective's KL does.
* :math:`\log p(\mathcal D \mid w)`: the float64 log-likelihood above, summed over the
  ``n`` examples given and scaled by :math:`N / n`, with :math:`N` the model's data-set
  size (the scale of the model's own ELBO): exact on the whole training set, an unbiased
  estimate on a subset.  A rank-1 BNN's likelihood is the equal-weight mixture of its
  ``M`` components.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from pyro.infer.autoguide import AutoGuide
from torch.func import vmap
from torch.utils.data import Dataset

from ..evaluation import SAMPLE_CHUNK
from ..guide import BNNGuide
from ..likelihoods import Categorical


def check_guide(guide, what: str) -> None:
    """Refuse (``TypeError``) a guide ``what`` cannot use -- a Pyro autoguide, or anything
    but a :class:`~twodg_pyro.guide.BNNGuide` -- in one line saying what to use instead."""
    if isinstance(guide, AutoGuide):
        raise TypeError(
            f"{what} does not take a Pyro autoguide ({type(guide).__name__}): it reads a "
            "guide's draws and variational parameters site by site through the library's "
            "guide API. Use twodg_pyro.guides.MeanFieldGuide(model) (the same mean-field "
            "Normal family, with the Normal at each weight site), or SharedGMMGuide, "
            "Rank1Guide or SSVIGuide"
        )
    if not isinstance(guide, BNNGuide):
        raise TypeError(
            f"{what} needs one of the library's guides (MeanFieldGuide, SharedGMMGuide, "
            f"Rank1Guide, SSVIGuide: a twodg_pyro.guide.BNNGuide), got "
            f"{type(guide).__name__}"
        )


def batches(data, batch_size: int, max_examples: int | None, seed: int, with_index: bool = False):
    """Evaluation data as a re-iterable list of ``(x, y)`` batches (``y`` required).

    Accepts a pair of tensors ``(X, y)``, a ``Dataset`` or an iterable of batches.
    ``max_examples`` keeps a seeded random subset (tensors, datasets) or the first
    examples (other iterables).  With ``with_index`` returns ``(batches, index)``:
    ``index`` the position of each kept example in ``data``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    if torch.is_tensor(data):
        raise ValueError("diagnostics need labelled data: pass (X, y), a Dataset or batches")
    if isinstance(data, (tuple, list)) and len(data) == 2 and torch.is_tensor(data[0]):
        x, y = data
        index = torch.arange(x.shape[0])
        if max_examples is not None and max_examples < x.shape[0]:
            index = torch.randperm(x.shape[0], generator=gen)[: int(max_examples)].sort().values
            x, y = x[index.to(x.device)], y[index.to(y.device)]
        out = list(zip(x.split(batch_size), y.split(batch_size), strict=True))
        return (out, index) if with_index else out
    if isinstance(data, Dataset) and hasattr(data, "__len__"):
        if hasattr(data, "tensors") and len(data.tensors) >= 2:
            return batches(tuple(data.tensors[:2]), batch_size, max_examples, seed, with_index)
        index = torch.arange(len(data))
        if max_examples is not None and max_examples < len(data):
            index = torch.randperm(len(data), generator=gen)[: int(max_examples)].sort().values
            data = torch.utils.data.Subset(data, index.tolist())
        out = list(torch.utils.data.DataLoader(data, batch_size=batch_size))
        return (out, index) if with_index else out
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
    return (out, torch.arange(n_examples(out))) if with_index else out


def count_examples(data) -> int | None:
    """Examples in ``(X, y)``, a ``Dataset`` or a ``DataLoader`` (``None``: another
    iterable, not counted without reading it)."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and torch.is_tensor(data[0]):
        return int(data[0].shape[0])
    dataset = data if isinstance(data, Dataset) else getattr(data, "dataset", None)
    if isinstance(dataset, Dataset) and hasattr(dataset, "__len__"):
        return len(dataset)
    return None


def n_examples(batch_list) -> int:
    return sum(int(x.shape[0]) for x, _ in batch_list)


def forward(model, weights: dict[str, torch.Tensor], batch_list, device, outputs: bool):
    r"""Per-draw log-likelihood ``(s, N)`` in float64 and, if asked, per-draw outputs.

    Outputs are ``(s, N, ...)``, or ``(s, M, N, ...)`` for a model with
    ``output_components = M``; the log-likelihood of such a draw is
    :math:`\log \frac1M \sum_m p(y \mid x, w_m)` (module docstring).
    """
    components = int(model.output_components)
    batched = vmap(model.network_forward, in_dims=(0, None), randomness="different")
    lik = model.likelihood
    lls, outs = [], []
    for xb, yb in batch_list:
        xb, yb = xb.to(device), yb.to(device)
        out = batched(weights, xb)  # (s, B, ...) or (s, M, B, ...)
        ll = log_likelihood(lik, out, yb, 2 if components > 1 else 1)
        if components > 1:
            ll = ll.reshape(out.shape[0], components, -1)
            ll = torch.logsumexp(ll, 1) - math.log(components)
        lls.append(ll.reshape(out.shape[0], -1))
        if outputs:
            outs.append(out)
    outs = torch.cat(outs, 2 if components > 1 else 1) if outputs else None  # along the examples
    return torch.cat(lls, 1), outs


def categorical_log_prob(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r""":math:`\log p(y) = -\operatorname{softplus}(\operatorname{logsumexp}_{j \ne y} f_j - f_y)`
    of logits ``(..., C)`` and labels broadcastable to ``logits.shape[:-1]``, in float64
    (module docstring): no rounding to 0 for confident predictions."""
    f = logits.to(torch.float64)
    idx = y.long().expand(f.shape[:-1]).unsqueeze(-1)
    f_y = f.gather(-1, idx).squeeze(-1)
    others = f.scatter(-1, idx, float("-inf"))
    return -torch.nn.functional.softplus(torch.logsumexp(others, -1) - f_y)


def log_likelihood(
    likelihood, outputs: torch.Tensor, y: torch.Tensor, particle_dims: int = 1
) -> torch.Tensor:
    r"""Per-example :math:`\log p(y \mid f)` in float64 of network ``outputs`` with
    ``particle_dims`` leading dimensions (draws, and a rank-1 BNN's components):
    ``(*particles, B)``."""
    if isinstance(likelihood, Categorical):
        return categorical_log_prob(outputs, y)
    f = outputs.to(torch.float64)
    d = likelihood.batched_distribution(f, particle_dims)
    return d.log_prob(y.to(torch.float64) if y.is_floating_point() else y)


def chunks(total: int, size: int = SAMPLE_CHUNK) -> Iterator[int]:
    return (min(size, total - done) for done in range(0, total, size))


def subset(n: int, k: int, seed: int, salt: int = 0) -> torch.Tensor:
    """Sorted seeded random subset of ``min(k, n)`` indices of ``range(n)``."""
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + salt)
    return torch.randperm(n, generator=gen)[: min(int(k), n)].sort().values


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


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
