r"""The ``mc_dropout`` row: Monte Carlo dropout (Gal & Ghahramani 2016), the baseline every
uncertainty table has (torch-uncertainty's ``mc_dropout``, edward2's ResNet-20 row).

The run's network is trained with dropout of rate :math:`p` on the input of every weight
layer but the first (``Linear`` and ``Conv2d``; the deterministic recipe,
``stage1.deterministic_*``, for ``mc_dropout.epochs`` epochs), and predicts with dropout
kept on: each of :math:`S` draws is one forward pass with fresh Bernoulli masks
:math:`z_s`,

.. math:: p(y \mid x, \mathcal D) \approx \frac1S \sum_{s=1}^S
    \mathrm{softmax}(f_{w \odot z_s}(x)),

seeded with ``seed`` (every batch of a draw in order, so the same data in the same
batches give the same numbers).  Dropout sits in forward pre-hooks, not in new layers:
the network keeps its parameter names, and its file is the network's
(``net/<name>``) plus ``p``.

The whole method is this module and one entry of the registry
(:data:`~twodg_pyro.pipeline.settings.registry.METHOD_REGISTRY`, with its settings
:class:`~twodg_pyro.pipeline.settings.registry.MCDropoutConfig`): its trained method
(:class:`MCDropout`) predicts, counts its forward passes and saves through the
protocol every consumer uses (:class:`~twodg_pyro.methods.TrainedMethod`).
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ...evaluation import seeded
from ...io.model_format import state_tensors
from ...methods.base import TrainedMethod, net_section
from ...prediction import _device_of, deterministic_predict
from ..settings.build import seed_everything, train_loader
from .deterministic import train

if TYPE_CHECKING:
    from ..runtime.context import RunContext


def _drop_input(p: float, module, args):
    """A forward pre-hook (with ``p`` bound): dropout of rate ``p`` on a layer's input, in
    training and prediction alike."""
    return (F.dropout(args[0], p, training=True), *args[1:])


class MCDropout(TrainedMethod):
    r"""A network with dropout of rate ``p`` before every weight layer but the first,
    predicting by :math:`S` seeded draws of dropout masks (module docstring).

    Args:
        net: the network (trained with the dropout in place: see :func:`run`); the hooks
            are added to it.
        p: the dropout rate, in (0, 1).

    Example::

        method = MCDropout(LeNet5(), p=0.1)   # train method.net with its dropout on
        pred = method.predict((X, y), num_samples=30, seed=0)
        method.sample_probs(X, 10, seed=0).shape   # (10, N, C)
        method.save("model_mc_dropout.pt")
    """

    name = "mc_dropout"
    file_tag = "mc_dropout"

    def __init__(self, net: nn.Module, p: float = 0.1):
        super().__init__()
        if not 0 < float(p) < 1:
            raise ValueError(f"p = {p!r}: the dropout rate must be in (0, 1)")
        self.net, self.p = net, float(p)
        layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        if len(layers) < 2:
            raise ValueError(
                f"MC dropout needs two weight layers or more (dropout before all but the "
                f"first), {type(net).__name__} has {len(layers)}"
            )
        for layer in layers[1:]:
            layer.register_forward_pre_hook(functools.partial(_drop_input, self.p))

    @property
    def settings(self) -> dict:
        return {"p": self.p}

    def _draws(self, parts, num_samples, seed):
        with seeded(seed, _device_of(self.net)):
            return torch.stack(
                [deterministic_predict(self.net, parts).mean for _ in range(int(num_samples))]
            )

    def file_content(self) -> tuple[dict, dict]:
        return {"mc_dropout": self.settings}, state_tensors(self.net, "net/")

    @classmethod
    def from_file(cls, header, payload, network, where):
        p = (header.get("mc_dropout") or {}).get("p")
        if not isinstance(p, (int, float)) or isinstance(p, bool):
            raise ValueError(f"{where!r}: the header's mc_dropout has no dropout rate p")
        return cls(net_section(payload, network), p)


def run(ctx: RunContext) -> dict:
    """The run's initial network with MC dropout (``cfg.mc_dropout``), trained with the
    deterministic recipe on a fresh loader of the run's seed; its record (``p``,
    ``epochs``)."""
    cfg = ctx.cfg
    mc = cfg.mc_dropout
    epochs = mc.epochs if mc.epochs is not None else cfg.stage1.deterministic_epochs
    seed_everything(cfg.seed)
    method = MCDropout(copy.deepcopy(ctx.net), mc.p)
    seconds = train(ctx, epochs, train_loader(ctx.art.split, cfg.data, cfg.seed), method.net)[1]
    n_net = sum(p.numel() for p in method.net.parameters())
    return ctx.finish("mc_dropout", method, seconds, n_net, p=mc.p, epochs=int(epochs))
