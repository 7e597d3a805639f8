"""The rules that settings obey, and the section class that checks them on construction.

A field of a section carries its rules in its type, ``Annotated[type, rule, ...]``; a
``Literal[...]`` type is the rule "one of its values".  A broken rule raises
:class:`ConfigError` naming the setting and its value (``sharing.gmm_max_iter = -1:
must be an integer >= 1``).  The sections live with what they configure: the 2DG
method's in :mod:`twodg_pyro.sharing.config`, the application's, one per table of the
config file, in :mod:`twodg_pyro.pipeline.settings` (``sections``, ``registry``,
``evaluation``); :mod:`twodg_pyro.pipeline.settings.config` reads the files.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, get_args, get_origin, get_type_hints

#: the recipes of the deterministic network (:func:`~twodg_pyro.baselines.train_deterministic`,
#: ``stage1.deterministic_optimizer``)
Optimizer = Literal["adam", "sgd"]


class ConfigError(ValueError):
    """A setting is unknown or out of range; the message names it."""


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
        require(self.test(value), name, value, self.what)


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


def optional_at_least(low: int, absent: str) -> Rule:
    """``None`` or an integer >= ``low``: "must be an integer >= <low>, <absent>" where
    ``absent`` says what a missing value means (``"or absent for all"``)."""
    return optional(at_least(low), f"must be an integer >= {low}, {absent}")


BOOLEAN = Rule(lambda v: isinstance(v, bool), "must be true or false")
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


def one_of(options: tuple) -> Rule:
    """A string among ``options``."""
    return Rule(lambda v: isinstance(v, str) and v in options, f"must be one of {list(options)}")


def _is_list_of(kind: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (list, tuple)) and all(kind(x) for x in v)


# named rules of single settings (annotations refer to them by name)
FOLDER = Rule(lambda v: v is None or (isinstance(v, str) and v != ""), "must be a folder name")
HIDDEN_UNITS = Rule(
    _is_list_of(lambda h: _is_int(h) and h > 0),
    "must be a list of positive integers (units per hidden layer)",
)
EPOCH_LIST = Rule(_is_list_of(lambda m: _is_int(m) and m >= 0), "must be epochs (integers >= 0)")
INIT_SCALE = Rule(
    lambda v: (
        v in ("paper", "curvature", "hess_init") or (_is_number(v) and math.isfinite(v) and v > 0)
    ),
    "must be 'paper', 'curvature', 'hess_init' or a positive number",
)
_DATA_SIZE = re.compile(r"data_size(?:\s*\*\s*(\S+))?")


def data_size_multiple(value: Any) -> float | None:
    r"""The multiple :math:`m` of a KL-weight setting that names the data-size rule:
    ``"data_size"`` (1) or ``"data_size * m"`` (a positive finite :math:`m`: :math:`m`
    times the rule's :math:`\beta`); ``None`` for any other value."""
    match = _DATA_SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None or match.group(1) is None:
        return None if match is None else 1.0
    try:
        m = float(match.group(1))
    except ValueError:
        return None
    return m if 0 < m < math.inf else None


KL_WEIGHT = Rule(
    lambda v: data_size_multiple(v) is not None or (_is_number(v) and 0 < v < math.inf),
    'must be a positive number, "data_size" (beta tied to the data and network sizes) or '
    '"data_size * m" (m > 0 times it)',
)
POSITIVE_OR_INF = Rule(lambda v: _is_number(v) and v > 0, "must be a number > 0 (or inf)")
METHOD_LIST = Rule(lambda v: isinstance(v, (list, tuple)), "must be a list of method names")
DEVICE = Rule(
    lambda v: isinstance(v, str) and re.fullmatch(r"cpu|cuda(:\d+)?", v) is not None,
    "must be 'cpu', 'cuda' or 'cuda:<index>'",
)


def names_of(known: tuple[str, ...]) -> Rule:
    """A list of values, each among ``known``."""
    return Rule(
        lambda v: isinstance(v, (list, tuple)) and all(x in known for x in v),
        f"must be a list of values from {', '.join(map(str, known))}",
    )


def _rules(hint) -> list[Rule]:
    """The rules of a field's type: its ``Annotated`` rules, or "one of" a ``Literal``."""
    rules: list[Rule] = []
    if get_origin(hint) is Annotated:
        hint, *extra = get_args(hint)
        rules += [r for r in extra if isinstance(r, Rule)]
    if get_origin(hint) is Literal:
        rules.insert(0, one_of(get_args(hint)))
    return rules


class Section:
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
            require(not _too_large(value), prefix + f.name, value, "must be below 2**63")
        self._check()

    def _check(self) -> None:
        """Constraints between fields (none by default)."""


def require(cond: bool, name: str, value: Any, what: str) -> None:
    """Raise ``"<name> = <value>: <what>"`` unless ``cond`` (a check across fields)."""
    if not cond:
        raise ConfigError(f"{name} = {value!r}: {what}")
