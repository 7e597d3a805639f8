"""What the methods of one run share: :class:`RunContext`.

:func:`~twodg_pyro.pipeline.run` builds one (the data, the seeded initial network, the
training loader, checkpoints, where the stages run) and hands it to every method it runs
(:mod:`twodg_pyro.pipeline.methods`, one module per method); a method predicts, keeps
and records its trained method through it.  Stage 1 is trained once, on first request,
and returned to the methods that build on it
(:func:`~twodg_pyro.pipeline.methods.mean_field.stage1`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ...distributed import env
from ...infer.temperature import resolve_kl_weight
from ...metrics import classification_metrics
from ...prediction import Prediction
from ..outputs.results import size_mb
from .execution import LOCAL, Execution
from .trained import RunArtifacts


@dataclass(kw_only=True)
class RunContext:
    """The settings of a run and what its methods share; every stage and method takes it
    first, in place of these as parameters.

    Attributes:
        cfg: the settings (a :class:`~twodg_pyro.pipeline.settings.config.RunConfig`).
        checkpoints: the run's checkpoint folder (a
            :class:`~twodg_pyro.pipeline.runtime.resume.RunCheckpoints`; ``None``: none); with it
            a stage writes its checkpoints on rank 0 and continues from one when resuming.
        execution: where the SVI loops run (one process, or every rank).
        art: what the run produced so far.
        resume_from: the stage the run resumes from (``None``: a fresh run).
        net: the seeded initial network (every method copies it).
        loader: the seeded training loader of the deterministic network and its
            pretraining (they continue one shuffling stream).
        deterministic: the deterministic network once trained, with its epochs.
        stage1: stage 1's trained mean-field BNN and its seconds, once trained.
        kl_weights: the KL weight of each stage's settings, once resolved
            (:meth:`kl_weight`).

    Example::

        ctx = RunContext(cfg=config_from_dict({...}))   # what run() builds, in full
        stage1 = stage1_mean_field(ctx, split, net)      # a stage takes it first
        pred = ctx.predict(stage1, eval_data)            # the run's seeded prediction
    """

    cfg: Any
    checkpoints: Any = None
    execution: Execution = LOCAL
    art: RunArtifacts = field(default_factory=RunArtifacts)
    resume_from: str | None = None
    net: nn.Module | None = None
    loader: Any = None
    deterministic: tuple[nn.Module, int] | None = None
    stage1: Any = None
    kl_weights: dict[str, float] = field(default_factory=dict)

    @property
    def progress(self) -> bool:
        """Progress bars: when the settings ask for them, on rank 0."""
        return bool(self.cfg.progress) and env.is_main()

    def kl_weight(self, stage: str, model) -> float:
        r""":math:`\beta` of ``cfg.<stage>.kl_weight`` for this run, resolved once (a number
        as it is; ``"data_size"`` from the run's data and network, which ``model``
        holds: :func:`~twodg_pyro.infer.temperature.resolve_kl_weight`)."""
        if stage not in self.kl_weights:
            setting = getattr(self.cfg, stage).kl_weight
            self.kl_weights[stage] = resolve_kl_weight(setting, model)
        return self.kl_weights[stage]

    @staticmethod
    def timed(fn, *args, **kwargs) -> tuple[Any, float]:
        """``fn(*args, **kwargs)`` and the seconds it took."""
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        return out, time.perf_counter() - t0

    def predict(self, method, eval_data=None, **kw) -> Prediction:
        """The run's prediction of ``eval_data`` (default: the run's evaluation data) by a
        trained ``method``: ``num_samples`` draws seeded with the run's seed
        (:mod:`twodg_pyro.evaluation`), or the method's own; ``kw``: ``keep_samples``."""
        cfg = self.cfg

        def fn(d):
            return method.predict(d, cfg.num_samples, cfg.seed, progress=self.progress, **kw)

        data = self.art.eval_data if eval_data is None else eval_data
        return self.execution.predict(fn, data, cfg.device)

    def keep(self, name: str, method, pred: Prediction) -> None:
        """Keep ``name``'s trained method and its prediction in the run's artifacts."""
        self.art.trained[name] = method
        self.art.predictions[name] = Prediction(mean=pred.mean, targets=pred.targets)

    def finish(self, name: str, method, seconds: float, n_params: int, **fields) -> dict:
        """Predict the evaluation data by the trained ``method`` (:meth:`predict`), keep both
        (:meth:`keep`) and return ``name``'s row (:meth:`record`, which takes ``fields``)."""
        pred = self.predict(method)
        self.keep(name, method, pred)
        return self.record(name, pred, seconds, n_params, **fields)

    def record(
        self, method: str, pred, seconds: float, n_params: int, stored=None, state=None, **fields
    ) -> dict:
        """``method``'s row: the metrics of ``pred``, ``n_params`` trainable numbers
        (``stored``: those kept for prediction, default the same; ``size_mb`` at float32),
        ``fields``, the seconds, the final ELBO terms of ``state`` and the execution's
        fields."""
        stored = n_params if stored is None else stored
        out = {
            "method": method,
            **classification_metrics(pred.mean, pred.targets),
            "trainable_params": n_params,
            "stored_params": stored,
            "size_mb": size_mb(stored),
            **fields,
            "train_seconds": seconds,
        }
        if state is not None:
            out["final_elbo_terms"] = state.history[-1] if state.history else {}
        return {**out, **self.execution.record_fields()}
