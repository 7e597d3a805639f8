r"""Stochastic variational inference: the training loop.

Each step draws a minibatch, evaluates the ELBO's terms with the guide's
reparameterised sample, and takes an optimiser step on

.. math:: \text{loss} = \text{nll}\cdot\tfrac{N}{B}\text{-scaled} + \beta \sum \mathrm{KL}.

Guides expose named parameter groups (``loc``, ``scale``, ...) so that means and
scales get their own learning rates; parameters of the model that are not Bayesian
(e.g. BatchNorm affine) form the group ``deterministic``.  Any other Pyro guide module
(e.g. Pyro's ``AutoNormal``, ``AutoLowRankMultivariateNormal``) is trained too: it is
run once on the first minibatch to create its parameters, which are grouped by their
top-level name (:func:`guide_param_groups`).

The loop calls :meth:`~twodg_pyro.infer.DecomposedELBO.loss_terms`, which runs the
library's programs without ``pyro.param`` statements: it neither reads nor writes Pyro's
param store (see :mod:`twodg_pyro.pyro_params` for mixing ``fit`` with ``pyro.infer.SVI``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pyro.poutine as poutine
import torch
from torch import nn
from tqdm.auto import tqdm

from .callbacks import Callback
from .elbo import DecomposedELBO

__all__ = ["TrainState", "fit", "build_optimizer", "guide_param_groups"]


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
    if hasattr(guide, "param_groups"):
        return guide.param_groups()
    groups: dict[str, list] = {}
    for name, p in guide.named_parameters():
        top = name.split(".", 1)[0].removesuffix("_unconstrained")
        groups.setdefault(_GROUP_OF.get(top, top), []).append(p)
    return [{"name": k, "params": v} for k, v in groups.items()]


def prepare_guide(model: nn.Module, guide: nn.Module, data: Iterable, device=None) -> None:
    """Create the parameters of a guide that makes them at its first call (Pyro's
    autoguides), by running it once on the first minibatch; nothing for the library's
    guides or a guide that has its parameters.

    Raises:
        TypeError: ``guide`` is not a ``torch.nn.Module`` (it has no parameters to train).
    """
    if hasattr(guide, "param_groups"):
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
    x, y = _to_device(batch, device)[:2]
    with poutine.block():
        guide(x, y)


def build_optimizer(
    model: nn.Module,
    guide: nn.Module,
    lr: float | Mapping[str, float],
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    old: torch.optim.Optimizer | None = None,
    **optim_kwargs,
) -> torch.optim.Optimizer:
    """An optimiser over the guide's named groups and the model's deterministic parameters.

    When ``old`` is given (e.g. after a merge changed the guide's parameters), the
    per-parameter state of every parameter object that still exists is carried over;
    new parameters start fresh (or with state set by the guide before the call).
    """
    groups = [dict(g) for g in guide_param_groups(guide)]
    det = [p for p in getattr(model, "deterministic_parameters", lambda: [])()]
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


@dataclass
class TrainState:
    """Everything the loop and its callbacks share.

    ``history`` holds one record per epoch: the mean of each ELBO term, ``loss``,
    ``beta`` and ``epoch``.
    """

    model: nn.Module
    guide: nn.Module
    elbo: DecomposedELBO
    optimizer: torch.optim.Optimizer
    lr: float | Mapping[str, float]
    epochs: int
    epoch: int = 0
    step: int = 0
    history: list[dict] = field(default_factory=list)
    stop: bool = False
    extras: dict = field(default_factory=dict)

    def rebuild_optimizer(self) -> None:
        """Rebuild the optimiser after the guide's parameters changed, keeping the state
        of every surviving parameter."""
        self.optimizer = build_optimizer(
            self.model, self.guide, self.lr, type(self.optimizer), old=self.optimizer
        )


def start_state(
    model: nn.Module,
    guide: nn.Module,
    epochs: int,
    lr: float | Mapping[str, float],
    elbo: DecomposedELBO | None,
    optimizer: type[torch.optim.Optimizer],
    clip_norm: float | None,
    state: TrainState | None,
) -> TrainState:
    """Check a training loop's settings and return the state it trains: ``state``
    continued up to ``epochs`` (its ELBO and optimiser kept), or a new one."""
    if int(epochs) < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs!r}")
    if clip_norm is not None and not (clip_norm > 0):
        raise ValueError(f"clip_norm must be positive, got {clip_norm!r}")
    elbo = elbo if elbo is not None else (state.elbo if state else DecomposedELBO())
    if state is None:
        opt = build_optimizer(model, guide, lr, optimizer)
        state = TrainState(model, guide, elbo, opt, lr, int(epochs))
    state.epochs = int(epochs)
    return state


def clip_gradients(optimizer: torch.optim.Optimizer, clip_norm: float | None) -> None:
    """Clip the gradient norm of all of ``optimizer``'s parameters (``None``: nothing)."""
    if clip_norm is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, clip_norm)


