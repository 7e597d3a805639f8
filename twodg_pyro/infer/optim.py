r"""The optimiser of the training loop: named parameter groups, learning rates per group
and carrying optimiser state across a change of the guide's parameters.

A guide's parameters come in named groups (``loc``, ``scale``, ``centre``, ...:
:meth:`~twodg_pyro.guides.BNNGuide.param_groups`) so that each gets its own learning
rate; the model's deterministic parameters (e.g. BatchNorm affine) form the group
``deterministic``.  Any other Pyro guide module (e.g. Pyro's ``AutoNormal``) has its
parameters grouped by their top-level name (:func:`guide_param_groups`).

When a callback replaces some of the guide's parameter tensors by tensors with other
rows (a merge of mixture components, a move of SSVI's subspace), the optimiser's
per-parameter state follows the rows (:func:`remap_optimizer_rows`) and the optimiser
is rebuilt over the new tensors, keeping the state of every other parameter
(:func:`build_optimizer` with ``old``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import pyro.poutine as poutine
import torch
from torch import nn

from ..guide import BNNGuide


def _check_lr(name: str, lr: float) -> float:
    lr = float(lr)
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"learning rate for group {name!r} must be positive, got {lr!r}")
    return lr


def _group_lrs(lr: float | Mapping[str, float], names: Iterable[str]) -> dict[str, float]:
    if isinstance(lr, Mapping):
        unknown = set(lr) - set(names) - {"default"}
        if unknown:
            raise ValueError(
                f"learning rate given for unknown parameter group(s) {sorted(unknown)}; "
                f"groups are {sorted(names)} (or 'default')"
            )
        default = lr.get("default", 1e-3)
        return {n: _check_lr(n, lr.get(n, default)) for n in names}
    return {n: _check_lr(n, lr) for n in names}


_GROUP_OF = {"loc": "loc", "locs": "loc", "scale": "scale", "scales": "scale"}


def guide_param_groups(guide: nn.Module) -> list[dict]:
    """``guide.param_groups()`` for the library's guides; for any other guide module (e.g.
    Pyro's autoguides) its parameters grouped by top-level name, ``locs``/``loc`` ->
    ``"loc"``, ``scales``/``scale`` -> ``"scale"``, others by their own name (e.g.
    ``"cov_factor"``)."""
    if isinstance(guide, BNNGuide):
        return guide.param_groups()
    groups: dict[str, list] = {}
    for name, p in guide.named_parameters():
        top = name.split(".", 1)[0].removesuffix("_unconstrained")
        groups.setdefault(_GROUP_OF.get(top, top), []).append(p)
    return [{"name": k, "params": v} for k, v in groups.items()]


def to_device(batch: Sequence, device) -> Sequence:
    """A minibatch's tensors moved to ``device`` (``None``: as they are)."""
    if device is None:
        return batch
    return [b.to(device, non_blocking=True) if torch.is_tensor(b) else b for b in batch]


def prepare_guide(model: nn.Module, guide: nn.Module, data: Iterable, device=None) -> None:
    """Create the parameters of a guide that makes them at its first call (Pyro's
    autoguides), by running it once on the first minibatch; nothing for the library's
    guides or a guide that has its parameters.

    Raises:
        TypeError: ``guide`` is not a ``torch.nn.Module`` (it has no parameters to train).
    """
    if isinstance(guide, BNNGuide):
        return
    if not isinstance(guide, nn.Module):
        raise TypeError(
            f"fit trains a guide module (a twodg_pyro guide or a Pyro autoguide), got "
            f"{type(guide).__name__}"
        )
    if next(guide.parameters(), None) is not None:
        return
    batch = next(iter(data), None)
    if batch is None:
        raise ValueError("no minibatches to set the guide up with: the data set is empty")
    x, y = to_device(batch, device)[:2]
    with poutine.block():
        guide(x, y)


def build_optimizer(
    model: nn.Module,
    guide: nn.Module,
    lr: float | Mapping[str, float],
    optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
    old: torch.optim.Optimizer | None = None,
    **optim_kwargs,
) -> torch.optim.Optimizer:
    """An optimiser over the guide's named groups and the model's deterministic parameters.

    When ``old`` is given (e.g. after a merge changed the guide's parameters), the
    per-parameter state of every parameter object that still exists is carried over;
    new parameters start fresh (or with state set before the call, e.g. by
    :func:`remap_optimizer_rows`).
    """
    groups = [dict(g) for g in guide_param_groups(guide)]
    det = list(model.deterministic_parameters())
    if det:
        groups.append({"name": "deterministic", "params": det})
    lrs = _group_lrs(lr, [g["name"] for g in groups])
    for g in groups:
        g["lr"] = lrs[g["name"]]
        g["params"] = [p for p in g["params"] if p.requires_grad]
    groups = [g for g in groups if g["params"]]
    opt = optimizer(groups, **optim_kwargs)
    if old is not None:
        for p in (p for g in opt.param_groups for p in g["params"]):
            if p in old.state:
                opt.state[p] = old.state[p]
    return opt


def remap_optimizer_rows(
    optimizer: torch.optim.Optimizer,
    pairs: Iterable[tuple[torch.Tensor, torch.Tensor]],
    mapping: torch.Tensor,
    n_new: int,
) -> None:
    r"""Give each new parameter the optimiser state of the old one's rows.

    Row :math:`j` of an old parameter's state tensors (Adam's moments, ...) goes to row
    ``mapping[j]`` of the new parameter's, ``n_new`` rows in all: rows sent to the same
    new row are averaged (a merge of components), a row sent to ``-1`` is dropped (a
    coordinate leaving SSVI's subspace), and a new row that receives none starts at zero
    (a coordinate joining it).  State that is not one row per parameter row (Adam's
    ``step``) is kept.  Call the optimiser's rebuild afterwards
    (:meth:`~twodg_pyro.infer.TrainState.rebuild_optimizer`) so that it holds the new
    tensors.

    Args:
        optimizer: the optimiser holding the old parameters' state.
        pairs: ``(old parameter, new parameter)`` pairs whose rows ``mapping`` relates.
        mapping: ``(n_old,)`` integer tensor, the new row of each old row, or ``-1``.
        n_new: the number of rows of the new parameters.
    """
    pairs = list(pairs)
    if not pairs:
        return
    mapping = mapping.long().to(pairs[0][0].device)
    kept = mapping >= 0
    rows = mapping[kept]
    for old, new in pairs:
        st = optimizer.state.pop(old, None)
        if not st:
            continue
        moved = {}
        for key, value in st.items():
            if torch.is_tensor(value) and value.dim() >= 1 and value.shape == old.shape:
                acc = value.new_zeros((n_new, *value.shape[1:]))
                acc = acc.index_add(0, rows, value[kept] if not bool(kept.all()) else value)
                cnt = torch.bincount(rows, minlength=n_new).clamp_min(1).to(value.dtype)
                moved[key] = acc / cnt.view(-1, *([1] * (value.dim() - 1)))
            else:
                moved[key] = value
        optimizer.state[new] = moved
