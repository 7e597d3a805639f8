r"""The ``stochastic`` tying's KL to a Normal prior, in expectation over the component.

Under the ``stochastic`` tying a weight of component :math:`k` first draws
:math:`(\tilde\mu, t) \sim \mathcal N(m_k, S_k)` and :math:`\tilde\sigma = |t|` (the
``sigma`` coordinates) or :math:`\tilde\sigma = e^{t}` (``log_sigma``), then
:math:`w \sim \mathcal N(\tilde\mu, \tilde\sigma^2)`.  Its Eq. 10 term (spec, stage 3) is
:math:`\mathbb E_{(\tilde\mu, t)}\,\mathrm{KL}(\mathcal N(\tilde\mu, \tilde\sigma^2) \|
\mathcal N(p_0, s_p^2))`, with

.. math::
    \mathrm{KL} = \log s_p - \log\tilde\sigma
        + \frac{\tilde\sigma^2 + (\tilde\mu - p_0)^2}{2 s_p^2} - \frac12 .

Every moment it needs is available in closed form, so the expectation is computed
exactly instead of by a Monte Carlo draw:
:math:`\mathbb E(\tilde\mu - p_0)^2 = (m_0 - p_0)^2 + S_{00}`;
for ``log_sigma``, :math:`\mathbb E\log\tilde\sigma = m_1` and
:math:`\mathbb E\tilde\sigma^2 = e^{2 m_1 + 2 S_{11}}`;
for ``sigma``, :math:`\mathbb E\tilde\sigma^2 = m_1^2 + S_{11}` and
:math:`\mathbb E\log|t|` from :func:`expected_log_abs_normal`.

Why it matters: the pathwise Monte Carlo gradient of :math:`-\log|t|` is
:math:`-1/t`, whose variance is infinite for a Normal :math:`t` (the density does not
vanish at 0).  With thousands of weights per component, some draws land next to zero
and a single step's gradient is dominated by them; the exact expectation has no such
term (and costs :math:`O(K)` instead of :math:`O(n_w)`).
"""

from __future__ import annotations

import math

import torch

# Poisson-mixture series below this half non-centrality, asymptotic expansion above it
_SERIES_MAX_H = 200.0


# E log|1 + r z| = -1/2 sum_n (2n - 1)!! / n r^(2n): the coefficients (2n - 1)!! / (2n)
_ASYM = (0.5, 0.75, 2.5, 13.125, 94.5, 866.25)


def expected_log_abs_normal(mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathbb E\log|t|` for :math:`t \sim \mathcal N(m, v)`, elementwise, differentiable.

    :math:`t^2 / v` is a non-central :math:`\chi^2_1` with non-centrality
    :math:`\lambda = m^2 / v`, a Poisson(:math:`h = \lambda/2`) mixture of central
    :math:`\chi^2_{1 + 2j}`, and :math:`\mathbb E\log\chi^2_\nu = \log 2 + \psi(\nu/2)`:

    .. math::
        \mathbb E\log|t| = \tfrac12\Big(\log(2v)
            + \sum_{j \ge 0} e^{-h}\frac{h^j}{j!}\,\psi\big(\tfrac12 + j\big)\Big),
        \qquad h = \frac{m^2}{2v}.

    For :math:`h > 200` the series is replaced by the (asymptotic) expansion

    .. math::
        \mathbb E\log|t| = \log|m| + \mathbb E\log|1 + r z|
            = \log|m| - \sum_{n \ge 1} \frac{(2n-1)!!}{2n}\,r^{2n},
        \qquad r^2 = \frac{v}{m^2} < \frac{1}{400},

    cut after :math:`n = 6` (the next term is below :math:`10^{-14}`; the neglected
    mass of :math:`1 + rz < 0` is below :math:`e^{-200}`).

    Args:
        mean: :math:`m`, any shape.
        var: :math:`v > 0`, broadcastable with ``mean``.
    """
    mean, var = torch.broadcast_tensors(mean, var)
    var = var.clamp_min(torch.finfo(var.dtype).tiny)
    h = mean.square() / (2 * var)
    big = h > _SERIES_MAX_H
    # the series sees a harmless h where the expansion is used, and h >= 1e-30 so that
    # d xlogy(j, h)/dh = j / h stays finite at m = 0
    series_h = torch.where(big, torch.ones_like(h), h).clamp_min(1e-30)
    h_max = float(series_h.detach().max()) if series_h.numel() else 0.0
    # h + 12 sqrt(h) + 25 terms leave a tail mass below 1e-30 (at most 395, for h = 200)
    n_terms = int(math.ceil(h_max + 12.0 * math.sqrt(h_max) + 25.0))
    j = torch.arange(n_terms, dtype=mean.dtype, device=mean.device)
    log_w = torch.xlogy(j, series_h.unsqueeze(-1)) - series_h.unsqueeze(-1) - torch.lgamma(j + 1)
    psi = torch.special.digamma(j + 0.5)
    series = 0.5 * (torch.log(2 * var) + (log_w.exp() * psi).sum(-1))
    # the expansion, fed only the entries where it is used (the double-``where`` keeps
    # the unused branch, where m may be 0, out of the gradient)
    m_safe = torch.where(big, mean, torch.ones_like(mean))
    r2 = torch.where(big, var, torch.zeros_like(var)) / m_safe.square()
    poly = torch.zeros_like(r2)
    for c in reversed(_ASYM):  # Horner in r^2
        poly = (poly + c) * r2
    asym = torch.log(m_safe.abs()) - poly
    return torch.where(big, asym, series)


def expected_normal_kl(
    centres: torch.Tensor,
    covariances: torch.Tensor,
    prior_loc: torch.Tensor | float,
    prior_scale: torch.Tensor | float,
    coordinates: str = "sigma",
) -> torch.Tensor:
    r""":math:`\mathbb E_{(\tilde\mu, t) \sim \mathcal N(m_k, S_k)}
    \mathrm{KL}(\mathcal N(\tilde\mu, \tilde\sigma^2) \| \mathcal N(p_0, s_p^2))` per component.

    Args:
        centres: :math:`m_k` in the mixture's coordinates, ``(K, 2)``.
        covariances: :math:`S_k`, ``(K, 2, 2)``.
        prior_loc, prior_scale: the Normal prior :math:`p_0, s_p`.
        coordinates: ``"sigma"`` (:math:`\tilde\sigma = |t|`) or ``"log_sigma"``
            (:math:`\tilde\sigma = e^t`).

    Returns:
        ``(K,)`` expected KL (the module docstring gives the moments).
    """
    m0, m1 = centres[:, 0], centres[:, 1]
    s00, s11 = covariances[:, 0, 0], covariances[:, 1, 1]
    if coordinates == "sigma":
        e_log_sigma = expected_log_abs_normal(m1, s11)
        e_sigma2 = m1.square() + s11
    elif coordinates == "log_sigma":
        e_log_sigma = m1
        e_sigma2 = torch.exp(2 * m1 + 2 * s11)
    else:
        raise ValueError(f"coordinates must be 'sigma' or 'log_sigma', got {coordinates!r}")
    sp = torch.as_tensor(prior_scale, dtype=centres.dtype, device=centres.device)
    p0 = torch.as_tensor(prior_loc, dtype=centres.dtype, device=centres.device)
    e_dev2 = (m0 - p0).square() + s00
    return torch.log(sp) - e_log_sigma + (e_sigma2 + e_dev2) / (2 * sp.square()) - 0.5
