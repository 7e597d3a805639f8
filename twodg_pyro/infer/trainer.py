r"""Stochastic variational inference: the training loop.

Each step draws a minibatch, evaluates the ELBO's terms with the guide's
reparameterised sample, and takes an optimiser step on

.. math:: \text{loss} = \text{nll}\cdot\tfrac{N}{B}\text{-scaled} + \beta \sum \mathrm{KL}.

:func:`fit` is the one epoch loop of the library.  What differs between training in this
process and training on every rank of a process group is a *step strategy*
(:class:`TrainingStep`): how a minibatch's loss is evaluated, how the epoch's means are
reduced and checked, and what happens around the callbacks.  :class:`TrainingStep`
itself is the single-process step;
:class:`~twodg_pyro.distributed.train.DataParallelStep` the DDP one (reduce the terms
over the ranks, check that the ranks agree, wrap the module anew after a merge).

Parameter groups, learning rates and the optimiser are in :mod:`.optim`, the state the
loop and its callbacks share in :mod:`.state`, checkpoints and resuming in
:mod:`.checkpoint`.  The loop calls :meth:`~twodg_pyro.infer.DecomposedELBO.loss_terms`,
which runs the library's programs without ``pyro.param`` statements: it neither reads
nor writes Pyro's param store (see :mod:`twodg_pyro.pyro_params` for mixing ``fit`` with
``pyro.infer.SVI``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import pyro.poutine as poutine
import torch
from torch import nn
from tqdm.auto import tqdm

from ..guide import check_guide_sites
from .callbacks import Callback
from .elbo import DecomposedELBO
from .optim import prepare_guide, to_device
from .state import TrainState, start_state


class TrainingStep:
    """How :func:`fit` runs in one process (subclassed for a process group).

    The loop calls, in this order: :meth:`start` once (before the callbacks'
    ``on_train_begin``); per epoch :meth:`before_epoch` (before ``on_epoch_begin``),
    :meth:`batches`, per minibatch :meth:`loss_terms` and :meth:`add` (which checks the
    loss before the backward pass), then :meth:`epoch_means`, :meth:`end_epoch` (before
    ``on_epoch_end``) and :meth:`after_callbacks`; at the end :meth:`before_train_end`
    (before ``on_train_end``) and :meth:`finish`.
    """

    #: whether this process shows progress (rank 0 of a group)
    is_main: bool = True

    def __init__(self):
        self._sums: dict[str, float] = {}
        self._n = 0

    def start(self, state: TrainState) -> None:
        """Before the callbacks' ``on_train_begin``: nothing here."""

    def before_epoch(self, state: TrainState) -> None:
        """Before the callbacks' ``on_epoch_begin``: nothing here."""

    def batches(self, data: Iterable, state: TrainState, device) -> Iterator[tuple]:
        """The epoch's ``(x, y)`` minibatches of ``data``, on ``device``; resets the
        epoch's running means."""
        self._sums, self._n = {}, 0
        for batch in data:
            yield tuple(to_device(batch, device)[:2])

    def loss_terms(self, state: TrainState, x, y) -> tuple[torch.Tensor, dict]:
        """``(loss, terms)`` of one minibatch: the ELBO's terms
        (:meth:`~twodg_pyro.infer.DecomposedELBO.loss_terms`) and their combination."""
        terms = state.elbo.loss_terms(state.loss_program, state.guide, x, y)
        return state.elbo.combine(terms), terms

    def add(self, state: TrainState, loss, terms: Mapping, callbacks: Sequence) -> None:
        """Check one minibatch's loss (before its backward pass) and add it and its terms
        to the epoch's running sums.

        Raises:
            FloatingPointError: the loss is NaN or infinite; the message names the epoch,
                step, the terms that went bad and the last checkpoint written.
        """
        if not torch.isfinite(loss):
            bad = {k: float(v.detach()) for k, v in terms.items() if not torch.isfinite(v).all()}
            ckpt = [c for c in (cb.last_checkpoint() for cb in callbacks) if c is not None]
            value = float(loss.detach())
            raise FloatingPointError(
                f"loss is {value} at epoch {state.epoch}, step {state.step}; "
                f"non-finite ELBO terms: {bad or 'none (overflow in the sum)'}; "
                f"last good epoch: {state.epoch - 1}"
                + (f"; last good checkpoint: {ckpt[0]}" if ckpt else "")
            )
        for k, v in {"loss": loss, **terms}.items():
            self._sums[k] = self._sums.get(k, 0.0) + float(v.detach())
        self._n += 1

    def epoch_means(self) -> dict[str, float] | None:
        """The epoch's mean loss and terms, ``None`` when it had no minibatches."""
        return {k: v / self._n for k, v in self._sums.items()} if self._n else None

    def end_epoch(self, state: TrainState) -> None:
        """After the epoch's record, before the callbacks' ``on_epoch_end``: nothing here."""

    def after_callbacks(self, state: TrainState, callbacks: Sequence[Callback]) -> None:
        """After the callbacks' ``on_epoch_end``: nothing here."""

    def before_train_end(self, state: TrainState) -> None:
        """Before the callbacks' ``on_train_end``: nothing here."""

    def finish(self, state: TrainState) -> None:
        """After the loop (the model is in eval mode): nothing here."""


