r"""The checkpoint file: what it holds, writing it and reading it back.

The :class:`~twodg_pyro.infer.checkpoint.Checkpoint` callback writes, every ``every``
epochs and after the last one, one file holding everything
:func:`~twodg_pyro.infer.fit` needs to continue exactly where it was
(:func:`~twodg_pyro.infer.checkpoint.checkpoint_payload` builds its content from the
training state, :func:`~twodg_pyro.infer.checkpoint.restore_state` rebuilds the state
from it; this module is the file alone, and imports nothing of the library above
:mod:`twodg_pyro.files`):

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

Files are written with :func:`~twodg_pyro.files.atomic.atomic_torch_save` (temporary file in
the same folder, ``fsync``, rename), so a run killed at any moment leaves either the
previous complete checkpoint or the new one, never half a file; they load with
``torch.load(weights_only=True)`` (:func:`load_checkpoint`), so no code runs on loading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .payload import PayloadFormat, payload_section, read_payload, write_payload

__all__ = [
    "CHECKPOINT_FORMAT_VERSION",
    "CHECKPOINT_KIND",
    "CheckpointData",
    "load_checkpoint",
    "write_checkpoint",
]

#: 2: with a content checksum (1, without one, is refused)
CHECKPOINT_FORMAT_VERSION = 2
#: the header's ``kind`` of a checkpoint
CHECKPOINT_KIND = "twodg_pyro.Checkpoint"
_FORMAT = PayloadFormat(
    kind=CHECKPOINT_KIND,
    version=CHECKPOINT_FORMAT_VERSION,
    noun="a twodg_pyro checkpoint",
    header_noun="the checkpoint header",
    kind_noun="a twodg_pyro checkpoint",
    version_noun="checkpoint format version",
    older="an earlier twodg_pyro wrote it; run the stage again (it cannot be resumed)",
    finite_prefixes=("model/", "guide/", "structure/", "optimizer"),
)


#: Seal a checkpoint's payload with its checksum and write it atomically.
write_checkpoint = write_payload


# ---------------------------------------------------------------------- loading
_T = TypeVar("_T")


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
        <twodg_pyro.sharing.SharingStructure.from_payload>`: the file knows no guide), or
        ``None`` when the checkpoint has none.

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
