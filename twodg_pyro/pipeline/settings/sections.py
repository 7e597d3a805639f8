"""The settings every run reads: the data, the network, the prior and the stages of
Algorithm 1 (tables ``[data]``, ``[network]``, ``[prior]``, ``[stage1]``, ``[sharing]``,
``[stage3]`` of the config file).

Every threshold of the paper (spec section 4) is a field with the paper's value as
default; each field's rules are in its type (:mod:`twodg_pyro.settings`).  The table
``[sharing]`` is the 2DG method's own settings, :class:`~twodg_pyro.sharing.SharingConfig`
(defined with the method, in :mod:`twodg_pyro.sharing.config`), reused here as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, get_args

from ...bnn import NormStats
from ...data import available_datasets
from ...guides.tyings import TyingName
from ...priors import PRIORS
from ...settings import (
    BOOLEAN,
    EPOCH_LIST,
    FOLDER,
    FRACTION,
    HIDDEN_UNITS,
    INIT_SCALE,
    KL_WEIGHT,
    POSITIVE_OR_INF,
    SEED,
    ConfigError,
    Optimizer,
    Section,
    at_least,
    finite_at_least_zero,
    one_of,
    positive,
    require,
)

#: ``network.dtype`` values: the floating type of the network's parameters, and so of the
#: priors, guides, draws, stage 2's mixture and the predictions.
DType = Literal["float32", "float64"]
DTYPES: tuple[str, ...] = get_args(DType)


def torch_dtype(name: str):
    """The ``torch.dtype`` of a ``network.dtype`` setting (``"float32"``, ``"float64"``)."""
    import torch

    if name not in DTYPES:
        raise ConfigError(f"network.dtype = {name!r}: must be one of {list(DTYPES)}")
    return getattr(torch, name)


@dataclass
class DataConfig(Section):
    """Which data set and how it is batched."""

    section: ClassVar[str] = "data"
    name: Annotated[str, one_of(tuple(available_datasets()))] = "digits"
    root: Annotated[str | None, FOLDER] = None
    batch_size: Annotated[int, at_least(1)] = 128
    val_fraction: Annotated[float, FRACTION] = 0.1
    test_fraction: Annotated[float, FRACTION] = 0.2
    split_seed: Annotated[int, SEED] = 0
    #: CIFAR training augmentation (paper App. I.2); ImageNet's is always on
    augment: Annotated[bool, BOOLEAN] = True

    def _check(self) -> None:
        if self.name == "digits":  # digits carves both from one set; the others have a test set
            require(
                self.val_fraction + self.test_fraction < 1,
                "data.val_fraction + data.test_fraction",
                self.val_fraction + self.test_fraction,
                "must be < 1 (nothing would be left to train on)",
            )


@dataclass
class NetworkConfig(Section):
    """The deterministic architecture (see ``twodg_pyro.models.build_network``)."""

    section: ClassVar[str] = "network"
    arch: str = "mlp"
    hidden: Annotated[list[int], HIDDEN_UNITS] = field(default_factory=lambda: [128])
    pretrain_epochs: Annotated[int, at_least(0)] = 0
    #: normalisation statistics of the Bayesian model while it trains: ``"batch"`` or
    #: ``"frozen"`` (the running statistics of the pretrained network;
    #: :class:`~twodg_pyro.bnn.BNNModel`)
    norm_stats: NormStats = "batch"
    #: everything downstream (priors, guides, mixture, predictions) follows the network
    dtype: DType = "float32"

    def _check(self) -> None:
        from ...models import available_networks

        known = available_networks()
        require(
            isinstance(self.arch, str) and self.arch.strip().lower().replace("-", "_") in known,
            "network.arch",
            self.arch,
            f"must be one of {known}",
        )


@dataclass
class PriorConfig(Section):
    """The prior over Bayesian weights: ``normal``, ``laplace``, ``layerwise``,
    ``pretrained`` (centred at the network's initial, e.g. pretrained, weights with
    standard deviation ``scale + delta |w|``, see
    :class:`~twodg_pyro.priors.PretrainedPrior`), ``empirical_bayes`` (a zero-mean
    Normal per site whose scale maximises the Laplace evidence of the pretrained network,
    learnt by stage 1: :class:`~twodg_pyro.priors.PerSiteNormalPrior`) or any registered
    prior's ``kind``
    (:data:`~twodg_pyro.priors.PRIORS`, built by its ``from_settings``)."""

    section: ClassVar[str] = "prior"
    kind: str = "normal"
    scale: Annotated[float, positive()] = 1.0
    delta: Annotated[float, finite_at_least_zero()] = 0.0

    def _check(self) -> None:
        settable = {k for k, cls in PRIORS.items() if cls.in_settings}
        require(
            isinstance(self.kind, str) and self.kind in settable,
            "prior.kind",
            self.kind,
            f"must name a registered prior that settings build, one of "
            f"{sorted(k for k in settable if k.islower())}",
        )


@dataclass
class Stage1Config(Section):
    r"""Mean-field pretraining (Algorithm 1, stage 1) and the deterministic network's
    training recipe (the baseline, and the pretraining of ``network.pretrain_epochs``).

    ``kl_weight`` is a KL temperature :math:`\beta`: stage 1 minimises
    :math:`\text{nll} + \beta\,\mathrm{KL}`; 1 is the true ELBO, and every results row
    trained with another value says so.  The ``deterministic_*`` settings select Adam at
    a constant rate (the default) or the paper's SGD recipe (App. I.3: momentum, weight
    decay, linear warm-up, learning-rate steps by ``deterministic_gamma`` at
    ``deterministic_milestones``)."""

    section: ClassVar[str] = "stage1"
    epochs: Annotated[int, at_least(0)] = 300
    lr_loc: Annotated[float, positive()] = 1e-2
    lr_scale: Annotated[float, positive()] = 1e-2
    kl_warmup_epochs: Annotated[int, at_least(0)] = 0
    #: a positive number, or ``"data_size"``:
    #: :func:`~twodg_pyro.infer.temperature.data_size_kl_weight` of the training set's
    #: size and the network's Bayesian weights (the records state the beta it gave)
    kl_weight: Annotated[str | float, KL_WEIGHT] = 1.0
    #: ``"paper"`` (App. I.4), ``"curvature"`` (the optimum of the tempered ELBO under
    #: the diagonal Gauss-Newton curvature of the pretrained network:
    #: :func:`~twodg_pyro.infer.curvature.curvature_scales`), ``"hess_init"`` (the same
    #: optimum under a curvature of ``hess_init`` per example and weight, IVON's start) or
    #: a positive constant
    init_scale: Annotated[str | float, INIT_SCALE] = "paper"
    hess_init: Annotated[float, positive()] = 0.5
    #: ``"svi"`` (the ELBO's gradients with Adam at ``lr_loc`` / ``lr_scale``) or
    #: ``"von"`` (variational online Newton, natural gradients:
    #: :class:`~twodg_pyro.infer.VariationalOnlineNewton` with the ``von_*`` settings,
    #: ``ess`` = N / ``kl_weight``; the deterministic parameters take Adam at ``lr_loc``)
    trainer: Literal["svi", "von"] = "svi"
    von_lr: Annotated[float, positive()] = 0.1
    von_beta1: Annotated[float, FRACTION] = 0.9
    von_beta2: Annotated[float, FRACTION] = 0.99999
    #: the largest step of a mean per unit learning rate (``inf``: no clipping)
    von_clip_radius: Annotated[float, POSITIVE_OR_INF] = 1e-3
    #: epochs of linear warm-up, then a cosine decay to 0 at the stage's last step
    von_warmup_epochs: Annotated[int, at_least(0)] = 0
    #: the stage's last epochs at learning rate 0 (the cosine ends before them): the means
    #: and the deterministic parameters stay, and the precisions settle at the curvature
    #: of the final means (the scales keep following the falling training loss until the
    #: learning rate stops; issue 43)
    von_settle_epochs: Annotated[int, at_least(0)] = 0
    #: the precisions' rate in the settling epochs: ``0`` decays it from 1 - ``von_beta2``
    #: (Robbins-Monro); a constant in (0, 1) holds it there, with the bias of VON's
    #: positivity correction, a relative rate x Var(S_hat) / 2 S^2
    #: (:mod:`~twodg_pyro.infer.von`; the comparison of ``stage1_selection.py``)
    von_settle_rate: Annotated[float, FRACTION] = 0.0
    deterministic_epochs: Annotated[int, at_least(0)] = 300
    deterministic_lr: Annotated[float, positive()] = 1e-2
    deterministic_optimizer: Optimizer = "adam"
    deterministic_momentum: Annotated[float, finite_at_least_zero()] = 0.9
    deterministic_weight_decay: Annotated[float, finite_at_least_zero()] = 0.0
    deterministic_milestones: Annotated[list[int], EPOCH_LIST] = field(default_factory=list)
    deterministic_gamma: Annotated[float, positive()] = 0.1
    deterministic_warmup_epochs: Annotated[int, at_least(0)] = 0

    def _check(self) -> None:
        require(
            self.trainer != "von" or self.kl_warmup_epochs == 0,
            "stage1.kl_warmup_epochs",
            self.kl_warmup_epochs,
            "must be 0 with stage1.trainer = 'von' (its scales follow one KL weight)",
        )
        require(
            self.von_settle_epochs == 0 or self.von_settle_epochs < self.epochs,
            "stage1.von_settle_epochs",
            self.von_settle_epochs,
            f"must be below stage1.epochs = {self.epochs} (the means train in the others)",
        )
        require(
            self.von_settle_rate == 0 or self.von_settle_epochs > 0,
            "stage1.von_settle_rate",
            self.von_settle_rate,
            "applies to the settling epochs: set stage1.von_settle_epochs too",
        )


@dataclass
class Stage3Config(Section):
    """Training the shared-weight BNN (stage 3) and its refinement hooks."""

    section: ClassVar[str] = "stage3"
    epochs: Annotated[int, at_least(0)] = 100
    lr_centre: Annotated[float, positive()] = 1e-3
    lr_outlier: Annotated[float, positive()] = 1e-3
    lr_cov: Annotated[float, positive()] = 1e-3
    tying: TyingName = "representative"
    #: epochs between merge hooks (0: never during stage 3)
    merge_every: Annotated[int, at_least(0)] = 0
    #: epochs between Mahalanobis reassignment hooks (0: never)
    reassign_every: Annotated[int, at_least(0)] = 0
    #: KL temperature beta of stage 3 (1: the true bound, Eq. 10), or ``"data_size"``
    #: (as ``stage1.kl_weight``)
    kl_weight: Annotated[str | float, KL_WEIGHT] = 1.0
    #: pruning inside stage 3 (:mod:`twodg_pyro.sharing.prune`): inliers whose stage-1
    #: :math:`|\mu|/\sigma` is below it are tied to pinned zero-mean components before
    #: stage 3 trains the rest (0: none)
    prune_snr: Annotated[float, finite_at_least_zero()] = 0.0
    #: the pinned components: ``"zero"`` (the weights removed) or ``"matched"`` (one per
    #: layer, its pruned weights' second moment; its scale learnt, which the KL pulls to
    #: the prior's: "zero" had the lower NLL at every threshold on three LeNet-5 seeds,
    #: ``experiments/results/frontier_stage3.md``)
    prune_spread: Literal["matched", "zero"] = "zero"
    #: pruning reaches ``prune_snr`` over this many first epochs of stage 3, the weights
    #: of lowest SNR first (gradual pruning, :class:`~twodg_pyro.sharing.PruneRamp`); 0:
    #: all at once, before the first epoch
    prune_ramp_epochs: Annotated[int, at_least(0)] = 0

    def _check(self) -> None:
        ramp = self.prune_ramp_epochs
        require(
            ramp == 0 or (self.prune_snr > 0 and self.prune_spread == "zero"),
            "stage3.prune_ramp_epochs",
            ramp,
            "ramps pruning with stage3.prune_snr > 0 and prune_spread = 'zero'",
        )
        require(
            ramp <= self.epochs,
            "stage3.prune_ramp_epochs",
            ramp,
            f"must be at most stage3.epochs = {self.epochs}",
        )
