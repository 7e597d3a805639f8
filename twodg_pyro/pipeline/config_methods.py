"""The settings of the methods compared with 2DG: rank-1 BNN, Sparse Subspace VI, the
matched deterministic network, the deep ensemble, post-hoc Laplace and the MCMC reference
posterior (tables ``[rank1]``, ``[ssvi]``, ``[deterministic_matched]``, ``[ensemble]``,
``[laplace]``, ``[mcmc]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from ..baselines.laplace import LaplaceHessian, LaplacePredictive, LaplaceSubset, PriorStructure
from ..guides.rank1 import InitMean, Rank1PriorKind, Routing
from ..guides.ssvi_subspace import AdditionCriterion, RemovalCriterion
from ..settings import (
    BOOLEAN,
    UNIT,
    Section,
    at_least,
    in_range,
    optional_at_least,
    positive,
    require,
)


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
class LaplaceConfig(Section):
    """Post-hoc Laplace (method ``laplace``; needs ``pip install laplace-torch``) on the
    run's deterministic network: over the ``last_layer`` or ``all`` weights with a
    ``kron`` or ``diag`` GGN, the prior precision (``scalar`` or, with ``subset =
    "all"``, ``layerwise``) fitted by ``marglik_steps`` steps on the marginal likelihood;
    predicted by ``num_samples`` seeded draws of the linearised (``glm``) or the plain
    (``nn``) network (:mod:`twodg_pyro.baselines.laplace`); the curvature is summed over
    the training set in batches of ``batch_size``."""

    section: ClassVar[str] = "laplace"
    subset: LaplaceSubset = "last_layer"
    hessian: LaplaceHessian = "kron"
    pred_type: LaplacePredictive = "glm"
    prior_structure: PriorStructure = "scalar"
    marglik_steps: Annotated[int, at_least(0)] = 100
    marglik_lr: Annotated[float, positive()] = 0.1
    #: examples per batch of the curvature pass (with ``subset = "all"``, ``hessian =
    #: "diag"`` laplace-torch forms each batch's Jacobian, batch x classes x weights)
    batch_size: Annotated[int, at_least(1)] = 32

    def _check(self) -> None:
        require(
            not (self.subset == "last_layer" and self.prior_structure == "layerwise"),
            "laplace.prior_structure",
            self.prior_structure,
            "laplace-torch fits a scalar prior precision for subset = 'last_layer'; use "
            "'scalar' (or subset = 'all')",
        )


@dataclass
class MCMCConfig(Section):
    """The reference posterior by MCMC (method ``mcmc``,
    :func:`~twodg_pyro.infer.mcmc.run_mcmc`): Pyro's ``nuts`` (or ``hmc`` with
    ``num_steps`` leapfrog steps) on the run's network, prior and likelihood, on the whole
    training set at once; ``num_chains`` chains (chain ``c`` seeded ``seed + c``) of
    ``warmup_steps`` adaptation and ``num_samples`` kept iterations, every ``thin``-th
    stored; chains start at prior draws times ``init_scale`` (``init = "prior"``) or at
    the network plus that much noise (``"network"``).  A network of more than
    ``max_params`` Bayesian scalars is refused."""

    section: ClassVar[str] = "mcmc"
    kernel: Literal["nuts", "hmc"] = "nuts"
    num_samples: Annotated[int, at_least(1)] = 500
    warmup_steps: Annotated[int, at_least(0)] = 500
    num_chains: Annotated[int, at_least(1)] = 4
    thin: Annotated[int, at_least(1)] = 1
    init: Literal["prior", "network"] = "prior"
    init_scale: Annotated[float, positive()] = 0.1
    target_accept_prob: Annotated[float, in_range(0, 1, (False, False))] = 0.8
    max_tree_depth: Annotated[int, at_least(1)] = 10
    step_size: Annotated[float, positive()] = 1e-2
    num_steps: Annotated[int, at_least(1)] = 32
    temperature: Annotated[float, positive()] = 1.0
    jit_compile: Annotated[bool, BOOLEAN] = False
    max_params: Annotated[int, at_least(1)] = 5000

    def _check(self) -> None:
        require(
            self.thin <= self.num_samples,
            "mcmc.thin",
            self.thin,
            f"keeps no draw of mcmc.num_samples = {self.num_samples}",
        )
