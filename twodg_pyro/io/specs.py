r"""What a model file says about its model, as JSON: the likelihood, the prior, the
Bayesian sites, and how to rebuild each from it.

Shared by the full model files (:mod:`~twodg_pyro.io.bnn_file`,
:mod:`~twodg_pyro.io.model_file`) and the compact ones (:mod:`~twodg_pyro.io.compact`).

**Priors.**  The library's priors are stored by their numbers and rebuilt exactly:
``NormalPrior``, ``LaplacePrior``, ``LayerwiseNormalPrior``, the rank-1 ``CauchyPrior``,
and ``PretrainedPrior``, whose centres are the network's own initial values (the frozen
Bayesian tensors the file keeps with the network: ``"centres": "network"``) or, when
they are not, tensors stored beside it (``prior/<site>``, ``"centres": "stored"``).  A
prior given as one ``pyro.distributions`` distribution with scalar parameters
(``BNNModel(net, prior=dist.StudentT(3., 0., .1))``), or as a mapping from site names to
such distributions, is stored as the distribution's class name and parameters and
rebuilt from ``pyro.distributions`` (nothing is imported by name from anywhere else).

A prior that cannot be stored (a function of the site such as ``lambda site:
dist.StudentT(3., 0., .1)``, a user's ``Prior`` subclass, a distribution with tensor
parameters) is **never replaced silently**: saving warns
(:class:`PriorNotStoredWarning`) and records its ``repr``; loading warns again and gives
the model an :class:`UnavailablePrior`, which predicts as well as any prior (prediction
does not use it) but raises a ``ValueError`` naming the file and the prior wherever the
prior is needed (the Pyro model program, the ELBO, the k-hat), until a prior is passed
to the loader (``load_model(path, prior=...)``).
"""

from __future__ import annotations

import fnmatch
import warnings

import pyro.distributions as dist
import torch
from torch import nn

from ..priors import Prior
from .network_size import build_file_network

__all__ = [
    "PriorNotStoredWarning",
    "UnavailablePrior",
    "exact_include",
    "likelihood_spec",
    "prior_spec",
    "rebuild_likelihood",
    "rebuild_prior",
    "site_types",
]


class PriorNotStoredWarning(UserWarning):
    """A model's prior cannot be written to a model file (or was not): the loaded model
    gets an :class:`UnavailablePrior` unless a prior is passed to the loader."""


# ---------------------------------------------------------------------------- likelihood
def likelihood_spec(lik) -> dict:
    """``{"kind", "dataset_size"[, "scale"]}`` of a Categorical or Gaussian likelihood."""
    from ..likelihoods import Gaussian

    spec = {"kind": type(lik).__name__, "dataset_size": lik.dataset_size}
    if isinstance(lik, Gaussian):
        spec["scale"] = lik.scale
    return spec


def rebuild_likelihood(spec: dict):
    """The likelihood of :func:`likelihood_spec`'s ``spec``; another kind is a ValueError."""
    from ..likelihoods import Categorical, Gaussian

    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind == "Gaussian":
        return Gaussian(spec["dataset_size"], spec["scale"])
    if kind != "Categorical":
        raise ValueError(f"the likelihood {spec!r:.80} is not Categorical or Gaussian")
    return Categorical(spec["dataset_size"])


# ---------------------------------------------------------------------------- priors
class UnavailablePrior(Prior):
    """The prior of a model loaded from a file that could not store it.

    Prediction never calls the prior; anything that does (the model program, an ELBO,
    the k-hat) gets a ``ValueError`` that says which prior it was and how to supply it.
    """

    def __init__(self, description: str, where: str):
        self.description = description
        self.where = where

    def _fail(self):
        raise ValueError(
            f"the prior of the model loaded from {self.where!r} was not stored in the file "
            f"({self.description}): pass it to the loader, e.g. load_model(path, "
            "prior=...), to train the model or compute its ELBO or k-hat; prediction "
            "does not need it"
        )

    def __call__(self, site, like=None):
        self._fail()

    def site_distribution(self, site):
        self._fail()

    def __repr__(self) -> str:
        return f"UnavailablePrior({self.description})"


_SCALAR_TYPES = (int, float)


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
        if not isinstance(value, _SCALAR_TYPES) or isinstance(value, bool):
            return None
        params[key] = float(value)
    if "logits" in params and "probs" in params:
        del params["probs"]
    try:  # it must rebuild to the same distribution
        again = _rebuild_distribution({"type": name, "params": params})
    except (TypeError, ValueError):
        return None
    if type(again) is not type(d):
        return None
    return {"type": name, "params": params}


def _rebuild_distribution(spec: dict):
    cls = getattr(dist, str(spec["type"]), None)
    if not (isinstance(cls, type) and issubclass(cls, dist.Distribution)):
        raise ValueError(f"{spec['type']!r} is not a pyro.distributions distribution")
    params = {k: torch.tensor(float(v)) for k, v in dict(spec["params"]).items()}
    return cls(**params)


