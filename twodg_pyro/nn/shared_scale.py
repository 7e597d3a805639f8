r"""One flat scale :math:`\sigma` per step for a fused mean-field draw and the VON update.

With ``fused_kl`` a diagonal Normal guide draws all its weights at once,
:math:`w = \mu + \epsilon\,\operatorname{softplus}(\rho)` on the sites' :math:`\rho`
concatenated, and :class:`~twodg_pyro.infer.VariationalOnlineNewton` then needs the same
:math:`\sigma` for its Price estimate and writes back :math:`\rho' =
\operatorname{softplus}^{-1}(\sigma')` from the new precision.  On the CPU the scale map
and its inverse are a large part of what a small network's step pays over a
deterministic one (``benchmarks/bench_von_parts.py``: LeNet-5's 61,706 scales,
0.27-0.40 ms each way), so the two share it, per guide (keyed by its first :math:`\rho`):

- the draw takes the :math:`\sigma` remembered for the current :math:`\rho`, else
  computes :math:`\operatorname{softplus}(\rho)`, and marks it *drawn*;
- the update reuses the drawn :math:`\sigma` (the same bits the draw used; else it
  computes its own) and, after a shared step, remembers its :math:`\sigma'` with the
  :math:`\rho'` it wrote, for the next draw.

So a fused VON step computes neither softplus: the next draw's :math:`\sigma'` is the
update's own, whose inverse gave :math:`\rho'`, where the unshared step would draw with
:math:`\operatorname{softplus}(\rho')`: the same to a few units in the last place (the
round trip's rounding).  An entry is used only while :math:`\rho` equals, value for
value, the :math:`\rho` it was stored with (any other write to the parameters makes it
stale; VON keeps :math:`\sigma'` in its state, so a resumed run gets it back), and the
update uses only a drawn one: the default, site-by-site step never marks one, so it stays
the traced step's arithmetic to the bit.  CPU tensors only (on a GPU the scale map is
cheap and the equality check would wait for the device).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .functional import softplus

#: id of a guide's first rho -> (a weak reference to it, rho, sigma, drawn) of its last
#: draw or update (by id: a tensor is no dictionary key; the entry goes with the tensor)
_SHARED: dict[int, tuple] = {}


def _store(rhos: Sequence[torch.Tensor], rho: torch.Tensor, sigma: torch.Tensor, drawn: bool):
    key = id(rhos[0])
    gone = weakref.ref(rhos[0], lambda _: _SHARED.pop(key, None))
    _SHARED[key] = (gone, rho.detach(), sigma, drawn)


def _entry(rhos: Sequence[torch.Tensor], rho: torch.Tensor) -> tuple | None:
    r"""The entry of ``rhos`` whose flat :math:`\rho` equals ``rho`` (``None``: none)."""
    if rho.device.type != "cpu":
        return None
    hit = _SHARED.get(id(rhos[0]))
    if hit is None or hit[0]() is not rhos[0]:
        return None
    stored = hit[1]
    same = stored.shape == rho.shape and stored.dtype == rho.dtype
    return hit if same and torch.equal(stored, rho.detach()) else None


def drawn_scale(rhos: Sequence[torch.Tensor], rho: torch.Tensor) -> torch.Tensor:
    r""":math:`\sigma` of a fused draw at the flat ``rho`` (the sites' ``rhos``
    concatenated): the one remembered for this :math:`\rho`, else ``softplus(rho)``;
    marked drawn for the update (module docstring).  No gradient flows through it."""
    hit = _entry(rhos, rho)
    sigma = hit[2] if hit is not None else softplus(rho.detach())
    if rho.device.type == "cpu":  # kept: a copy of rho (``rho`` may be a view of the guide's)
        _store(rhos, hit[1] if hit is not None else rho.detach().clone(), sigma, True)
    return sigma


def scale_of_draw(rhos: Sequence[torch.Tensor], rho: torch.Tensor) -> torch.Tensor | None:
    r"""The :math:`\sigma` that the last fused draw of ``rhos`` used, while their flat
    :math:`\rho` is still ``rho``; ``None`` when no fused draw was made at this
    :math:`\rho` (the caller computes its own)."""
    hit = _entry(rhos, rho)
    return hit[2] if hit is not None and hit[3] else None


def remember_scale(rhos: Sequence[torch.Tensor], rho: torch.Tensor, sigma: torch.Tensor) -> None:
    r"""Remember ``sigma`` as the scale of ``rhos`` while their flat :math:`\rho` is
    ``rho`` (an update's :math:`\sigma'` with the :math:`\rho'` it wrote), for the next
    fused draw.  ``rho`` is kept as it is: a tensor nothing writes afterwards."""
    if rho.device.type == "cpu":
        _store(rhos, rho, sigma, False)
