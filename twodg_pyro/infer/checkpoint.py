r"""Training checkpoints that survive a kill, and resuming from them: beside the loop
they resume.

A :class:`Checkpoint` callback writes, every ``every`` epochs and after the last one,
one file holding everything :func:`~twodg_pyro.infer.fit` needs to continue exactly
where it was: :func:`checkpoint_payload` takes it from the training state (the file's
format: :mod:`twodg_pyro.files.checkpoint`; the random states: :mod:`twodg_pyro.rng`);
:func:`restore_state` rebuilds the :class:`~twodg_pyro.infer.TrainState` from it, and
:func:`resume_fit` continues :func:`~twodg_pyro.infer.fit`.

Put the :class:`Checkpoint` *last* in the callback list so that it sees the epoch after
every other callback (refinement hooks, annealing) has run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..files.checkpoint import (
    CHECKPOINT_FORMAT_VERSION,
    CHECKPOINT_KIND,
    CheckpointData,
    load_checkpoint,
    write_checkpoint,
)
from ..guide import SharingGuide
from ..rng import capture_rng, loader_generators, restore_rng
from .callbacks import Callback
from .elbo import DecomposedELBO
from .optim import build_optimizer
from .state import TrainState
from .trainer import fit

__all__ = [
    "Checkpoint",
    "callback_keys",
    "checkpoint_payload",
    "optimizer_layout",
    "restore_state",
    "resume_fit",
    "site_list",
]


# ---------------------------------------------------------------------- payload
def _param_names(model: nn.Module, guide: nn.Module) -> dict[int, str]:
    names = {id(p): f"guide.{n}" for n, p in guide.named_parameters()}
    names.update({id(p): f"model.{n}" for n, p in model.named_parameters()})
    return names


def optimizer_layout(optimizer: torch.optim.Optimizer, model, guide) -> list[list]:
    """``[[group name, [[param name, shape], ...]], ...]`` in optimiser order."""
    names = _param_names(model, guide)
    return [
        [
            str(g.get("name", i)),
            [[names.get(id(p), "?"), list(p.shape)] for p in g["params"]],
        ]
        for i, g in enumerate(optimizer.param_groups)
    ]


def site_list(model) -> list[list]:
    """``[[site name, shape], ...]`` of the model's Bayesian sites, in order."""
    return [[s.name, list(s.shape)] for s in model.sites]


def _jsonable(obj):
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if torch.is_tensor(obj):
        return obj.tolist()
    if isinstance(obj, (np.generic,)):
        return obj.item()
    return obj


