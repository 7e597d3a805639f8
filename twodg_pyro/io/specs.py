r"""What a model file says about its model, as JSON: the likelihood, the prior, the
Bayesian sites, and how to rebuild each from it.

Shared by the full model files (:mod:`~twodg_pyro.io.model_format`,
:mod:`~twodg_pyro.io.model_file`) and the compact ones (:mod:`~twodg_pyro.io.compact`).

**Likelihoods and priors** describe themselves: the spec of either is its class's
``to_spec`` and the class that reads it is the one registered under the spec's ``kind``
(:data:`~twodg_pyro.likelihoods.LIKELIHOODS`, :data:`~twodg_pyro.priors.PRIORS`), the
library's (:class:`~twodg_pyro.priors.PretrainedPrior` says how its centres are kept,
:class:`~twodg_pyro.priors.SitePrior` how ``pyro.distributions`` are) and a user's
alike.  A likelihood of another kind is refused.

A prior that cannot be stored (a function of the site such as ``lambda site:
dist.StudentT(3., 0., .1)``, a ``Prior`` subclass without its own ``kind``, a
distribution with tensor parameters) is **never replaced silently**: saving warns
(:class:`PriorNotStoredWarning`) and records its ``repr``; loading warns again and gives
the model an :class:`UnavailablePrior`, which predicts as well as any prior (prediction
does not use it) but raises a ``ValueError`` naming the file and the prior wherever the
prior is needed (the Pyro model program, the ELBO, the k-hat), until a prior is passed
to the loader (``load_model(path, prior=...)``).  A file naming a prior kind that is not
registered (a user's prior whose class is not defined) loads the same way.
"""

from __future__ import annotations

import glob
import warnings

import torch
from torch import nn

from ..likelihoods import LIKELIHOODS, Likelihood
from ..priors import PRIORS, Prior
from .network_size import build_file_network


class PriorNotStoredWarning(UserWarning):
    """A model's prior cannot be written to a model file (or was not): the loaded model
    gets an :class:`UnavailablePrior` unless a prior is passed to the loader."""


# ---------------------------------------------------------------------------- likelihood
def likelihood_spec(lik: Likelihood) -> dict:
    """The likelihood's spec (:meth:`~twodg_pyro.likelihoods.Likelihood.to_spec`):
    ``{"kind", "dataset_size"[, "scale"]}`` of a Categorical or Gaussian likelihood."""
    return lik.to_spec()


def rebuild_likelihood(spec: dict) -> Likelihood:
    """The likelihood of :func:`likelihood_spec`'s ``spec``; another kind is a ValueError."""
    kind = spec.get("kind") if isinstance(spec, dict) else None
    cls = LIKELIHOODS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        *others, last = LIKELIHOODS
        names = f"{', '.join(others)} or {last}" if others else last
        raise ValueError(f"the likelihood {spec!r:.80} is not {names}")
    return cls.from_spec(spec)


# ---------------------------------------------------------------------------- priors
class UnavailablePrior(Prior):
    """The prior of a model loaded from a file that could not store it.

    Prediction never calls the prior; anything that does (the model program, an ELBO,
    the k-hat) gets a ``ValueError`` that says which prior it was and how to supply it.
    """

    kind = "custom"
    in_settings = False

    def __init__(self, description: str, where: str):
        self.description = description
        self.where = where

    def _fail(self, *_args, **_kwargs):
        raise ValueError(
            f"the prior of the model loaded from {self.where!r} was not stored in the file "
            f"({self.description}): pass it to the loader, e.g. load_model(path, "
            "prior=...), to train the model or compute its ELBO or k-hat; prediction "
            "does not need it"
        )

    __call__ = site_distribution = _fail

    def to_spec(self, model=None) -> tuple[dict, dict[str, torch.Tensor]]:
        """``{"kind": "custom", "repr": description}``: still not stored."""
        return {"kind": "custom", "repr": self.description}, {}

    @classmethod
    def from_spec(cls, spec: dict, net: nn.Module, tensors: dict, where: str) -> UnavailablePrior:
        """The stand-in for a prior of ``spec`` that was not stored, or whose kind is
        not registered here."""
        return cls(str(spec.get("repr") or spec.get("kind") or "no prior recorded"), where)

    def __repr__(self) -> str:
        return f"UnavailablePrior({self.description})"


