r"""A last-layer Laplace approximation under a 2DG BNN's draws of the body (issue 43's
untried route to Laplace's OOD detection; a study of ``uncertainty.py``).

The ``2dg + laplace`` row fits laplace-torch's last-layer Kronecker Laplace around the
2DG BNN's mean network and predicts with the body at its means: the body's posterior
spread is dropped.  Two predictives keep it.  Draw :math:`s` runs the network with the
2DG guide's draw :math:`w_s` of every Bayesian site but the last layer's, whose weights
:math:`W_s \sim \mathcal N(W_*, P^{-1})` come from the Laplace approximation
(:math:`W_*`: the 2DG BNN's mean last layer):

* **body draws** (:class:`BodyDrawLaplace` with the ``2dg + laplace`` row's
  approximation): :math:`P` is the Laplace fitted around the mean network;
* **under body draws** (with :func:`fit_under_body_draws`'s):
  :math:`P = \mathbb E_{q(w)}[H(w)] + \delta I`,
  the Kronecker-factored GGN of the last layer averaged over the body's draws (one
  fresh draw per batch of laplace-torch's fit: its features are those of a drawn
  body), and its prior precision :math:`\delta` refitted by laplace-torch's marginal
  likelihood on the same fit.  This is the curvature, in the last layer, of the
  expected log-likelihood :math:`\mathbb E_{q(w)} \log p(y \mid x, W, w)` the
  variational body leaves.

The body draws are the plain 2DG row's (the same seeded chunks of
:data:`~twodg_pyro.evaluation.SAMPLE_CHUNK` draws) and the last layer's the
``2dg + laplace`` row's (:meth:`LaplacePosterior.sample_params` with the same seed), so
the three rows differ by the predictive alone.  Its file holds what the
``2dg + laplace`` file holds (the 2DG BNN and the last layer's factors); the compact
format has no field for this predictive, so a file read back predicts with the body at
its means.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from twodg_pyro.bnn import match_input
from twodg_pyro.evaluation import SAMPLE_CHUNK, seeded
from twodg_pyro.methods import LaplacePosterior, fit_laplace
from twodg_pyro.methods.base import TrainedMethod


class _DrawnBody(nn.Module):
    """The mean network whose Bayesian sites but ``last`` are drawn afresh from the
    guide at every forward (laplace-torch fits its last layer, ``net``'s, on it)."""

    def __init__(self, net: nn.Module, guide, last: set[str]):
        super().__init__()
        self.net = net
        self.__dict__["guide"] = guide  # not a submodule: its parameters are not the net's
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        draw = self.guide.sample_weights(1)
        body = {k: v[0] for k, v in draw.items() if k not in self.last}
        x = match_input(x, next(self.net.parameters()))
        return functional_call(self.net, body, (x,), strict=False)


def fit_under_body_draws(bnn, loader, settings, seed: int) -> LaplacePosterior:
    """laplace-torch's last-layer Laplace of ``bnn``'s mean network with its body drawn
    from ``bnn.guide`` at every batch (seeded with ``seed``; the caller's random state is
    kept), as a :class:`LaplacePosterior` over the mean network."""
    net = bnn.mean_network()
    linear = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise ValueError(f"{type(net).__name__} has no Linear layer for a last-layer Laplace")
    name, module = linear[-1]
    last = {f"{name}.{n}" for n, _ in module.named_parameters()}
    with seeded(seed):
        post = fit_laplace(_DrawnBody(net, bnn.guide, last), loader, settings)
    names = [n.removeprefix("net.") for n in post.param_names]
    if set(names) != last:
        raise ValueError(f"laplace-torch's last layer {names} is not {sorted(last)}")
    return post.rebuilt(net=net, param_names=names, residual=None)


class BodyDrawLaplace(TrainedMethod):
    r"""A 2DG BNN's body draws with a last-layer Laplace approximation's draws of the
    last layer (see the module docstring).

    Args:
        bnn: the 2DG BNN (a :class:`~twodg_pyro.methods.GuidePosterior`).
        laplace: a last-layer :class:`LaplacePosterior` over ``bnn``'s mean network.
        name: the results row.
    """

    def __init__(self, bnn, laplace: LaplacePosterior, name: str):
        super().__init__()
        if laplace.subset != "last_layer":
            raise ValueError(f"a last-layer Laplace is needed, not subset = {laplace.subset!r}")
        self.bnn, self.laplace, self.name = bnn, laplace, name
        self.last = set(laplace.param_names)

    @property
    def net(self) -> nn.Module:
        return self.laplace.net

    def _draws(self, parts, num_samples: int, seed: int) -> torch.Tensor:
        n = int(num_samples)
        with seeded(seed):  # the plain 2DG row's chunks
            chunks = [
                self.bnn.guide.sample_weights(min(SAMPLE_CHUNK, n - i))
                for i in range(0, n, SAMPLE_CHUNK)
            ]
        body = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0] if k not in self.last}
        head = self.laplace._unflatten(self.laplace.sample_params(n, seed))
        rows = []
        for xb, _ in parts:
            xb = match_input(xb, self.laplace.mean())
            probs = [
                functional_call(
                    self.net,
                    {**{k: v[s] for k, v in body.items()}, **{k: v[s] for k, v in head.items()}},
                    (xb,),
                ).softmax(-1)
                for s in range(n)
            ]
            rows.append(torch.stack(probs).cpu())
        return torch.cat(rows, 1)