def checkpoint_payload(
    state,
    stage: str,
    callbacks: Mapping | Sequence = (),
    generators: Sequence = (),
    config: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """The dictionary a checkpoint holds for ``state`` (a
    :class:`~twodg_pyro.infer.TrainState`): ``callbacks`` (objects with ``state_dict()``,
    keyed by :func:`callback_keys` or given as a mapping) and the random states, the data
    loaders' ``generators`` included (:func:`~twodg_pyro.rng.capture_rng`)."""
    model, guide = state.model, state.guide
    header = {
        "kind": CHECKPOINT_KIND,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "stage": stage,
        "epoch": int(state.epoch),
        "step": int(state.step),
        "epochs": int(state.epochs),
        "beta": float(state.elbo.beta),
        "lr": _jsonable(state.lr),
        "stop": bool(state.stop),
        "complete": bool(state.epoch >= state.epochs or state.stop),
        "guide_class": type(guide).__name__,
        "tying": guide.tying if isinstance(guide, SharingGuide) else None,
        "optimizer_class": type(state.optimizer).__name__,
        "optimizer_layout": optimizer_layout(state.optimizer, model, guide),
        "sites": site_list(model),
        "history": _jsonable(state.history),
        "config": _jsonable(config) if config is not None else None,
        "extra": _jsonable(extra) if extra is not None else {},
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    payload: dict = {"header": json.dumps(header)}
    for k, v in model.state_dict().items():
        payload[f"model/{k}"] = v.detach().cpu().clone()
    for k, v in guide.state_dict().items():
        payload[f"guide/{k}"] = v.detach().cpu().clone()
    structure = guide.structure() if isinstance(guide, SharingGuide) else None
    if structure is not None:
        for k, v in structure.to_payload().items():
            payload[f"structure/{k}"] = v
    payload["optimizer"] = _cpu(state.optimizer.state_dict())
    cbs = callbacks.items() if isinstance(callbacks, Mapping) else callback_keys(callbacks)
    payload["callbacks"] = {k: cb.state_dict() for k, cb in cbs}
    payload["rng"] = capture_rng(generators)
    return payload


def _cpu(obj):
    if torch.is_tensor(obj):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_cpu(v) for v in obj)
    return obj


def callback_keys(callbacks: Sequence) -> list[tuple]:
    """Stable keys for a callback list: ``[("<index>:<class name>", callback), ...]``."""
    return [(f"{i}:{type(cb).__name__}", cb) for i, cb in enumerate(callbacks)]


class Checkpoint(Callback):
    """Write a resumable checkpoint every ``every`` epochs and after the last epoch.

    Args:
        path: the checkpoint file (replaced atomically each time).
        every: interval in epochs (>= 1).
        stage: a name stored in the file (``"stage1"``, ``"stage3"``, ...).
        callbacks: the *other* callbacks of the same ``fit`` whose state must be saved
            (a list, keyed by position and class, or a ``{key: callback}`` mapping).
        generators: data loaders (or ``torch.Generator`` objects) whose random state
            drives the batch order; restored on resume.
        config: the run's settings (a JSON-serialisable dict), stored for ``--resume``.
        extra: a dict, or a function returning one, stored with each checkpoint (e.g.
            the records of methods already finished).

    Attributes:
        last_saved: ``(path, epoch)`` of the last checkpoint written, or ``None``;
            :func:`~twodg_pyro.infer.fit` names it when the loss becomes NaN.
    """

    def __init__(
        self,
        path: str | Path,
        every: int = 1,
        stage: str = "train",
        callbacks: Mapping[str, Callback] | Sequence[Callback] = (),
        generators: Sequence = (),
        config: dict | None = None,
        extra: dict | Callable[[], dict] | None = None,
    ):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"checkpoint interval 'every' must be an integer >= 1, got {every!r}")
        self.path = Path(path)
        self.every = every
        self.stage = str(stage)
        self.callbacks = callbacks
        self.generators = list(generators)
        loader_generators(self.generators)  # fail early on an unseeded loader
        self.config = config
        self.extra = extra
        self.last_saved: tuple[str, int] | None = None
        if self.path.is_file():
            self.last_saved = (str(self.path), -1)

    def save(self, state) -> Path:
        """Write the checkpoint of ``state`` now."""
        extra = self.extra() if callable(self.extra) else self.extra
        payload = checkpoint_payload(
            state, self.stage, self.callbacks, self.generators, self.config, extra
        )
        write_checkpoint(payload, self.path)
        self.last_saved = (str(self.path), int(state.epoch))
        return self.path

    def on_epoch_end(self, state) -> None:
        if state.epoch % self.every == 0 or state.epoch >= state.epochs:
            self.save(state)

    def on_train_end(self, state) -> None:
        # stopped early (EarlyStopping, ...) between two scheduled checkpoints
        if self.last_saved is None or self.last_saved[1] != state.epoch:
            self.save(state)

    def last_checkpoint(self) -> str:
        """``"<path> (epoch e)"`` of the last checkpoint written, for error messages."""
        if self.last_saved is None:
            return "none written yet"
        path, epoch = self.last_saved
        return f"{path} (epoch {epoch})" if epoch >= 0 else f"{path} (from an earlier run)"


def _load_module(module: nn.Module, state: dict, what: str, where: str) -> None:
    mine = module.state_dict()
    missing = sorted(set(mine) - set(state))
    unexpected = sorted(set(state) - set(mine))
    wrong = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)}, here {tuple(mine[k].shape)}"
        for k in set(mine) & set(state)
        if tuple(state[k].shape) != tuple(mine[k].shape)
    )
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}")
        if wrong:
            parts.append(f"shape mismatch {wrong[:5]}")
        raise ValueError(
            f"checkpoint {where!r} was written for another {what}: " + "; ".join(parts)
        )
    module.load_state_dict(state)


