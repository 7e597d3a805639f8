"""Checkpoints of a pipeline run, and resuming a killed run (``--resume RUN_DIR``).

With ``checkpoint_every = E > 0`` a run writes, in ``RUN_DIR/checkpoints/`` (each file
replaced atomically; the file format: :mod:`twodg_pyro.infer.checkpoint`):

* ``config.json``: the run's settings (written when the run starts; ``--resume`` reads
  it);
* ``stage1.pt``: the mean-field BNN being trained (every ``E`` epochs and after the
  last), with the records of the methods already finished (the deterministic
  baseline);
* ``stage3.pt``: the shared-GMM BNN being trained (every ``E`` epochs and after the
  last), with its current sharing structure, the hook states, the stage-2 report and
  the records of the methods already finished (deterministic, mean-field).

Resuming continues from the latest checkpoint: a ``stage3.pt`` continues stage 3; a
``stage1.pt`` continues stage 1 and then runs stages 2 and 3 from it.  What is
*recomputed* rather than restored, because it is cheap and deterministic given the
seed: loading and splitting the data, building the network; the deterministic
baseline when the run was killed before the first stage-1 checkpoint (then the whole
run restarts from the seed); stage 2 (outliers, mixture, merging, ellipses: it is
recomputed only when resuming from stage 1, as the stage-3 checkpoint holds its
result); the methods after ``2dg`` (``rank1``, ``ssvi``, each seeded on its own).  All
random states (torch, NumPy, Python, the data loaders' shuffling generators) are
restored with each checkpoint, so on CPU a resumed run ends with exactly the results
of an uninterrupted one (timings aside).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...files.atomic import atomic_write_text
from ...infer.checkpoint import Checkpoint, CheckpointData, load_checkpoint
from ..settings.config import ConfigError, RunConfig, config_from_dict
from ..settings.presets import merge_settings

#: Stages with checkpoints, latest first.
STAGES = ("stage3", "stage1")
#: Settings a resumed run may change: where and how visibly it runs, and what it computes
#: after its results (a run saved on a GPU resumes on the CPU and back); the fast step
#: computes the traced step's loss and gradients.
_IGNORED = ("progress", "device", "checkpoint_every", "diagnostics", "fast_step")


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        if not prefix and k in _IGNORED:
            continue
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} (checkpoint) vs {vb!r} (given)")
    return out


def load_run_config(run_dir: str | Path, overrides: dict | None = None) -> RunConfig:
    """The settings a checkpointed run was started with (``--resume``), with
    ``overrides`` (e.g. ``progress``, ``device``) applied.

    Raises:
        FileNotFoundError: ``run_dir`` has no ``checkpoints/config.json``.
        ConfigError: the stored settings are unreadable.
    """
    path = Path(run_dir) / "checkpoints" / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"cannot resume {str(run_dir)!r}: no {path.name} in {str(path.parent)!r} (was the "
            "run started with checkpoint_every > 0?)"
        )
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{str(path)!r} is not valid JSON: {e}") from e
    return config_from_dict(merge_settings(values, overrides or {}))


def _with_defaults(values: dict) -> dict:
    """Stored settings with the defaults of settings added since they were written (so
    that a checkpoint of an older version compares equal), or as they are if unreadable."""
    try:
        return config_from_dict(values).to_dict()
    except (TypeError, ValueError):  # ConfigError included
        return values


def _refuse_other_settings(stored: dict, cfg: RunConfig, what: str) -> None:
    diff = _differences(stored, cfg.to_dict())
    if diff:
        raise ConfigError(f"{what} with other settings: " + "; ".join(diff))


class RunCheckpoints:
    """The checkpoint folder of one run.

    Args:
        run_dir: the run's output folder (``None``: no checkpoints).
        cfg: the run's settings.
        resume: continue from the checkpoints found there; otherwise any checkpoints
            of an earlier run in that folder are removed when the run starts (which
            :func:`~twodg_pyro.pipeline.run` allows only with ``overwrite``).
    """

    def __init__(self, run_dir: str | Path | None, cfg: RunConfig, resume: bool = False):
        self.cfg = cfg
        self.every = int(getattr(cfg, "checkpoint_every", 0) or 0)
        self.dir = Path(run_dir) / "checkpoints" if run_dir is not None else None
        self.resume = bool(resume)
        if self.resume and self.dir is None:
            raise ValueError("resuming needs the run folder")
        self._loaded: dict[str, CheckpointData | None] = {}

    @property
    def enabled(self) -> bool:
        return self.dir is not None and self.every > 0

    def path(self, stage: str) -> Path:
        return self.dir / f"{stage}.pt"

    def start(self) -> None:
        """Called once the run's inputs are validated: a fresh run clears old checkpoints
        and writes ``config.json``; a resumed run checks the settings (the
        :class:`~twodg_pyro.pipeline.runtime.run_folder.RunFolder` removed temporary files)."""
        if self.dir is None:
            return
        if self.resume:
            stored = load_run_config(self.dir.parent).to_dict()
            _refuse_other_settings(stored, self.cfg, f"cannot resume {str(self.dir.parent)!r}")
            return
        if not self.enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for stage in STAGES:
            self.path(stage).unlink(missing_ok=True)
        atomic_write_text(
            self.dir / "config.json", json.dumps(self.cfg.to_dict(), indent=2, sort_keys=True)
        )

    def load(self, stage: str) -> CheckpointData | None:
        """The checkpoint of ``stage`` when resuming and one exists, else ``None``."""
        if not self.resume or self.dir is None:
            return None
        if stage not in self._loaded:
            path = self.path(stage)
            ckpt = load_checkpoint(path, stage=stage) if path.is_file() else None
            if ckpt is not None and ckpt.config is not None:
                what = f"checkpoint {str(path)!r} belongs to a run"
                _refuse_other_settings(_with_defaults(ckpt.config), self.cfg, what)
            self._loaded[stage] = ckpt
        return self._loaded[stage]

    def latest(self) -> str | None:
        """The latest stage with a checkpoint to resume from, or ``None``."""
        for stage in STAGES:
            if self.load(stage) is not None:
                return stage
        return None

    def callback(self, stage: str, callbacks=(), generators=(), extra=None) -> Checkpoint | None:
        """A :class:`~twodg_pyro.infer.checkpoint.Checkpoint` for ``stage``, or ``None`` when
        checkpoints are off."""
        if not self.enabled:
            return None
        config = self.cfg.to_dict()
        cb = Checkpoint(self.path(stage), self.every, stage, callbacks, generators, config, extra)
        ckpt = self._loaded.get(stage)
        cb.last_saved = (str(self.path(stage)), ckpt.epoch) if ckpt is not None else None
        return cb
