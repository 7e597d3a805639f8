r"""The :class:`Prior` protocol: a site's distribution, on the network's device and
dtype, and how a prior describes itself to model files and run settings (its
``kind``, :meth:`Prior.to_spec` / :meth:`Prior.from_spec`, the registry :data:`PRIORS`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import pyro
import pyro.distributions as dist
import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..nn.sites import BayesianSite


def public_settings(obj) -> dict | None:
    """``obj``'s public attributes (not starting with ``_``), ``None`` unless every one is
    a JSON scalar (a number, string, boolean or ``None``)."""
    out = {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    scalar = (bool, int, float, str, type(None))
    return out if all(isinstance(v, scalar) for v in out.values()) else None


def _positive(value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return value


#: device/dtype copies of distribution parameters: source tensor -> {(device, dtype):
#: (source version, copy)}; an entry lives as long as its source tensor.
_MOVED: WeakIdKeyDictionary = WeakIdKeyDictionary()
_CPU = torch.device("cpu")


def _tensor_to(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``t`` on ``device``, floating tensors in ``dtype`` (integer ones keep theirs); ``t``
    itself when it is there already.  Copies of tensors without gradients are cached
    (per source tensor and its in-place version), so a fixed prior parameter is copied to
    the GPU once, not at every step."""
    target = dtype if t.is_floating_point() else t.dtype
    if t.device == device and t.dtype == target:
        return t
    if t.requires_grad:  # a learnt prior parameter: keep the graph, no caching
        return t.to(device=device, dtype=target)
    per = _MOVED.setdefault(t, {})
    hit = per.get((device, target))
    if hit is not None and hit[0] == t._version:
        return hit[1]
    moved = t.to(device=device, dtype=target)
    per[(device, target)] = (t._version, moved)
    return moved


def distribution_to(
    d: dist.Distribution, device: torch.device | str, dtype: torch.dtype
) -> dist.Distribution:
    """``d`` with its tensor parameters on ``device`` and floating ones in ``dtype``.

    Rebuilds ``d`` from its ``arg_constraints`` parameters (``Normal``, ``Laplace``,
    ``StudentT``, ``LogNormal``, ... any distribution whose constructor takes them), through
    ``Independent`` and ``MixtureSameFamily`` wrappers; returns ``d`` itself when every
    parameter is there already.

    Raises:
        TypeError: ``d`` cannot be rebuilt from its parameters and has some elsewhere
            (build such a prior from tensors on the network's device instead).
    """
    device = torch.device(device)
    if isinstance(d, dist.Independent):
        base = distribution_to(d.base_dist, device, dtype)
        if base is d.base_dist:
            return d
        return dist.Independent(base, d.reinterpreted_batch_ndims, validate_args=False)
    if isinstance(d, dist.MixtureSameFamily):
        mix = distribution_to(d.mixture_distribution, device, dtype)
        comp = distribution_to(d.component_distribution, device, dtype)
        if mix is d.mixture_distribution and comp is d.component_distribution:
            return d
        return dist.MixtureSameFamily(mix, comp, validate_args=False)
    params, attrs = {}, d.__dict__
    for name in d.arg_constraints:
        value = attrs.get(name)
        if value is None:
            if not isinstance(getattr(type(d), name, None), property):
                continue  # a lazily computed alternative parameterisation (probs/logits)
            value = getattr(d, name, None)  # e.g. LogNormal's loc/scale (properties)
        if isinstance(value, torch.Tensor):
            params[name] = value
    if "logits" in params and "probs" in params:
        del params["probs"]
    moved = {name: _tensor_to(value, device, dtype) for name, value in params.items()}
    if all(moved[name] is value for name, value in params.items()):
        return d
    try:
        # no validation, also of parts built inside (StudentT's Chi2): it would read
        # values back from the device
        with pyro.validation_enabled(False):
            return type(d)(**moved, validate_args=False)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"cannot move a {type(d).__name__} prior to {device} / {dtype} by rebuilding it "
            f"from its parameters ({e}); build it from tensors on the network's device and "
            "dtype instead"
        ) from e


#: every prior class with a ``kind``: that name and its ``aliases`` -> the class
PRIORS: dict[str, type[Prior]] = {}