def prior_spec(prior, model=None) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(spec, tensors)``: the JSON spec of ``prior`` and the tensors to store beside it
    (:meth:`~twodg_pyro.priors.Prior.to_spec`; e.g. ``{site: centre}`` of a
    ``PretrainedPrior`` whose centres are not the network's).

    Warns :class:`PriorNotStoredWarning` for a prior that cannot be stored (see the
    module docstring) and returns ``{"kind": "custom", "repr": ...}`` for it.
    """
    stored = prior.to_spec(model) if isinstance(prior, Prior) and prior.kind is not None else None
    if stored is not None:
        return stored
    text = repr(prior)
    warnings.warn(
        f"the prior {text:.120} cannot be stored in a model file (only priors with a kind "
        "of their own and pyro.distributions with scalar parameters can): the file records its "
        "description, and loading it gives a model whose prior must be passed again "
        "(load_model(path, prior=...)) to train it or compute its ELBO or k-hat; "
        "prediction does not need it",
        PriorNotStoredWarning,
        stacklevel=3,
    )
    return {"kind": "custom", "repr": text}, {}


def rebuild_prior(spec: dict | None, net: nn.Module, where: str, tensors=None, warn: bool = True):
    """The prior of ``spec`` (see :func:`prior_spec`) for a model over ``net``: its
    registered class's :meth:`~twodg_pyro.priors.Prior.from_spec`.

    ``tensors``: those stored with it (the centres ``{site: tensor}`` of a ``"stored"``
    PretrainedPrior).  A prior that was not stored, or whose kind is not registered,
    gives an :class:`UnavailablePrior` (with a :class:`PriorNotStoredWarning` when
    ``warn``).

    Raises:
        ValueError: a spec that names a known prior with wrong numbers, or stored centres
            that are missing.
    """
    spec = spec or {}
    kind = spec.get("kind")
    cls = PRIORS.get(kind, UnavailablePrior) if isinstance(kind, str) else UnavailablePrior
    prior = cls.from_spec(spec, net, tensors or {}, where)
    if warn and isinstance(prior, UnavailablePrior):
        warnings.warn(
            f"{where!r} was saved with a prior that could not be stored "
            f"({prior.description:.120}): the loaded model predicts, but its prior raises "
            "until you pass one (load_model(path, prior=...))",
            PriorNotStoredWarning,
            stacklevel=3,
        )
    return prior


# ---------------------------------------------------------------------------- sites
def site_types(net: nn.Module, module_names) -> tuple[type[nn.Module], ...]:
    """The classes of ``net``'s modules ``module_names`` (the layer types to select)."""
    return tuple(dict.fromkeys(type(net.get_submodule(name)) for name in module_names))


def exact_include(names) -> list[str]:
    """Globs that select exactly the parameters ``names``."""
    return [glob.escape(n) for n in names]


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
        detail = " ".join(str(e).split())  # torch's is a line per tensor
        raise ValueError(f"the network does not match the one saved in {where!r}: {detail}") from e
    return net


def rebuild_bnn_model(net: nn.Module, prior, likelihood, site_names: list[str], where: str):
    """A :class:`~twodg_pyro.bnn.BNNModel` over ``net`` whose Bayesian sites are exactly
    ``site_names`` (the saved model's, whatever selection made them).

    Raises:
        ValueError: the network lacks one of the sites.
    """
    from ..bnn import BNNModel

    try:
        types = site_types(net, [n.rpartition(".")[0] for n in site_names])
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