def restore_state(
    ckpt: CheckpointData | str | Path,
    model: nn.Module,
    guide: nn.Module,
    lr,
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    elbo=None,
    callbacks: Mapping[str, Callback] | Sequence[Callback] = (),
    generators: Sequence = (),
    epochs: int | None = None,
    rng: bool = True,
    **optim_kwargs,
):
    """A :class:`~twodg_pyro.infer.TrainState` rebuilt from a checkpoint, ready for
    ``fit(..., state=state)``.

    ``model`` and ``guide`` must be built the same way as when the checkpoint was
    written (same network and, for a shared-GMM guide, any structure: the saved one is
    adopted first).  Restores the model and guide state, the optimiser state (checked
    parameter by parameter), ``callbacks`` (same keys as when saved), the ELBO's
    ``beta``, the history, and, with ``rng=True``, every random state including the
    data loaders' ``generators``.

    Raises:
        ValueError: the checkpoint belongs to another network, guide or optimiser, naming
            what differs.
    """
    if not isinstance(ckpt, CheckpointData):
        ckpt = load_checkpoint(ckpt)
    h, where = ckpt.header, ckpt.path
    sites = site_list(model)
    if h.get("sites") != sites:
        saved = h.get("sites") or []
        n_saved = sum(int(np.prod(s)) for _, s in saved)
        n_here = sum(int(np.prod(s)) for _, s in sites)
        raise ValueError(
            f"checkpoint {where!r} was written for another network: {len(saved)} Bayesian "
            f"sites with {n_saved} weights (first {saved[:1]}), this network has {len(sites)} "
            f"sites with {n_here} weights (first {sites[:1]})"
        )
    if h.get("guide_class") != type(guide).__name__:
        raise ValueError(
            f"checkpoint {where!r} holds a {h.get('guide_class')} guide, got a "
            f"{type(guide).__name__}"
        )
    tying = guide.tying if isinstance(guide, SharingGuide) else None
    if h.get("tying") != tying:
        raise ValueError(
            f"checkpoint {where!r} was written with tying {h.get('tying')!r}, the guide has "
            f"tying {tying!r}"
        )
    _load_module(model, ckpt.section("model/"), "network", where)
    if ckpt.has_structure:  # decoded by the class of the guide's own structure
        current = guide.structure() if isinstance(guide, SharingGuide) else None
        if current is None:
            raise ValueError(
                f"checkpoint {where!r} holds a sharing structure, the {type(guide).__name__} "
                "guide has none"
            )
        guide.load_structure(ckpt.structure(type(current).from_payload))
    _load_module(guide, ckpt.section("guide/"), "guide", where)

    opt = build_optimizer(model, guide, lr, optimizer, **optim_kwargs)
    layout = optimizer_layout(opt, model, guide)
    if layout != h.get("optimizer_layout"):
        raise ValueError(
            f"checkpoint {where!r}: the optimiser's parameters differ from the saved ones "
            f"(saved {_short(h.get('optimizer_layout'))}, here {_short(layout)})"
        )
    if h.get("optimizer_class") != type(opt).__name__:
        raise ValueError(
            f"checkpoint {where!r} holds {h.get('optimizer_class')} state, the optimiser is "
            f"{type(opt).__name__}"
        )
    opt.load_state_dict(ckpt.payload["optimizer"])

    elbo = elbo if elbo is not None else DecomposedELBO()
    elbo.beta = float(h.get("beta", elbo.beta))
    total = int(h["epochs"]) if epochs is None else int(epochs)
    state = TrainState(model, guide, elbo, opt, lr, total)
    state.epoch, state.step = int(h["epoch"]), int(h["step"])
    state.stop = bool(h.get("stop", False))  # e.g. early stopping had fired
    state.history = [dict(r) for r in h.get("history", [])]
    saved_cbs = ckpt.payload["callbacks"]
    cbs = callbacks.items() if isinstance(callbacks, Mapping) else callback_keys(callbacks)
    cbs = list(cbs)
    given = {k for k, _ in cbs}
    # a stateless callback (empty state_dict) need not have been saved
    unmatched = sorted(set(saved_cbs) - given) + sorted(
        k for k, cb in cbs if k not in saved_cbs and cb.state_dict()
    )
    if unmatched:
        raise ValueError(
            f"checkpoint {where!r} holds callback states {sorted(saved_cbs)}, the callbacks "
            f"given are {sorted(given)}: {unmatched} do not match"
        )
    for k, cb in cbs:
        if k in saved_cbs:
            cb.load_state_dict(saved_cbs[k])
    if rng:
        restore_rng(ckpt.payload["rng"], generators)
    return state


def _short(layout) -> str:
    if not layout:
        return "nothing"
    return ", ".join(f"{g}: {len(ps)} tensors" for g, ps in layout)


def resume_fit(
    ckpt: CheckpointData | str | Path,
    model: nn.Module,
    guide: nn.Module,
    data,
    epochs: int | None = None,
    lr=1e-3,
    callbacks: Sequence[Callback] = (),
    checkpoint: Checkpoint | None = None,
    generators: Sequence | None = None,
    optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
    **fit_kwargs,
):
    """Restore the state saved in ``ckpt`` and continue :func:`~twodg_pyro.infer.fit`.

    ``callbacks`` are the same callbacks as in the interrupted run (their state is
    restored from the checkpoint); ``checkpoint``, when given, keeps writing checkpoints
    and is appended last.  ``generators`` default to ``[data]`` when ``data`` has a
    seeded generator (a :func:`~twodg_pyro.data.make_loader` loader).
    """
    if generators is None:
        generators = [data] if getattr(data, "generator", None) is not None else []
    state = restore_state(
        ckpt,
        model,
        guide,
        lr,
        optimizer=optimizer,
        elbo=fit_kwargs.pop("elbo", None),
        callbacks=callbacks,
        generators=generators,
        epochs=epochs,
    )
    cbs = list(callbacks) + ([checkpoint] if checkpoint is not None else [])
    return fit(model, guide, data, state.epochs, lr=lr, callbacks=cbs, state=state, **fit_kwargs)
