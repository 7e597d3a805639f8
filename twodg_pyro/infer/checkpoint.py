r"""Training checkpoints that survive a kill, and resuming from them, beside the loop
they resume.  A :class:`Checkpoint` callback writes, every ``every`` epochs and after the
last one, one file holding everything :func:`~twodg_pyro.infer.fit` needs to continue
exactly where it was (:func:`checkpoint_payload`), atomically (a run killed at any moment
leaves the previous checkpoint or the new one, never half a file); :func:`load_checkpoint`
reads it back without executing code (``torch.load(weights_only=True)``),
:func:`restore_state` rebuilds the :class:`~twodg_pyro.infer.TrainState` from it and
:func:`resume_fit` continues ``fit``.  Put the :class:`Checkpoint` *last* in the callback
list so that it sees the epoch after every other callback (refinement hooks, annealing).

The file (the container of :mod:`twodg_pyro.files.payload`):

* ``header`` (JSON): kind, ``format_version``, stage name, epoch, step, epochs, the
  KL weight ``beta``, the learning rates, the guide and optimiser classes, the
  model's sites, the names of the optimised parameters in optimiser order, the
  per-epoch history, and the run config and any ``extra`` record the caller adds;
* ``model/<name>``: the model's state (the network's deterministic parts, e.g.
  BatchNorm parameters and running statistics);
* ``guide/<name>``: the guide's parameters and buffers, and for a shared-GMM guide its
  current :class:`~twodg_pyro.sharing.SharingStructure` under ``structure/<name>``
  (merges change the number of components, so the structure is needed to rebuild
  parameters of the right shape);
* ``optimizer``: ``optimizer.state_dict()`` (parameters by their index in the
  optimiser's groups; the header names each index, checked on restore);
* ``callbacks``: each callback's ``state_dict()`` (merge/reassignment hooks, ...);
* ``rng/...``: the torch (and CUDA) RNG, NumPy's and Python's ``random`` states, and
  the states of the data loaders' generators (shuffling order; :mod:`twodg_pyro.rng`);
* ``checksum``: ``"sha256:..."``, the content digest of everything above
  (:mod:`twodg_pyro.files.integrity`): a checkpoint whose content changed after it was
  written (one flipped byte) is refused on load, as is one with NaN/inf parameters or
  optimiser state.  A checkpoint of another format version (version 1, before the
  checksum, included) is refused with a ``ValueError`` naming it and its version.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from ..files.payload import PayloadFormat, payload_section, read_payload, write_payload
from ..guide import SharingGuide
from ..rng import capture_rng, loader_generators, restore_rng
from .callbacks import Callback
from .elbo import DecomposedELBO
from .optim import build_optimizer
from .state import TrainState
from .trainer import fit

_FORMAT = PayloadFormat(
    kind="twodg_pyro.Checkpoint",
    version=2,  # with a content checksum (1, without one, is refused)
    kind_noun="a twodg_pyro checkpoint",
    version_noun="checkpoint format version",
    older="an earlier twodg_pyro wrote it; run the stage again (it cannot be resumed)",
    finite_prefixes=("model/", "guide/", "structure/", "optimizer"),
)
_T = TypeVar("_T")


def _optimizer_layout(optimizer: torch.optim.Optimizer, model, guide) -> list[list]:
    """``[[group name, [[param name, shape], ...]], ...]`` in optimiser order."""
    names = {id(p): f"guide.{n}" for n, p in guide.named_parameters()}
    names.update({id(p): f"model.{n}" for n, p in model.named_parameters()})
    return [
        [str(g.get("name", i)), [[names.get(id(p), "?"), list(p.shape)] for p in g["params"]]]
        for i, g in enumerate(optimizer.param_groups)
    ]


def _sites(model) -> list[list]:
    return [[s.name, list(s.shape)] for s in model.sites]


def _json_default(obj):
    if torch.is_tensor(obj) or isinstance(obj, np.generic):
        return obj.tolist()
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _cpu(obj):
    if torch.is_tensor(obj):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def _callback_keys(callbacks: Mapping | Sequence) -> list[tuple]:
    """``[(key, callback), ...]``: a mapping's items, or ``"<index>:<class name>"`` keys."""
    if isinstance(callbacks, Mapping):
        return list(callbacks.items())
    return [(f"{i}:{type(cb).__name__}", cb) for i, cb in enumerate(callbacks)]


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
    a list keyed by position and class, or a mapping) and the random states, the data
    loaders' ``generators`` included (:func:`~twodg_pyro.rng.capture_rng`)."""
    model, guide = state.model, state.guide
    header = {
        "kind": _FORMAT.kind,
        "format_version": _FORMAT.version,
        "stage": stage,
        "epoch": int(state.epoch),
        "step": int(state.step),
        "epochs": int(state.epochs),
        "beta": float(state.elbo.beta),
        "lr": state.lr,
        "stop": bool(state.stop),
        "complete": bool(state.epoch >= state.epochs or state.stop),
        "guide_class": type(guide).__name__,
        "tying": guide.tying if isinstance(guide, SharingGuide) else None,
        "optimizer_class": type(state.optimizer).__name__,
        "optimizer_layout": _optimizer_layout(state.optimizer, model, guide),
        "sites": _sites(model),
        "history": state.history,
        "config": config,
        "extra": extra if extra is not None else {},
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    payload: dict = {"header": json.dumps(header, default=_json_default)}
    payload.update({f"model/{k}": v for k, v in _cpu(model.state_dict()).items()})
    payload.update({f"guide/{k}": v for k, v in _cpu(guide.state_dict()).items()})
    structure = guide.structure() if isinstance(guide, SharingGuide) else None
    if structure is not None:
        payload.update({f"structure/{k}": v for k, v in structure.to_payload().items()})
    payload["optimizer"] = _cpu(state.optimizer.state_dict())
    payload["callbacks"] = {k: cb.state_dict() for k, cb in _callback_keys(callbacks)}
    payload["rng"] = capture_rng(generators)
    return payload


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
        self.last_saved = (str(self.path), -1) if self.path.is_file() else None

    def save(self, state) -> Path:
        """Write the checkpoint of ``state`` now."""
        extra = self.extra() if callable(self.extra) else self.extra
        payload = checkpoint_payload(
            state, self.stage, self.callbacks, self.generators, self.config, extra
        )
        write_payload(payload, self.path)
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


@dataclass
class CheckpointData:
    """A loaded checkpoint: its header and tensors (see the module docstring)."""

    path: str
    header: dict
    payload: dict = field(repr=False)

    @property
    def stage(self) -> str:
        return self.header["stage"]

    @property
    def epoch(self) -> int:
        return int(self.header["epoch"])

    @property
    def complete(self) -> bool:
        return bool(self.header.get("complete"))

    @property
    def config(self) -> dict | None:
        return self.header.get("config")

    @property
    def extra(self) -> dict:
        return self.header.get("extra") or {}

    def section(self, prefix: str) -> dict:
        return payload_section(self.payload, prefix)

    @property
    def has_structure(self) -> bool:
        """Whether the checkpoint holds a sharing structure (a shared-GMM guide's)."""
        return bool(self.section("structure/"))

    def structure(self, decode: Callable[[dict], _T]) -> _T | None:
        """The saved sharing structure decoded by ``decode`` (its ``structure/`` section
        in, e.g. :meth:`SharingStructure.from_payload
        <twodg_pyro.sharing.SharingStructure.from_payload>`), or ``None`` when the
        checkpoint has none.

        Raises:
            ValueError: ``decode`` refuses the section (naming the checkpoint).
        """
        sec = self.section("structure/")
        if not sec:
            return None
        try:
            return decode(sec)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"checkpoint {self.path!r}: bad sharing structure: {e}") from e


