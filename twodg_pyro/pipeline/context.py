"""The methods a run can train, and what they share.

Every method is one entry of the registry :data:`METHOD_REGISTRY`, a :class:`Method`: its
function, its settings section, whether it is Bayesian, whether it runs under
``torchrun`` and whether it writes a model file.  Everything else that lists methods is
derived from it: the choices of ``methods`` in the settings
(:data:`~twodg_pyro.pipeline.config.METHODS`), the sections of
:class:`~twodg_pyro.pipeline.config.RunConfig`, the methods with mutual information, the
model files and the methods ``torchrun`` runs.

:func:`~twodg_pyro.pipeline.run` builds one :class:`RunContext` (the data, the seeded
initial network, the training loader, checkpoints, where the stages run) and hands it
to every method it runs.  Stage 1 is trained once, on first request, and *returned* to
the methods that build on it (:meth:`RunContext.stage1`).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import nn

from ..infer.temperature import resolve_kl_weight
from ..metrics import classification_metrics
from ..prediction import Prediction
from .algorithm1 import Runtime, run_2dg, stage1_mean_field
from .alternatives import run_rank1, run_ssvi
from .baseline_methods import (
    run_deterministic_matched,
    run_ensemble,
    run_laplace,
    run_mcmc_method,
)
from .builders import seed_everything
from .config_methods import (
    EnsembleConfig,
    LaplaceConfig,
    MatchedDeterministicConfig,
    MCMCConfig,
    Rank1Config,
    SSVIConfig,
)
from .results import kl_weight_field, size_mb
from .trained import RunArtifacts, Trained


@dataclass(kw_only=True)
class RunContext(Runtime):
    """What the methods of one run share (and, as a
    :class:`~twodg_pyro.pipeline.algorithm1.Runtime`, how its stages train).

    Attributes:
        art: what the run produced so far.
        resume_from: the stage the run resumes from (``None``: a fresh run).
        net: the seeded initial network (every method copies it).
        loader: the seeded training loader of the deterministic network and its
            pretraining (they continue one shuffling stream).
        deterministic: the deterministic baseline once trained, with its epochs.
    """

    art: RunArtifacts
    resume_from: str | None
    net: nn.Module
    loader: Any
    deterministic: tuple[nn.Module, int] | None = None
    _stage1: tuple[Trained, float] | None = None

    @property
    def trainer(self) -> dict:
        """How the deterministic networks train: the keyword arguments of
        :func:`~twodg_pyro.baselines.train_deterministic` beyond the learning rate (the
        optimiser and, for SGD, its schedule: ``stage1.deterministic_*``), the device,
        progress and ``train``, this execution's trainer."""
        s1 = self.cfg.stage1
        return {
            "train": self.execution.train_deterministic,
            "device": self.cfg.device,
            "progress": self.progress,
            "optimizer": s1.deterministic_optimizer,
            "momentum": s1.deterministic_momentum,
            "weight_decay": s1.deterministic_weight_decay,
            "milestones": tuple(s1.deterministic_milestones),
            "gamma": s1.deterministic_gamma,
            "warmup_epochs": s1.deterministic_warmup_epochs,
        }

    def train_deterministic(self, epochs: int, loader=None) -> tuple[nn.Module, float]:
        """A copy of :attr:`net` trained deterministically for ``epochs`` on ``loader``
        (default :attr:`loader`); and seconds."""
        det = copy.deepcopy(self.net)
        t0 = time.perf_counter()
        recipe = self.trainer
        data = self.execution.shard(self.loader if loader is None else loader, self.cfg.seed)
        recipe.pop("train")(det, data, epochs, self.cfg.stage1.deterministic_lr, **recipe)
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
                self,
                self.art.split,
                copy.deepcopy(net),
                {"records": self.art.records},  # the live list: checkpoints see new rows
            )
            self._stage1 = (trained, time.perf_counter() - t0)
            self.art.mean_field = trained
        return self._stage1

    def keep(self, method: str, trained, pred: Prediction) -> None:
        """Keep ``method``'s trained object and prediction in the run's artifacts."""
        self.art.trained[method] = trained
        self.art.predictions[method] = Prediction(mean=pred.mean, targets=pred.targets)

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


# ---------------------------------------------------------------------------- methods
def deterministic(ctx: RunContext) -> dict | None:
    """The deterministic network trained on the data (its record was restored when
    resuming)."""
    if ctx.resume_from is not None:
        return None
    epochs = ctx.cfg.stage1.deterministic_epochs
    det, seconds = ctx.train_deterministic(epochs)
    ctx.deterministic = (det, epochs)
    pred = ctx.predict(det, None, ctx.art.eval_data)
    ctx.keep("deterministic", Trained(det, None, None), pred)
    return ctx.record("deterministic", pred, seconds, sum(p.numel() for p in det.parameters()))


