r"""VI diagnostics of a trained BNN guide (Yao et al. 2018, "Yes, but did it work?").

:func:`vi_diagnostics` computes the importance ratios
:math:`\log r_s = \log p(w^{(s)}, \mathcal D) - \log q(w^{(s)})` of ``S`` draws of the
guide and their Pareto :math:`\hat k` (ArviZ's PSIS through
:func:`~twodg_pyro.diagnostics.arviz_stats.psislw`), read against the sample-size
threshold :math:`\min(1 - 1/\log_{10} S, 0.7)` (:func:`khat_assessment`).  Over tens of
thousands of weights this :math:`\hat k` is all but always above 0.7 and does not say
where the approximation fails: :mod:`twodg_pyro.diagnostics.blocks` asks per layer, for
the outliers and per mixture component.

* :math:`\log p(w, \mathcal D) = \log p(w) + \log p(\mathcal D \mid w)`: the joint
  density of :mod:`twodg_pyro.diagnostics._draws` (the float64 log-likelihood summed
  over the training data given, by default all of it; on a subset of ``n`` examples
  scaled by ``N / n``, an unbiased but noisier estimate, which inflates :math:`\hat k`;
  SSVI's prior restricted to its active subspace :math:`\Gamma`, where its :math:`q`
  lives).
* :math:`\log q(w)`: :func:`twodg_pyro.guides.marginal_density.guide_log_q` (exact for
  mean-field, rank-1, SSVI and the ``representative`` tying, Gauss-Hermite quadrature
  for ``stochastic``, a product-of-marginals surrogate for ``tied``, which has no joint
  density: its :math:`\hat k` compares the posterior with that surrogate and is reported
  for completeness only, ``exact = False``).
* Rank-1 BNN: a draw is all ``M`` rows of every factor site (the model's sample
  sites); :math:`p(y \mid x, w)` is the equal-weight mixture of the ``M`` components,
  the predictive that :func:`~twodg_pyro.prediction.predict` averages (training routes each
  example to one component instead, so this target is the ensemble's model, not the
  training objective's).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm

from ..evaluation import seeded
from ..guides.marginal_density import LOG_Q_METHODS, log_q_fn
from ..prediction import _device_of
from ._draws import batches, check_guide, chunks, likelihood_scale, log_joint, n_examples, target
from .arviz_stats import khat_threshold, psislw

#: Yao et al.'s ceiling of a usable k-hat (0.5, "good", is the threshold at S = 100 draws).
KHAT_OK = 0.7
#: PSIS fits the largest ceil(min(S / 5, 3 sqrt(S))) ratios; ArviZ needs more than 4.
MIN_KHAT_SAMPLES = 30


def khat_inputs(model, guide, who: str, num_samples, train_data, batch_size, max_examples, seed):
    """What every k-hat of ``guide`` starts from: ``(S, device, batches)`` -- the draws
    checked (at least :data:`MIN_KHAT_SAMPLES`), the guide's device, and the seeded
    training batches (a subset of at most ``max_examples``); the model in eval mode.
    ``ValueError`` for too few draws or no training data."""
    check_guide(guide, who)
    S = int(num_samples)
    if S < MIN_KHAT_SAMPLES:
        raise ValueError(
            f"num_samples must be at least {MIN_KHAT_SAMPLES} for the Pareto fit (its tail "
            f"needs more than 4 draws), got {num_samples!r}"
        )
    model.eval()
    device = _device_of(guide) or torch.device("cpu")
    data = batches(train_data, int(batch_size), max_examples, seed)
    if not data:
        raise ValueError("no training data (empty data set)")
    return S, device, data


def khat_row(log_r: np.ndarray) -> dict:
    """``khat``, ``khat_assessment``, ``ess`` (of the smoothed normalised weights) and
    ``log_ratio_sd`` of the log importance ratios of ``S`` draws."""
    lw, khat = psislw(log_r)
    return {
        "khat": khat,
        "khat_assessment": khat_assessment(khat, log_r.size),
        "ess": float(1.0 / np.exp(np.logaddexp.reduce(2 * lw))),
        "log_ratio_sd": float(log_r.std()),
    }


def khat_assessment(khat: float, num_samples: int) -> str:
    r"""``"good"``: :math:`\hat k` at most :func:`~.arviz_stats.khat_threshold` of ``S``
    (:math:`\min(1 - 1/\log_{10} S, 0.7)`; 0.5 at S = 100); ``"ok"``: below 0.7, the
    ceiling (more draws raise the threshold towards it); ``"unreliable"`` otherwise.  A
    NaN :math:`\hat k` (every ratio equal: :math:`q \propto p`) is ``"good"``."""
    if math.isnan(khat) or khat <= khat_threshold(num_samples):
        return "good"
    return "ok" if khat < KHAT_OK else "unreliable"


@torch.no_grad()
def vi_diagnostics(
    model,
    guide,
    train_data,
    num_samples: int = 100,
    seed: int = 0,
    max_examples: int | None = None,
    batch_size: int = 512,
    quadrature_nodes: int = 64,
    progress: bool = False,
) -> dict:
    r"""Pareto :math:`\hat k` of the importance ratios :math:`p(w, \mathcal D) / q(w)`.

    Args:
        model, guide: the trained BNN (any of the library's guides; a Pyro autoguide is
            refused with a ``TypeError`` naming what to use).
        train_data: the training data (``(X, y)``, a ``Dataset`` or batches).
        num_samples: draws from :math:`q`, at least 30 (Yao et al. use about 100 or more;
            with fewer the tail fit is unreliable).
        seed: seeds the draws and an example subset (the caller's random state is
            restored).
        max_examples: use a seeded random subset of this many training examples and scale
            its log-likelihood by ``N / n`` (``N`` = the model's data-set size).
        progress: a tqdm bar (``"k-hat"``) over the draws.

    Returns:
        ``khat``; ``khat_threshold`` (:math:`\min(1 - 1/\log_{10} S, 0.7)`) and
        ``khat_assessment`` (:func:`khat_assessment`: ``"good"`` at most the threshold,
        ``"ok"`` below 0.7, ``"unreliable"``); ``log_q_method`` and ``exact`` (see the
        module docstring); ``target`` (the joint density of the ratio's numerator);
        ``elbo`` (mean log ratio: an estimate of the full-data ELBO, when ``exact``);
        ``log_evidence_is`` (importance-sampling estimate of :math:`\log p(\mathcal D)`);
        ``ess`` (effective sample size of the smoothed normalised weights);
        ``log_ratio_sd``; ``num_samples``, ``n_examples``, ``loglik_scale``.

    Raises:
        FloatingPointError: a log ratio that is not finite (named count).
    """
    S, device, data = khat_inputs(
        model, guide, "vi_diagnostics", num_samples, train_data, batch_size, max_examples, seed
    )
    scale = likelihood_scale(model, data)
    log_q, method = log_q_fn(guide, quadrature_nodes)
    ratios = []
    bar = tqdm(total=S, desc="k-hat", unit="draw", disable=not progress, leave=False)
    with bar, seeded(seed, device):
        for s in chunks(S):
            weights = guide.draw(s).weights
            log_p = log_joint(model, guide, weights, data, device, scale)
            ratios.append((log_p - log_q(weights).to(torch.float64)).cpu())
            bar.update(s)
    log_r = torch.cat(ratios).numpy()
    if not np.all(np.isfinite(log_r)):
        raise FloatingPointError(
            f"{int((~np.isfinite(log_r)).sum())} of {S} log importance ratios are not finite"
        )
    return {
        **khat_row(log_r),
        "khat_threshold": khat_threshold(S),
        "log_q_method": method,
        "exact": LOG_Q_METHODS.get(method, False),
        "target": target(model, guide),
        "elbo": float(log_r.mean()),
        "log_evidence_is": float(np.logaddexp.reduce(log_r)) - math.log(S),
        "num_samples": S,
        "n_examples": n_examples(data),
        "loglik_scale": float(scale),
    }
