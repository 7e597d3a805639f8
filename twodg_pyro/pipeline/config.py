"""Validated settings of a run (data, network, prior, the three stages of Algorithm 1).

Every threshold of the paper (spec section 4) is a field with the paper's value as
default.  Settings load from TOML, JSON or YAML files; an unknown key or a bad
value raises :class:`ConfigError` naming it (``sharing.gmm_max_iter = -1: ...``).
Every field of every section is checked when the settings are built, so a bad value
in a late stage fails before anything trains.

A config file that sets nothing (empty, or comments only) is an error: it would
silently run the library defaults (300 epochs, ``K = 2000``), which suit no data set
in particular.  ``preset = "digits"`` at the top of a file starts from the main job's
settings (:mod:`~twodg_pyro.pipeline.presets`), the file's other settings override it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin, get_type_hints

from ..baselines.deterministic import Optimizer
from ..baselines.laplace import LaplaceHessian, LaplacePredictive, LaplaceSubset, PriorStructure
from ..data import available_datasets
from ..gmm.merging import MergeRule, MergeTest
from ..guides.rank1 import InitMean, Rank1PriorKind, Routing
from ..guides.ssvi_subspace import AdditionCriterion, RemovalCriterion
from ..guides.tyings import TyingName
from ..priors import PriorKind
from ..sharing.outliers import OutlierRule
from ..sharing.structure import Coordinates
from ..uncertainty import BUILTIN_OOD_SETS, CORRUPTIONS, FOLDER_OOD_SETS, SEVERITIES
from .presets import merge_settings

__all__ = [
    "ConfigError",
    "DataConfig",
    "NetworkConfig",
    "PriorConfig",
    "Stage1Config",
    "SharingConfig",
    "Stage3Config",
    "Rank1Config",
    "SSVIConfig",
    "MatchedDeterministicConfig",
    "EnsembleConfig",
    "LaplaceConfig",
    "UncertaintyConfig",
    "DiagnosticsConfig",
    "RunConfig",
    "DTYPES",
    "METHODS",
    "Rule",
    "torch_dtype",
    "load_config",
    "config_from_dict",
]


class ConfigError(ValueError):
    """A setting is unknown or out of range; the message names it."""


#: ``network.dtype`` values: the floating type of the network's parameters, and so of the
#: priors, guides, draws, stage 2's mixture and the predictions.
DType = Literal["float32", "float64"]
DTYPES: tuple[str, ...] = get_args(DType)
#: the methods a run trains and evaluates
Method = Literal[
    "deterministic",
    "mean_field",
    "2dg",
    "rank1",
    "ssvi",
    "deterministic_matched",
    "ensemble",
    "laplace",
]
METHODS: tuple[str, ...] = get_args(Method)
#: ``cpu``, ``cuda`` or ``cuda:<index>``.
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


def torch_dtype(name: str):
    """The ``torch.dtype`` of a ``network.dtype`` setting (``"float32"``, ``"float64"``)."""
    import torch

    if name not in DTYPES:
        raise ConfigError(f"network.dtype = {name!r}: must be one of {list(DTYPES)}")
    return getattr(torch, name)


# ---------------------------------------------------------------------------- constraints
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Rule:
    """A constraint on one setting: ``test(value)`` must hold, else ``"<name> = <value>:
    <what>"`` is the error.  Fields carry their rules as ``Annotated[type, rule, ...]``;
    a ``Literal[...]`` type is the rule "one of its values"."""

    test: Callable[[Any], bool]
    what: str

    def check(self, name: str, value: Any) -> None:
        if not self.test(value):
            raise ConfigError(f"{name} = {value!r}: {self.what}")


def positive(what: str = "must be a positive number") -> Rule:
    """A finite number > 0."""
    return Rule(lambda v: _is_number(v) and math.isfinite(v) and v > 0, what)


def at_least(low: int, what: str | None = None) -> Rule:
    """An integer >= ``low``."""
    return Rule(lambda v: _is_int(v) and v >= low, what or f"must be an integer >= {low}")


def finite_at_least_zero(what: str = "must be a finite number >= 0") -> Rule:
    """A finite number >= 0."""
    return Rule(lambda v: _is_number(v) and math.isfinite(v) and v >= 0, what)


def in_range(low: float, high: float, closed: tuple[bool, bool]) -> Rule:
    """A number in the interval from ``low`` to ``high`` (``closed`` at either end)."""

    def test(v) -> bool:
        if not _is_number(v):
            return False
        return (v >= low if closed[0] else v > low) and (v <= high if closed[1] else v < high)

    brackets = ("[" if closed[0] else "(") + f"{low}, {high}" + ("]" if closed[1] else ")")
    return Rule(test, f"must be in {brackets}")


def optional(rule: Rule, what: str) -> Rule:
    """``None`` (absent) or what ``rule`` admits."""
    return Rule(lambda v: v is None or rule.test(v), what)


BOOLEAN = Rule(lambda v: isinstance(v, bool), "must be true or false")
INTEGER = Rule(_is_int, "must be an integer")
#: the largest seed: NumPy's and scikit-learn's seeds are 32-bit (torch takes 64 bits)
MAX_SEED = 2**32 - 1
SEED = Rule(
    lambda v: _is_int(v) and 0 <= v <= MAX_SEED,
    f"must be an integer in [0, {MAX_SEED}] (the seeds NumPy and scikit-learn take)",
)
#: every integer setting must fit a signed 64-bit integer (torch's and the data
#: loaders'): beyond it they fail deep inside with "Overflow when unpacking long long"
INT64_LIMIT = 2**63


def _too_large(value: Any) -> bool:
    """Whether ``value`` (an integer, or a list of them) holds an integer beyond 64 bits."""
    if isinstance(value, (list, tuple)):
        return any(_too_large(v) for v in value)
    return _is_int(value) and not -INT64_LIMIT <= value < INT64_LIMIT


FRACTION = in_range(0, 1, (True, False))  # [0, 1)
UNIT = in_range(0, 1, (True, True))  # [0, 1]


def _one_of(options: tuple) -> Rule:
    return Rule(lambda v: isinstance(v, str) and v in options, f"must be one of {list(options)}")


def _is_list_of(kind: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (list, tuple)) and all(kind(x) for x in v)


def _is_device(v) -> bool:
    return isinstance(v, str) and DEVICE_PATTERN.fullmatch(v) is not None


# named rules of single settings (annotations refer to them by name)
FOLDER = Rule(lambda v: v is None or (isinstance(v, str) and v != ""), "must be a folder name")
HIDDEN_UNITS = Rule(
    _is_list_of(lambda h: _is_int(h) and h > 0),
    "must be a list of positive integers (units per hidden layer)",
)
EPOCH_LIST = Rule(_is_list_of(lambda m: _is_int(m) and m >= 0), "must be epochs (integers >= 0)")
INIT_SCALE = Rule(
    lambda v: v == "paper" or (_is_number(v) and math.isfinite(v) and v > 0),
    "must be 'paper' or a positive number",
)
POSITIVE_OR_INF = Rule(lambda v: _is_number(v) and v > 0, "must be a number > 0 (or inf)")
METHOD_LIST = Rule(lambda v: isinstance(v, (list, tuple)), "must be a list of method names")
DEVICE = Rule(_is_device, "must be 'cpu', 'cuda' or 'cuda:<index>'")


def _rules(hint) -> list[Rule]:
    """The rules of a field's type: its ``Annotated`` rules, or "one of" a ``Literal``."""
    rules: list[Rule] = []
    if get_origin(hint) is Annotated:
        hint, *extra = get_args(hint)
        rules += [r for r in extra if isinstance(r, Rule)]
    if get_origin(hint) is Literal:
        rules.insert(0, _one_of(get_args(hint)))
    return rules