def _network_values(net: nn.Module, names) -> dict[str, torch.Tensor]:
    params = dict(net.named_parameters())
    return {n: params[n] for n in names if n in params}


def prior_spec(prior, model=None) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(spec, tensors)``: the JSON spec of ``prior`` and the tensors to store beside it
    (``{site: centre}`` of a ``PretrainedPrior`` whose centres are not the network's).

    Warns :class:`PriorNotStoredWarning` for a prior that cannot be stored (see the
    module docstring) and returns ``{"kind": "custom", "repr": ...}`` for it.
    """
    from ..guides.rank1 import CauchyPrior
    from ..priors import (
        LaplacePrior,
        LayerwiseNormalPrior,
        NormalPrior,
        PretrainedPrior,
        SitePrior,
    )

    if isinstance(prior, PretrainedPrior):
        spec = {"kind": "PretrainedPrior", "scale": prior.scale, "delta": prior.delta}
        names = [s.name for s in model.sites] if model is not None else list(prior.values)
        net_values = _network_values(model.net, names) if model is not None else {}
        same = all(
            n in net_values
            and n in prior.values
            and net_values[n].shape == prior.values[n].shape
            and torch.equal(
                net_values[n].detach().cpu(), prior.values[n].detach().cpu().to(net_values[n].dtype)
            )
            for n in names
        )
        if same:
            return {**spec, "centres": "network"}, {}
        missing = [n for n in names if n not in prior.values]
        if missing:
            raise ValueError(f"PretrainedPrior has no centre for site {missing[0]!r}")
        return {**spec, "centres": "stored"}, {
            n: prior.values[n].detach().cpu().clone() for n in names
        }
    if isinstance(prior, (NormalPrior, LaplacePrior, CauchyPrior)):
        return {"kind": type(prior).__name__, "loc": prior.loc, "scale": prior.scale}, {}
    if isinstance(prior, LayerwiseNormalPrior):
        return {
            "kind": "LayerwiseNormalPrior",
            "gain": prior.gain,
            "bias_scale": prior.bias_scale,
        }, {}
    if isinstance(prior, SitePrior):
        if isinstance(prior.prior, dist.Distribution):
            d = _distribution_spec(prior.prior)
            if d is not None:
                return {"kind": "distribution", **d}, {}
        elif isinstance(prior.prior, dict) or hasattr(prior.prior, "items"):
            sites = {k: _distribution_spec(v) for k, v in prior.prior.items()}
            default = None if prior.default is None else _distribution_spec(prior.default)
            if all(v is not None for v in sites.values()) and (
                prior.default is None or default is not None
            ):
                return {"kind": "per_site", "sites": sites, "default": default}, {}
    if isinstance(prior, UnavailablePrior):
        return {"kind": "custom", "repr": prior.description}, {}
    text = repr(prior)
    warnings.warn(
        f"the prior {text:.120} cannot be stored in a model file (only the library's "
        "priors and pyro.distributions with scalar parameters can): the file records its "
        "description, and loading it gives a model whose prior must be passed again "
        "(load_model(path, prior=...)) to train it or compute its ELBO or k-hat; "
        "prediction does not need it",
        PriorNotStoredWarning,
        stacklevel=3,
    )
    return {"kind": "custom", "repr": text}, {}


def rebuild_prior(spec: dict | None, net: nn.Module, where: str, tensors=None, warn: bool = True):
    """The prior of ``spec`` (see :func:`prior_spec`) for a model over ``net``.

    ``tensors``: the stored centres ``{site: tensor}`` of a ``"stored"`` PretrainedPrior.
    A prior that was not stored gives an :class:`UnavailablePrior` (with a
    :class:`PriorNotStoredWarning` when ``warn``).

    Raises:
        ValueError: a spec that names a known prior with wrong numbers, or stored centres
            that are missing.
    """
    from ..guides.rank1 import CauchyPrior
    from ..priors import (
        LaplacePrior,
        LayerwiseNormalPrior,
        NormalPrior,
        PretrainedPrior,
        SitePrior,
    )

    spec = spec or {}
    kind = spec.get("kind")
    if kind == "PretrainedPrior":
        if spec.get("centres", "network") == "stored":
            if not tensors:
                raise ValueError(f"{where!r}: its PretrainedPrior's stored centres are missing")
            return PretrainedPrior(tensors, spec["scale"], spec["delta"])
        return PretrainedPrior.from_network(net, spec["scale"], spec["delta"])
    if kind == "NormalPrior":
        return NormalPrior(spec["scale"], spec["loc"])
    if kind == "LaplacePrior":
        return LaplacePrior(spec["scale"], spec["loc"])
    if kind == "CauchyPrior":
        return CauchyPrior(spec["scale"], spec["loc"])
    if kind == "LayerwiseNormalPrior":
        return LayerwiseNormalPrior(spec["gain"], spec["bias_scale"])
    if kind == "distribution":
        return SitePrior(_rebuild_distribution(spec))
    if kind == "per_site":
        sites = {k: _rebuild_distribution(v) for k, v in spec["sites"].items()}
        default = None if spec.get("default") is None else _rebuild_distribution(spec["default"])
        return SitePrior(sites, default)
    description = str(spec.get("repr") or kind or "no prior recorded")
    if warn:
        warnings.warn(
            f"{where!r} was saved with a prior that could not be stored ({description:.120}): "
            "the loaded model predicts, but its prior raises until you pass one "
            "(load_model(path, prior=...))",
            PriorNotStoredWarning,
            stacklevel=3,
        )
    return UnavailablePrior(description, where)


# ---------------------------------------------------------------------------- sites
def _escape(name: str) -> str:
    """A glob that matches exactly ``name`` (fnmatch's ``[``, ``*``, ``?`` escaped)."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in name)


def site_types(net: nn.Module, module_names) -> tuple[type[nn.Module], ...]:
    """The classes of ``net``'s modules ``module_names`` (the layer types to select)."""
    types = []
    for name in module_names:
        t = type(net.get_submodule(name))
        if t not in types:
            types.append(t)
    return tuple(types)


def exact_include(names) -> list[str]:
    """Globs that select exactly the parameters ``names``."""
    out = [_escape(n) for n in names]
    assert all(fnmatch.fnmatchcase(n, g) for n, g in zip(names, out, strict=True))
    return out


# ---------------------------------------------------------------------------- rebuilding
def saved_dtype(header: dict, net_state: dict, where: str) -> torch.dtype:
    """The network dtype of a model file: its header's ``dtype``, else (files written before
    it was recorded) that of its floating network tensors, else float32."""
    name = header.get("dtype")
    if name is not None:
        if name not in ("float32", "float64", "float16", "bfloat16"):
            raise ValueError(f"{where!r}: unknown network dtype {name!r} in the header")
        return getattr(torch, name)
    for t in net_state.values():
        if torch.is_tensor(t) and t.is_floating_point():
            return t.dtype
    return torch.float32


def rebuild_network(header: dict, net: nn.Module | None, net_state: dict, where: str) -> nn.Module:
    """The network of a model file: ``net`` (or one built from the header's ``network``
    spec), cast to the saved dtype, with the saved state loaded.

    Raises:
        ValueError: no network spec and no ``net``, a spec that cannot be built, or a
            network that does not match the saved state.
    """
    if net is None:
        shapes = {k: tuple(v.shape) for k, v in net_state.items() if torch.is_tensor(v)}
        net = build_file_network(header.get("network"), where, shapes, "stores")
    net = net.to(saved_dtype(header, net_state, where))  # before load_state_dict casts
    try:
        net.load_state_dict(net_state)
    except RuntimeError as e:
        raise ValueError(f"the network does not match the one saved in {where!r}: {e}") from e
    return net


def module_of(site_name: str) -> str:
    """The owning module's name of a parameter name (``"layers.0.weight"`` -> ``"layers.0"``)."""
    return site_name.rsplit(".", 1)[0] if "." in site_name else ""


def rebuild_bnn_model(net: nn.Module, prior, likelihood, site_names: list[str], where: str):
    """A :class:`~twodg_pyro.model.BNNModel` over ``net`` whose Bayesian sites are exactly
    ``site_names`` (the saved model's, whatever selection made them).

    Raises:
        ValueError: the network lacks one of the sites.
    """
    from ..model import BNNModel

    try:
        types = site_types(net, [module_of(n) for n in site_names])
        model = BNNModel(
            net,
            prior=prior,
            likelihood=likelihood,
            layer_types=types,
            include=exact_include(site_names),
        )
    except (AttributeError, ValueError) as e:
        raise ValueError(
            f"the network does not match the one saved in {where!r}: it has no Bayesian "
            f"sites {site_names[:4]}...: {e}"
        ) from e
    if model.site_names != list(site_names):
        raise ValueError(
            f"the network does not match the one saved in {where!r}: its Bayesian sites are "
            f"{model.site_names[:4]}..., the file's {list(site_names)[:4]}..."
        )
    return model


def rebuild_parts(payload: dict, header: dict, where: str, net: nn.Module | None, prior):
    """``(net, likelihood, prior)`` of a full model file: the network (``net``'s
    architecture, or the header's) with the saved weights, the likelihood, and ``prior``
    or the saved one.

    Raises:
        ValueError: naming the file, when the network does not match or the saved prior
            cannot be rebuilt.
    """
    from ..files.payload import payload_section

    net = rebuild_network(header, net, payload_section(payload, "net/"), where)
    lik = rebuild_likelihood(header["likelihood"])
    if prior is None:
        try:
            prior = rebuild_prior(
                header.get("prior"), net, where, payload_section(payload, "prior/")
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{where!r}: the header's prior {header.get('prior')!r:.80} "
                f"cannot be rebuilt: {type(e).__name__}: {e}"
            ) from e
    return net, lik, prior
