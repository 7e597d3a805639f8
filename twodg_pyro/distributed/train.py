r"""SVI across processes: the ELBO module under ``DistributedDataParallel`` (stages 1 and 3).

:func:`fit_distributed` is :func:`~twodg_pyro.infer.fit` for a process group: every rank
runs it with the same arguments; without a group it runs the same loop in one process.

**The loss on each rank, and why the gradient is the single-process one.**  Let the
configured (global) batch have :math:`G = W b` examples, :math:`W` ranks holding
:math:`b` each (:math:`\mathcal B_r`), :math:`N` the training-set size (the
likelihood's ``dataset_size``, *global*), :math:`\ell_i(w) = -\log p(y_i \mid f_w(x_i))`
and :math:`\varepsilon` the noise of the guide's reparameterised draw
:math:`w = w(\theta, \varepsilon)`.  One process on the whole global batch minimises

.. math::
    L_G(\theta) = \frac{N}{G} \sum_{i \in \cup_r \mathcal B_r} \ell_i(w)
        + \beta\,\mathrm{KL}(\theta).

Rank :math:`r` evaluates the ordinary minibatch loss of its own examples — the data
plate scales its log-likelihood by :math:`N / b` — with the KL *unscaled*:

.. math::
    L_r(\theta) = \frac{N}{b} \sum_{i \in \mathcal B_r} \ell_i(w_r)
        + \beta\,\mathrm{KL}(\theta),

and DDP all-reduces the *mean* of the gradients,
:math:`g = \frac1W \sum_r \nabla L_r`.  Because
:math:`\frac1W \sum_r \frac{N}{b} \sum_{\mathcal B_r} \ell_i = \frac{N}{G}
\sum_{\cup_r \mathcal B_r} \ell_i` and :math:`\frac1W \sum_r \beta\,\mathrm{KL} =
\beta\,\mathrm{KL}`, :math:`g = \nabla L_G` whenever every rank uses the same draw
(``noise="shared"``): the likelihood is scaled by the global :math:`N` and the KL is
counted once.  (In the equivalent sum convention each rank contributes
:math:`\frac{N}{G}\sum_{\mathcal B_r}\ell_i + \beta\,\mathrm{KL}/W`.)  With
``noise="independent"`` (default) every rank draws its own :math:`w_r`; then
:math:`\mathbb E[g] = \nabla\,\mathbb E_\varepsilon[L_G]`, the same unbiased gradient
averaged over :math:`W` weight draws instead of one (lower variance).  A Monte Carlo KL
is likewise averaged over the ranks' draws.  ``DistributedSampler`` gives every rank the
same number of examples per epoch (repeating at most :math:`W - 1` examples when
:math:`W \nmid N`), so the last, smaller global batch splits evenly too.

**Agreement between ranks.**  Parameters start equal (DDP broadcasts rank 0's at
wrapping) and stay equal (identical averaged gradients, identical optimiser steps).
Each step all-reduces the loss and its terms (one small vector) *before* the backward
pass: the history is the global one on every rank, and a NaN on any rank stops every
rank with the same error instead of leaving the others waiting.  Callbacks (KL
annealing, the merge and Mahalanobis hooks) run on every rank under a random seed that
is the same on every rank, so they take identical decisions; afterwards a checksum of
all parameters and buffers is compared across ranks (a divergence is an error on every
rank), the optimiser has been rebuilt on every rank by the hook itself, and when a hook
replaced parameter objects (a merge) the module is wrapped anew in DDP.  BatchNorm-like
buffers of the model are averaged over ranks at each epoch's end.  Only rank 0 writes
progress; a callback that writes files (the :class:`~twodg_pyro.infer.checkpoint.Checkpoint`
of the pipeline, ...) is wrapped in :class:`MainOnly`: it runs on rank 0, and its outcome
(an error, or a request to stop) reaches every rank.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partialmethod

import numpy as np
import pyro
import torch
from pyro.infer.elbo import ELBOModule
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

from ..infer.callbacks import Callback
from ..infer.state import TrainState
from ..infer.trainer import TrainingStep, fit
from . import env
from .data import ShardedLoader

_NOISE = ("independent", "shared")
_DDP_ARGS = inspect.signature(DDP.__init__).parameters
_BUFFER_SYNC_ARG = (
    "forward_sync_buffers" if "forward_sync_buffers" in _DDP_ARGS else "broadcast_buffers"
)
_HAS_INIT_SYNC = "init_sync" in _DDP_ARGS


class ELBOTermsModule(ELBOModule):
    """Pyro's ``ELBOModule`` (model + guide + ELBO) returning ``(loss, terms)``: the DDP unit."""

    def forward(self, *args, **kwargs):
        terms = self.elbo.loss_terms(self.model, self.guide, *args, **kwargs)
        return self.elbo.combine(terms), terms


