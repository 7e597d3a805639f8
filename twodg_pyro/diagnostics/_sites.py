"""Names and coordinates of the exported sites: the method of a guide, each site's named
dimensions, and the seeded sub-grid of a large site ("Thinning" in
:mod:`twodg_pyro.diagnostics.arviz_export`)."""

from __future__ import annotations

import math

import torch

from ..guide import BNNGuide
from ._draws import subset

__all__ = ["gather_flat", "method_of", "site_dims", "take", "thinned_coordinates"]


# ---------------------------------------------------------------------------- names
def method_of(guide) -> str:
    """The method name of a guide (:attr:`~twodg_pyro.guide.BNNGuide.method`:
    ``"mean_field"``, ``"2dg"``, ``"rank1"``, ``"ssvi"``), else the guide's class name."""
    method = guide.method if isinstance(guide, BNNGuide) else None
    return method or type(guide).__name__


def site_dims(site) -> list[str]:
    """Named dimensions of a site's tensor, prefixed with the site's name (see the module
    docstring): ``["fc1.weight_out", "fc1.weight_in"]`` for a Linear weight."""
    n, nd, kind = site.name, len(site.shape), site.layer_type
    if site.param_name in ("r", "s") and nd == 2:  # a rank-1 factor: (M, out) or (M, in)
        names = ["component", "out" if site.param_name == "r" else "in"]
    elif site.param_name == "bias" and nd == 1:
        names = ["out"]
    elif site.param_name == "weight" and kind == "Linear" and nd == 2:
        names = ["out", "in"]
    elif site.param_name == "weight" and kind.startswith("ConvTranspose") and nd >= 3:
        names = ["in", "out", *[f"k{i}" for i in range(nd - 2)]]
    elif site.param_name == "weight" and kind.startswith("Conv") and nd >= 3:
        names = ["out", "in", *[f"k{i}" for i in range(nd - 2)]]
    else:
        names = [f"dim_{i}" for i in range(nd)]
    return [f"{n}_{d}" for d in names]


def thinned_coordinates(
    shape, max_values: int | None, seed: int, salt: int = 0
) -> list[torch.Tensor] | None:
    """The seeded sub-grid of a tensor of ``shape`` with at most ``max_values`` entries:
    one sorted index tensor per dimension, or ``None`` when every entry fits.

    Dimensions are served from the smallest: each keeps
    :math:`\\min(n_d, \\lfloor b^{1/r} \\rfloor)` indices of the remaining budget
    :math:`b` over the :math:`r` dimensions left, so a 3x3 kernel stays whole and the
    product never exceeds ``max_values``.
    """
    shape = [int(d) for d in shape]
    if max_values is None or math.prod(shape) <= int(max_values):
        return None
    if int(max_values) < 1:
        raise ValueError(f"max_site_values must be at least 1 (or None), got {max_values!r}")
    keep = list(shape)
    budget, left = int(max_values), len(shape)
    for d in sorted(range(len(shape)), key=lambda i: shape[i]):
        k = min(shape[d], max(1, int(math.floor(budget ** (1.0 / left) + 1e-9))))
        keep[d], budget, left = k, max(1, budget // k), left - 1
    return [
        subset(n, k, seed, salt=salt * 64 + d) if k < n else torch.arange(n)
        for d, (n, k) in enumerate(zip(shape, keep, strict=True))
    ]


def take(t: torch.Tensor, grid: list[torch.Tensor] | None, lead: int) -> torch.Tensor:
    """``t[..., grid...]`` with ``lead`` leading dimensions left whole."""
    if grid is None:
        return t
    for d, idx in enumerate(grid):
        t = t.index_select(lead + d, idx.to(t.device))
    return t


def gather_flat(weights: dict[str, torch.Tensor], sites, flat_index: torch.Tensor) -> torch.Tensor:
    """``(S, len(flat_index))``: the draws ``{site: (S, *shape)}`` at global flat indices
    (in the guide's site order), without concatenating every site."""
    flat_index = flat_index.long().cpu()
    first = next(iter(weights.values()))
    out = first.new_empty(first.shape[0], flat_index.numel())
    off = 0
    for site in sites:
        inside = (flat_index >= off) & (flat_index < off + site.numel)
        if inside.any():
            local = (flat_index[inside] - off).to(first.device)
            w = weights[site.name].reshape(first.shape[0], -1)
            out[:, inside.to(out.device)] = w.index_select(1, local)
        off += site.numel
    return out
