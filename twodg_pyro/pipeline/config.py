"""Validated settings of a run (data, network, prior, the three stages of Algorithm 1).

Every threshold of the paper (spec section 4) is a field with the paper's value as
default.  Settings load from TOML, JSON or YAML files; an unknown key or a bad
value raises :class:`ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

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
    "DiagnosticsConfig",
    "RunConfig",
    "DTYPES",
    "torch_dtype",
    "load_config",
    "config_from_dict",
]


class ConfigError(ValueError):
    """A setting is unknown or out of range; the message names it."""


#: ``network.dtype`` values: the floating type of the network's parameters, and so of the
#: priors, guides, draws, stage 2's mixture and the predictions.
DTYPES = ("float32", "float64")


def torch_dtype(name: str):
    """The ``torch.dtype`` of a ``network.dtype`` setting (``"float32"``, ``"float64"``)."""
    import torch

    _choice("network.dtype", name, DTYPES)
    return getattr(torch, name)


def _require(cond: bool, name: str, value: Any, what: str) -> None:
    if not cond:
        raise ConfigError(f"{name} = {value!r}: {what}")


def _pos(name: str, value: float) -> None:
    _require(
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0,
        name,
        value,
        "must be a positive number",
    )


def _nonneg_int(name: str, value: int) -> None:
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        name,
        value,
        "must be an integer >= 0",
    )


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    _require(value in options, name, value, f"must be one of {list(options)}")


@dataclass
class DataConfig:
    """Which data set and how it is batched."""

    name: str = "digits"
    root: str | None = None
    batch_size: int = 128
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    split_seed: int = 0
    augment: bool = True  # CIFAR training augmentation (paper App. I.2); ImageNet always

    def __post_init__(self):
        _choice(
            "data.name",
            self.name,
            ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "imagenet"),
        )
        _require(
            isinstance(self.batch_size, int) and self.batch_size >= 1,
            "data.batch_size",
            self.batch_size,
            "must be an integer >= 1",
        )
        for n in ("val_fraction", "test_fraction"):
            v = getattr(self, n)
            _require(0 <= v < 1, f"data.{n}", v, "must be in [0, 1)")


@dataclass
class NetworkConfig:
    """The deterministic architecture (see ``twodg_pyro.models.build_network``)."""

    arch: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128])
    pretrain_epochs: int = 0
    dtype: str = "float32"  # or "float64": everything downstream follows the network

    def __post_init__(self):
        _require(
            isinstance(self.arch, str) and self.arch,
            "network.arch",
            self.arch,
            "must name an architecture",
        )
        _require(
            all(isinstance(h, int) and h > 0 for h in self.hidden),
            "network.hidden",
            self.hidden,
            "must be positive integers",
        )
        _nonneg_int("network.pretrain_epochs", self.pretrain_epochs)
        _choice("network.dtype", self.dtype, DTYPES)


@dataclass
class PriorConfig:
    """The prior over Bayesian weights: ``normal``, ``laplace``, ``layerwise`` or
    ``pretrained`` (empirical Bayes: centred at the network's initial, e.g. pretrained,
    weights with standard deviation ``scale + delta |w|``, see
    :class:`~twodg_pyro.priors.PretrainedPrior`)."""

    kind: str = "normal"
    scale: float = 1.0
    delta: float = 0.0

    def __post_init__(self):
        _choice("prior.kind", self.kind, ("normal", "laplace", "layerwise", "pretrained"))
        _pos("prior.scale", self.scale)
        _require(
            isinstance(self.delta, (int, float)) and math.isfinite(self.delta) and self.delta >= 0,
            "prior.delta",
            self.delta,
            "must be a finite number >= 0",
        )


@dataclass
class Stage1Config:
    r"""Mean-field pretraining (Algorithm 1, stage 1) and the deterministic network's
    training recipe (the baseline, and the pretraining of ``network.pretrain_epochs``).

    ``kl_weight`` is a KL temperature :math:`\beta`: stage 1 minimises
    :math:`\text{nll} + \beta\,\mathrm{KL}`; 1 is the true ELBO, and every results row
    trained with another value says so.  The ``deterministic_*`` settings select Adam at
    a constant rate (the default) or the paper's SGD recipe (App. I.3: momentum, weight
    decay, linear warm-up, learning-rate steps by ``deterministic_gamma`` at
    ``deterministic_milestones``)."""

    epochs: int = 300
    lr_loc: float = 1e-2
    lr_scale: float = 1e-2
    kl_warmup_epochs: int = 0
    kl_weight: float = 1.0
    init_scale: str | float = "paper"
    deterministic_epochs: int = 300
    deterministic_lr: float = 1e-2
    deterministic_optimizer: str = "adam"
    deterministic_momentum: float = 0.9
    deterministic_weight_decay: float = 0.0
    deterministic_milestones: list[int] = field(default_factory=list)
    deterministic_gamma: float = 0.1
    deterministic_warmup_epochs: int = 0

    def __post_init__(self):
        _nonneg_int("stage1.epochs", self.epochs)
        _nonneg_int("stage1.kl_warmup_epochs", self.kl_warmup_epochs)
        _nonneg_int("stage1.deterministic_epochs", self.deterministic_epochs)
        _nonneg_int("stage1.deterministic_warmup_epochs", self.deterministic_warmup_epochs)
        for n in ("lr_loc", "lr_scale", "deterministic_lr", "kl_weight", "deterministic_gamma"):
            _pos(f"stage1.{n}", getattr(self, n))
        _choice("stage1.deterministic_optimizer", self.deterministic_optimizer, ("adam", "sgd"))
        for n in ("deterministic_momentum", "deterministic_weight_decay"):
            v = getattr(self, n)
            _require(
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v >= 0,
                f"stage1.{n}",
                v,
                "must be a finite number >= 0",
            )
        _require(
            all(
                isinstance(m, int) and not isinstance(m, bool) and m >= 0
                for m in self.deterministic_milestones
            ),
            "stage1.deterministic_milestones",
            self.deterministic_milestones,
            "must be epochs (integers >= 0)",
        )
        if isinstance(self.init_scale, str):
            _choice("stage1.init_scale", self.init_scale, ("paper",))
        else:
            _pos("stage1.init_scale", self.init_scale)


@dataclass
class SharingConfig:
    """Outliers, the 2-D mixture and its refinement (stage 1 steps 3-5, stage 2)."""

    coordinates: str = "sigma"  # (mu, sigma) as in the paper, or "log_sigma"
    outlier_rule: str = "absolute"  # |mu| > tau_w; or "quantile" / "layer_std"
    tau_w: float = 0.2
    mu_quantile: float = 0.99
    layer_std_multiple: float = 3.0
    grad_percentile: float = 0.01  # P_g: top fraction of |dL/dmu|
    grad_batches: int = 4
    n_components: int = 2000
    gmm_batch_size: int | None = None
    gmm_max_iter: int = 100
    n_min: int = 20
    mahalanobis_threshold: float = 5.991
    k_nearest: int = 5
    merge_rule: str = "paper"  # or "moment"
    merge_test: str = "both"  # or "difference"
    tau_d: float = 1e-2  # W2 merge threshold T_W
    tau_g: float = math.inf
    tau_v: float = math.inf
    use_outliers: bool = True
    use_ellipses: bool = True
    use_merging: bool = True

    def __post_init__(self):
        _choice("sharing.coordinates", self.coordinates, ("sigma", "log_sigma"))
        _choice("sharing.outlier_rule", self.outlier_rule, ("absolute", "quantile", "layer_std"))
        _choice("sharing.merge_rule", self.merge_rule, ("paper", "moment"))
        _choice("sharing.merge_test", self.merge_test, ("both", "difference"))
        _pos("sharing.tau_w", self.tau_w)
        _require(
            0 < self.mu_quantile < 1, "sharing.mu_quantile", self.mu_quantile, "must be in (0, 1)"
        )
        _pos("sharing.layer_std_multiple", self.layer_std_multiple)
        _require(
            0 <= self.grad_percentile < 1,
            "sharing.grad_percentile",
            self.grad_percentile,
            "must be in [0, 1)",
        )
        _require(
            isinstance(self.grad_batches, int) and self.grad_batches >= 1,
            "sharing.grad_batches",
            self.grad_batches,
            "must be an integer >= 1",
        )
        _require(
            isinstance(self.n_components, int) and self.n_components >= 1,
            "sharing.n_components",
            self.n_components,
            "must be an integer >= 1",
        )
        _nonneg_int("sharing.n_min", self.n_min)
        _pos("sharing.mahalanobis_threshold", self.mahalanobis_threshold)
        _require(
            isinstance(self.k_nearest, int) and self.k_nearest >= 1,
            "sharing.k_nearest",
            self.k_nearest,
            "must be an integer >= 1",
        )
        _require(self.tau_d >= 0, "sharing.tau_d", self.tau_d, "must be >= 0")
        for n in ("tau_g", "tau_v"):
            _require(getattr(self, n) > 0, f"sharing.{n}", getattr(self, n), "must be > 0")


@dataclass
class Stage3Config:
    """Training the shared-weight BNN (stage 3) and its refinement hooks."""

    epochs: int = 100
    lr_centre: float = 1e-3
    lr_outlier: float = 1e-3
    lr_cov: float = 1e-3
    tying: str = "representative"  # or "stochastic", "tied"
    merge_every: int = 0  # epochs between merge hooks (0: never during stage 3)
    reassign_every: int = 0  # epochs between Mahalanobis reassignment hooks
    kl_weight: float = 1.0  # KL temperature beta of stage 3 (1: the true bound, Eq. 10)

    def __post_init__(self):
        _nonneg_int("stage3.epochs", self.epochs)
        for n in ("lr_centre", "lr_outlier", "lr_cov", "kl_weight"):
            _pos(f"stage3.{n}", getattr(self, n))
        _choice("stage3.tying", self.tying, ("representative", "stochastic", "tied"))
        _nonneg_int("stage3.merge_every", self.merge_every)
        _nonneg_int("stage3.reassign_every", self.reassign_every)


@dataclass
class Rank1Config:
    """Rank-1 BNN (Dusenberry et al. 2020): ``M`` mixture components over rank-1 factors.

    ``prior`` is ``normal`` or ``cauchy``, centred at 1 with scale ``prior_scale``; factor
    means start at random signs (``init_mean = "random_sign"``) or at 1 (``"ones"``) and
    their standard deviations at ``init_scale``; ``routing`` sends example ``i`` to
    component ``i mod M`` (``"modulo"``) or every example to every component
    (``"tile"``).  The KL is annealed linearly over the first two thirds of ``epochs``.
    """

    components: int = 4
    epochs: int = 300
    lr: float = 1e-2
    prior: str = "normal"
    prior_scale: float = 1.0
    init_scale: float = 1e-3
    init_mean: str = "random_sign"
    routing: str = "modulo"

    def __post_init__(self):
        _require(
            isinstance(self.components, int)
            and not isinstance(self.components, bool)
            and self.components >= 1,
            "rank1.components",
            self.components,
            "M (mixture components) must be an integer >= 1",
        )
        _nonneg_int("rank1.epochs", self.epochs)
        _pos("rank1.lr", self.lr)
        _choice("rank1.prior", self.prior, ("normal", "cauchy"))
        _pos("rank1.prior_scale", self.prior_scale)
        _pos("rank1.init_scale", self.init_scale)
        _choice("rank1.init_mean", self.init_mean, ("random_sign", "ones"))
        _choice("rank1.routing", self.routing, ("modulo", "tile"))


@dataclass
class SSVIConfig:
    """Sparse Subspace VI (Li et al. 2024): a mean-field posterior on ``density`` of the
    coordinates of each Bayesian tensor, the subspace updated every ``update_every``
    epochs by ``removal`` (``mu``, ``snr``, ``snr_abs_theta``) and ``addition``
    (``gradient``, ``random``), moving ``move_fraction`` of the active coordinates at
    first, decaying by a cosine to 0 at ``stop_fraction`` of training."""

    density: float = 0.1
    removal: str = "snr_abs_theta"
    addition: str = "gradient"
    update_every: int = 5
    move_fraction: float = 0.3
    stop_fraction: float = 0.75
    epochs: int = 300
    lr: float = 1e-2

    def __post_init__(self):
        _require(
            isinstance(self.density, (int, float))
            and not isinstance(self.density, bool)
            and 0 < self.density <= 1,
            "ssvi.density",
            self.density,
            "must be in (0, 1]",
        )
        _choice("ssvi.removal", self.removal, ("mu", "snr", "snr_abs_theta"))
        _choice("ssvi.addition", self.addition, ("gradient", "random"))
        _require(
            isinstance(self.update_every, int) and self.update_every >= 1,
            "ssvi.update_every",
            self.update_every,
            "must be an integer >= 1",
        )
        for n in ("move_fraction", "stop_fraction"):
            v = getattr(self, n)
            _require(
                isinstance(v, (int, float)) and 0 <= v <= 1, f"ssvi.{n}", v, "must be in [0, 1]"
            )
        _nonneg_int("ssvi.epochs", self.epochs)
        _pos("ssvi.lr", self.lr)


@dataclass
class DiagnosticsConfig:
    """What a run computes after its results are written, and how much of it.

    ``enabled = false`` (``--no-diagnostics``) writes the results and the model file only:
    no InferenceData, Pareto k-hat, PSIS-LOO, posterior summary or figures.

    The budget: the k-hat uses ``khat_samples`` draws from q on a seeded subset of at most
    ``max_examples`` training examples (its log-likelihood scaled by N / n); the
    InferenceData (and so PSIS-LOO) holds ``num_samples`` draws on a seeded subset of at
    most ``max_examples`` evaluation examples.  Counting one forward pass of one example as
    the unit, the diagnostics' passes (``khat_samples * n_train + num_samples * n_eval``)
    are further held to ``budget`` times the passes of the exported model's training
    (epochs times training examples, over its SVI stages; a training pass also runs the
    backward, so ``budget = 1`` keeps the diagnostics to about a third of the training
    time): both subsets shrink in proportion, to no fewer than ``min_examples`` each.
    """

    enabled: bool = True
    khat_samples: int = 100
    max_examples: int = 2000
    budget: float = 1.0
    min_examples: int = 100

    def __post_init__(self):
        _require(
            isinstance(self.khat_samples, int)
            and not isinstance(self.khat_samples, bool)
            and self.khat_samples >= 25,
            "diagnostics.khat_samples",
            self.khat_samples,
            "must be an integer >= 25 (the Pareto fit of the k-hat needs them)",
        )
        for n in ("max_examples", "min_examples"):
            v = getattr(self, n)
            _require(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                f"diagnostics.{n}",
                v,
                "must be an integer >= 1",
            )
        _require(
            self.min_examples <= self.max_examples,
            "diagnostics.min_examples",
            self.min_examples,
            f"must not exceed diagnostics.max_examples = {self.max_examples}",
        )
        _pos("diagnostics.budget", self.budget)


@dataclass
class RunConfig:
    """A whole run: which methods, data, network, prior and the stages' settings."""

    methods: list[str] = field(default_factory=lambda: ["deterministic", "mean_field", "2dg"])
    seed: int = 0
    device: str = "cpu"
    num_samples: int = 30
    progress: bool = True
    checkpoint_every: int = 0  # epochs between checkpoints of stages 1 and 3 (0: none)
    data: DataConfig = field(default_factory=DataConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    stage1: Stage1Config = field(default_factory=Stage1Config)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    stage3: Stage3Config = field(default_factory=Stage3Config)
    rank1: Rank1Config = field(default_factory=Rank1Config)
    ssvi: SSVIConfig = field(default_factory=SSVIConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def __post_init__(self):
        known = ("deterministic", "mean_field", "2dg", "rank1", "ssvi")
        for m in self.methods:
            _choice("methods[]", m, known)
        _require(len(self.methods) > 0, "methods", self.methods, "must name at least one method")
        _require(
            isinstance(self.num_samples, int) and self.num_samples >= 1,
            "num_samples",
            self.num_samples,
            "N_s must be an integer >= 1",
        )
        _nonneg_int("checkpoint_every", self.checkpoint_every)
        _require(
            self.device == "cpu" or self.device.startswith("cuda"),
            "device",
            self.device,
            "must be 'cpu' or 'cuda[:i]'",
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


def load_config(
    path: str | Path, overrides: dict | None = None, base: dict | None = None
) -> RunConfig:
    """Read a TOML (``.toml``), JSON (``.json``) or YAML (``.yaml``/``.yml``) config file.

    ``base`` (e.g. a preset's settings) is what the file's settings override; the
    ``overrides`` (command-line options) override both."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            values = tomllib.loads(text)
        elif suffix == ".json":
            values = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as e:
                raise ConfigError("YAML configs need PyYAML (pip install pyyaml)") from e
            values = yaml.safe_load(text) or {}
        else:
            raise ConfigError(
                f"config file {str(path)!r}: unknown format {suffix!r} (use .toml, .json or .yaml)"
            )
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} cannot be parsed: {e}") from e
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a table of settings")
    values = merge_settings(merge_settings(base or {}, values), overrides or {})
    return config_from_dict(values)


def merge_settings(base: dict, over: dict) -> dict:
    """Recursively update nested settings ``base`` with ``over`` (a new dict)."""
    out = dict(base)
    for k, v in over.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = merge_settings(out[k], v) if nested else v
    return out