def mean_field(ctx: RunContext) -> dict | None:
    """Stage 1's mean-field BNN (its record was restored when resuming from stage 3)."""
    (model, guide, state, _), seconds = ctx.stage1()
    if ctx.resume_from == "stage3":
        return None
    pred = ctx.predict(model, guide, ctx.art.eval_data)
    ctx.art.predictions["mean_field"] = pred
    # 2 per Bayesian weight + the deterministic ones
    n_train = guide.num_trainable() + sum(p.numel() for p in model.deterministic_parameters())
    return ctx.record(
        "mean_field",
        pred,
        seconds,
        n_train,
        state=state,
        scale_trajectory=scale_trajectory(state.history),
        scale_convergence=scale_convergence(state.history),
        trainer=ctx.cfg.stage1.trainer,
        **kl_weight_field(resolve_kl_weight(ctx.cfg.stage1.kl_weight, model)),
    )


def two_dg(ctx: RunContext) -> dict:
    """The 2DG BNN: stages 2-3 on the mean-field BNN that stage 1 returns
    (:func:`~twodg_pyro.pipeline.algorithm1.run_2dg`)."""
    stage1, _ = ctx.stage1()
    return run_2dg(ctx, ctx.art.split, stage1, ctx.art, ctx.art.eval_data)


class Method(NamedTuple):
    """A method a run can train, a row of the results table.

    ``run(ctx)`` returns its record (``None``: none, e.g. restored from a checkpoint);
    ``settings``: its section of the settings (``[<name>]``, a field of
    :class:`~twodg_pyro.pipeline.config.RunConfig`; ``None``: it has none); ``bayesian``:
    its draws differ (mutual information is defined); ``distributed``: it runs under
    ``torchrun`` (:func:`~twodg_pyro.pipeline.run_distributed`); ``model_file``: the run
    writes ``model_<name>.pt`` for it."""

    run: Callable[[RunContext], dict | None]
    settings: type | None = None
    bayesian: bool = True
    distributed: bool = False
    model_file: bool = True


#: The methods a run can train, in the order they run: the choices of ``methods`` in the
#: settings (:data:`~twodg_pyro.pipeline.config.METHODS`).
METHOD_REGISTRY: dict[str, Method] = {
    "deterministic": Method(deterministic, bayesian=False, distributed=True, model_file=False),
    "mean_field": Method(mean_field, distributed=True),
    "2dg": Method(two_dg, distributed=True),
    "rank1": Method(run_rank1, Rank1Config),
    "ssvi": Method(run_ssvi, SSVIConfig),
    "deterministic_matched": Method(
        run_deterministic_matched, MatchedDeterministicConfig, bayesian=False
    ),
    "ensemble": Method(run_ensemble, EnsembleConfig),
    "laplace": Method(run_laplace, LaplaceConfig),
    "mcmc": Method(run_mcmc_method, MCMCConfig),
}
#: The methods whose draws differ (mutual information defined).
BAYESIAN_METHODS = tuple(name for name, m in METHOD_REGISTRY.items() if m.bayesian)


_TRAJECTORY_KEYS = ("loss", "kl", "nll", "sigma_median", "sigma_ratio_median", "sigma_over_spread")


def scale_trajectory(history: list[dict], points: int = 11) -> list[dict]:
    """About ``points`` evenly spaced epochs of a fit's history (always the last), each
    with its ELBO terms and the scales' summary of
    :class:`~twodg_pyro.infer.ScaleTrajectory`: whether the fit converged, in a few
    numbers."""
    if not history:
        return []
    step = max(1, len(history) // max(1, points - 1))
    picked = list(range(0, len(history), step))
    if picked[-1] != len(history) - 1:
        picked.append(len(history) - 1)
    return [
        {
            "epoch": history[i].get("epoch", i),
            **{k: history[i][k] for k in _TRAJECTORY_KEYS if k in history[i]},
        }
        for i in picked
    ]


def scale_convergence(history: list[dict], tail: float = 0.1, tol: float = 0.02) -> dict | None:
    r"""Whether a fit's scales settled: the relative change of the median scale over the
    last ``tail`` of its epochs (at least one epoch),
    :math:`|\tilde\sigma_{E} / \tilde\sigma_{E - \lceil tail\,E \rceil} - 1|`, and
    ``converged`` when it is below ``tol``; ``None`` for a history without scales."""
    scales = [h.get("sigma_median") for h in history]
    if len(scales) < 2 or any(v is None for v in scales):
        return None
    back = max(1, math.ceil(tail * len(scales)))
    start, end = scales[-1 - back], scales[-1]
    change = abs(end / start - 1.0) if start > 0 else math.inf
    return {
        "median_scale_change": change,
        "over_epochs": back,
        "tolerance": tol,
        "converged": bool(change < tol),
    }
