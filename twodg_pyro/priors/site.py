r"""A user's prior given as distributions, and the coercion of a prior argument."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyro.distributions as dist
import torch
from torch import nn

from ..nn.sites import BayesianSite
from .base import Prior
from .iid import NormalPrior


class SitePrior(Prior):
    """A user-supplied prior: one distribution for all sites, a mapping from site name
    to distribution (with an optional ``default``), or a function ``site -> distribution``.

    In a model file, one ``pyro.distributions`` distribution with scalar parameters
    (``kind: "distribution"``) or a mapping of such (``"per_site"``) is stored as the
    distributions' class names and parameters, and rebuilt from ``pyro.distributions``
    (nothing is imported by name from anywhere else); a function, or a distribution
    with tensor parameters, cannot be stored.
    """

    kind = "distribution"
    aliases = ("per_site",)
    in_settings = False

    def __init__(
        self,
        prior: dist.Distribution
        | Mapping[str, dist.Distribution]
        | Callable[[BayesianSite], dist.Distribution],
        default: dist.Distribution | None = None,
    ):
        if not isinstance(prior, (dist.Distribution, Mapping)) and not callable(prior):
            raise TypeError(
                f"SitePrior needs a distribution, a mapping or a callable, got {type(prior)}"
            )
        self.prior = prior
        self.default = default

    @classmethod
    def from_settings(cls, scale: float, delta: float, net: nn.Module | None) -> SitePrior:
        """Refused: a ``SitePrior`` holds distributions, which settings cannot name."""
        raise ValueError(
            f"prior.kind = {cls.kind!r} needs distributions, which a settings file cannot "
            "give; build a SitePrior in Python and pass it to BNNModel"
        )

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        if isinstance(self.prior, dist.Distribution):
            return self.prior
        if isinstance(self.prior, Mapping):
            d = self.prior.get(site.name, self.default)
            if d is None:
                raise KeyError(
                    f"SitePrior has no distribution for site {site.name!r} and no default; "
                    f"known sites: {sorted(self.prior)}"
                )
            return d
        d = self.prior(site)
        if not isinstance(d, dist.Distribution):
            raise TypeError(
                f"the prior function returned {type(d).__name__} for site {site.name!r}, "
                "expected a pyro distribution"
            )
        return d

    def to_spec(self, model=None) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """``{"kind": "distribution", "type", "params"}`` or ``{"kind": "per_site",
        "sites": {site: {"type", "params"}}, "default"}``; ``None`` for a function or a
        distribution that is not a ``pyro.distributions`` one with scalar parameters."""
        if isinstance(self.prior, dist.Distribution):
            d = _distribution_spec(self.prior)
            return None if d is None else ({"kind": "distribution", **d}, {})
        if not hasattr(self.prior, "items"):
            return None
        sites = {k: _distribution_spec(v) for k, v in self.prior.items()}
        default = None if self.default is None else _distribution_spec(self.default)
        if any(v is None for v in sites.values()) or (self.default is not None and default is None):
            return None
        return {"kind": "per_site", "sites": sites, "default": default}, {}

    @classmethod
    def from_spec(cls, spec: dict, net: nn.Module, tensors: dict, where: str) -> SitePrior:
        if spec["kind"] == "distribution":
            return cls(_rebuild_distribution(spec))
        sites = {k: _rebuild_distribution(v) for k, v in spec["sites"].items()}
        default = spec.get("default")
        return cls(sites, None if default is None else _rebuild_distribution(default))


def _distribution_spec(d) -> dict | None:
    """``{"type", "params"}`` of a ``pyro.distributions`` distribution whose parameters
    are scalars, else ``None``."""
    name = type(d).__name__
    if getattr(dist, name, None) is not type(d):
        return None
    params = {}
    for key in d.arg_constraints:
        value = d.__dict__.get(key)
        if value is None:
            continue
        if torch.is_tensor(value):
            if value.numel() != 1:
                return None
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        params[key] = float(value)
    if "logits" in params and "probs" in params:
        del params["probs"]
    try:  # it must rebuild to the same distribution
        again = _rebuild_distribution({"type": name, "params": params})
    except (TypeError, ValueError):
        return None
    return {"type": name, "params": params} if type(again) is type(d) else None


def _rebuild_distribution(spec: dict):
    cls = getattr(dist, str(spec["type"]), None)
    if not (isinstance(cls, type) and issubclass(cls, dist.Distribution)):
        raise ValueError(f"{spec['type']!r} is not a pyro.distributions distribution")
    params = {k: torch.tensor(float(v)) for k, v in dict(spec["params"]).items()}
    return cls(**params)


def as_prior(prior: Prior | dist.Distribution | Callable | float | None) -> Prior:
    """Coerce a user's prior argument: ``None`` -> ``NormalPrior(1.0)``, a float ->
    ``NormalPrior(float)``, a distribution, mapping or callable -> :class:`SitePrior`."""
    if prior is None:
        return NormalPrior(1.0)
    if isinstance(prior, Prior):
        return prior
    if isinstance(prior, (int, float)) and not isinstance(prior, bool):
        return NormalPrior(float(prior))
    return SitePrior(prior)
