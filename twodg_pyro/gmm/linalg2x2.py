"""Closed-form linear algebra on batches of 2x2 symmetric positive-definite matrices.

Every function takes tensors shaped ``(..., 2, 2)`` (any leading batch shape) and
works elementwise on the batch, with no call into ``torch.linalg``: for 2x2
matrices the determinant, inverse, square root and Cholesky factor have short
closed forms that vectorise over millions of matrices and run on any device.

For ``S = [[a, b], [b, c]]``:

* ``det S = a c - b^2``, ``tr S = a + c``;
* ``S^{-1} = [[c, -b], [-b, a]] / det S``;
* ``S^{1/2} = (S + sqrt(det S) I) / sqrt(tr S + 2 sqrt(det S))`` (the unique SPD
  square root; follows from Cayley-Hamilton);
* ``chol S = [[sqrt(a), 0], [b / sqrt(a), sqrt(c - b^2 / a)]]`` (lower factor L,
  ``L L^T = S``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor


def _check_square2(S: Tensor, name: str = "S") -> None:
    if not isinstance(S, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(S).__name__}")
    if S.dim() < 2 or S.shape[-2:] != (2, 2):
        raise ValueError(f"{name} must have shape (..., 2, 2), got {tuple(S.shape)}")


def mat2x2(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """``[[a, b], [c, d]]`` of four tensors shaped ``(...)``; shape ``(..., 2, 2)``."""
    return torch.stack((a, b, c, d), dim=-1).unflatten(-1, (2, 2))


def det2x2(S: Tensor) -> Tensor:
    """Determinant ``det S = S00 S11 - S01 S10`` of each 2x2 matrix; shape ``(...)``."""
    _check_square2(S)
    return S[..., 0, 0] * S[..., 1, 1] - S[..., 0, 1] * S[..., 1, 0]


def trace2x2(S: Tensor) -> Tensor:
    """Trace ``tr S = S00 + S11`` of each 2x2 matrix; shape ``(...)``."""
    _check_square2(S)
    return S[..., 0, 0] + S[..., 1, 1]


def logdet2x2(S: Tensor) -> Tensor:
    """``log det S`` of each 2x2 SPD matrix; shape ``(...)``."""
    return torch.log(det2x2(S))


def inv2x2(S: Tensor) -> Tensor:
    """Inverse ``S^{-1} = adj(S) / det S`` with ``adj [[a, b], [c, d]] = [[d, -b], [-c, a]]``."""
    det = det2x2(S)
    adj = mat2x2(S[..., 1, 1], -S[..., 0, 1], -S[..., 1, 0], S[..., 0, 0])
    return adj / det[..., None, None]


def sqrtm2x2(S: Tensor) -> Tensor:
    """Principal square root of SPD ``S``: ``(S + s I) / sqrt(tr S + 2 s)``, ``s = sqrt(det S)``.

    The result ``R`` is SPD and satisfies ``R @ R = S``. Tiny negative determinants
    from round-off are clamped to zero (PSD input then still gives a PSD root).
    """
    s = torch.sqrt(det2x2(S).clamp_min(0.0))
    t = torch.sqrt(trace2x2(S) + 2.0 * s)
    eye = torch.eye(2, dtype=S.dtype, device=S.device)
    return (S + s[..., None, None] * eye) / t[..., None, None]


def cholesky2x2(S: Tensor) -> Tensor:
    """Lower Cholesky factor ``L`` with ``L L^T = S``.

    ``L = [[sqrt(a), 0], [b / sqrt(a), sqrt(c - b^2 / a)]]`` for ``S = [[a, b], [b, c]]``.
    """
    _check_square2(S)
    l11 = torch.sqrt(S[..., 0, 0])
    l21 = S[..., 1, 0] / l11
    l22 = torch.sqrt((S[..., 1, 1] - l21 * l21).clamp_min(0.0))
    zero = torch.zeros_like(l11)
    return mat2x2(l11, zero, l21, l22)


def eigvalsh2x2(S: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvalues ``(lambda_min, lambda_max)`` of symmetric 2x2 ``S``.

    ``lambda = tr/2 -+ sqrt((a - c)^2 / 4 + b^2)``; the smaller one is computed as
    ``det / lambda_max`` to avoid cancellation.
    """
    _check_square2(S)
    a, b, c = S[..., 0, 0], S[..., 0, 1], S[..., 1, 1]
    half_tr = 0.5 * (a + c)
    rad = torch.sqrt(0.25 * (a - c) ** 2 + b * b)
    lmax = half_tr + rad
    lmin = torch.where(lmax > 0, (a * c - b * b) / lmax.clamp_min(torch.finfo(S.dtype).tiny), 0.0)
    return lmin, lmax