def _derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) % (2**32) for p in parts]).generate_state(1)[0])


def _seed_common(seed: int, epoch: int, tag: int) -> None:
    """A seed that is the same on every rank (for callbacks and hooks)."""
    pyro.set_rng_seed(_derive_seed(seed, tag, epoch))


def state_checksum(*modules: nn.Module) -> torch.Tensor:
    """``[n_tensors, n_elements, sum, position-weighted sum, sum |.|]`` of all parameters
    and floating buffers (float64): equal on every rank while the ranks agree."""
    n_t, n_e = 0, 0
    s = torch.zeros(3, dtype=torch.float64)
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            t64 = t.detach().to(torch.float64)
            n_t += 1
            n_e += t.numel()
            total = t64.sum().cpu()
            s += torch.stack([total, total * n_t, t64.abs().sum().cpu()])
    return torch.cat([torch.tensor([float(n_t), float(n_e)], dtype=torch.float64), s])


def _wrap(
    module: nn.Module, device: torch.device | None, options: Mapping | None, sync: bool = True
) -> nn.Module:
    """``module`` under DDP (itself without a group).  ``sync=False`` skips DDP's broadcast
    of rank 0's parameters and buffers when the ranks are known to agree (re-wrapping
    after a merge, right after the cross-rank checksum)."""
    if not env.is_distributed():
        return module
    ids = None
    if device is not None and device.type == "cuda":
        ids = [device.index if device.index is not None else torch.cuda.current_device()]
    # static_graph: the same parameters take part in every step (a guide's empty
    # parameter, e.g. no outliers, is then handled without a graph search per step);
    # no buffer broadcast in forward: guide buffers are structure (kept equal by the
    # hooks), model buffers (BatchNorm statistics) are averaged at each epoch's end
    kwargs = {"device_ids": ids, "static_graph": True, _BUFFER_SYNC_ARG: False}
    if not sync and _HAS_INIT_SYNC:
        kwargs["init_sync"] = False
    kwargs.update(options or {})
    return DDP(module, **kwargs)


def average_buffers(module: nn.Module) -> None:
    """Mean over ranks of the module's floating buffers (BatchNorm running statistics)."""
    if not env.is_distributed():
        return
    world = env.get_world_size()
    with torch.no_grad():
        for b in module.buffers():
            if b.is_floating_point() and b.numel():
                b.copy_(env.all_reduce_sum(b) / world)


class MainOnly:
    """Run ``callback`` on rank 0 only (a checkpoint writer, a logger, ...).

    Each call of the four ``on_*`` methods is a barrier that carries rank 0's outcome: an
    exception on rank 0 is raised on every rank, and ``on_epoch_end``'s request to stop
    reaches every rank.  Every other attribute (``state_dict``, ``last_checkpoint``, ...)
    is the wrapped callback's.
    """

    def __init__(self, callback: Callback):
        self.callback = callback

    def __getattr__(self, name):
        if name == "callback":
            raise AttributeError(name)
        return getattr(self.callback, name)

    def _call(self, method: str, state):
        what = f"run {type(self.callback).__name__}.{method}"
        return env.on_main(lambda: getattr(self.callback, method)(state), what, share=True)

    on_train_begin = partialmethod(_call, "on_train_begin")
    on_epoch_begin = partialmethod(_call, "on_epoch_begin")
    on_epoch_end = partialmethod(_call, "on_epoch_end")
    on_train_end = partialmethod(_call, "on_train_end")