class _Section:
    """A section of settings: on construction every field is checked against the rules
    of its type (``Annotated`` / ``Literal``), then :meth:`_check` runs the checks that
    involve several fields.  ``section`` prefixes the names in errors."""

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self), include_extras=True)
        prefix = f"{self.section}." if self.section else ""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            for rule in _rules(hints[f.name]):
                rule.check(prefix + f.name, value)
            _require(not _too_large(value), prefix + f.name, value, "must be below 2**63")
        self._check()

    def _check(self) -> None:
        """Constraints between fields (none by default)."""


def _require(cond: bool, name: str, value: Any, what: str) -> None:
    if not cond:
        raise ConfigError(f"{name} = {value!r}: {what}")


# ---------------------------------------------------------------------------- sections
@dataclass
class DataConfig(_Section):
    """Which data set and how it is batched."""

    section: ClassVar[str] = "data"
    name: Annotated[str, _one_of(tuple(available_datasets()))] = "digits"
    root: Annotated[str | None, FOLDER] = None
    batch_size: Annotated[int, at_least(1)] = 128
    val_fraction: Annotated[float, FRACTION] = 0.1
    test_fraction: Annotated[float, FRACTION] = 0.2
    split_seed: Annotated[int, SEED] = 0
    #: CIFAR training augmentation (paper App. I.2); ImageNet's is always on
    augment: Annotated[bool, BOOLEAN] = True

    def _check(self) -> None:
        if self.name == "digits":  # digits carves both from one set; the others have a test set
            _require(
                self.val_fraction + self.test_fraction < 1,
                "data.val_fraction + data.test_fraction",
                self.val_fraction + self.test_fraction,
                "must be < 1 (nothing would be left to train on)",
            )