def load_checkpoint(path: str | Path, stage: str | None = None) -> CheckpointData:
    """Read a checkpoint without executing code (``torch.load(weights_only=True)``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: truncated, corrupted or foreign file (a pickle with code, another
            kind of file), another format version, or another stage than ``stage``.
    """
    payload, header = read_payload(path, _FORMAT)
    where = str(path)
    missing = [k for k in ("optimizer", "callbacks", "rng") if k not in payload]
    if missing:
        raise ValueError(f"{where!r} is an incomplete checkpoint: missing {missing}")
    if stage is not None and header.get("stage") != stage:
        raise ValueError(
            f"{where!r} is a checkpoint of stage {header.get('stage')!r}, expected {stage!r}"
        )
    return CheckpointData(where, header, payload)


def _load_module(module: nn.Module, state: dict, what: str, where: str) -> None:
    mine = module.state_dict()
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)}, here {tuple(v.shape)}"
        for k, v in mine.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    differences = (
        ("missing", set(mine) - set(state)),
        ("unexpected", set(state) - set(mine)),
        ("shape mismatch", wrong),
    )
    parts = [f"{label} {sorted(keys)[:5]}" for label, keys in differences if keys]
    if parts:
        raise ValueError(
            f"checkpoint {where!r} was written for another {what}: " + "; ".join(parts)
        )
    module.load_state_dict(state)


