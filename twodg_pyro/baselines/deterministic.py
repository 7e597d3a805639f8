r"""The deterministic network trained by maximum likelihood (cross-entropy).

It is both a baseline and the pretraining that initialises the means of stage 1
(spec Stage 1 step 1).  Two recipes:

* ``optimizer="adam"`` (the library default): Adam at a constant learning rate;
* ``optimizer="sgd"``: SGD with momentum and weight decay, an optional linear warm-up
  over the first ``warmup_epochs`` epochs and a step schedule that multiplies the
  learning rate by ``gamma`` at each epoch of ``milestones``,

  .. math:: \text{lr}_e = \text{lr}\cdot\min\!\Big(1, \frac{e + 1}{E_w}\Big)\cdot
      \gamma^{\#\{m \in \text{milestones}: m \le e\}},

  the paper's App. I.3 recipe (SGD at 0.1, 2 warm-up epochs, milestones, weight decay
  5e-4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import get_args

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..settings import Optimizer


def _epoch_lr(
    lr: float, epoch: int, warmup_epochs: int, milestones: Sequence[int], gamma: float
) -> float:
    """The learning rate of (0-based) ``epoch`` under warm-up and the step schedule."""
    warm = min(1.0, (epoch + 1) / warmup_epochs) if warmup_epochs > 0 else 1.0
    return lr * warm * gamma ** sum(1 for m in milestones if m <= epoch)


def train_deterministic(
    net: nn.Module,
    data: Iterable,
    epochs: int,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    device: torch.device | str | None = None,
    progress: bool = True,
    optimizer: str = "adam",
    momentum: float = 0.9,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
    warmup_epochs: int = 0,
    on_epoch_end: Callable[[int, nn.Module], bool | None] | None = None,
) -> nn.Module:
    """Train ``net`` in place on the mean cross-entropy; returns ``net``.

    Args:
        net: the network (trained in place).
        data: ``(x, y)`` minibatches, one pass per epoch.
        epochs: number of passes.
        lr: the base learning rate.
        weight_decay: L2 penalty of the optimiser.
        device: where minibatches are moved.
        progress: a tqdm bar over the epochs.
        optimizer: ``"adam"`` (constant ``lr``) or ``"sgd"`` (momentum, warm-up, steps).
        momentum: SGD momentum.
        milestones: epochs at which the learning rate is multiplied by ``gamma``.
        gamma: the step factor.
        warmup_epochs: epochs of linear warm-up from ``lr / warmup_epochs`` to ``lr``.
        on_epoch_end: called as ``on_epoch_end(epoch, net)`` after each (0-based) epoch;
            a true return value stops training (early stopping).  It may evaluate
            ``net`` (training mode is restored after it).

    Floating inputs are cast to the network's dtype (a float64 network on float32 data).

    Raises:
        ValueError: for a non-positive learning rate, negative epochs or weight decay, or
            an unknown optimiser — naming the value.
    """
    if not (lr > 0):
        raise ValueError(f"learning rate must be positive, got {lr!r}")
    if int(epochs) < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs!r}")
    if not (weight_decay >= 0):
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if optimizer not in get_args(Optimizer):
        raise ValueError(f"optimizer must be one of {list(get_args(Optimizer))}, got {optimizer!r}")
    if not (gamma > 0):
        raise ValueError(f"gamma must be positive, got {gamma!r}")
    if optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    like = next(net.parameters())  # inputs follow the network's dtype (and device)
    net.train()
    for epoch in tqdm(range(int(epochs)), desc="deterministic", disable=not progress, leave=False):
        if optimizer == "sgd":
            for group in opt.param_groups:
                group["lr"] = _epoch_lr(lr, epoch, int(warmup_epochs), milestones, gamma)
        for x, y in data:
            if device is not None:
                x, y = x.to(device), y.to(device)
            if x.is_floating_point() and x.dtype != like.dtype:
                x = x.to(like.dtype)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()
        if on_epoch_end is not None:
            stop = on_epoch_end(epoch, net)
            net.train()
            if stop:
                break
    net.eval()
    return net