def _known_arch(value) -> bool:
    from ..models import available_networks

    return (
        isinstance(value, str) and value.strip().lower().replace("-", "_") in available_networks()
    )


def _arch_rule() -> Rule:
    from ..models import available_networks

    return Rule(_known_arch, f"must be one of {available_networks()}")


@dataclass
class NetworkConfig(_Section):
    """The deterministic architecture (see ``twodg_pyro.models.build_network``)."""

    section: ClassVar[str] = "network"
    arch: str = "mlp"
    hidden: Annotated[list[int], HIDDEN_UNITS] = field(default_factory=lambda: [128])
    pretrain_epochs: Annotated[int, at_least(0)] = 0
    #: everything downstream (priors, guides, mixture, predictions) follows the network
    dtype: DType = "float32"

    def _check(self) -> None:
        _arch_rule().check("network.arch", self.arch)


@dataclass
class PriorConfig(_Section):
    """The prior over Bayesian weights: ``normal``, ``laplace``, ``layerwise`` or
    ``pretrained`` (empirical Bayes: centred at the network's initial, e.g. pretrained,
    weights with standard deviation ``scale + delta |w|``, see
    :class:`~twodg_pyro.priors.PretrainedPrior`)."""

    section: ClassVar[str] = "prior"
    kind: PriorKind = "normal"
    scale: Annotated[float, positive()] = 1.0
    delta: Annotated[float, finite_at_least_zero()] = 0.0


@dataclass
class Stage1Config(_Section):
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
    kl_weight: Annotated[float, positive()] = 1.0
    #: ``"paper"`` (App. I.4) or a positive constant
    init_scale: Annotated[str | float, INIT_SCALE] = "paper"
    deterministic_epochs: Annotated[int, at_least(0)] = 300
    deterministic_lr: Annotated[float, positive()] = 1e-2
    deterministic_optimizer: Optimizer = "adam"
    deterministic_momentum: Annotated[float, finite_at_least_zero()] = 0.9
    deterministic_weight_decay: Annotated[float, finite_at_least_zero()] = 0.0
    deterministic_milestones: Annotated[list[int], EPOCH_LIST] = field(default_factory=list)
    deterministic_gamma: Annotated[float, positive()] = 0.1
    deterministic_warmup_epochs: Annotated[int, at_least(0)] = 0


