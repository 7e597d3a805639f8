r"""Tensors laid end to end in one storage, read as one flat vector without a copy.

The fused mean-field step (``fused_kl``) and the VON update work on every weight at once:
:math:`\mu`, :math:`\rho`, their gradients and the momentum as flat vectors.  Kept one
tensor per site, each step concatenates them (a copy of all the weights, and a dozen
operations and autograd nodes per site on a small network) and splits the results back.
Laid end to end in one storage (:func:`pack`), the same vectors are views
(:func:`flat_view`), and one operation on the view updates every site.

:func:`flat` is the one entry point: the view where the layout allows it, else the
concatenated copy; the numbers are the same either way, so the caller never asks which.
A caller that writes into the result must check :func:`flat_view` itself (writing into
the copy changes nothing).  :func:`split_as` cuts a flat vector back into the tensors'
shapes.

Example::

    pack(params)                    # one storage; each parameter keeps its identity
    v = flat_view(params)           # a view of all of them, in order
    v.mul_(0.5)                     # halves every parameter
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def flat_view(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One 1-D view (detached) of ``tensors`` when they lie end to end, in order and
    contiguous, in one storage; ``None`` otherwise (e.g. tensors allocated one by one)."""
    if not tensors:
        return None
    first = tensors[0]
    end, size, n = first.data_ptr(), first.element_size(), 0
    for t in tensors:
        if t.data_ptr() != end or t.dtype != first.dtype or not t.is_contiguous():
            return None
        end, n = end + t.numel() * size, n + t.numel()
    # tensors of other storages that happen to follow in memory run past the first's
    if (first.storage_offset() + n) * size > first.untyped_storage().nbytes():
        return None
    return first.detach().as_strided((n,), (1,))


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tensors`` flattened and concatenated in order: :func:`flat_view` where the layout
    allows it (no copy: do not write into it unless that is meant), else a new tensor."""
    view = flat_view(tensors)
    return view if view is not None else torch.cat([t.detach().reshape(-1) for t in tensors])


def split_as(flat_tensor: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """The inverse of :func:`flat`: ``flat_tensor`` cut, in order, into views of
    ``shapes``."""
    parts = flat_tensor.split([math.prod(shape) for shape in shapes])
    return [v.view(shape) for v, shape in zip(parts, shapes, strict=True)]


def pack(params: Sequence[torch.Tensor]) -> bool:
    """Lay ``params`` end to end in one new storage, values unchanged (each tensor keeps
    its identity: ``.data`` is rebound, so optimisers and modules holding it see the
    move).  ``False`` (nothing moved) when they already are, or are not distinct
    tensors of one device and dtype."""
    if flat_view(params) is not None or len({id(p) for p in params}) != len(params):
        return False
    first = params[0]
    if any(p.device != first.device or p.dtype != first.dtype for p in params):
        return False
    buffer = torch.empty(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
    with torch.no_grad():
        for p, view in zip(params, split_as(buffer, [p.shape for p in params]), strict=True):
            view.copy_(p)
            p.data = view
    return True