def _param_ids(module: nn.Module) -> list[int]:
    return [id(p) for p in module.parameters()]


class DataParallelStep(TrainingStep):
    """:func:`~twodg_pyro.infer.fit`'s step on every rank of a process group (see the
    module docstring); without a group, the same loop in one process.

    Args:
        seed: seeds the shuffling, the guide's noise and the callbacks' randomness.
        noise: ``"independent"`` or ``"shared"`` (see :func:`fit_distributed`).
        device: where the minibatches go (and the GPU DDP uses).
        ddp_options: keyword arguments for ``DistributedDataParallel``.
    """

    def __init__(
        self,
        seed: int = 0,
        noise: str = "independent",
        device: torch.device | str | None = None,
        ddp_options: Mapping | None = None,
    ):
        super().__init__()
        if noise not in _NOISE:
            raise ValueError(f"noise must be one of {list(_NOISE)}, got {noise!r}")
        self.seed, self.noise = int(seed), noise
        self.device = torch.device(device) if device is not None else None
        self.ddp_options = ddp_options
        self.rank, self.world = env.get_rank(), env.get_world_size()
        self.is_main = self.rank == 0
        self._sums: torch.Tensor | None = None
        self._keys: list[str] = []

    def start(self, state: TrainState) -> None:
        """Wrap the ELBO module in DDP; the callbacks' seed."""
        self.module = ELBOTermsModule(state.model, state.guide, state.elbo)
        self.wrapped = _wrap(self.module, self.device, self.ddp_options)
        self.ids = _param_ids(self.module)
        _seed_common(self.seed, state.epoch, 1)

    def before_epoch(self, state: TrainState) -> None:
        self._epoch = state.epoch
        _seed_common(self.seed, self._epoch, 2)

    def batches(self, data: Iterable, state: TrainState, device) -> Iterator[tuple]:
        """This rank's shard of the epoch (``data``: a :class:`ShardedLoader`), the guide's
        noise seeded per rank and epoch (``independent``) or per step (``shared``)."""
        self._sums, self._n = None, 0
        epoch = state.epoch
        data.set_epoch(epoch)
        if self.noise == "independent":
            torch.manual_seed(_derive_seed(self.seed, 3, epoch, self.rank))
        dev = self.device
        for j, batch in enumerate(data):
            if self.noise == "shared":
                torch.manual_seed(_derive_seed(self.seed, 4, epoch, j))
            yield tuple(b.to(dev) if dev is not None else b for b in batch[:2])

    def loss_terms(self, state: TrainState, x, y) -> tuple[torch.Tensor, dict]:
        return self.wrapped(x, y)

    def add(self, state: TrainState, loss, terms: Mapping, callbacks: Sequence) -> None:
        """All-reduce the loss and its terms (one small vector, before the backward pass:
        a NaN on any rank stops every rank) and add their global means."""
        self._keys = keys = sorted(terms)
        local = torch.stack([loss.detach().reshape(())] + [terms[k].detach() for k in keys])
        glob = env.all_reduce_sum(local.to(torch.float64)) / self.world
        if not bool(torch.isfinite(glob).all()):
            names = ["loss", *keys]
            bad = {k: v for k, v in zip(names, local.tolist(), strict=True) if not math.isfinite(v)}
            raise FloatingPointError(
                f"loss is not finite at epoch {state.epoch}, step {state.step} (rank {self.rank}); "
                f"global mean terms {dict(zip(names, glob.tolist(), strict=True))}; "
                f"non-finite terms on this rank: {bad or 'none (another rank)'}; "
                f"last good epoch: {state.epoch - 1}"
            )
        self._sums = glob if self._sums is None else self._sums + glob
        self._n += 1

    def epoch_means(self) -> dict[str, float] | None:
        if self._sums is None:
            return None
        means = (self._sums / max(self._n, 1)).tolist()
        return {"loss": means[0], **dict(zip(self._keys, means[1:], strict=True))}

    def end_epoch(self, state: TrainState) -> None:
        """Average the model's buffers over the ranks; the callbacks' seed."""
        average_buffers(state.model)
        _seed_common(self.seed, self._epoch, 5)

    def after_callbacks(self, state: TrainState, callbacks: Sequence[Callback]) -> None:
        """Check that the ranks agree; wrap anew when a hook replaced parameters."""
        env.check_same_across_ranks(
            torch.cat(
                [state_checksum(state.model, state.guide), torch.tensor([float(state.stop)])]
            ),
            f"the model and guide state after epoch {self._epoch} (callbacks: "
            f"{[type(c).__name__ for c in callbacks]})",
        )
        new_ids = _param_ids(self.module)
        if new_ids != self.ids:  # a hook replaced parameters: a new DDP reducer over them
            del self.wrapped
            self.wrapped = _wrap(self.module, self.device, self.ddp_options, sync=False)
            self.ids = new_ids

    def before_train_end(self, state: TrainState) -> None:
        _seed_common(self.seed, state.epoch, 6)

    def finish(self, state: TrainState) -> None:
        env.barrier()


