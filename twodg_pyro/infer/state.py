"""What the training loop and its callbacks share: :class:`TrainState`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .elbo import DecomposedELBO
from .optim import build_optimizer


@dataclass
class TrainState:
    """Everything the loop and its callbacks share.

    ``history`` holds one record per epoch: the mean of each ELBO term, ``loss``,
    ``beta`` and ``epoch``.  ``program`` is the Pyro program the loss runs when it is
    not ``model`` itself (a handler around it, e.g. ``poutine.scale(model, 0.5)``);
    ``model`` is always the model module (its parameters, modes and sites).
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
    program: Callable | None = None
    #: the optimiser's class or factory (``functools.partial`` with its settings)
    make_optimizer: Callable[..., torch.optim.Optimizer] | None = None

    @property
    def loss_program(self) -> Callable:
        """What the loss runs: :attr:`program`, else :attr:`model`."""
        return self.model if self.program is None else self.program

    def rebuild_optimizer(self) -> None:
        """Rebuild the optimiser after the guide's parameters changed, keeping the state
        of every surviving parameter."""
        make = self.make_optimizer or type(self.optimizer)
        self.optimizer = build_optimizer(self.model, self.guide, self.lr, make, old=self.optimizer)


def start_state(
    model: nn.Module,
    guide: nn.Module,
    epochs: int,
    lr: float | Mapping[str, float],
    elbo: DecomposedELBO | None,
    optimizer: Callable[..., torch.optim.Optimizer],
    clip_norm: float | None,
    state: TrainState | None,
) -> TrainState:
    """Check a training loop's settings and return the state it trains: ``state``
    continued up to ``epochs`` (its ELBO and optimiser kept; the fast-step settings of
    ``elbo``, when given), or a new one."""
    if int(epochs) < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs!r}")
    if clip_norm is not None and not (clip_norm > 0):
        raise ValueError(f"clip_norm must be positive, got {clip_norm!r}")
    if state is not None and elbo is not None:
        state.elbo.fast_step, state.elbo.fused_kl = elbo.fast_step, elbo.fused_kl
    elbo = elbo if elbo is not None else (state.elbo if state else DecomposedELBO())
    if state is None:
        opt = build_optimizer(model, guide, lr, optimizer)
        state = TrainState(model, guide, elbo, opt, lr, int(epochs), make_optimizer=optimizer)
    state.epochs = int(epochs)
    return state
