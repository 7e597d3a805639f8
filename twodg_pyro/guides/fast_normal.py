r"""The diagonal Normal guide's fused fast step (``fused_kl``, :mod:`twodg_pyro.infer.fast_step`):
every site's draw and KL as one flat vector and one autograd node.

Site by site, a step of the mean-field guide costs a dozen small operations per site and
as many autograd nodes (the scale, the draw, the closed-form KL and their backward
passes): on a small network such as LeNet-5 (ten sites) that overhead, not the
arithmetic, is what a Bayesian step pays over a deterministic one.  Fused, the sites'
:math:`\mu` and :math:`\rho` are read as one flat vector each (on the CPU a view: the first
fast draw lays the guide's tensors end to end, :mod:`twodg_pyro.nn.flat_storage`; else
a concatenated copy) and :class:`_DrawKL` computes, for all :math:`n` weights at once,

.. math::
    \sigma = \operatorname{softplus}(\rho), \qquad w = \mu + \epsilon\sigma, \qquad
    \mathrm{KL} = \sum_i \tfrac12\Big(\frac{\sigma_i^2 + (\mu_i - m_i)^2}{s_i^2} - 1
        - \log\frac{\sigma_i^2}{s_i^2}\Big)

with the closed-form gradients (:math:`g_w`, :math:`g_\mathrm{KL}` the incoming ones)

.. math::
    \frac{\partial}{\partial\mu_i} = g_{w,i} + g_\mathrm{KL}\,\frac{\mu_i - m_i}{s_i^2},
    \qquad \frac{\partial}{\partial\rho_i} = \Big(g_{w,i}\,\epsilon_i + g_\mathrm{KL}
        \Big(\frac{\sigma_i}{s_i^2} - \frac{1}{\sigma_i}\Big)\Big)
        \operatorname{sigmoid}(\rho_i).

The noise :math:`\epsilon` is drawn site by site in site order, as the program draws it,
so the fused step is the traced step's bound up to float rounding (the scale of a small
site is computed by another kernel; the KL is summed in another order), not bit for bit.
Under :class:`~twodg_pyro.infer.VariationalOnlineNewton` the draw's :math:`\sigma` is the
one the last update computed (:mod:`twodg_pyro.nn.shared_scale`), not its softplus round
trip: the same to rounding.

**The default step** (:func:`draw_kl`) keeps the traced step's arithmetic to the bit.  On
a small network it still does most of its work on flat vectors: each site's scale is
computed and its noise drawn by itself, as the program does, and only then are the sites
concatenated for the elementwise part (the draw :math:`\mu + \epsilon\sigma` and the
closed-form KL, in torch's own operations, so autograd's gradients are the per-site ones
element by element); the KL is summed site by site and the sums added in site order, as
the traced ELBO adds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.autograd.function import once_differentiable

from ..nn.flat_storage import flat, split_as
from ..nn.functional import softplus
from ..nn.shared_scale import drawn_scale


def normal_normal_kl(loc, scale, p_loc, p_scale) -> torch.Tensor:
    r"""Elementwise :math:`\mathrm{KL}(\mathcal N(\text{loc}, \text{scale}^2) \|
    \mathcal N(p_\text{loc}, p_\text{scale}^2))` with the arithmetic of
    ``torch.distributions``' Normal-Normal KL (so sums of it match the traced ELBO's bit for
    bit): :math:`\tfrac12(r + ((\text{loc} - p_\text{loc}) / p_\text{scale})^2 - 1 - \log r)`,
    :math:`r = (\text{scale} / p_\text{scale})^2`."""
    var_ratio = (scale / p_scale).pow(2)
    t1 = ((loc - p_loc) / p_scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


class _DrawKL(torch.autograd.Function):
    """``(KL, w_1, ..., w_k)`` of the sites' ``mu_1..mu_k, rho_1..rho_k`` (``sites``)
    under flat Normal priors (module docstring).  The sites enter and leave one by one,
    so autograd records no concatenation or split; inside they are one flat vector, a
    view where the guide keeps them end to end (:mod:`twodg_pyro.nn.flat_storage`).
    ``rho``: the flat rho (computed by the caller for its shared scale) or ``None``."""

    @staticmethod
    def forward(ctx, eps, p_loc, p_scale, sigma, rho, k, *sites):
        rho = flat(sites[k:]) if rho is None else rho
        loc = flat(sites[:k])
        # sigma: softplus(rho) computed by the caller (the shared scale), if given
        sigma = softplus(rho) if sigma is None else sigma
        w = loc + eps * sigma  # two roundings, as Normal.rsample
        d = loc - p_loc
        precision = p_scale.pow(-2)
        var_ratio = sigma.square().mul_(precision)
        kl = (var_ratio + d.square().mul_(precision) - 1 - var_ratio.log()).sum() * 0.5
        ctx.save_for_backward(rho, eps, sigma, d, precision, p_scale)
        ctx.shapes = [t.shape for t in sites[:k]]
        return (kl, *split_as(w, ctx.shapes))

    @staticmethod
    @once_differentiable
    def backward(ctx, g_kl, *g_ws):  # grads of unused outputs come as zeros
        rho, eps, sigma, d, precision, p_scale = ctx.saved_tensors
        g_w = torch.cat([g.reshape(-1) for g in g_ws])
        kl_loc = (d * precision).mul_(g_kl)  # the KL's gradient in mu (minus it in m)
        g_loc = kl_loc + g_w
        g_sigma = (sigma * precision).sub_(sigma.reciprocal()).mul_(g_kl)
        g_rho = g_sigma.addcmul_(g_w, eps).mul_(torch.sigmoid(rho))
        g_p_loc = g_p_scale = None
        if ctx.needs_input_grad[1]:
            g_p_loc = kl_loc.neg_()
        if ctx.needs_input_grad[2]:
            ratio = (sigma.square() + d.square()).mul_(precision)
            g_p_scale = (1.0 - ratio).div_(p_scale).mul_(g_kl)
        sites = (*split_as(g_loc, ctx.shapes), *split_as(g_rho, ctx.shapes))
        return (None, g_p_loc, g_p_scale, None, None, None, *sites)


def _flat_priors(owner, shapes, normals: Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """The priors' ``(m, s)`` of every weight (sites of ``shapes``), flat in site order;
    kept on ``owner`` while the priors are the same tensors (a learnt prior's are rebuilt
    at every step)."""
    tensors = [t for pair in normals for t in pair]
    versions = [t._version for t in tensors]
    cache = owner.__dict__.get("_fused_normal_priors")
    # the cache holds the tensors themselves: identity, not a reusable id(), is compared
    if (
        cache is not None
        and len(cache[0]) == len(tensors)
        and all(a is b for a, b in zip(cache[0], tensors, strict=True))
        and cache[1] == versions
    ):
        return cache[2]
    flat = tuple(
        torch.cat([t.expand(shape).reshape(-1) for t, shape in zip(ts, shapes, strict=True)])
        for ts in zip(*normals, strict=True)
    )
    if not any(t.requires_grad for t in tensors):
        owner.__dict__["_fused_normal_priors"] = (tensors, versions, flat)
    return flat


#: the most weights whose draw and KL :func:`draw_kl` computes on the sites concatenated:
#: on a small network that saves a quarter of a step's operations (LeNet-5's 61,706
#: weights: 433 instead of 579); on a larger one each site's operations are few against
#: its arithmetic, and the concatenated copies (about five of all the weights) would only
#: add memory
FLAT_UP_TO = 2**17


def draw_kl(
    owner, locs: Sequence[torch.Tensor], scales: Sequence[torch.Tensor], normals: Sequence
) -> tuple[list[torch.Tensor], torch.Tensor]:
    r"""``([w_s, ...], KL)`` as the program and the traced ELBO compute them, bit for bit
    (module docstring): :math:`w_s = \mu_s + \epsilon_s\sigma_s` with the noise drawn
    site by site, and :math:`\sum_s \sum_i \mathrm{KL}_{s,i}` by
    :func:`normal_normal_kl` summed site by site, for the Normal priors ``normals``
    (``[(m_s, s_s), ...]``); on the sites concatenated up to :data:`FLAT_UP_TO` weights
    (``owner`` keeps the flat priors), else site by site."""
    eps = [torch.randn(mu.shape, device=mu.device, dtype=mu.dtype) for mu in locs]
    if sum(mu.numel() for mu in locs) > FLAT_UP_TO:
        values = [mu + e * s for mu, e, s in zip(locs, eps, scales, strict=True)]
        pairs = zip(locs, scales, normals, strict=True)
        return values, sum(normal_normal_kl(mu, s, *p).sum() for mu, s, p in pairs)
    loc = torch.cat([mu.reshape(-1) for mu in locs])
    scale = torch.cat([s.reshape(-1) for s in scales])
    shapes, sizes = [mu.shape for mu in locs], [mu.numel() for mu in locs]
    w = loc + torch.cat([e.reshape(-1) for e in eps]) * scale  # as Normal.rsample
    kl = normal_normal_kl(loc, scale, *_flat_priors(owner, shapes, normals))
    total = sum(part.sum() for part in kl.split(sizes))
    return split_as(w, shapes), total


def fused_draw_kl(
    owner, locs: Sequence[torch.Tensor], rhos: Sequence[torch.Tensor], normals: Sequence
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``([w_s, ...], KL)``: one draw of every site of a diagonal Normal guide (``locs``
    and ``rhos`` in site order; the noise drawn site by site, in that order) and its KL to
    the Normal priors ``normals`` (``[(m_s, s_s), ...]``), by :class:`_DrawKL`, at the
    scale shared with the VON update (:func:`~twodg_pyro.nn.shared_scale.drawn_scale`);
    ``owner`` (the guide) keeps the flat priors.  Where the guide keeps ``locs`` and
    ``rhos`` end to end (:mod:`twodg_pyro.nn.flat_storage`) they are read as views."""
    sizes = [mu.numel() for mu in locs]
    eps = locs[0].new_empty(sum(sizes))
    for part in eps.split(sizes):  # each site's noise as torch.randn(shape) draws it
        part.normal_()
    rho = flat(rhos)
    shapes = [mu.shape for mu in locs]
    sigma = drawn_scale(rhos, rho)
    priors = _flat_priors(owner, shapes, normals)
    kl, *values = _DrawKL.apply(eps, *priors, sigma, rho, len(locs), *locs, *rhos)
    return values, kl
