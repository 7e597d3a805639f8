"""Where the pipeline's stages run: in one process, or on every rank of a process group.

:func:`~twodg_pyro.pipeline.run` is the one orchestration of Algorithm 1; what differs
between a plain run and a data-parallel one under ``torchrun`` (the training functions,
the data their loops iterate, predictions, stage 2's mixture and the ranks' agreement
on it, the fields of every record) is injected as an :class:`Execution`.  This module
holds the single-process one (the default);
:class:`~twodg_pyro.pipeline.runtime.data_parallel.DataParallel` is the multi-process one (its
module lists how each piece differs).  Files are written the same way by both: through
:func:`~twodg_pyro.distributed.env.on_main` and
:class:`~twodg_pyro.distributed.MainOnly`, which run on rank 0 only and are plain calls
in one process.
"""

from __future__ import annotations

from ...baselines import train_deterministic
from ...infer import fit


class Execution:
    """One process: the plain training loop on the seeded loader (the default).

    Subclasses (:class:`~twodg_pyro.pipeline.runtime.data_parallel.DataParallel`) override the
    pieces that run differently on several processes.
    """

    #: the mixture class of stage 2 (``None``: :func:`~twodg_pyro.sharing.build_sharing`'s
    #: default, :class:`~twodg_pyro.gmm.GaussianMixture2D`).
    mixture = None

    def check(self, cfg, resume: bool = False) -> None:
        """Raise ``ValueError`` for settings this execution cannot run: none here."""

    def configure(self, cfg):
        """The settings the run uses (e.g. this rank's GPU); ``cfg`` itself here."""
        return cfg

    def shard(self, loader, seed: int):
        """The data the training loops iterate for the seeded ``loader``: ``loader``."""
        return loader

    def fit(self, model, guide, data, epochs: int, *, seed: int, **kwargs):
        """SVI (:func:`~twodg_pyro.infer.fit`; ``seed`` is the loader's and unused here)."""
        return fit(model, guide, data, epochs=epochs, **kwargs)

    def train_deterministic(
        self, net, data, epochs: int, lr: float, *, device, progress: bool, **recipe
    ):
        """Train the deterministic network ``net`` in place on ``data`` (``recipe``: the
        optimiser settings of :func:`~twodg_pyro.baselines.train_deterministic`)."""
        return train_deterministic(
            net, data, epochs, lr, device=device, progress=progress, **recipe
        )

    def predict(self, fn, eval_data, device):
        """``fn(eval_data)``: the predictions of the whole evaluation set."""
        return fn(eval_data)

    def seed_common(self, seed: int) -> None:
        """Before a step every rank must take alike (stage 2): nothing to align here."""

    def agree(self, structure):
        """The sharing structure every rank uses: ``structure``."""
        return structure

    def record_fields(self) -> dict:
        """Fields added to every record of the results table: none."""
        return {}


#: The single-process execution.
LOCAL = Execution()