def _check_same(where: str, what: str, saved, here) -> None:
    if saved != here:
        raise ValueError(f"checkpoint {where!r} was written with {what} {saved!r}, here {here!r}")


def _short(layout) -> str:
    return ", ".join(f"{g}: {len(ps)} tensors" for g, ps in layout) if layout else "nothing"


def restore_state(
    ckpt: CheckpointData | str | Path,
    model: nn.Module,
    guide: nn.Module,
    lr,
    optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
    elbo=None,
    callbacks: Mapping[str, Callback] | Sequence[Callback] = (),
    generators: Sequence = (),
    epochs: int | None = None,
):
    """A :class:`~twodg_pyro.infer.TrainState` rebuilt from a checkpoint, ready for
    ``fit(..., state=state)``.

    ``model`` and ``guide`` must be built the same way as when the checkpoint was
    written (same network and, for a shared-GMM guide, any structure: the saved one is
    adopted first).  Restores the model and guide state, the optimiser state (checked
    parameter by parameter), ``callbacks`` (same keys as when saved), the ELBO's
    ``beta``, the history, and every random state including the data loaders'
    ``generators``.

    Raises:
        ValueError: the checkpoint belongs to another network, guide or optimiser, naming
            what differs.
    """
    if not isinstance(ckpt, CheckpointData):
        ckpt = load_checkpoint(ckpt)
    h, where = ckpt.header, ckpt.path
    sites = _sites(model)
    if h.get("sites") != sites:
        saved = h.get("sites") or []
        n_saved = sum(int(np.prod(s)) for _, s in saved)
        n_here = sum(int(np.prod(s)) for _, s in sites)
        raise ValueError(
            f"checkpoint {where!r} was written for another network: {len(saved)} Bayesian "
            f"sites with {n_saved} weights (first {saved[:1]}), this network has {len(sites)} "
            f"sites with {n_here} weights (first {sites[:1]})"
        )
    _check_same(where, "a guide of class", h.get("guide_class"), type(guide).__name__)
    tying = guide.tying if isinstance(guide, SharingGuide) else None
    _check_same(where, "tying", h.get("tying"), tying)
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

    opt = build_optimizer(model, guide, lr, optimizer)
    layout = _optimizer_layout(opt, model, guide)
    if layout != h.get("optimizer_layout"):
        raise ValueError(
            f"checkpoint {where!r}: the optimiser's parameters differ from the saved ones "
            f"(saved {_short(h.get('optimizer_layout'))}, here {_short(layout)})"
        )
    _check_same(where, "an optimiser of class", h.get("optimizer_class"), type(opt).__name__)
    opt.load_state_dict(ckpt.payload["optimizer"])

    elbo = elbo if elbo is not None else DecomposedELBO()
    elbo.beta = float(h.get("beta", elbo.beta))
    total = int(h["epochs"]) if epochs is None else int(epochs)
    state = TrainState(model, guide, elbo, opt, lr, total, make_optimizer=optimizer)
    state.epoch, state.step = int(h["epoch"]), int(h["step"])
    state.stop = bool(h.get("stop", False))  # e.g. early stopping had fired
    state.history = [dict(r) for r in h.get("history", [])]
    saved_cbs = ckpt.payload["callbacks"]
    cbs = _callback_keys(callbacks)
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
    restore_rng(ckpt.payload["rng"], generators)
    return state


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
    optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.Adam,
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
    elbo = fit_kwargs.pop("elbo", None)
    state = restore_state(ckpt, model, guide, lr, optimizer, elbo, callbacks, generators, epochs)
    cbs = list(callbacks) + ([checkpoint] if checkpoint is not None else [])
    return fit(model, guide, data, state.epochs, lr=lr, callbacks=cbs, state=state, **fit_kwargs)
