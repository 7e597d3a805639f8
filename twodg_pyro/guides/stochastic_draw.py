r"""The stochastic tying's draw (:func:`draw_stochastic`): per-component coefficients, the
differentiable draw with what its KL needs, and the no-gradient (prediction) draw.

A weight tied stochastically to a component with mean :math:`(m_0, m_1)` and covariance
:math:`S = L L^\top` is drawn from two normals :math:`u, \varepsilon`:

.. math::
    t = m_1 + \sqrt{S_{11}}\,u, \qquad
    w = m_0 + b\sqrt{S_{11}}\,u + \sqrt{v + \tilde\sigma(t)^2}\,\varepsilon,

with :math:`b = S_{01}/S_{11}`, :math:`v = S_{00} - S_{01}^2/S_{11}` and
:math:`\tilde\sigma(t)` the drawn second coordinate as a scale (``t`` in ``sigma``
coordinates, ``exp(t)`` in ``log_sigma`` ones): the joint law of :math:`(t, w)` of the
three-normal draw, with :math:`\tilde\mu` integrated out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from ..sharing.structure import plane_sigma

if TYPE_CHECKING:
    from .assignment import TyingGuide

#: elements (draws x weights) per block of the no-gradient draw (a cache-sized scratch)
DRAW_BLOCK = 1 << 15


class Conditional(NamedTuple):
    r"""The ``stochastic`` tying's :math:`\tilde\mu \mid t` per weight and draw: its mean
    :math:`c`, its variance :math:`v`, and :math:`\tilde\sigma(t)`."""

    mean: torch.Tensor
    var: torch.Tensor
    sigma: torch.Tensor


class StochasticParts(NamedTuple):
    """A differentiable ``stochastic`` draw's :class:`Conditional` of every weight
    ``(S, n_w)`` (ellipse weights as if plain) and of the ellipse weights ``(S, n_e)``."""

    plain: Conditional
    ellipse: Conditional | None


def stochastic_coefficients(m0, m1, l00, l10, l11):
    r"""``(m0, m1, sqrt(S11), b sqrt(S11), v)`` of components given their Cholesky factors:
    :math:`S_{11} = l_{10}^2 + l_{11}^2`, :math:`b = S_{01}/S_{11} = l_{00} l_{10}/S_{11}`,
    :math:`v = S_{00} - S_{01}^2/S_{11} = (l_{00} l_{11})^2/S_{11}`; zero for the degenerate
    ``S = 0`` of an outlier."""
    s11 = l10 * l10 + l11 * l11
    pos = s11 > 0
    inv = torch.where(pos, 1.0 / s11.clamp_min(1e-30), torch.zeros_like(s11))
    a = s11.sqrt()
    return m0, m1, a, l00 * l10 * inv * a, (l00 * l11).square() * inv


def draw_stochastic_into(
    out: torch.Tensor,
    coefficients: torch.Tensor | tuple[torch.Tensor, ...],
    index: torch.Tensor | None = None,
    coordinates: str = "sigma",
) -> torch.Tensor:
    r"""The two-normal draw (module docstring) into ``out`` ``(S, n)``, without gradients.

    Args:
        out: the draws, ``(S, n)``.
        coefficients: :func:`stochastic_coefficients`' five ``(m0, m1, sqrt(S11),
            b sqrt(S11), v)``: per component, a ``(5, K')`` table whose columns ``index``
            picks for each weight; or, with ``index=None``, per weight, each ``(n,)`` or
            ``(S, n)``.
        index: ``(n,)`` column of the table for each weight (``None``: per-weight
            coefficients).
        coordinates: ``"sigma"`` or ``"log_sigma"`` (how :math:`\tilde\sigma` follows from
            :math:`t`).

    Block by block of columns, so that the block's coefficients (gathered from the table
    per block, not into five weight-sized vectors), its two normals (drawn in one call)
    and the intermediate :math:`v + \tilde\sigma^2` stay in the cache in scratch buffers
    of about :data:`DRAW_BLOCK` elements, and ``out`` is the only weight-sized memory
    written.  The law of each weight does not depend on the blocks; which normals of the
    random stream a weight takes does (not whether its coefficients come gathered)."""
    S, n = out.shape
    cols = max(1, min(n, DRAW_BLOCK // max(1, S)))
    normals = out.new_empty(2, S, cols)  # u and eps of a block, drawn in one call
    var_full = out.new_empty(S, cols)
    if index is None:
        blocks = zip(*[t.split(cols, dim=-1) for t in coefficients], strict=True)
    else:
        gathered = out.new_empty(5, cols)
        blocks = (
            torch.index_select(
                coefficients, 1, i, out=gathered.view(-1)[: 5 * i.numel()].view(5, -1)
            ).unbind(0)
            for i in index.split(cols)
        )
    for (m0_b, m1_b, a_b, ba_b, v_b), out_b in zip(blocks, out.split(cols, dim=-1), strict=True):
        w = out_b.shape[-1]
        z, var = normals, var_full
        if w < cols:  # the last, narrower block
            z = normals.view(-1)[: 2 * S * w].view(2, S, w)
            var = var_full.view(-1)[: S * w].view(S, w)
        u, eps = z.normal_().unbind(0)
        torch.addcmul(m1_b, a_b, u, out=var)  # t, the drawn second coordinate
        if coordinates == "sigma":  # sigma~^2 = t^2
            torch.addcmul(v_b, var, var, out=var)
        else:  # sigma~^2 = exp(2 t)
            var.mul_(2).exp_().add_(v_b)
        torch.addcmul(m0_b, ba_b, u, out=out_b)
        out_b.addcmul_(var.sqrt_(), eps)
    return out


def draw_stochastic(
    guide: TyingGuide, S: int, chosen: torch.Tensor | None, out_scale: torch.Tensor, fast: bool
) -> tuple[torch.Tensor, torch.Tensor | None, StochasticParts | None]:
    r"""``(flat (S, n_w), ellipse weights (S, n_e) or None, parts)``: ``S`` two-normal
    draws of every weight of the shared-GMM ``guide`` (outliers: components with
    :math:`S = 0` and :math:`\sigma` ``out_scale``; ``chosen``: each ellipse weight's
    component per draw).  ``fast`` (prediction) draws block by block
    (:func:`draw_stochastic_into`), without ``parts``: the conditionals
    :math:`\tilde\mu \mid t` from which a Monte Carlo KL draws :math:`\tilde\mu`
    afterwards (:class:`~twodg_pyro.guides.tyings.Stochastic`), so that the triple has the
    law of the three-normal draw and stays reparameterised."""
    n_w = guide.nat_index.numel()
    d = guide.chol_log_diag.exp()
    zeros = guide.outlier_loc.new_zeros(guide.kinds.outliers)
    m1 = guide.centres()[:, 1]
    log_sigma = guide.coordinates != "sigma"
    # per component (outliers: zero covariance): m0, m1, L00, L10, L11
    cols = [
        torch.cat([guide.centre_mu, guide.outlier_loc]),
        torch.cat([m1, out_scale.log() if log_sigma else out_scale]),
        torch.cat([d[:, 0], zeros]),
        torch.cat([guide.chol_off, zeros]),
        torch.cat([d[:, 1], zeros]),
    ]
    coef = stochastic_coefficients(*cols)  # m0, m1, sqrt(S11), b sqrt(S11), v
    e_per = None
    if chosen is not None:
        c = chosen.reshape(-1)
        e_per = [col.index_select(0, c).view(chosen.shape) for col in coef]
    if fast:  # gathered per block inside the draw: no weight-sized coefficient vectors
        like = {"dtype": coef[0].dtype, "device": coef[0].device}
        flat = torch.empty(S, n_w, **like)
        draw_stochastic_into(flat, torch.stack(coef), guide.nat_index, guide.coordinates)
        ell = None
        if chosen is not None:
            ell = torch.empty(chosen.shape, **like)
            draw_stochastic_into(ell, e_per, None, guide.coordinates)
        return flat, ell, None
    # 1-D gathers: their backward is a fast serial (deterministic) index_add
    per = [c.index_select(0, guide.nat_index) for c in coef]  # 5 x (n_w,)

    def draw(p, shape):
        m0, m1_, a, ba, v = p
        u, eps = torch.randn(2, *shape, device=m0.device, dtype=m0.dtype)
        t = torch.addcmul(m1_, a, u)
        sig = plane_sigma(t, guide.coordinates)
        cond_mean = torch.addcmul(m0, ba, u)
        return torch.addcmul(cond_mean, torch.sqrt(v + sig * sig), eps), cond_mean, v, sig

    flat, cond_mean, v, sig = draw(per, (S, n_w))
    ell, ellipse = None, None
    if chosen is not None:
        ell, cm_e, v_e, sig_e = draw(e_per, chosen.shape)
        ellipse = Conditional(cm_e, v_e, sig_e)
    # (c, v, sigma~) per weight, assembled only if a Monte Carlo KL asks for them
    return flat, ell, StochasticParts(Conditional(cond_mean, v.expand(S, n_w), sig), ellipse)
