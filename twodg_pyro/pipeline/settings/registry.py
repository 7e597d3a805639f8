"""The methods a run can train, as settings: the registry :data:`METHOD_REGISTRY` (each
method's module, settings section and what the run does with it) and the sections of
the methods compared with 2DG: rank-1 BNN, Sparse Subspace VI, the matched deterministic
network and the deep ensemble (tables ``[rank1]``, ``[ssvi]``,
``[deterministic_matched]``, ``[ensemble]``; post-hoc Laplace's ``[laplace]`` and MCMC's
``[mcmc]`` live with those methods, :mod:`twodg_pyro.methods.laplace_settings` and
:mod:`twodg_pyro.methods.mcmc.settings`).

Nothing here imports a method's implementation: a method's module is imported when a
run trains it (:func:`method_runner`), so that loading settings loads no method.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, ClassVar, NamedTuple

from ...guides.rank1 import InitMean, Rank1PriorKind, Routing
from ...guides.ssvi_subspace import AdditionCriterion, RemovalCriterion
from ...methods.laplace_settings import LaplaceConfig
from ...methods.mcmc.settings import MCMCConfig
from ...settings import UNIT, Section, at_least, in_range, optional_at_least, positive


@dataclass
class Rank1Config(Section):
    """Rank-1 BNN (Dusenberry et al. 2020): ``M`` mixture components over rank-1 factors.

    ``prior`` is ``normal`` or ``cauchy``, centred at 1 with scale ``prior_scale`` (0.1,
    the rank-1 authors' default for deep residual networks, 0.05 on ImageNet: at scale 1 a
    ResNet-20's 21 layers each multiply their units by a factor of standard deviation
    near 1 and its accuracy fell to 0.873 against the deterministic 0.969); factor
    means start at random signs (``init_mean = "random_sign"``) or at 1 (``"ones"``) and
    their standard deviations at ``init_scale``; ``routing`` sends example ``i`` to
    component ``i mod M`` (``"modulo"``) or every example to every component
    (``"tile"``).  The KL is annealed linearly over the first two thirds of ``epochs``.
    """

    section: ClassVar[str] = "rank1"
    components: Annotated[int, at_least(1, "M (mixture components) must be an integer >= 1")] = 4
    epochs: Annotated[int, at_least(0)] = 300
    lr: Annotated[float, positive()] = 1e-2
    prior: Rank1PriorKind = "normal"
    prior_scale: Annotated[float, positive()] = 0.1
    init_scale: Annotated[float, positive()] = 1e-3
    init_mean: InitMean = "random_sign"
    routing: Routing = "modulo"


@dataclass
class SSVIConfig(Section):
    """Sparse Subspace VI (Li et al. 2024): a mean-field posterior on ``density`` of the
    coordinates of each Bayesian tensor, the subspace updated every ``update_every``
    epochs by ``removal`` (``mu``, ``snr``, ``snr_abs_theta``) and ``addition``
    (``gradient``, ``random``), moving ``move_fraction`` of the active coordinates at
    first, decaying by a cosine to 0 at ``stop_fraction`` of training."""

    section: ClassVar[str] = "ssvi"
    density: Annotated[float, in_range(0, 1, (False, True))] = 0.1
    removal: RemovalCriterion = "snr_abs_theta"
    addition: AdditionCriterion = "gradient"
    update_every: Annotated[int, at_least(1)] = 5
    move_fraction: Annotated[float, UNIT] = 0.3
    stop_fraction: Annotated[float, UNIT] = 0.75
    epochs: Annotated[int, at_least(0)] = 300
    lr: Annotated[float, positive()] = 1e-2


@dataclass
class MatchedDeterministicConfig(Section):
    """The deterministic network trained for as many epochs as the Bayesian pipeline
    (method ``deterministic_matched``): ``network.pretrain_epochs + stage1.epochs +
    stage3.epochs`` unless ``epochs`` is set, with the deterministic recipe
    (``stage1.deterministic_*``), keeping the weights of the epoch with the best
    validation NLL (``data.val_fraction``; without a validation split, the last epoch);
    with ``patience``, training stops after that many epochs without improvement."""

    section: ClassVar[str] = "deterministic_matched"
    epochs: Annotated[
        int | None, optional_at_least(0, "or absent for pretrain + stage-1 + stage-3 epochs")
    ] = None
    patience: Annotated[int | None, optional_at_least(1, "or absent to train every epoch")] = None


@dataclass
class EnsembleConfig(Section):
    """A deep ensemble (method ``ensemble``): ``members`` deterministic networks trained
    with the deterministic recipe (``stage1.deterministic_*``) for ``epochs`` epochs
    (absent: ``stage1.deterministic_epochs``), member ``m`` initialised and shuffled with
    seed ``seed + m`` (member 0 is the deterministic row's network)."""

    section: ClassVar[str] = "ensemble"
    members: Annotated[int, at_least(1, "M (ensemble members) must be an integer >= 1")] = 5
    epochs: Annotated[int | None, optional_at_least(0, "or absent for deterministic_epochs")] = None


@dataclass
class MCDropoutConfig(Section):
    """Monte Carlo dropout (method ``mc_dropout``): the run's network with dropout of rate
    ``p`` before every weight layer but the first, trained with the deterministic recipe
    (``stage1.deterministic_*``) for ``epochs`` epochs (absent:
    ``stage1.deterministic_epochs``), predicting by ``num_samples`` seeded draws of
    dropout masks (:mod:`twodg_pyro.pipeline.methods.mc_dropout`)."""

    section: ClassVar[str] = "mc_dropout"
    p: Annotated[float, in_range(0, 1, (False, False))] = 0.1
    epochs: Annotated[int | None, optional_at_least(0, "or absent for deterministic_epochs")] = None


# ---------------------------------------------------------------------------- registry
class Method(NamedTuple):
    """A method a run can train, a row of the results table: one registration.

    ``module``: the module of :mod:`twodg_pyro.pipeline.methods` whose ``run(ctx)`` trains and
    evaluates it and returns its record (``None``: none, e.g. restored from a
    checkpoint); ``settings``: its section of the settings (``[<name>]``, a field of
    :class:`~twodg_pyro.pipeline.settings.config.RunConfig`; ``None``: it has none);
    ``distributed``: it runs under ``torchrun``
    (:func:`~twodg_pyro.pipeline.run_distributed`); ``model_file``: the run writes
    ``model_<name>.pt`` for it.  Whether its draws differ is its trained method's
    (:attr:`~twodg_pyro.methods.TrainedMethod.bayesian`)."""

    module: str
    settings: type | None = None
    distributed: bool = False
    model_file: bool = True


#: The methods a run can train, in the order they run: the choices of ``methods`` in the
#: settings (:data:`~twodg_pyro.pipeline.settings.config.METHODS`).
METHOD_REGISTRY: dict[str, Method] = {
    "deterministic": Method("deterministic", distributed=True, model_file=False),
    "mean_field": Method("mean_field", distributed=True),
    "2dg": Method("two_dg", distributed=True),
    "rank1": Method("rank1", Rank1Config),
    "ssvi": Method("ssvi", SSVIConfig),
    "deterministic_matched": Method("deterministic_matched", MatchedDeterministicConfig),
    "ensemble": Method("ensemble", EnsembleConfig),
    "mc_dropout": Method("mc_dropout", MCDropoutConfig),
    "laplace": Method("laplace", LaplaceConfig),
    "mcmc": Method("mcmc", MCMCConfig),
}


def method_runner(name: str) -> Callable:
    """The function that trains and evaluates method ``name``: ``run`` of its module,
    imported now (its module registers the file of its trained method, if any)."""
    module = f"twodg_pyro.pipeline.methods.{METHOD_REGISTRY[name].module}"
    return importlib.import_module(module).run
