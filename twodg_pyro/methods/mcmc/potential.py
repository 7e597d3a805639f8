r"""The potential of a reference posterior: the model's unnormalised posterior over the flat
vector of its Bayesian tensors, full batch, as one function for Pyro's HMC/NUTS kernels
(:func:`flat_potential`; see :mod:`twodg_pyro.methods.mcmc.sampler`).

.. math::
    U(w) = -\log p(w) - \frac1T \sum_{n=1}^{N} \log p(y_n \mid f_w(x_n))
"""

from __future__ import annotations

import torch
from torch import nn

from ...prediction import _batches

__all__ = ["FlatPotential", "chain_forward", "flat_potential", "linear_chain"]


class FlatPotential:
    r"""The potential :math:`U(w)` of the module docstring over the flat vector ``w``
    (a picklable callable: ``potential({"w": w})``, Pyro's ``potential_fn`` convention).

    Args:
        model: the :class:`~twodg_pyro.bnn.BNNModel` (its prior, likelihood, network).
        x, y: all training inputs and labels.
        temperature: :math:`T` (1: the Bayes posterior).
    """

    def __init__(self, model, x: torch.Tensor, y: torch.Tensor, temperature: float = 1.0):
        self.model = model
        self.x, self.y = x, y
        self.temperature = float(temperature)
        self.sites = list(model.sites)
        self.priors = [model.prior_distribution(s) for s in self.sites]
        sizes = [s.numel for s in self.sites]
        self.offsets = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        self.layers = linear_chain(model)

    @property
    def traceable(self) -> bool:
        """Whether the potential can be JIT-compiled (:func:`linear_chain`: PyTorch's
        tracer refuses :func:`torch.func.functional_call`)."""
        return self.layers is not None

    @property
    def dim(self) -> int:
        """:math:`n_w`, the length of the flat vector."""
        return self.offsets[-1]

    def unflatten(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{site: tensor}`` of a flat vector ``(n_w,)`` (or ``(S, n_w)``: leading draws)."""
        lead = tuple(w.shape[:-1])
        return {
            s.name: w[..., a:b].reshape(*lead, *s.shape)
            for s, a, b in zip(self.sites, self.offsets[:-1], self.offsets[1:], strict=True)
        }

    def flatten(self, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """The flat vector of ``{site: tensor}`` (the inverse of :meth:`unflatten`)."""
        return torch.cat([weights[s.name].reshape(-1) for s in self.sites])

    def log_prior(self, w: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(w)`, the sum of the sites' prior log-densities."""
        parts = self.unflatten(w)
        return sum(
            p.log_prob(parts[s.name]).sum() for s, p in zip(self.sites, self.priors, strict=True)
        )

    def log_likelihood(self, w: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_n \log p(y_n \mid f_w(x_n))` over all training examples."""
        weights = self.unflatten(w)
        if self.layers is not None:
            out = chain_forward(self.layers, weights, self.x)
        else:
            out = self.model.network_forward(weights, self.x)
        return self.model.likelihood.log_prob(out, self.y).sum()

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        w = params["w"]
        return -(self.log_prior(w) + self.log_likelihood(w) / self.temperature)


def linear_chain(model) -> list[tuple[str | None, nn.Module]] | None:
    """The network as a chain of layers when it is one that :func:`chain_forward` runs
    without :func:`torch.func.functional_call` (so that the potential can be traced for
    JIT): a :class:`torch.nn.Sequential`, or the library's ``MLP`` (flatten, then its
    ``layers``), of ``Linear`` layers whose weight and bias are all Bayesian sites and
    parameter-free layers (activations, ``Flatten``, ``Dropout`` in eval mode).
    ``[(prefix or None, module)]``; ``None`` for any other network."""
    net = model.net
    chain: list[tuple[str | None, nn.Module]] = []
    if isinstance(net, nn.Sequential):
        seq, prefix = net, ""
    elif set(dict(net.named_children())) == {"layers"} and isinstance(net.layers, nn.Sequential):
        if type(net).__name__ != "MLP":
            return None
        seq, prefix = net.layers, "layers."
        chain.append((None, nn.Flatten()))
    else:
        return None
    names = set(model.site_names)
    for name, module in seq.named_children():
        own = [p for p, _ in module.named_parameters()]
        if isinstance(module, nn.Linear):
            if {f"{prefix}{name}.{p}" for p in own} - names:
                return None
            chain.append((f"{prefix}{name}.", module))
        elif own or list(module.buffers()):
            return None
        else:
            chain.append((None, module))
    return chain


def chain_forward(chain, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Run a :func:`linear_chain` with the Bayesian tensors ``weights`` on ``x``."""
    h = x
    for prefix, module in chain:
        if prefix is None:
            h = module(h)
        else:
            bias = weights.get(prefix + "bias")
            h = torch.nn.functional.linear(h, weights[prefix + "weight"], bias)
    return h


def flat_potential(model, data, temperature: float = 1.0) -> FlatPotential:
    """The :class:`FlatPotential` of ``model`` on all of ``data`` (a pair ``(X, y)``, a
    data set or batches: concatenated into one full batch).

    Raises:
        ValueError: unlabelled data, or a likelihood scaled for another number of
            examples than the data holds (its ``dataset_size``: the posterior would not
            be the one the guides approximate).
    """
    batches = _batches(data, 1 << 30)
    if any(yb is None for _, yb in batches):
        raise ValueError("run_mcmc needs labelled training data: pass (X, y) or (x, y) batches")
    like = model.site_parameter(0)
    x = torch.cat([xb for xb, _ in batches]).to(device=like.device, dtype=like.dtype)
    y = torch.cat([yb for _, yb in batches]).to(like.device)
    n = getattr(model.likelihood, "dataset_size", len(y))
    if int(n) != len(y):
        raise ValueError(
            f"the model's likelihood is scaled for dataset_size = {n} examples but the data "
            f"hold {len(y)}: full-batch MCMC needs the likelihood of all of them (build the "
            f"BNNModel with likelihood={len(y)})"
        )
    return FlatPotential(model, x, y, temperature)
