"""Validated settings of a run (data, network, prior, the three stages of Algorithm 1).

Every threshold of the paper (spec section 4) is a field with the paper's value as
default.  Settings load from TOML, JSON or YAML files; an unknown key or a bad
value raises :class:`ConfigError` naming it (``sharing.gmm_max_iter = -1: ...``).
Every field of every section is checked when the settings are built, so a bad value
in a late stage fails before anything trains.

A config file that sets nothing (empty, or comments only) is an error: it would
silently run the library defaults (300 epochs, ``K = 2000``), which suit no data set
in particular.  ``preset = "digits"`` at the top of a file starts from the main job's
settings (:mod:`~twodg_pyro.pipeline.settings.presets`), the file's other settings override it.

This module is the settings' home: :class:`RunConfig` (the top level of a config
file) and reading it from files and dicts.  The rules a setting obeys are in
:mod:`twodg_pyro.settings`; the sections, one per table of the file, in
:mod:`.sections` (data, network, prior, the stages; ``[sharing]`` is the 2DG method's
own :class:`~twodg_pyro.sharing.SharingConfig`), :mod:`.registry` (the registry of
methods, :data:`~twodg_pyro.pipeline.settings.registry.METHOD_REGISTRY`, and the sections
of the compared methods) and :mod:`.evaluation` (uncertainty, diagnostics); the sections
of a run are importable from here (:data:`__all__`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, get_args, get_origin, get_type_hints

from ...data import REGRESSION
from ...files.atomic import jsonable
from ...settings import (
    BOOLEAN,
    DEVICE,
    INT64_LIMIT,
    METHOD_LIST,
    SEED,
    ConfigError,
    Section,
    at_least,
    one_of,
    require,
)
from ...sharing.config import SharingConfig
from .evaluation import DiagnosticsConfig, UncertaintyConfig
from .presets import merge_settings
from .registry import METHOD_REGISTRY, Rank1Config, SSVIConfig
from .sections import DataConfig, NetworkConfig, PriorConfig, Stage1Config, Stage3Config

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
    "UncertaintyConfig",
    "DiagnosticsConfig",
    "RunConfig",
    "INT64_LIMIT",
    "METHODS",
    "SEED",
    "load_config",
    "config_from_dict",
    "MAX_NESTING",
]

#: the methods a run trains and evaluates: the registry's, in the order they run
METHODS: tuple[str, ...] = tuple(METHOD_REGISTRY)


@dataclass
class _RunSettings(Section):
    """The settings of a run that are no method's own (see :class:`RunConfig`)."""

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
    #: site's prior is one Normal (:mod:`twodg_pyro.guides.fast_shared`), and draw the
    #: mean-field guide's sites with their KL as one flat vector
    #: (:mod:`twodg_pyro.guides.fast_normal`): the same bound up to float rounding, less
    #: work per step; false: site by site, bit for bit the traced step
    fused_kl: Annotated[bool, BOOLEAN] = False
    data: DataConfig = field(default_factory=DataConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    prior: PriorConfig = field(default_factory=PriorConfig)
    stage1: Stage1Config = field(default_factory=Stage1Config)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    stage3: Stage3Config = field(default_factory=Stage3Config)
    uncertainty: UncertaintyConfig = field(default_factory=UncertaintyConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)

    def _check(self) -> None:
        # the sections' types first: the checks below read them
        hints = get_type_hints(type(self))
        for f in dataclasses.fields(self):
            cls, value = hints[f.name], getattr(self, f.name)
            if dataclasses.is_dataclass(cls):
                require(isinstance(value, cls), f.name, value, f"must be a {cls.__name__}")
        for m in self.methods:
            one_of(METHODS).check("methods[]", m)
        require(len(self.methods) > 0, "methods", self.methods, "must name at least one method")
        require(
            self.data.name not in REGRESSION,
            "data.name",
            self.data.name,
            "is a regression data set, and a run trains classifiers: fit a regression BNN "
            "in Python (docs/regression.md) and evaluate its model file with twodg-pyro "
            f"evaluate MODEL_FILE --data {self.data.name}",
        )
        require(
            len(set(self.methods)) == len(self.methods),
            "methods",
            self.methods,
            "names a method twice",
        )
        if "laplace" in self.methods:
            import importlib.util

            require(
                importlib.util.find_spec("laplace") is not None,
                "methods",
                self.methods,
                "the method 'laplace' needs the laplace-torch package, which is not "
                "installed: pip install laplace-torch",
            )
            require(
                self.laplace.network != "2dg" or "2dg" in self.methods,
                "laplace.network",
                self.laplace.network,
                "is the 2DG BNN's mean network: add '2dg' to methods",
            )

    def to_dict(self) -> dict:
        """Plain, JSON-serialisable dictionary of every setting."""
        return jsonable(dataclasses.asdict(self))


RunConfig = dataclasses.make_dataclass(
    "RunConfig",
    [
        (name, m.settings, field(default_factory=m.settings))
        for name, m in METHOD_REGISTRY.items()
        if m.settings is not None
    ],
    bases=(_RunSettings,),
    namespace={
        "__module__": __name__,
        "__doc__": """A whole run: which methods, data, network, prior and the stages'
    settings, and the section of every method that has settings of its own (``rank1``,
    ``ssvi``, ...: :attr:`~twodg_pyro.pipeline.settings.registry.Method.settings`).""",
    },
)


def _coerce(name: str, hint, value):
    """Coerce simple JSON/TOML values to a field's type (ints and ``"inf"`` to floats)."""
    if isinstance(value, str) and value in ("inf", "+inf", "-inf"):
        value = float(value)
    origin = get_origin(hint)
    args = get_args(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a table/dict, got {value!r}")
        return config_from_dict(value, hint, prefix=f"{name}.")
    if hint is float or (args and float in args and not isinstance(value, str)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if value is None and type(None) in args:
                return None
            raise ConfigError(f"{name} must be a number, got {value!r}")
        return float(value) if hint is float else value
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
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
    return cls(**{key: _coerce(prefix + key, hints[key], v) for key, v in values.items()})


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


#: the deepest nesting of tables and lists a config file may have: the settings are
#: sections (tables) of values, a few of them lists (``network.hidden``), 3 levels at most;
#: the room above that is generous, and a file far deeper (100,000 levels) would
#: otherwise reach Python's recursion limit in the parsers, an unexpected failure
MAX_NESTING = 16

# a TOML key part (bare or quoted), and a dotted key (or table header) of more parts than
# MAX_NESTING where a key starts (a line, or after "[", "{" or ","): tomllib reads such a
# key in time quadratic in its parts (minutes for 100,000), so it is refused before parsing
_TOML_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')"""
_TOML_DEEP_KEY = re.compile(
    rf"(?:^|(?<=[\[{{,]))[ \t]*{_TOML_PART}(?:[ \t]*\.[ \t]*{_TOML_PART}){{{MAX_NESTING},}}+",
    re.MULTILINE,
)


def _too_deep(where: str, nesting: str) -> ConfigError:
    return ConfigError(
        f"config file {where!r} is nested too deeply ({nesting}): a config file nests "
        f"tables and lists at most {MAX_NESTING} levels deep (its settings need 3)"
    )


def _nesting(values) -> tuple[int, str]:
    """How deep tables and lists nest in parsed settings (a scalar: 0, ``{"a": 1}``: 1),
    and the path to the deepest (``"stage1.a[0]"``); without recursion, each shared
    object (a YAML alias) measured once."""
    height: dict[int, int] = {}
    stack = [(values, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (dict, list)) or (id(node) in height and not done):
            continue
        children = list(node.values() if isinstance(node, dict) else node)
        if done:
            inner = [height.get(id(c), 0) for c in children if isinstance(c, (dict, list))]
            height[id(node)] = 1 + max(inner, default=0)
        else:
            height[id(node)] = 0  # a cycle (an alias of an ancestor) ends here
            stack.append((node, True))
            stack.extend((c, False) for c in children)
    path, node = "", values
    for _ in range(MAX_NESTING + 1):  # down the deepest branch, for the message
        if not isinstance(node, (dict, list)):
            break
        items = node.items() if isinstance(node, dict) else enumerate(node)
        deeper = [(k, v) for k, v in items if isinstance(v, (dict, list))]
        if not deeper:
            break
        key, node = max(deeper, key=lambda kv: height.get(id(kv[1]), 0))
        path += f".{key}" if isinstance(key, str) else f"[{key}]"
    return (height.get(id(values), 0) if isinstance(values, (dict, list)) else 0), path[1:]


def _parse(text: str, suffix: str, where: str):
    """The settings in a config file's ``text`` (by its ``suffix``), or a
    :class:`ConfigError` naming the file: unparseable, or nested more than
    :data:`MAX_NESTING` levels deep."""
    if suffix == ".toml" and (deep := _TOML_DEEP_KEY.search(text)):
        line = text.count("\n", 0, deep.start()) + 1
        raise _too_deep(where, f"a dotted key of more than {MAX_NESTING} parts on line {line}")
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
    except RecursionError:
        # the parsers recurse once per level; the error's own text says only "maximum
        # recursion depth exceeded"
        limit = sys.getrecursionlimit()
        raise _too_deep(
            where, f"tables or lists inside each other past Python's recursion limit, {limit}"
        ) from None
    depth, path = _nesting(values)
    if depth > MAX_NESTING:
        raise _too_deep(where, f"{depth} levels, down {path}")
    return values


def load_config(
    path: str | Path, overrides: dict | None = None, base: dict | None = None
) -> RunConfig:
    """Read a TOML (``.toml``), JSON (``.json``) or YAML (``.yaml``/``.yml``) config file.

    ``base`` (e.g. a preset's settings, ``train --preset NAME``) is what the file's
    settings override; a top-level ``preset = "<name>"`` in the file names that base
    instead (:func:`~twodg_pyro.pipeline.settings.presets.preset`).  The ``overrides``
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
    values = _parse(_read_text(path), suffix, where)
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