@dataclass
class SharingConfig(_Section):
    """Outliers, the 2-D mixture and its refinement (stage 1 steps 3-5, stage 2).

    Thresholds, each with one name (spec section 4): ``tau_w`` (the absolute mean rule),
    ``grad_percentile`` (:math:`P_g`), ``n_min`` (:math:`N_\\min`), ``mahalanobis_threshold``
    (:math:`T_M`), ``tau_d`` (:math:`T_W`, on :math:`W_2`), ``tau_g`` and ``tau_v`` (the
    merge's gradient and variance tests; ``inf`` skips them)."""

    section: ClassVar[str] = "sharing"
    coordinates: Coordinates = "sigma"
    outlier_rule: OutlierRule = "absolute"
    tau_w: Annotated[float, positive()] = 0.2
    mu_quantile: Annotated[float, in_range(0, 1, (False, False))] = 0.99
    layer_std_multiple: Annotated[float, positive()] = 3.0
    grad_percentile: Annotated[float, FRACTION] = 0.01
    grad_batches: Annotated[int, at_least(1)] = 4
    n_components: Annotated[int, at_least(1)] = 2000
    gmm_batch_size: Annotated[
        int | None,
        optional(
            at_least(1),
            "must be an integer >= 1 (points per EM mini-batch), or absent for full batches",
        ),
    ] = None
    gmm_max_iter: Annotated[int, at_least(1)] = 100
    #: fit the mixture to a seeded random subsample of at most this many inlier points
    #: (every inlier is still assigned by the fitted mixture); absent: all of them
    gmm_max_points: Annotated[
        int | None,
        optional(
            at_least(1),
            "must be an integer >= n_components, or absent to fit the mixture to all inlier points",
        ),
    ] = None
    n_min: Annotated[int, at_least(0)] = 20
    mahalanobis_threshold: Annotated[float, positive()] = 5.991
    k_nearest: Annotated[int, at_least(1)] = 5
    merge_rule: MergeRule = "paper"
    merge_test: MergeTest = "both"
    tau_d: Annotated[float, finite_at_least_zero("must be a number >= 0")] = 1e-2
    tau_g: Annotated[float, POSITIVE_OR_INF] = math.inf
    tau_v: Annotated[float, POSITIVE_OR_INF] = math.inf
    use_outliers: Annotated[bool, BOOLEAN] = True
    use_ellipses: Annotated[bool, BOOLEAN] = True
    use_merging: Annotated[bool, BOOLEAN] = True

    def _check(self) -> None:
        _require(
            self.k_nearest <= self.n_components,
            "sharing.k_nearest",
            self.k_nearest,
            f"must be an integer <= n_components ({self.n_components}): a point far from "
            "its component is blended from its k nearest components",
        )
        if self.gmm_max_points is not None:
            _require(
                self.gmm_max_points >= self.n_components,
                "sharing.gmm_max_points",
                self.gmm_max_points,
                f"must be an integer >= n_components ({self.n_components}), or absent to fit "
                "the mixture to all inlier points",
            )


@dataclass
class Stage3Config(_Section):
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
    #: KL temperature beta of stage 3 (1: the true bound, Eq. 10)
    kl_weight: Annotated[float, positive()] = 1.0


