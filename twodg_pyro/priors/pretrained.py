r"""The empirical-Bayes prior centred at given (e.g. pretrained) weights."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pyro.distributions as dist
import torch
from torch import nn

from ..nn.sites import BayesianSite
from .base import Prior, _positive


class PretrainedPrior(Prior):
    r"""Empirical-Bayes prior centred at given (e.g. pretrained) weights:

    .. math:: w_i \sim \mathcal N\big(\hat w_i,\ (s + \delta\,|\hat w_i|)^2\big).

    With ``delta = 0`` every weight has the same scale ``s``; ``delta > 0`` widens the
    prior of large weights (MOPED, Krishnan et al. 2020, sets a scale proportional to
    ``|w|``; ``s`` keeps it positive for weights near zero).  Centred at a deterministic
    network's trained weights, the KL term no longer pulls every mean to zero: it keeps
    the posterior near the pretrained solution, and ``s`` bounds how far the scales grow.
    The prior is different for every weight: the ELBO's KL is closed form against a
    Normal guide, per weight.

    In a model file its centres are the network's own initial values (the frozen
    Bayesian tensors the file keeps with the network: ``"centres": "network"``) or, when
    they are not, tensors stored beside it (``prior/<site>``, ``"centres": "stored"``).

    Args:
        values: ``{site name: tensor}`` of centres (any superset of the model's sites).
        scale: ``s``, the prior standard deviation of a zero weight (positive).
        delta: ``delta >= 0``.
    """

    kind = "PretrainedPrior"
    aliases = ("pretrained",)  # in run settings
    settled = True

    def __init__(self, values: Mapping[str, torch.Tensor], scale: float = 0.1, delta: float = 0.0):
        self.scale = _positive(scale, "PretrainedPrior scale")
        delta = float(delta)
        if not math.isfinite(delta) or delta < 0:
            raise ValueError(f"PretrainedPrior delta must be a finite number >= 0, got {delta!r}")
        self.delta = delta
        self.values = {k: v.detach().clone() for k, v in values.items()}
        for k, v in self.values.items():
            if not torch.isfinite(v).all():
                raise ValueError(f"PretrainedPrior centre {k!r} holds NaN or infinite values")

    @classmethod
    def from_network(cls, net: torch.nn.Module, scale: float = 0.1, delta: float = 0.0):
        """Centred at ``net``'s current parameters."""
        return cls(dict(net.named_parameters()), scale, delta)

    def site_distribution(self, site: BayesianSite) -> dist.Distribution:
        if site.name not in self.values:
            raise KeyError(f"PretrainedPrior has no centre for site {site.name!r}")
        loc = self.values[site.name]
        if tuple(loc.shape) != tuple(site.shape):
            raise ValueError(
                f"PretrainedPrior centre of {site.name!r} has shape {tuple(loc.shape)}, "
                f"the site has {tuple(site.shape)}"
            )
        return dist.Normal(loc, self.scale + self.delta * loc.abs(), validate_args=False)

    def to_spec(self, model=None) -> tuple[dict, dict[str, torch.Tensor]]:
        """``"centres": "network"`` when the centres of ``model``'s sites are its
        network's values, else ``"stored"`` with them as the tensors (a ``ValueError``
        when one is missing)."""
        spec = {"kind": self.kind, "scale": self.scale, "delta": self.delta}
        names = [s.name for s in model.sites] if model is not None else list(self.values)
        params = dict(model.net.named_parameters()) if model is not None else {}
        net_values = {n: params[n] for n in names if n in params}
        same = all(
            n in net_values
            and n in self.values
            and torch.equal(
                net_values[n].detach().cpu(), self.values[n].detach().cpu().to(net_values[n].dtype)
            )
            for n in names
        )
        if same:
            return {**spec, "centres": "network"}, {}
        missing = [n for n in names if n not in self.values]
        if missing:
            raise ValueError(f"PretrainedPrior has no centre for site {missing[0]!r}")
        return {**spec, "centres": "stored"}, {
            n: self.values[n].detach().cpu().clone() for n in names
        }

    @classmethod
    def from_spec(cls, spec: dict, net: nn.Module, tensors: dict, where: str) -> PretrainedPrior:
        """Centred at ``net``'s values, or at the stored ``tensors`` (a ``ValueError``
        when they are missing)."""
        if spec.get("centres", "network") == "stored":
            if not tensors:
                raise ValueError(f"{where!r}: its PretrainedPrior's stored centres are missing")
            return cls(tensors, spec["scale"], spec["delta"])
        return cls.from_network(net, spec["scale"], spec["delta"])

    @classmethod
    def from_settings(cls, scale: float, delta: float, net: nn.Module | None) -> PretrainedPrior:
        """Centred at ``net``'s current (e.g. pretrained) parameters; ``net`` is needed."""
        if net is None:
            raise ValueError(
                "prior.kind = 'pretrained' needs the network whose weights it is centred at"
            )
        return cls.from_network(net, scale, delta)

    def __repr__(self) -> str:
        return (
            f"PretrainedPrior(scale={self.scale!r}, delta={self.delta!r}, sites={len(self.values)})"
        )
