"""What the methods of one run share: the :class:`RunContext` that
:func:`~twodg_pyro.pipeline.run` builds once (the data, the seeded initial network, the
training loader, checkpoints, where the stages run) and hands to every method of its
registry.  Stage 1 is trained once, on first request, and *returned* to the methods that
build on it (:meth:`RunContext.stage1`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from torch import nn

from ..evaluation import seeded_predict
from .algorithm1 import Runtime, stage1_mean_field
from .builders import seed_everything
from .config import RunConfig
from .execution import Execution
from .resume import RunCheckpoints
from .trained import RunArtifacts, Trained

__all__ = ["RunContext", "deterministic_recipe"]


@dataclass
class RunContext:
    """What the methods of one run share.

    Attributes:
        cfg: the settings; ``art``: what the run produced so far.
        execution: where the stages run; ``checkpoints``: the run's checkpoint folder,
            ``resume_from``: the stage it resumes from (``None``: a fresh run).
        net: the seeded initial network (every method copies it).
        loader: the seeded training loader of the deterministic network and its
            pretraining (they continue one shuffling stream).
        deterministic: the deterministic baseline once trained, with its epochs.
    """

    cfg: RunConfig
    art: RunArtifacts
    execution: Execution
    checkpoints: RunCheckpoints
    resume_from: str | None
    net: nn.Module
    loader: object
    deterministic: tuple[nn.Module, int] | None = None
    _stage1: tuple[Trained, float] | None = None

    @property
    def progress(self) -> bool:
        return self.runtime.progress

    @property
    def runtime(self) -> Runtime:
        """How the stages train (:class:`~twodg_pyro.pipeline.algorithm1.Runtime`)."""
        return Runtime(self.cfg, self.checkpoints, self.execution)

    def train_deterministic(self, epochs: int) -> tuple[nn.Module, float]:
        """A copy of :attr:`net` trained deterministically for ``epochs``; and seconds."""
        cfg = self.cfg
        det = copy.deepcopy(self.net)
        t0 = time.perf_counter()
        self.execution.train_deterministic(
            det,
            self.execution.shard(self.loader, cfg.seed),
            epochs,
            cfg.stage1.deterministic_lr,
            device=cfg.device,
            progress=self.progress,
            **deterministic_recipe(cfg),
        )
        return det, time.perf_counter() - t0

    def initial_network(self) -> nn.Module:
        """The network stage 1 starts from: pretrained for ``network.pretrain_epochs``
        (the deterministic baseline when it trained as long), else :attr:`net`.  A resumed
        run does not pretrain (its checkpoint holds the trained guide)."""
        epochs = self.cfg.network.pretrain_epochs
        if not epochs or self.resume_from is not None:
            return self.net
        if self.deterministic is not None and self.deterministic[1] == epochs:
            return self.deterministic[0]
        return self.train_deterministic(epochs)[0]

    def stage1(self) -> tuple[Trained, float]:
        """Stage 1 (:func:`~twodg_pyro.pipeline.algorithm1.stage1_mean_field`), trained
        once for the methods that need it, and its seconds."""
        if self._stage1 is None:
            net = self.initial_network()
            seed_everything(self.cfg.seed)
            t0 = time.perf_counter()
            trained = stage1_mean_field(
                self.runtime,
                self.art.split,
                copy.deepcopy(net),
                {"records": self.art.records},  # the live list: checkpoints see new rows
            )
            self._stage1 = (trained, time.perf_counter() - t0)
            self.art.mean_field = trained
        return self._stage1

    def predict(self, model, guide):
        """The run's seeded prediction of the evaluation data (:mod:`twodg_pyro.evaluation`)."""
        cfg = self.cfg
        return self.execution.predict(
            lambda d: seeded_predict(
                model, guide, d, cfg.num_samples, cfg.seed, progress=self.progress
            ),
            self.art.eval_data,
            cfg.device,
        )


def deterministic_recipe(cfg: RunConfig) -> dict:
    """The keyword arguments of :func:`~twodg_pyro.baselines.train_deterministic` beyond
    the learning rate: the optimiser and, for SGD, its schedule (``stage1.deterministic_*``)."""
    s1 = cfg.stage1
    return {
        "optimizer": s1.deterministic_optimizer,
        "momentum": s1.deterministic_momentum,
        "weight_decay": s1.deterministic_weight_decay,
        "milestones": tuple(s1.deterministic_milestones),
        "gamma": s1.deterministic_gamma,
        "warmup_epochs": s1.deterministic_warmup_epochs,
    }