@dataclass
class Rank1Config(_Section):
    """Rank-1 BNN (Dusenberry et al. 2020): ``M`` mixture components over rank-1 factors.

    ``prior`` is ``normal`` or ``cauchy``, centred at 1 with scale ``prior_scale``; factor
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
    prior_scale: Annotated[float, positive()] = 1.0
    init_scale: Annotated[float, positive()] = 1e-3
    init_mean: InitMean = "random_sign"
    routing: Routing = "modulo"


@dataclass
class SSVIConfig(_Section):
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
class MatchedDeterministicConfig(_Section):
    """The deterministic network trained for as many epochs as the Bayesian pipeline
    (method ``deterministic_matched``): ``network.pretrain_epochs + stage1.epochs +
    stage3.epochs`` unless ``epochs`` is set, with the deterministic recipe
    (``stage1.deterministic_*``), keeping the weights of the epoch with the best
    validation NLL (``data.val_fraction``; without a validation split, the last epoch);
    with ``patience``, training stops after that many epochs without improvement."""

    section: ClassVar[str] = "deterministic_matched"
    epochs: Annotated[
        int | None,
        optional(
            at_least(0),
            "must be an integer >= 0, or absent for pretrain + stage-1 + stage-3 epochs",
        ),
    ] = None
    patience: Annotated[
        int | None,
        optional(at_least(1), "must be an integer >= 1, or absent to train every epoch"),
    ] = None


@dataclass
class EnsembleConfig(_Section):
    """A deep ensemble (method ``ensemble``): ``members`` deterministic networks trained
    with the deterministic recipe (``stage1.deterministic_*``) for ``epochs`` epochs
    (absent: ``stage1.deterministic_epochs``), member ``m`` initialised and shuffled with
    seed ``seed + m`` (member 0 is the deterministic row's network)."""

    section: ClassVar[str] = "ensemble"
    members: Annotated[int, at_least(1, "M (ensemble members) must be an integer >= 1")] = 5
    epochs: Annotated[
        int | None,
        optional(at_least(0), "must be an integer >= 0, or absent for deterministic_epochs"),
    ] = None


@dataclass
class LaplaceConfig(_Section):
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
        _require(
            not (self.subset == "last_layer" and self.prior_structure == "layerwise"),
            "laplace.prior_structure",
            self.prior_structure,
            "laplace-torch fits a scalar prior precision for subset = 'last_layer'; use "
            "'scalar' (or subset = 'all')",
        )


def _names_of(known: tuple[str, ...]) -> Rule:
    return Rule(
        lambda v: isinstance(v, (list, tuple)) and all(x in known for x in v),
        f"must be a list of values from {', '.join(map(str, known))}",
    )


@dataclass
class UncertaintyConfig(_Section):
    """OOD detection, shift and selective prediction in the results of a run
    (:mod:`twodg_pyro.pipeline.uncertainty_step`): off unless ``enabled``.  ``draws``
    (absent: ``num_samples``) seeded draws per method; every built-in OOD set of
    ``ood_sets`` and every folder set of ``folder_sets`` (read from ``folder_root``), at
    most ``ood_size`` images each; every corruption family of ``corruptions`` at
    ``severities`` on at most ``shift_size`` evaluation images."""

    section: ClassVar[str] = "uncertainty"
    enabled: Annotated[bool, BOOLEAN] = False
    draws: Annotated[
        int | None, optional(at_least(1), "must be an integer >= 1, or absent for num_samples")
    ] = None
    ood_sets: Annotated[list[str], _names_of(tuple(BUILTIN_OOD_SETS))] = field(
        default_factory=lambda: list(BUILTIN_OOD_SETS)
    )
    folder_sets: Annotated[list[str], _names_of(tuple(FOLDER_OOD_SETS))] = field(
        default_factory=list
    )
    folder_root: Annotated[str | None, FOLDER] = None
    ood_size: Annotated[
        int | None, optional(at_least(1), "must be an integer >= 1, or absent for all")
    ] = None
    corruptions: Annotated[list[str], _names_of(tuple(CORRUPTIONS))] = field(
        default_factory=lambda: list(CORRUPTIONS)
    )
    severities: Annotated[list[int], _names_of(SEVERITIES)] = field(
        default_factory=lambda: list(SEVERITIES)
    )
    shift_size: Annotated[
        int | None, optional(at_least(1), "must be an integer >= 1, or absent for all")
    ] = None

    def _check(self) -> None:
        _require(
            not self.folder_sets or self.folder_root is not None,
            "uncertainty.folder_root",
            self.folder_root,
            f"is needed to read the folder sets {self.folder_sets}",
        )


@dataclass
class DiagnosticsConfig(_Section):
    """What a run computes after its results are written, and how much of it.

    ``enabled = false`` (``--no-diagnostics``) writes the results and the model file only:
    no InferenceData, Pareto k-hat, PSIS-LOO, posterior summary or figures.

    The budget: the k-hat uses ``khat_samples`` draws from q on a seeded subset of at most
    ``max_examples`` training examples (its log-likelihood scaled by N / n); the
    InferenceData (and so PSIS-LOO) holds ``num_samples`` draws on a seeded subset of at
    most ``max_examples`` evaluation examples, and its ``sample_stats.log_p`` evaluates
    those draws on the k-hat's training examples.  Counting one forward pass of one
    example as the unit, the diagnostics' passes (``khat_samples * n_train + E *
    num_samples * (n_eval + n_train)`` for ``E`` exported methods, plus ``khat_samples *
    n_train`` per block k-hat when they fit; see
    :func:`~twodg_pyro.pipeline.diagnostics_steps.diagnostics_budget`)
    are further held to ``budget`` times the passes of the exported model's training
    (epochs times training examples, over its SVI stages; a training pass also runs the
    backward, so ``budget = 1`` keeps the diagnostics to about a third of the training
    time): both subsets shrink in proportion, to no fewer than ``min_examples`` each.

    ``max_site_values``: the InferenceData holds at most this many values of each Pyro
    site per draw (a seeded sub-grid of a larger site; ``null``/``None``: every value;
    see :mod:`twodg_pyro.diagnostics.arviz_export`).
    """

    section: ClassVar[str] = "diagnostics"
    enabled: Annotated[bool, BOOLEAN] = True
    khat_samples: Annotated[
        int, at_least(30, "must be an integer >= 30 (the Pareto fit of the k-hat needs them)")
    ] = 100
    max_examples: Annotated[int, at_least(1)] = 2000
    budget: Annotated[float, positive()] = 1.0
    min_examples: Annotated[int, at_least(1)] = 100
    max_site_values: Annotated[
        int | None, optional(at_least(1), "must be an integer >= 1, or null for every value")
    ] = 10_000

    def _check(self) -> None:
        _require(
            self.min_examples <= self.max_examples,
            "diagnostics.min_examples",
            self.min_examples,
            f"must not exceed diagnostics.max_examples = {self.max_examples}",
        )


@dataclass
class RunConfig(_Section):
    """A whole run: which methods, data, network, prior and the stages' settings."""

    methods: Annotated[list[str], METHOD_LIST] = field(
        default_factory=lambda: ["deterministic", "mean_field", "2dg"]
    )
    seed: Annotated[int, SEED] = 0
    device: Annotated[str, DEVICE] = "cpu"
    num_samples: Annotated[int, at_least(1, "N_s must be an integer >= 1")] = 30
    progress: Annotated[bool, BOOLEAN] = True
    #: epochs between checkpoints of stages 1 and 3 (0: none)
    checkpoint_every: Annotated[int, at_least(0)] = 0
    #: train the SVI stages with the fast step where it applies (the same loss and
    #: gradients as tracing the Pyro programs, without the tracing:
    #: :mod:`twodg_pyro.infer.fast_step`); false: always trace
    fast_step: Annotated[bool, BOOLEAN] = True
    #: in the fast step, sum the shared-GMM guide's KL over all sites at once where each
    #: site's prior is one Normal (:mod:`twodg_pyro.guides.fast_shared`): the same bound
    #: up to float rounding, less work per step; false: site by site, bit for bit the
    #: traced step
    fused_kl: Annotated[bool, BOOLEAN] = False
    data: DataConfig = field(default_factory=DataConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    stage1: Stage1Config = field(default_factory=Stage1Config)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    stage3: Stage3Config = field(default_factory=Stage3Config)
    rank1: Rank1Config = field(default_factory=Rank1Config)
    ssvi: SSVIConfig = field(default_factory=SSVIConfig)
    deterministic_matched: MatchedDeterministicConfig = field(
        default_factory=MatchedDeterministicConfig
    )
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    laplace: LaplaceConfig = field(default_factory=LaplaceConfig)
    uncertainty: UncertaintyConfig = field(default_factory=UncertaintyConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def _check(self) -> None:
        for m in self.methods:
            _one_of(METHODS).check("methods[]", m)
        _require(len(self.methods) > 0, "methods", self.methods, "must name at least one method")
        _require(
            len(set(self.methods)) == len(self.methods),
            "methods",
            self.methods,
            "names a method twice",
        )
        if "laplace" in self.methods:
            import importlib.util

            _require(
                importlib.util.find_spec("laplace") is not None,
                "methods",
                self.methods,
                "the method 'laplace' needs the laplace-torch package, which is not "
                "installed: pip install laplace-torch",
            )
        hints = get_type_hints(type(self))
        for f in dataclasses.fields(self):
            cls = hints[f.name]
            if dataclasses.is_dataclass(cls):
                _require(
                    isinstance(getattr(self, f.name), cls),
                    f.name,
                    getattr(self, f.name),
                    f"must be a {cls.__name__}",
                )

    def to_dict(self) -> dict:
        """Plain, JSON-serialisable dictionary of every setting."""
        return _jsonable(dataclasses.asdict(self))


def _jsonable(obj):
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_jsonable(v) for v in obj]
    return obj


def _coerce(name: str, hint, value):
    """Coerce simple JSON/TOML values to a field's type (ints to floats, 'inf' strings)."""
    origin = get_origin(hint)
    args = get_args(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a table/dict, got {value!r}")
        return config_from_dict(value, hint, prefix=f"{name}.")
    if hint is float or (args and float in args and not isinstance(value, str)):
        if isinstance(value, str) and value in ("inf", "+inf", "-inf"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if value is None and type(None) in args:
                return None
            raise ConfigError(f"{name} must be a number, got {value!r}")
        return float(value) if hint is float else value
    if hint is float and isinstance(value, str):
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if origin is list and not isinstance(value, list):
        raise ConfigError(f"{name} must be a list, got {value!r}")
    return value


def config_from_dict(values: dict, cls: type = RunConfig, prefix: str = ""):
    """Build a settings dataclass from a (nested) dict; unknown keys are errors."""
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(prefix + u for u in unknown)}; "
            f"known in this section: {sorted(names)}"
        )
    kwargs = {}
    for key, value in values.items():
        if isinstance(value, str) and value in ("inf", "+inf", "-inf"):
            value = float(value)
        kwargs[key] = _coerce(prefix + key, hints[key], value)
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - defensive
        raise ConfigError(f"{prefix}: {e}") from e


def _read_text(path: Path) -> str:
    """The text of a config file, or a :class:`ConfigError` naming what is wrong with it."""
    where = str(path)
    if path.is_dir():
        raise ConfigError(f"config file {where!r} is a folder, not a file")
    if not path.exists():
        raise ConfigError(f"config file {where!r} does not exist")
    if not path.is_file():  # reading a pipe would wait for a writer, forever
        raise ConfigError(f"config file {where!r} is not a regular file (a pipe, device or socket)")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {where!r} cannot be read: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark (some editors write one) is no setting
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {where!r} is not a text file (byte {raw[e.start]:#04x} at offset "
            f"{e.start} is not UTF-8); expected TOML, JSON or YAML settings"
        ) from e
    if "\x00" in text:
        raise ConfigError(
            f"config file {where!r} is not a text file (it holds NUL bytes); expected TOML, "
            "JSON or YAML settings"
        )
    return text


def load_config(
    path: str | Path, overrides: dict | None = None, base: dict | None = None
) -> RunConfig:
    """Read a TOML (``.toml``), JSON (``.json``) or YAML (``.yaml``/``.yml``) config file.

    ``base`` (e.g. a preset's settings, ``train --preset NAME``) is what the file's
    settings override; a top-level ``preset = "<name>"`` in the file names that base
    instead (:func:`~twodg_pyro.pipeline.presets.preset`).  The ``overrides``
    (command-line options) override both.  A file that sets nothing is an error unless a
    base is given.

    Raises:
        ConfigError: the file is missing, a folder, not text, not parseable, sets
            nothing (without a base), names a preset other than ``base``, or holds an
            unknown or bad setting (named).
    """
    path = Path(path)
    where = str(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json", ".yaml", ".yml") and not path.is_dir():
        if not path.exists():
            raise ConfigError(f"config file {where!r} does not exist")
        raise ConfigError(
            f"config file {where!r}: unknown format {suffix!r} (use .toml, .json or .yaml)"
        )
    text = _read_text(path)
    try:
        if suffix == ".toml":
            values = tomllib.loads(text)
        elif suffix == ".json":
            values = json.loads(text)
        else:
            try:
                import yaml
            except ImportError as e:
                raise ConfigError("YAML configs need PyYAML (pip install pyyaml)") from e
            try:
                values = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise ConfigError(
                    f"config file {where!r} cannot be parsed: {' '.join(str(e).split())}"
                ) from e
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"config file {where!r} cannot be parsed: {e}") from e
    if (values is None or values == {}) and base is None:
        raise ConfigError(
            f"config file {where!r} sets nothing: an empty config would silently run the "
            "library defaults (300 epochs, K = 2000); write the settings, or start from a "
            'preset: preset = "digits" in the file (the main job\'s), or --preset NAME'
        )
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise ConfigError(f"config file {where!r} must hold a table of settings")
    if "preset" in values:
        from .presets import PRESETS, preset

        name = values.pop("preset")
        if not isinstance(name, str) or name not in PRESETS:
            raise ConfigError(f"preset = {name!r}: must be one of {sorted(PRESETS)}")
        if base is not None and base != preset(name):
            raise ConfigError(
                f"config file {where!r} says preset = {name!r}, another preset was given "
                "too (--preset): name one"
            )
        base = preset(name)
    values = merge_settings(merge_settings(base or {}, values), overrides or {})
    return config_from_dict(values)