def fit_distributed(
    model: nn.Module,
    guide: nn.Module,
    data: Dataset | ShardedLoader,
    epochs: int,
    *,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    noise: str = "independent",
    ddp_options: Mapping | None = None,
    **fit_kwargs,
) -> TrainState:
    """Train ``guide`` (and the model's deterministic parameters) by SVI on every rank:
    :func:`~twodg_pyro.infer.fit` with a :class:`DataParallelStep`.

    Every rank calls it with the same arguments (see the module docstring for the
    loss each rank computes).  Without a process group it is a single-process loop
    with the same sampler, seeds and history.

    Args:
        model, guide: as :func:`~twodg_pyro.infer.fit`; ``model.likelihood.dataset_size``
            is the size of the *whole* training set.
        data: the whole training ``Dataset`` (each rank reads its shard through a
            ``DistributedSampler``), or a :class:`ShardedLoader`.
        epochs: total number of epochs (a resumed ``state`` continues up to it).
        batch_size: the global batch (all ranks together) when ``data`` is a Dataset;
            it must be a multiple of the world size.
        device: as ``fit``, and the GPU DDP uses.
        fit_kwargs: ``fit``'s ``lr``, ``elbo``, ``optimizer``, ``clip_norm``, ``progress``,
            ``state`` and ``callbacks``.  The callbacks run on every rank (under a seed
            common to all ranks) and must leave every rank in the same state: wrap a
            callback that writes files in :class:`MainOnly`.
        seed: seeds the shuffling, the guide's noise and the callbacks' randomness.
        noise: ``"independent"`` (each rank its own weight draw) or ``"shared"`` (every
            rank the same draw per step: the result is that of one process on the
            global batch, up to floating-point summation order).
        ddp_options: keyword arguments for ``DistributedDataParallel`` over the defaults
            ``static_graph=True`` and no buffer broadcast in forward; e.g.
            ``{"static_graph": False, "find_unused_parameters": True}`` for a model whose
            set of used parameters changes from step to step.

    Raises:
        ValueError: bad settings, e.g. a batch size the world size does not divide
            (the same message on every rank, before any communication).
        FloatingPointError: the loss became non-finite on some rank (every rank raises).
        RuntimeError: the ranks' parameters diverged, or a collective timed out.
    """
    step = DataParallelStep(seed, noise, device, ddp_options)
    if isinstance(data, ShardedLoader):
        loader = data
        if batch_size is not None and batch_size != loader.global_batch_size:
            raise ValueError(
                f"batch_size={batch_size} differs from the loader's global batch "
                f"{loader.global_batch_size}"
            )
    else:
        if batch_size is None:
            raise ValueError("batch_size (the global batch) is required when data is a Dataset")
        loader = ShardedLoader(data, batch_size, seed=seed)
    return fit(model, guide, loader, epochs, device=device, step=step, **fit_kwargs)