def _to_device(batch, device):
    if device is None:
        return batch
    return [b.to(device, non_blocking=True) if torch.is_tensor(b) else b for b in batch]


def fit(
    model: nn.Module,
    guide: nn.Module,
    data: Iterable,
    epochs: int,
    lr: float | Mapping[str, float] = 1e-3,
    elbo: DecomposedELBO | None = None,
    callbacks: Sequence[Callback] = (),
    device: torch.device | str | None = None,
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    clip_norm: float | None = None,
    progress: bool = True,
    state: TrainState | None = None,
) -> TrainState:
    """Train ``guide`` (and the model's deterministic parameters) by SVI.

    Args:
        model: a :class:`~twodg_pyro.model.BNNModel` (``model(x, y)``).
        guide: a guide with ``param_groups()`` (mean-field, shared-GMM, ...), or another
            Pyro guide module such as ``AutoNormal`` (see :func:`guide_param_groups`).
        data: an iterable of ``(x, y)`` minibatches, e.g. a ``DataLoader``.
        epochs: total number of epochs (a resumed state continues up to it).
        lr: one learning rate, or ``{"loc": ..., "scale": ..., "default": ...}`` per group.
        elbo: the loss (default :class:`DecomposedELBO`).
        callbacks: :class:`~twodg_pyro.infer.callbacks.Callback` objects.
        device: where the minibatches are moved.
        optimizer: a ``torch.optim.Optimizer`` class.
        clip_norm: optional gradient-norm clipping.
        progress: show a tqdm bar with the ELBO terms.
        state: a state to continue from (resume); its optimiser is reused.

    Returns:
        The final :class:`TrainState`.

    Raises:
        FloatingPointError: the loss became NaN or infinite; the message names the
            epoch, step and the terms that went bad.
    """
    if state is None:
        prepare_guide(model, guide, data, device)
    state = start_state(model, guide, epochs, lr, elbo, optimizer, clip_norm, state)
    callbacks = list(callbacks)
    for cb in callbacks:
        cb.on_train_begin(state)
    model.train()
    bar = tqdm(
        total=state.epochs, initial=state.epoch, desc="SVI", disable=not progress, leave=False
    )
    try:
        while state.epoch < state.epochs and not state.stop:
            for cb in callbacks:
                cb.on_epoch_begin(state)
            sums: dict[str, float] = {}
            n_batches = 0
            for batch in data:
                x, y = _to_device(batch, device)[:2]
                state.optimizer.zero_grad(set_to_none=True)
                terms = state.elbo.loss_terms(state.model, state.guide, x, y)
                loss = state.elbo.combine(terms)
                if not torch.isfinite(loss):
                    bad = {
                        k: float(v.detach())
                        for k, v in terms.items()
                        if not torch.isfinite(v).all()
                    }
                    ckpt = [c.last_checkpoint() for c in callbacks if hasattr(c, "last_checkpoint")]
                    value = float(loss.detach())
                    raise FloatingPointError(
                        f"loss is {value} at epoch {state.epoch}, step {state.step}; "
                        f"non-finite ELBO terms: {bad or 'none (overflow in the sum)'}; "
                        f"last good epoch: {state.epoch - 1}"
                        + (f"; last good checkpoint: {ckpt[0]}" if ckpt else "")
                    )
                loss.backward()
                clip_gradients(state.optimizer, clip_norm)
                state.optimizer.step()
                state.step += 1
                n_batches += 1
                sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
                for k, v in terms.items():
                    sums[k] = sums.get(k, 0.0) + float(v.detach())
            if n_batches == 0:
                raise ValueError(f"no minibatches in epoch {state.epoch}: the data set is empty")
            record = {k: v / max(n_batches, 1) for k, v in sums.items()}
            record.update(epoch=state.epoch, beta=state.elbo.beta)
            state.history.append(record)
            state.epoch += 1
            bar.update(1)
            bar.set_postfix({k: f"{v:.4g}" for k, v in record.items() if k not in ("epoch",)})
            for cb in callbacks:
                if cb.on_epoch_end(state):
                    state.stop = True
        for cb in callbacks:
            cb.on_train_end(state)
    finally:
        bar.close()
    model.eval()
    return state
