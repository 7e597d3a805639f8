r"""The stochastic tying's draw pieces: per-component coefficients and the no-gradient
(prediction) draw.

A weight tied stochastically to a component with mean :math:`(m_0, m_1)` and covariance
:math:`S = L L^\top` is drawn from two normals :math:`u, \varepsilon`:

.. math::
    t = m_1 + \sqrt{S_{11}}\,u, \qquad
    w = m_0 + b\sqrt{S_{11}}\,u + \sqrt{v + \tilde\sigma(t)^2}\,\varepsilon,

with :math:`b = S_{01}/S_{11}`, :math:`v = S_{00} - S_{01}^2/S_{11}` and
:math:`\tilde\sigma(t)` the drawn second coordinate as a scale (``t`` in ``sigma``
coordinates, ``exp(t)`` in ``log_sigma`` ones).
"""

from __future__ import annotations

import torch

__all__ = ["DRAW_BLOCK", "draw_stochastic_into", "stochastic_coefficients"]

#: elements (draws x weights) per block of the no-gradient draw (a cache-sized scratch)
DRAW_BLOCK = 1 << 15


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