def _shape(t) -> object:
    return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__


def _check_finite_rows(name: str, t: Tensor) -> None:
    bad = ~torch.isfinite(t)
    n_bad = int(bad.sum())
    if n_bad:
        row = int(torch.nonzero(bad.any(dim=1))[0, 0])
        raise ValueError(
            f"{name} contains {n_bad} non-finite value(s) (NaN or inf); first at row {row}: "
            f"{t[row].tolist()}"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_int(name: str, v: Any, low: int, none_ok: bool = False) -> None:
    """Raise ValueError unless ``v`` is an integer ``>= low`` (or None, with ``none_ok``)."""
    if none_ok and v is None:
        return
    if not _is_int(v) or v < low:
        kind = "None or an integer" if none_ok else "an integer"
        raise ValueError(f"{name} must be {kind} >= {low}, got {v!r}")


def _fmt_index(flat: int, batch_shape: tuple[int, ...]) -> str:
    if len(batch_shape) <= 1:
        return str(flat)
    return ", ".join(str(int(i)) for i in np.unravel_index(flat, batch_shape))


def check_spd(covs: Tensor, name: str = "covs", *, sym_rtol: float = 1e-5) -> None:
    """Raise ``ValueError`` unless every 2x2 matrix in ``covs`` is symmetric positive definite.

    Checks, in order: shape ``(..., 2, 2)``; all entries finite; symmetry
    ``|S01 - S10| <= sym_rtol * sqrt(S00 S11)`` (plus a tiny absolute slack);
    ``S00 > 0`` and ``det S > 0`` (Sylvester's criterion). The message names the
    first offending index and the offending value, e.g.
    ``covs[3] is not positive definite: det = -0.25``.
    """
    _check_square2(covs, name)
    batch_shape = tuple(covs.shape[:-2])
    flat = covs.reshape(-1, 2, 2)
    if flat.shape[0] == 0:
        return

    def refuse(mask: Tensor, what: Callable[[int], str]) -> None:
        """Raise naming the first matrix in ``mask`` and ``what(its flat index)``."""
        bad = torch.nonzero(mask).flatten()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"{name}[{_fmt_index(i, batch_shape)}] {what(i)}")

    refuse(
        ~torch.isfinite(flat).all(dim=(-2, -1)),
        lambda i: f"has non-finite entries: {flat[i].tolist()}",
    )
    s00, s01, s10, s11 = flat[:, 0, 0], flat[:, 0, 1], flat[:, 1, 0], flat[:, 1, 1]
    scale = torch.sqrt((s00 * s11).abs())
    tiny = torch.finfo(flat.dtype).tiny if flat.is_floating_point() else 0.0
    refuse(
        (s01 - s10).abs() > sym_rtol * scale + tiny,
        lambda i: f"is not symmetric: S01 = {float(s01[i]):.6g}, S10 = {float(s10[i]):.6g}",
    )
    refuse(s00 <= 0, lambda i: f"is not positive definite: S00 = {float(s00[i]):.6g}")
    det = s00 * s11 - s01 * s10
    refuse(det <= 0, lambda i: f"is not positive definite: det = {float(det[i]):.6g}")