def _model_module(program: Callable) -> nn.Module:
    """The model module of what :func:`fit` was given: the model, or the model inside Pyro
    handlers (``poutine.scale(model, 0.5)``: ``poutine.unwrap``)."""
    inner = poutine.unwrap(program) if callable(program) else program
    if isinstance(inner, nn.Module) and hasattr(inner, "deterministic_parameters"):
        return inner
    raise TypeError(
        "fit trains a BNNModel (or a Pyro handler around one, e.g. poutine.scale(model, 0.5)), "
        f"got {type(program).__name__}"
    )


#: the fields of an epoch's record that the progress bar shows, and their labels: the
#: loss, the KL term and the median ratio of the posterior scales to their start
#: (:class:`~twodg_pyro.infer.callbacks.ScaleTrajectory`).  Every other field (the NLL,
#: beta, the other scale percentiles, ...) stays in ``TrainState.history`` only, so the
#: bar fits an 80-column terminal.
BAR_FIELDS: dict[str, str] = {"loss": "loss", "kl": "kl", "sigma_ratio_median": "scale_ratio"}
# tqdm's bar without the rate (epochs per second; elapsed and remaining tell it)
_BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def _short(value: float) -> str:
    """A number in at most 4 significant digits and 7 characters: ``4213``, ``12.35k``,
    ``-1.235M``, ``3.2e-05``."""
    v = float(value)
    if not math.isfinite(v):
        return str(v)  # nan, inf, -inf
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(v) >= scale:
            return f"{v / (1e3 if suffix == 'k' else scale):.4g}{suffix}"
    return f"{v:.4g}"


def bar_fields(record: Mapping[str, float]) -> str:
    """The progress bar's text for one epoch's record: the :data:`BAR_FIELDS` it has,
    ``"loss=12.35k, kl=4213, scale_ratio=1.43"``."""
    return ", ".join(
        f"{label}={_short(record[key])}" for key, label in BAR_FIELDS.items() if key in record
    )