def register_class(registry: dict, name: str, cls: type, what: str) -> None:
    """``registry[name] = cls``; a name another class holds is a ``TypeError`` (the same
    class defined again, same module and name, replaces itself)."""
    held = registry.setdefault(name, cls)
    if (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(
            f"{cls.__qualname__}: the {what} {name!r} is taken by "
            f"{held.__module__}.{held.__qualname__}"
        )
    registry[name] = cls


def prior_class(name: str) -> type[Prior]:
    """The prior class registered under ``name`` (its ``kind`` or one of its ``aliases``);
    a ``ValueError`` naming those that are when none is."""
    if name not in PRIORS:
        raise ValueError(f"unknown prior {name!r}; registered: {sorted(PRIORS)}")
    return PRIORS[name]


class Prior(ABC):
    """Maps a Bayesian site to its prior: ``p(w_site) = prod_i p_i(w_i)``.

    A subclass implements :meth:`site_distribution`; the device and dtype of the
    distribution are handled here, for every prior (see :mod:`twodg_pyro.priors`).

    **Files and settings.**  A subclass with a ``kind`` registers itself in
    :data:`PRIORS` when it is defined; model files store it by :meth:`to_spec` and load
    it by :meth:`from_spec` (its module must be imported before such a file is loaded),
    run settings build it by :meth:`from_settings`.  The defaults store the public
    attributes (not starting with ``_``), which must then be JSON scalars and the
    constructor's keyword arguments; a prior with other state overrides them.  ``kind``,
    ``aliases`` and ``settled`` are each class's own, never inherited (a subclass may
    draw other weights): a subclass without a ``kind`` of its own is not stored.  A
    name another class holds is a ``TypeError`` naming it.
    """

    #: its name in model files (the spec's ``"kind"``) and settings; ``None``: not stored
    kind: ClassVar[str | None] = None
    #: further names of it: in run settings (``prior.kind``), or in older files
    aliases: ClassVar[tuple[str, ...]] = ()
    #: a promise: :meth:`site_distribution` depends on the site and on the public
    #: attributes only (by value; tensors by identity and in-place version), so the fast
    #: training step makes the sites' distributions once per settings, device and dtype
    #: (:func:`~twodg_pyro.infer.fast_step.site_priors`); ``False``: asked at every step
    settled: ClassVar[bool] = False
    #: whether run settings may name it (``prior.kind``): ``False`` for a prior that
    #: :meth:`from_settings` cannot build (it needs distributions, or stands in for one)
    in_settings: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        cls.kind, cls.aliases = own.get("kind"), tuple(own.get("aliases", ()))
        cls.settled = bool(own.get("settled"))
        for name in (cls.kind, *cls.aliases) if cls.kind is not None else ():
            register_class(PRIORS, name, cls, "prior kind")

    @abstractmethod
    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        """The prior of one site, with scalar events broadcastable to ``site.shape``."""

    def to_spec(self, model=None) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """``(spec, tensors)``: the JSON spec of this prior (``{"kind": kind, ...}``) and
        the tensors a full model file stores beside it (a compact one keeps the spec
        only), for ``model`` (or ``None``); ``None``: it cannot be stored.  The default:
        ``{"kind": kind, **public attributes}``, no tensors."""
        settings = public_settings(self)
        if self.kind is None or settings is None:
            return None
        return {"kind": self.kind, **settings}, {}

    @classmethod
    def from_spec(
        cls, spec: dict, net: nn.Module, tensors: dict[str, torch.Tensor], where: str
    ) -> Prior:
        """The prior of :meth:`to_spec`'s ``spec`` (and its stored ``tensors``) for a
        model over ``net``, from the file ``where``.  The default: ``cls(**settings)``.

        Raises:
            ValueError: ``spec`` is not what the prior writes (a setting missing).
        """
        settings = {k: v for k, v in spec.items() if k != "kind"}
        prior = cls(**settings)
        if prior.to_spec() != ({"kind": cls.kind, **settings}, {}):
            raise ValueError(f"{where!r}: {spec!r:.100} is not what a {cls.__name__} writes")
        return prior

    @classmethod
    def from_settings(cls, scale: float, delta: float, net: nn.Module | None) -> Prior:
        """The prior of a run's ``prior.scale`` and ``prior.delta`` for the network ``net``
        (``None``: none given).  The default: ``cls(scale)``."""
        return cls(scale)

    def constant(self, value: float) -> torch.Tensor:
        """``value`` as a 0-d tensor on the device and in the dtype of the call being
        answered (:meth:`__call__`'s ``like``; outside a call, float64 on the CPU), the
        same object for the same value, device and dtype: a fixed parameter made once per
        device and dtype, from the exact float64 value."""
        cache = self.__dict__.setdefault("_constants", {})
        key = (float(value), *self.__dict__.get("_target", (_CPU, torch.float64)))
        t = cache.get(key)
        if t is None:
            t = torch.tensor(float(value), dtype=torch.float64)
            t = cache[key] = t.to(device=key[1], dtype=key[2])
        return t

    def __call__(self, site: BayesianSite, like: torch.Tensor | None = None) -> dist.Distribution:
        """The prior of ``site`` expanded to its shape, as one Pyro sample site.

        Args:
            site: the Bayesian site.
            like: the site's network parameter (or any tensor on the network's device, in
                its dtype): the distribution's parameters are put on its device and, if
                floating, in its dtype.  ``None``: the CPU and torch's default dtype.

        Returns a distribution with ``event_shape == site.shape``.
        """
        device, dtype = (
            (_CPU, torch.get_default_dtype()) if like is None else (like.device, like.dtype)
        )
        outer = self.__dict__.get("_target")
        self._target = (device, dtype)  # what constant() makes its tensors for
        try:
            d = self.site_distribution(site)
        finally:
            if outer is None:
                del self._target
            else:
                self._target = outer
        try:  # parameters made elsewhere (a user's distribution, stored tensors)
            d = distribution_to(d, device, dtype)
        except TypeError as e:
            raise TypeError(f"prior for site {site.name!r}: {e}") from e
        if d.event_shape != torch.Size():
            raise ValueError(
                f"prior for site {site.name!r} must have scalar events, got "
                f"event_shape={tuple(d.event_shape)}"
            )
        return d.expand(site.shape).to_event(len(site.shape))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"
