r"""Small tensor functions shared by the guides, the baselines and the file readers.

:func:`softplus` and :func:`inverse_softplus` map a guide's unconstrained :math:`\rho` to
its scale :math:`\sigma = \log(1 + e^\rho)` and back, at every draw and every VON step.
On the CPU, torch's ``softplus``, ``log1p`` and ``expm1`` run element by element in
float32, where ``exp`` and ``log`` are vectorised (``benchmarks/bench_von_epoch.py``, one
thread, LeNet-5's 48,000 ``fc1`` scales: torch's softplus 459 us, this one 155 us).
For float32 on the CPU both are therefore written with ``exp`` and ``log`` only, in
Goldberg's and Kahan's forms, which stay accurate to a few units in the last place where
:math:`\rho` is very negative (:math:`\sigma \approx e^\rho`), on tensors of at least
:data:`VECTORISED_FROM` elements (below it, the half-dozen operations of these forms cost
more than torch's one kernel: the crossover ``benchmarks/bench_von_epoch.py`` records):

.. math::
    \log(1 + u) = u\,\frac{\log w}{w - 1}, \quad w = 1 \oplus u; \qquad
    e^s - 1 = s\,\frac{v - 1}{\log v}, \quad v = e^s

(:math:`\oplus`: the rounded sum; where :math:`w` or :math:`v` rounds to 1 the fraction
is 1), evaluated below 20 and continued linearly above it, where softplus is the
identity to float32's precision (torch's ``threshold``).  A guide's :math:`\rho` and
:math:`\sigma` are almost always below 20 (and :math:`\sigma` above :data:`MIN_SIGMA`):
one ``max`` (or ``aminmax``) pass says so, and the clamps and the linear continuation,
which would change nothing, are skipped (the same bits, four passes fewer).  Smaller
tensors, other dtypes and other devices use torch's own kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: the smallest sigma of the library: a guide's scale, a component centre's, a drawn
#: weight's, and the smallest ``x`` whose inverse softplus is taken (below it, ``expm1``
#: underflows)
MIN_SIGMA = 1e-8
#: above it softplus is the identity (torch's ``threshold``)
_LINEAR = 20.0
#: the fewest float32 CPU elements that the ``exp``/``log`` forms compute (fewer: torch's
#: kernels, whose one dispatch is then cheaper than the forms' several)
VECTORISED_FROM = 8192


def _vectorised(x: torch.Tensor) -> bool:
    """Whether the ``exp``/``log`` forms replace torch's kernels for ``x``."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.numel() >= VECTORISED_FROM


def _above_linear(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\max(x - 20, 0)`: the part of ``x`` continued linearly."""
    return (x - _LINEAR).clamp_min_(0.0)


class _Softplus(torch.autograd.Function):
    r""":math:`\log(1 + e^x)` from ``exp`` and ``log`` (module docstring), with the
    derivative :math:`\operatorname{sigmoid}(x)`.  (``forward`` takes ``ctx``: with a
    separate ``setup_context`` torch binds the arguments by ``inspect`` at every call.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        below = bool(x.max() <= _LINEAR)  # then the clamp and the continuation change nothing
        u = torch.exp(x if below else x.clamp_max(_LINEAR))
        w = u + 1.0
        out = torch.log(w)
        out.div_(w.sub_(1.0)).nan_to_num_(nan=1.0)  # log(w) / (w - 1), 1 where w = 1
        return out.mul_(u) if below else out.mul_(u).add_(_above_linear(x))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * torch.sigmoid(x)


def softplus(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\sigma = \log(1 + e^x)` (the identity above 20, as torch's), differentiable,
    vectorised for large float32 tensors on the CPU (module docstring).

    Example::

        sigma = softplus(rho)  # torch.nn.functional.softplus(rho) to a few ulp
    """
    return _Softplus.apply(x) if _vectorised(x) else F.softplus(x)


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    r""":math:`\rho = \log(e^{x} - 1)`, stable for small and large ``x`` (``x`` clamped at
    :data:`MIN_SIGMA`; the identity above 20); vectorised for large float32 tensors on the
    CPU."""
    if not _vectorised(x):
        x = x.clamp_min(MIN_SIGMA)
        return torch.where(x > _LINEAR, x, torch.log(torch.expm1(x)))
    least, most = torch.aminmax(x)
    inside = bool(least >= MIN_SIGMA) and bool(most <= _LINEAR)  # then the clamps do nothing
    x = x if inside else x.clamp_min(MIN_SIGMA)
    low = x if inside else x.clamp_max(_LINEAR)
    v = torch.exp(low)
    em1 = v - 1.0
    em1.div_(v.log_()).nan_to_num_(nan=1.0).mul_(low)  # expm1(low), low where v = 1
    return em1.log_() if inside else em1.log_().add_(_above_linear(x))


def match_input(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` on ``like``'s device, in ``like``'s dtype if ``x`` is floating (integer inputs,
    e.g. token ids, keep theirs); ``x`` itself when it is there already."""
    if x.is_floating_point():
        if x.dtype != like.dtype or x.device != like.device:
            return x.to(device=like.device, dtype=like.dtype)
        return x
    return x if x.device == like.device else x.to(like.device)


def batch_input(batch, like: torch.Tensor) -> torch.Tensor:
    """The inputs of one batch (a tensor, or the first of an ``(x, y, ...)`` pair or list)
    as :func:`match_input` places them for ``like``."""
    return match_input(batch[0] if isinstance(batch, list | tuple) else batch, like)