def fit(
    model: nn.Module | Callable,
    guide: nn.Module,
    data: Iterable,
    epochs: int,
    lr: float | Mapping[str, float] = 1e-3,
    elbo: DecomposedELBO | None = None,
    callbacks: Sequence[Callback] = (),
    device: torch.device | str | None = None,
    optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
    clip_norm: float | None = None,
    progress: bool = True,
    state: TrainState | None = None,
    step: TrainingStep | None = None,
) -> TrainState:
    """Train ``guide`` (and the model's deterministic parameters) by SVI.

    Args:
        model: a :class:`~twodg_pyro.bnn.BNNModel` (``model(x, y)``), or a Pyro
            handler around one (``poutine.scale(model, 0.5)`` tempers the joint density
            as in Pyro, ``poutine.condition(model, {site: value})``): the loss runs the
            handler, the optimiser, modes, callbacks and checkpoints see the model
            (:attr:`TrainState.model <twodg_pyro.infer.TrainState>`).
        guide: one of the library's guides (a :class:`~twodg_pyro.guides.BNNGuide`:
            mean-field, shared-GMM, ...), or another Pyro guide module such as
            ``AutoNormal`` (see :func:`~twodg_pyro.infer.optim.guide_param_groups`).
        data: an iterable of ``(x, y)`` minibatches, e.g. a ``DataLoader``.
        epochs: total number of epochs (a resumed state continues up to it).
        lr: one learning rate, or ``{"loc": ..., "scale": ..., "default": ...}`` per group.
        elbo: the loss (default :class:`DecomposedELBO`).
        callbacks: :class:`~twodg_pyro.infer.callbacks.Callback` objects.
        device: where the minibatches are moved.
        optimizer: a ``torch.optim.Optimizer`` class, or a factory of one over the
            parameter groups (``functools.partial(VariationalOnlineNewton, kl_weight=0.1)``:
            natural gradients of the mean-field guide, :mod:`~twodg_pyro.infer.von`).
        clip_norm: optional gradient-norm clipping.
        progress: show a tqdm bar with the loss, the KL term and the median scale ratio
            (:data:`BAR_FIELDS`; every field of an epoch stays in ``state.history``).
        state: a state to continue from (resume); its optimiser is reused.
        step: the step strategy (default: this process, :class:`TrainingStep`; under
            ``torch.distributed``: :func:`~twodg_pyro.distributed.fit_distributed`).

    Returns:
        The final :class:`~twodg_pyro.infer.TrainState`.

    Raises:
        TypeError: ``model`` holds no model module; a handler around the model with a
            step that computes its own loss (the distributed step).
        ValueError: bad settings, a guide built for another network (the first site
            that differs and both shapes), or an epoch without minibatches (empty data).
        FloatingPointError: the loss became NaN or infinite; the message names the
            epoch, step and the terms that went bad.
    """
    step = TrainingStep() if step is None else step
    program, model = model, _model_module(model)
    if program is not model and type(step).loss_terms is not TrainingStep.loss_terms:
        raise TypeError(
            f"{type(step).__name__} computes the loss of the model itself: pass the BNNModel, "
            "not a Pyro handler around it"
        )
    check_guide_sites(model, guide, "fit")
    if state is None:
        prepare_guide(model, guide, data, device)
    state = start_state(model, guide, epochs, lr, elbo, optimizer, clip_norm, state)
    state.program = None if program is model else program
    callbacks = list(callbacks)
    step.start(state)
    for cb in callbacks:
        cb.on_train_begin(state)
    model.train()
    bar = tqdm(
        total=state.epochs,
        initial=state.epoch,
        desc="SVI",
        disable=not (progress and step.is_main),
        leave=False,
        bar_format=_BAR_FORMAT,
    )
    try:
        while state.epoch < state.epochs and not state.stop:
            step.before_epoch(state)
            for cb in callbacks:
                cb.on_epoch_begin(state)
            for x, y in step.batches(data, state, device):
                state.optimizer.zero_grad(set_to_none=True)
                loss, terms = step.loss_terms(state, x, y)
                step.add(state, loss, terms, callbacks)
                loss.backward()
                if clip_norm is not None:
                    params = [p for g in state.optimizer.param_groups for p in g["params"]]
                    torch.nn.utils.clip_grad_norm_(params, clip_norm)
                state.optimizer.step()
                state.step += 1
            record = step.epoch_means()
            if record is None:
                raise ValueError(f"no minibatches in epoch {state.epoch}: the data set is empty")
            record.update(epoch=state.epoch, beta=state.elbo.beta)
            state.history.append(record)
            state.epoch += 1
            step.end_epoch(state)
            for cb in callbacks:
                if cb.on_epoch_end(state):
                    state.stop = True
            step.after_callbacks(state, callbacks)
            bar.update(1)
            bar.set_postfix_str(bar_fields(record))
        step.before_train_end(state)
        for cb in callbacks:
            cb.on_train_end(state)
    finally:
        bar.close()
    model.eval()
    step.finish(state)
    return state
