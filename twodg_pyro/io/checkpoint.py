r"""The checkpoint file: what it holds, writing it and reading it back.

The :class:`~twodg_pyro.infer.checkpoint.Checkpoint` callback writes, every ``every``
epochs and after the last one, one file holding everything
:func:`~twodg_pyro.infer.fit` needs to continue exactly where it was
(:func:`~twodg_pyro.infer.checkpoint.restore_state` rebuilds the training state from it):

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
  (:mod:`twodg_pyro.io.integrity`): a checkpoint whose content changed after it was
  written (one flipped byte) is refused on load, as is one with NaN/inf parameters or
  optimiser state.  Checkpoints of format version 1 (before the checksum) still load,
  with an :class:`~twodg_pyro.io.payload.UnverifiedFileWarning`.

Files are written with :func:`~twodg_pyro.io.files.atomic_torch_save` (temporary file in
the same folder, ``fsync``, rename), so a run killed at any moment leaves either the
previous complete checkpoint or the new one, never half a file; they load with
``torch.load(weights_only=True)`` (:func:`load_checkpoint`), so no code runs on loading.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..guide import BNNGuide
from ..rng import capture_rng
from .payload import PayloadFormat, payload_section, read_payload, write_payload

__all__ = [
    "CHECKPOINT_FORMAT_VERSION",
    "CheckpointData",
    "callback_keys",
    "checkpoint_payload",
    "load_checkpoint",
    "optimizer_layout",
    "site_list",
    "write_checkpoint",
]

#: 2: with a content checksum; 1 (no checksum) is still read, unverified.
CHECKPOINT_FORMAT_VERSION = 2
_KIND = "twodg_pyro.Checkpoint"
_FORMAT = PayloadFormat(
    kind=_KIND,
    version=CHECKPOINT_FORMAT_VERSION,
    noun="a twodg_pyro checkpoint",
    header_noun="the checkpoint header",
    kind_noun="a twodg_pyro checkpoint",
    version_noun="checkpoint format version",
    legacy_versions=(1,),
    finite_prefixes=("model/", "guide/", "structure/", "optimizer"),
)


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
        "kind": _KIND,
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
        "tying": guide.tying if isinstance(guide, BNNGuide) else None,
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
    structure = guide.structure() if isinstance(guide, BNNGuide) else None
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


def write_checkpoint(payload: dict, path: str | Path) -> None:
    """Seal ``payload`` with its checksum and write it atomically to ``path``."""
    write_payload(payload, path)


# ---------------------------------------------------------------------- loading
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

    def structure(self):
        """The saved :class:`~twodg_pyro.sharing.SharingStructure`, or ``None``."""
        from ..sharing.structure import SharingStructure

        sec = self.section("structure/")
        if not sec:
            return None
        try:
            return SharingStructure.from_payload(sec)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"checkpoint {self.path!r}: bad sharing structure: {e}") from e


def load_checkpoint(path: str | Path, stage: str | None = None) -> CheckpointData:
    """Read a checkpoint without executing code.

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
