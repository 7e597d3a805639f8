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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pos(name: str, value: float) -> None:
    _require(
        _is_number(value) and math.isfinite(value) and value > 0,
        name,
        value,
        "must be a positive number",
    )


def _nonneg_int(name: str, value: int) -> None:
    _int_at_least(name, value, 0)


def _int_at_least(name: str, value: int, low: int) -> None:
    _require(_is_int(value) and value >= low, name, value, f"must be an integer >= {low}")


def _in_range(name: str, value: float, low: float, high: float, closed: tuple[bool, bool]) -> None:
    """``low <(=) value <(=) high`` for a real number ``value``."""
    lo_ok = _is_number(value) and (value >= low if closed[0] else value > low)
    hi_ok = _is_number(value) and (value <= high if closed[1] else value < high)
    brackets = ("[" if closed[0] else "(") + f"{low}, {high}" + ("]" if closed[1] else ")")
    _require(lo_ok and hi_ok, name, value, f"must be in {brackets}")


def _bool(name: str, value: bool) -> None:
    _require(isinstance(value, bool), name, value, "must be true or false")


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    _require(
        isinstance(value, str) and value in options, name, value, f"must be one of {list(options)}"
    )


#: ``cpu``, ``cuda`` or ``cuda:<index>``.
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


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
            self.root is None or (isinstance(self.root, str) and self.root != ""),
            "data.root",
            self.root,
            "must be a folder name",
        )
        _int_at_least("data.batch_size", self.batch_size, 1)
        for n in ("val_fraction", "test_fraction"):
            _in_range(f"data.{n}", getattr(self, n), 0, 1, (True, False))
        if self.name == "digits":  # digits carves both from one set; the others have a test set
            _require(
                self.val_fraction + self.test_fraction < 1,
                "data.val_fraction + data.test_fraction",
                self.val_fraction + self.test_fraction,
                "must be < 1 (nothing would be left to train on)",
            )
        _require(_is_int(self.split_seed), "data.split_seed", self.split_seed, "must be an integer")
        _bool("data.augment", self.augment)


@dataclass
class NetworkConfig:
    """The deterministic architecture (see ``twodg_pyro.models.build_network``)."""

    arch: str = "mlp"
    hidden: list[int] = field(default_factory=lambda: [128])
    pretrain_epochs: int = 0
    dtype: str = "float32"  # or "float64": everything downstream follows the network

    def __post_init__(self):
        from ..models import available_networks

        known = available_networks()
        _require(
            isinstance(self.arch, str) and self.arch.strip().lower().replace("-", "_") in known,
            "network.arch",
            self.arch,
            f"must be one of {known}",
        )
        _require(
            isinstance(self.hidden, (list, tuple))
            and all(_is_int(h) and h > 0 for h in self.hidden),
            "network.hidden",
            self.hidden,
            "must be a list of positive integers (units per hidden layer)",
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
            _is_number(self.delta) and math.isfinite(self.delta) and self.delta >= 0,
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
            isinstance(self.deterministic_milestones, (list, tuple))
            and all(_is_int(m) and m >= 0 for m in self.deterministic_milestones),
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
        _in_range("sharing.mu_quantile", self.mu_quantile, 0, 1, (False, False))
        _pos("sharing.layer_std_multiple", self.layer_std_multiple)
        _in_range("sharing.grad_percentile", self.grad_percentile, 0, 1, (True, False))
        _int_at_least("sharing.grad_batches", self.grad_batches, 1)
        _int_at_least("sharing.n_components", self.n_components, 1)
        if self.gmm_batch_size is not None:
            _require(
                _is_int(self.gmm_batch_size) and self.gmm_batch_size >= 1,
                "sharing.gmm_batch_size",
                self.gmm_batch_size,
                "must be an integer >= 1 (points per EM mini-batch), or absent for full batches",
            )
        _int_at_least("sharing.gmm_max_iter", self.gmm_max_iter, 1)
        _nonneg_int("sharing.n_min", self.n_min)
        _pos("sharing.mahalanobis_threshold", self.mahalanobis_threshold)
        _int_at_least("sharing.k_nearest", self.k_nearest, 1)
        _require(
            _is_number(self.tau_d) and math.isfinite(self.tau_d) and self.tau_d >= 0,
            "sharing.tau_d",
            self.tau_d,
            "must be a number >= 0",
        )
        for n in ("tau_g", "tau_v"):
            v = getattr(self, n)
            _require(_is_number(v) and v > 0, f"sharing.{n}", v, "must be a number > 0 (or inf)")
        for n in ("use_outliers", "use_ellipses", "use_merging"):
            _bool(f"sharing.{n}", getattr(self, n))


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
        _in_range("ssvi.density", self.density, 0, 1, (False, True))
        _choice("ssvi.removal", self.removal, ("mu", "snr", "snr_abs_theta"))
        _choice("ssvi.addition", self.addition, ("gradient", "random"))
        _int_at_least("ssvi.update_every", self.update_every, 1)
        for n in ("move_fraction", "stop_fraction"):
            _in_range(f"ssvi.{n}", getattr(self, n), 0, 1, (True, True))
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

    ``max_site_values``: the InferenceData holds at most this many values of each Pyro
    site per draw (a seeded sub-grid of a larger site; ``null``/``None``: every value;
    see :mod:`twodg_pyro.diagnostics.arviz_export`).
    """

    enabled: bool = True
    khat_samples: int = 100
    max_examples: int = 2000
    budget: float = 1.0
    min_examples: int = 100
    max_site_values: int | None = 10_000

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
        _bool("diagnostics.enabled", self.enabled)
        v = self.max_site_values
        _require(
            v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
            "diagnostics.max_site_values",
            v,
            "must be an integer >= 1, or null for every value",
        )


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
        _require(
            isinstance(self.methods, (list, tuple)),
            "methods",
            self.methods,
            "must be a list of method names",
        )
        for m in self.methods:
            _choice("methods[]", m, known)
        _require(len(self.methods) > 0, "methods", self.methods, "must name at least one method")
        _require(
            len(set(self.methods)) == len(self.methods),
            "methods",
            self.methods,
            "names a method twice",
        )
        _require(_is_int(self.seed), "seed", self.seed, "must be an integer")
        _require(
            _is_int(self.num_samples) and self.num_samples >= 1,
            "num_samples",
            self.num_samples,
            "N_s must be an integer >= 1",
        )
        _bool("progress", self.progress)
        _nonneg_int("checkpoint_every", self.checkpoint_every)
        _require(
            isinstance(self.device, str) and DEVICE_PATTERN.fullmatch(self.device) is not None,
            "device",
            self.device,
            "must be 'cpu', 'cuda' or 'cuda:<index>'",
        )
        sections = (
            ("data", DataConfig),
            ("network", NetworkConfig),
            ("prior", PriorConfig),
            ("stage1", Stage1Config),
            ("sharing", SharingConfig),
            ("stage3", Stage3Config),
            ("rank1", Rank1Config),
            ("ssvi", SSVIConfig),
            ("diagnostics", DiagnosticsConfig),
        )
        for name, cls in sections:
            _require(
                isinstance(getattr(self, name), cls),
                name,
                getattr(self, name),
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
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {where!r} cannot be read: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
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


def merge_settings(base: dict, over: dict) -> dict:
    """Recursively update nested settings ``base`` with ``over`` (a new dict)."""
    out = dict(base)
    for k, v in over.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = merge_settings(out[k], v) if nested else v
    return out
